//! Nothing rolls back unseen (#23, records): a finished thread's final head is anchored where
//! the thread cannot reach it alone — a child's in its parent's `child_finished` line, a root's
//! in the project's signed, chained anchor log — and `weft verify` checks it: a thread.json
//! replaced by an older validly signed one with its transcript truncated to match, a document in
//! the wrong folder, a missing child (`--tree`), an edited anchor log.

use crate::support::{directive, weft_cmd, Fixture};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

fn verify(fx: &Fixture, args: &[&str]) -> (bool, String) {
    let o = weft_cmd(fx.root())
        .arg("verify")
        .args(args)
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).to_string(),
    )
}

/// A tree (root → kid) whose kid's and root's running-state records are kept aside while they
/// run: older, validly signed states to roll back to. The project's first finished root is a
/// quick one, so the anchor log begins before the tree.
async fn tree_with_old_states() -> (Fixture, String, String, tempfile::TempDir) {
    let root = directive("permissions: [\"thread.spawn.**\"]", "Root.");
    let kid = directive("", "Kid.");
    let quick = directive("", "Quick.");
    let script = "root:\n  - tool_calls: [ { name: spawn_thread, input: { directive: kid } } ]\n  - text: root done\nkid:\n  - text: thinking\n    delay: 1500ms\n  - text: kid done\nquick:\n  - text: hi\n";
    let fx = Fixture::new(
        &[("root", &root), ("kid", &kid), ("quick", &quick)],
        script,
        "",
    );
    let rt = fx.runtime().await;
    rt.run("quick", Default::default(), Default::default())
        .await
        .unwrap();
    let h = rt
        .start("root", Default::default(), Default::default())
        .await
        .unwrap();
    let root_id = h.id().to_string();
    let saved = tempfile::tempdir().unwrap();
    crate::support::wait_until("the kid to run", || {
        fx.rows_so_far()
            .iter()
            .any(|r| r.directive == "kid" && r.status == "running")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let kid_id = fx.id_of("kid");
    for id in [&root_id, &kid_id] {
        let from = fx.root().join(".weft/threads").join(id);
        let to = saved.path().join(id);
        std::fs::create_dir_all(&to).unwrap();
        std::fs::copy(from.join("thread.json"), to.join("thread.json")).unwrap();
    }
    let report = h.wait().await.unwrap();
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    rt.shutdown();
    (fx, root_id, kid_id, saved)
}

/// Puts back `id`'s saved thread.json and truncates its transcript to the head that one signs.
fn roll_back(fx: &Fixture, saved: &Path, id: &str) {
    let dir = fx.root().join(".weft/threads").join(id);
    let old = std::fs::read(saved.join(id).join("thread.json")).unwrap();
    let doc: Value = serde_json::from_slice(&old).unwrap();
    assert_ne!(doc["status"], "completed", "an older, non-terminal state");
    let keep = doc["transcript_head"]["seq"].as_i64().unwrap() as usize + 1;
    let text = std::fs::read_to_string(dir.join("transcript.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().take(keep).collect();
    std::fs::write(dir.join("transcript.jsonl"), lines.join("\n") + "\n").unwrap();
    std::fs::write(dir.join("thread.json"), old).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_child_fails_verify() {
    let (fx, _root, kid, saved) = tree_with_old_states().await;
    assert!(verify(&fx, &["--all"]).0, "clean before");
    roll_back(&fx, saved.path(), &kid);
    // The rolled-back records are consistent on their own: only the anchor tells.
    let (ok, out) = verify(&fx, &["--all"]);
    assert!(
        !ok && out.contains("rolled back") && out.contains(&kid),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_root_fails_verify() {
    let (fx, root, _kid, saved) = tree_with_old_states().await;
    roll_back(&fx, saved.path(), &root);
    let (ok, out) = verify(&fx, &[&root]);
    assert!(
        !ok && out.contains("rolled back") && out.contains("anchor log"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_folder_a_missing_child_and_an_edited_log_fail_verify() {
    let (fx, root, kid, _saved) = tree_with_old_states().await;
    let threads = fx.root().join(".weft/threads");
    // A child's folder deleted: --tree names it.
    let gone = tempfile::tempdir().unwrap();
    std::fs::rename(threads.join(&kid), gone.path().join("kid")).unwrap();
    let (ok, out) = verify(&fx, &["--tree", &root]);
    assert!(
        !ok && out.contains(&kid) && out.contains("missing"),
        "{out}"
    );
    // The root's records moved into the kid's folder: the document names another thread.
    std::fs::create_dir_all(threads.join(&kid)).unwrap();
    for f in ["thread.json", "transcript.jsonl"] {
        std::fs::copy(threads.join(&root).join(f), threads.join(&kid).join(f)).unwrap();
    }
    let (ok, out) = verify(&fx, &[&kid]);
    assert!(!ok && out.contains("sits in the folder of"), "{out}");
    // The anchor log edited: its chain or signature fails.
    let log = fx.root().join(".weft/state/anchors.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    std::fs::write(&log, text.replace("completed", "cancelled")).unwrap();
    let (ok, out) = verify(&fx, &["--all"]);
    assert!(!ok && out.contains("anchors.jsonl"), "{out}");
}

/// Cutting the anchor log's last lines (its chain stays whole) does not hide a rolled-back
/// root: the registry says it finished after the log began, and it is anchored nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_anchor_log_does_not_hide_a_rolled_back_root() {
    let (fx, root, _kid, saved) = tree_with_old_states().await;
    roll_back(&fx, saved.path(), &root);
    let log = fx.root().join(".weft/state/anchors.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() == 2 && lines[1].contains(&root),
        "the quick root's line, then the tree's: {lines:?}"
    );
    std::fs::write(&log, format!("{}\n", lines[0])).unwrap();
    let (ok, out) = verify(&fx, &["--all"]);
    assert!(
        !ok && out.contains(&root) && out.contains("anchored nowhere") && !out.contains("chain"),
        "{out}"
    );
}

/// A message edit re-anchors its thread: rolling the edit back (the thread.json before it, the
/// transcript cut to match) fails verify (review of #23).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_message_edit_fails_verify() {
    let t = directive("", "Say something.");
    let fx = Fixture::new(&[("t", &t)], "t:\n  - text: first answer\n", "");
    let (r, _rt) = fx.run("t", serde_json::json!({})).await;
    let id = r.thread_id.to_string();
    let dir = fx.root().join(".weft/threads").join(&id);
    let before_doc = std::fs::read(dir.join("thread.json")).unwrap();
    let before_lines = std::fs::read(dir.join("transcript.jsonl")).unwrap();
    let o = weft_cmd(fx.root())
        .args(["message", &id, "edit", "2", "EDITED"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(verify(&fx, &["--all"]).0, "clean after the edit");
    std::fs::write(dir.join("thread.json"), before_doc).unwrap();
    std::fs::write(dir.join("transcript.jsonl"), before_lines).unwrap();
    let (ok, out) = verify(&fx, &["--all"]);
    assert!(!ok && out.contains("rolled back"), "{out}");
}

/// Deleting what `weft delete` deletes is no alarm: a deleted child is not "missing" from its
/// tree, and a continuation of a deleted thread verifies (review of #23).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_threads_are_not_missing() {
    let (fx, root, kid, _saved) = tree_with_old_states().await;
    let o = weft_cmd(fx.root()).args(["delete", &kid]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (ok, out) = verify(&fx, &["--tree", &root]);
    assert!(ok, "{out}");
    let (ok, out) = verify(&fx, &["--all"]);
    assert!(ok, "{out}");
}

/// A tree that has finished in a process still alive (a `weft serve`, here this test process) is
/// held by no one: another process resumes it (review of #23: Busy forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_tree_of_a_live_process_can_be_resumed_elsewhere() {
    let t = directive("", "Say something.");
    let fx = Fixture::new(&[("t", &t)], "t:\n  - text: first\n  - text: again\n", "");
    let (r, rt) = fx.run("t", serde_json::json!({})).await;
    let o = weft_cmd(fx.root())
        .args(["resume", r.thread_id.as_str(), "--script"])
        .arg(fx.root().join("script.yaml"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    drop(rt);
}

/// A scheduled thread (a deferred child: no running parent records it) is anchored in the
/// project's log: rolled back to its running state, it fails verify (review of #23).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_scheduled_thread_fails_verify() {
    let s = directive(
        "limits: { spend: 0.01 }\npermissions: [ schedule, \"thread.spawn.x\" ]",
        "Schedule.",
    );
    let x = directive("", "X.");
    let script = "s:\n  - tool_calls: [ { name: schedule, input: { directive: x, delay: 0, limits: { spend: 0.002 } } } ]\n    usage: { input_tokens: 100, output_tokens: 0 }\n  - text: scheduled\n    usage: { input_tokens: 100, output_tokens: 0 }\nx:\n  - text: thinking\n    delay: 1500ms\n    usage: { input_tokens: 100, output_tokens: 0 }\n  - text: x done\n    usage: { input_tokens: 100, output_tokens: 0 }\n";
    let fx = Fixture::new(&[("s", &s), ("x", &x)], script, "");
    let rt = fx.runtime().await;
    rt.run("s", Default::default(), Default::default())
        .await
        .unwrap();
    crate::support::wait_until("the scheduled thread to run", || {
        fx.rows_so_far()
            .iter()
            .any(|r| r.directive == "x" && r.status == "running")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let xid = fx.id_of("x");
    let saved = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(saved.path().join(&xid)).unwrap();
    std::fs::copy(
        fx.root()
            .join(".weft/threads")
            .join(&xid)
            .join("thread.json"),
        saved.path().join(&xid).join("thread.json"),
    )
    .unwrap();
    rt.drain_hooks().await;
    rt.shutdown();
    assert!(verify(&fx, &["--all"]).0, "clean before");
    roll_back(&fx, saved.path(), &xid);
    let (ok, out) = verify(&fx, &["--all"]);
    assert!(
        !ok && out.contains("rolled back") && out.contains(&xid),
        "{out}"
    );
}

/// Roots that end together share the anchor log's appends (one lock, one write and one sync
/// for all the lines queued meanwhile): 120 roots cancelled at once are each anchored exactly
/// once, at the head their signed thread.json names, in one unbroken signed chain that
/// `weft verify --all` accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roots_ending_together_are_each_anchored_once_in_one_chain() {
    const N: usize = 120;
    let idle = directive("limits: { duration: 1h }", "Wait.");
    let fx = Fixture::new(
        &[("idle", &idle)],
        "idle:\n  - text: never\n    delay: 1h\n",
        "",
    );
    let rt = fx.runtime().await;
    let mut handles = Vec::new();
    for _ in 0..N {
        let h = rt
            .start("idle", Default::default(), Default::default())
            .await
            .unwrap();
        handles.push(h);
    }
    for h in &handles {
        assert!(h.cancel("all at once"));
    }
    let mut ids = Vec::new();
    for h in handles {
        ids.push(h.id().to_string());
        let report = h.wait().await.unwrap();
        assert_eq!(report.status, weft::Status::Cancelled, "{report:?}");
    }
    rt.shutdown();
    let log = std::fs::read_to_string(fx.root().join(".weft/state/anchors.jsonl")).unwrap();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), N, "one line per root:\n{log}");
    for id in &ids {
        let mine: Vec<&Value> = lines
            .iter()
            .filter(|l| l["thread"] == id.as_str())
            .collect();
        assert_eq!(mine.len(), 1, "{id} anchored once");
        let doc: Value = serde_json::from_slice(
            &std::fs::read(fx.root().join(".weft/threads").join(id).join("thread.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(mine[0]["head"], doc["transcript_head"]["hash"], "{id}");
        assert_eq!(mine[0]["status"], "cancelled");
    }
    let (ok, out) = verify(&fx, &["--all"]);
    assert!(ok, "{out}");
}
