//! Lifecycle guarantees: cancellation reaching the leaves, crash recovery, resume.

use crate::support::{directive, expected_spend, rows_json, wait_until, weft_cmd, Fixture};
use serde_json::{json, Map, Value};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use weft::LimitSet;
use weft::Status;
use weft::ThreadId;

fn spawn_calls(directive: &str, n: usize) -> String {
    (0..n)
        .map(|_| format!("      - {{ name: spawn_thread, input: {{ directive: {directive}, wait: false }} }}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// root → 10 mids → 10 leaves each (111 threads), leaves sleeping in a long LLM call.
fn wide_tree(leaf_delay: &str) -> Fixture {
    let perms =
        "permissions: [\"thread.spawn.**\"]\nlimits: { spawns: 10, concurrency: 10, spend: 5 }";
    let script = format!(
        "root:\n  - tool_calls:\n{}\n  - tool_calls: [ {{ name: wait_threads, input: {{}} }} ]\n  - text: root done\nmid:\n  - tool_calls:\n{}\n  - tool_calls: [ {{ name: wait_threads, input: {{}} }} ]\n  - text: mid done\nleaf:\n  - text: leaf done\n    delay: {leaf_delay}\n    usage: {{ input_tokens: 10, output_tokens: 5 }}\n",
        spawn_calls("mid", 10),
        spawn_calls("leaf", 10)
    );
    Fixture::new(
        &[
            ("root", &directive(perms, "Root.")),
            ("mid", &directive(perms, "Mid.")),
            ("leaf", &directive("", "Leaf.")),
        ],
        &script,
        "",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_root_of_111_live_threads_reaches_every_leaf_quickly() {
    let fx = wide_tree("60s");
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", Map::new(), LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().clone();
    let done = handle.wait();
    wait_until("111 running threads", || {
        fx.rows().iter().filter(|r| r.status == "running").count() == 111
    })
    .await;
    let started = Instant::now();
    assert!(rt.cancel(&id, "test"));
    let report = done.await.unwrap();
    let took = started.elapsed();
    assert_eq!(report.status, Status::Cancelled);
    let rows = fx.rows();
    assert_eq!(rows.len(), 111);
    assert!(
        rows.iter().all(|r| r.status == "cancelled"),
        "every thread ends cancelled"
    );
    let (violations, open) = rt.audit().await;
    assert!(
        violations.is_empty() && open == 0,
        "no open reservation: {open}"
    );
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
    for r in &rows {
        let finished = fx
            .events(&r.id)
            .iter()
            .filter(|e| e["type"] == "thread_finished")
            .count();
        assert_eq!(finished, 1, "{} finished exactly once", r.id);
    }
    eprintln!("cancel of 111 live threads finalized in {took:?}");
    assert!(took < Duration::from_secs(1), "cancel took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_middle_subtree_leaves_siblings_and_root_to_finish() {
    let perms = "permissions: [\"thread.spawn.**\"]\nlimits: { spawns: 10, concurrency: 10 }";
    let script = r#"
root:
  - usage: { input_tokens: 100, output_tokens: 10 }
    tool_calls:
      - { name: spawn_thread, input: { directive: fast, wait: false } }
      - { name: spawn_thread, input: { directive: slow, wait: false } }
  - usage: { input_tokens: 200, output_tokens: 10 }
    tool_calls: [ { name: wait_threads, input: {} } ]
  - usage: { input_tokens: 300, output_tokens: 10 }
    text: root done
fast:
  - usage: { input_tokens: 50, output_tokens: 50 }
    tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]
  - usage: { input_tokens: 60, output_tokens: 6 }
    text: fast done
slow:
  - usage: { input_tokens: 70, output_tokens: 7 }
    tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]
  - text: never
leaf:
  - usage: { input_tokens: 40, output_tokens: 4 }
    delay: 300ms
    text: leaf done
"#;
    let fx = Fixture::new(
        &[
            ("root", &directive(perms, "Root.")),
            ("fast", &directive(perms, "Fast.")),
            ("slow", &directive(perms, "Slow.")),
            ("leaf", &directive("", "Leaf.")),
        ],
        script,
        "",
    );
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", Map::new(), LimitSet::default())
        .await
        .unwrap();
    let done = handle.wait();
    wait_until("the slow subtree", || {
        fx.rows().iter().any(|r| {
            r.directive == "leaf"
                && r.parent_id
                    .as_deref()
                    .is_some_and(|p| p.starts_with("slow"))
        })
    })
    .await;
    let slow = fx
        .rows()
        .into_iter()
        .find(|r| r.directive == "slow")
        .unwrap();
    assert!(rt.cancel(&ThreadId::parse(&slow.id).unwrap(), "test"));
    let report = done.await.unwrap();
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let rows = fx.rows();
    for r in &rows {
        let under_slow = r.id == slow.id || r.parent_id.as_deref() == Some(slow.id.as_str());
        let want = if under_slow { "cancelled" } else { "completed" };
        assert_eq!(r.status, want, "{} ({})", r.id, r.directive);
    }
    let root_events = fx.events(report.thread_id.as_str());
    let waited = root_events
        .iter()
        .find(|e| {
            e["type"] == "tool_result" && e["content"].as_str().unwrap().contains("\"threads\"")
        })
        .unwrap();
    assert!(
        waited["content"]
            .as_str()
            .unwrap()
            .contains("\"status\":\"cancelled\""),
        "the parent sees a cancelled result: {waited}"
    );
    assert_eq!(
        report.spend_nanos.0,
        expected_spend(&fx),
        "root spend = exact sum of every thread's calls"
    );
    let (violations, open) = rt.audit().await;
    assert!(violations.is_empty() && open == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_child_error_policies() {
    let script = r#"
parent:
  - tool_calls:
      - { name: spawn_thread, input: { directive: bad, wait: false } }
      - { name: spawn_thread, input: { directive: slow, wait: false } }
  - tool_calls: [ { name: wait_threads, input: {} } ]
  - text: parent done
bad:
  - error: { kind: auth }
slow:
  - text: slow done
    delay: 400ms
"#;
    for (policy, parent_status, slow_status) in [
        ("continue", Status::Completed, "completed"),
        ("cancel_siblings", Status::Completed, "cancelled"),
        ("fail", Status::Error, "cancelled"),
    ] {
        let front = format!("permissions: [\"thread.spawn.**\"]\non_child_error: {policy}");
        let fx = Fixture::new(
            &[
                ("parent", &directive(&front, "P.")),
                ("bad", &directive("", "B.")),
                ("slow", &directive("", "S.")),
            ],
            script,
            "retries: 0\n",
        );
        let (report, rt) = fx.run("parent", json!({})).await;
        assert_eq!(report.status, parent_status, "{policy}: {report:?}");
        let rows = fx.rows();
        assert_eq!(
            rows.iter().find(|r| r.directive == "bad").unwrap().status,
            "error"
        );
        assert_eq!(
            rows.iter().find(|r| r.directive == "slow").unwrap().status,
            slow_status,
            "{policy}"
        );
        if policy == "fail" {
            assert!(report.error.unwrap().contains("child bad-"), "{policy}");
        }
        let (v, open) = rt.audit().await;
        assert!(v.is_empty() && open == 0);
    }
}

fn wait_rows(project: &std::path::Path, what: &str, f: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let rows = rows_json(project);
        if f(&rows) {
            return rows;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn weft_cancel_from_a_second_process_stops_a_running_tree() {
    let fx = wide_tree("60s");
    let script = fx.root().join("script.yaml");
    let child = weft_cmd(fx.root())
        .args([
            "run",
            "root",
            "--json",
            "--script",
            script.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rows = wait_rows(fx.root(), "111 running threads", |rows| {
        rows.iter().filter(|r| r["status"] == "running").count() == 111
    });
    let root = rows.iter().find(|r| r["directive"] == "root").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let o = weft_cmd(fx.root())
        .args(["cancel", &root, "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reply: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(reply["status"], "cancelled");
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "weft run exits 130 when its tree is cancelled"
    );
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["status"], "cancelled");
    assert!(rows_json(fx.root())
        .iter()
        .all(|r| r["status"] == "cancelled"));
    // Cancelling again is a clear no-op; an unknown id is an error.
    let o = weft_cmd(fx.root())
        .args(["cancel", &root])
        .output()
        .unwrap();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("nothing to cancel"));
    let o = weft_cmd(fx.root())
        .args(["cancel", "nobody-1-2"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        !fx.root().join(".weft/run").read_dir().unwrap().any(|e| e
            .unwrap()
            .path()
            .extension()
            .is_some_and(|x| x == "sock")),
        "sockets removed on exit"
    );
}

#[test]
fn ctrl_c_cancels_the_tree_and_exits_130() {
    let fx = wide_tree("60s");
    let script = fx.root().join("script.yaml");
    let child = weft_cmd(fx.root())
        .args(["run", "root", "--script", script.to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_rows(fx.root(), "running leaves", |rows| {
        rows.iter().filter(|r| r["status"] == "running").count() == 111
    });
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    assert!(rows_json(fx.root())
        .iter()
        .all(|r| r["status"] == "cancelled"));
}

#[test]
fn kill_9_then_restart_recovers_every_thread_and_resume_continues() {
    let fx = wide_tree("60s");
    let script = fx.root().join("script.yaml");
    let mut child = weft_cmd(fx.root())
        .args([
            "run",
            "root",
            "--json",
            "--script",
            script.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_rows(fx.root(), "a live tree", |rows| {
        rows.iter().filter(|r| r["status"] == "running").count() >= 60
    });
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // Tear the last line of one transcript, as a crash mid-append would.
    let rows = rows_json(fx.root());
    let torn_id = rows.iter().find(|r| r["directive"] == "mid").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let tr = fx
        .root()
        .join(".weft/threads")
        .join(&torn_id)
        .join("transcript.jsonl");
    std::io::Write::write_all(
        &mut std::fs::OpenOptions::new().append(true).open(&tr).unwrap(),
        b"{\"seq\":999,\"type\":\"tool_re",
    )
    .unwrap();
    let unfinished = rows
        .iter()
        .filter(|r| r["status"] == "running" || r["status"] == "created")
        .count();
    assert!(unfinished > 0);
    // Two processes recover at once: each thread is claimed by exactly one of them.
    let racers: Vec<_> = (0..2)
        .map(|_| {
            weft_cmd(fx.root())
                .args(["recover", "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut recovered: Vec<Value> = Vec::new();
    for r in racers {
        let o = r.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mine: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
        recovered.extend(mine);
    }
    assert_eq!(recovered.len(), unfinished, "each thread recovered once");
    for r in &rows {
        let id = r["id"].as_str().unwrap();
        let finished = fx
            .events(id)
            .iter()
            .filter(|e| e["type"] == "thread_finished")
            .count();
        assert_eq!(finished, 1, "{id}: one terminal line");
    }
    assert!(recovered
        .iter()
        .any(|r| r["id"] == torn_id.as_str() && r["torn_line_kept"] == true));
    assert!(
        tr.with_extension("torn").exists(),
        "the torn line is kept aside, not dropped"
    );
    let rows = rows_json(fx.root());
    assert!(
        rows.iter()
            .all(|r| r["status"] == "error" || r["status"] == "completed"),
        "nothing left running"
    );
    assert!(rows
        .iter()
        .filter(|r| r["status"] == "error")
        .all(|r| r["error"].as_str().unwrap().starts_with("interrupted")));
    let o = weft_cmd(fx.root())
        .args(["verify", "--all"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    // The ledger balances: nothing reserved, every account closed within its cap.
    let db = rusqlite::Connection::open(fx.root().join(".weft/state/ledger.db")).unwrap();
    let (open_res, open_acct, over): (i64, i64, i64) = db
        .query_row(
            "SELECT (SELECT COUNT(*) FROM reservations), (SELECT COUNT(*) FROM accounts WHERE closed=0),
                    (SELECT COUNT(*) FROM accounts WHERE inflight<>0 OR guaranteed<>0 OR spent>max)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        (open_res, open_acct, over),
        (0, 0, 0),
        "open reservations, open accounts, unbalanced accounts"
    );
    // Resume the interrupted root: its conversation goes on in a continuation thread.
    let root = rows.iter().find(|r| r["directive"] == "root").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let o = weft_cmd(fx.root())
        .args([
            "resume",
            &root,
            "-m",
            "children were lost; wrap up",
            "--json",
            "--script",
            script.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let out: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&o.stderr)));
    assert_eq!(out["status"], "completed", "{out}");
    assert_eq!(out["result"], "root done");
    assert_eq!(out["continuation_of"], root.as_str());
    let o = weft_cmd(fx.root())
        .args(["threads", "chain", &root, "--json"])
        .output()
        .unwrap();
    let chain: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(chain.len(), 2);
    assert_eq!(chain[1]["continuation_of"], root.as_str());
    assert!(weft_cmd(fx.root())
        .args(["verify", "--all"])
        .output()
        .unwrap()
        .status
        .success());
}

mod interleavings {
    use super::*;
    use proptest::prelude::*;

    /// One level's script: spawn `k` children of the next level (waiting or not), wait for all,
    /// then end with text or an error, every turn after `delay_ms`.
    fn level(
        name: &str,
        next: Option<&str>,
        k: usize,
        wait: bool,
        fail: bool,
        delay_ms: u64,
    ) -> String {
        let mut s = format!("{name}:\n");
        if let Some(next) = next.filter(|_| k > 0) {
            let calls: Vec<String> = (0..k)
                .map(|_| format!("      - {{ name: spawn_thread, input: {{ directive: {next}, wait: {wait} }} }}"))
                .collect();
            s += &format!("  - delay: {delay_ms}ms\n    usage: {{ input_tokens: 30, output_tokens: 3 }}\n    tool_calls:\n{}\n", calls.join("\n"));
            s += &format!("  - delay: {delay_ms}ms\n    usage: {{ input_tokens: 40, output_tokens: 4 }}\n    tool_calls: [ {{ name: wait_threads, input: {{}} }} ]\n");
        }
        if fail {
            s += &format!("  - delay: {delay_ms}ms\n    error: {{ kind: invalid_request }}\n");
        } else {
            s += &format!("  - delay: {delay_ms}ms\n    usage: {{ input_tokens: 50, output_tokens: 5 }}\n    text: {name} done\n");
        }
        s
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(std::env::var("WEFT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12)))]

        /// Random spawns, completions, errors and cancels: afterwards every thread is terminal
        /// exactly once, every file verifies and the ledger invariant holds with nothing reserved.
        #[test]
        fn every_thread_ends_exactly_once(
            shape in prop::collection::vec((0usize..4, any::<bool>(), any::<bool>(), 0u64..30), 3),
            cancels in prop::collection::vec((0u64..120, 0usize..1000), 0..3),
            policy in prop_oneof![Just("continue"), Just("cancel_siblings"), Just("fail")],
        ) {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(async move {
                let names = ["l0", "l1", "l2"];
                let mut script = String::new();
                for (i, (k, wait, fail, delay)) in shape.iter().enumerate() {
                    script += &level(names[i], names.get(i + 1).copied(), *k, *wait, *fail && i > 0, *delay);
                }
                let front = format!("permissions: [\"thread.spawn.**\"]\nlimits: {{ spawns: 10, concurrency: 10 }}\non_child_error: {policy}");
                let dirs: Vec<(&str, String)> = names.iter().map(|n| (*n, directive(&front, "Work."))).collect();
                let dirs: Vec<(&str, &str)> = dirs.iter().map(|(n, d)| (*n, d.as_str())).collect();
                let fx = Fixture::new(&dirs, &script, "retries: 0\n");
                let rt = fx.runtime().await;
                let handle = rt.start("l0", Map::new(), LimitSet::default()).await.unwrap();
    let done = handle.wait();
                let mut done = Box::pin(done);
                let mut early = None;
                for (at_ms, pick) in cancels {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(at_ms)) => {}
                        r = &mut done => {
                            early = Some(r);
                            break;
                        }
                    }
                    let live: Vec<_> = fx.rows().into_iter().filter(|r| !r.status.is_terminal()).collect();
                    if let Some(r) = live.get(pick % live.len().max(1)) {
                        rt.cancel(&ThreadId::parse(&r.id).unwrap(), "random cancel");
                    }
                }
                let report = match early {
                    Some(r) => r.unwrap(),
                    None => tokio::time::timeout(Duration::from_secs(20), done).await.expect("the root ends").unwrap(),
                };
                assert!(report.status.is_terminal());
                let rows = fx.rows();
                for r in &rows {
                    assert!(r.status.is_terminal(), "{} left {}", r.id, r.status);
                    let finished = fx.events(&r.id).iter().filter(|e| e["type"] == "thread_finished").count();
                    assert_eq!(finished, 1, "{} finished {finished} times", r.id);
                    let doc = fx.doc(&r.id);
                    assert_eq!(doc.history.iter().filter(|t| t.status.is_terminal()).count(), 1, "{}", r.id);
                    assert_eq!(doc.status.as_str(), r.status, "registry and thread.json agree on {}", r.id);
                }
                let (violations, open) = rt.audit().await;
                assert!(violations.is_empty() && open == 0, "{violations:?} {open}");
                assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
                assert_eq!(report.spend_nanos.0, expected_spend(&fx), "the root's spend is every settled call");
            });
        }
    }
}

/// SPEC §7: when the grace runs out, the descendants still alive are finalized anyway, deepest
/// first. With a 1 ms grace nothing acknowledges in time, so every thread below the root is
/// killed and must still end terminal, verified, with its ledger account closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_whose_grace_runs_out_leaves_every_thread_terminal() {
    let fx = wide_tree("60s");
    std::fs::write(
        fx.root().join(".weft/config.yaml"),
        "pricing:\n  scripted: { input: 1.00, output: 4.00 }\ncancel_grace: 1ms\n",
    )
    .unwrap();
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", Map::new(), LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().clone();
    wait_until("111 running threads", || {
        fx.rows().iter().filter(|r| r.status == "running").count() == 111
    })
    .await;
    assert!(rt.cancel(&id, "test"));
    let report = handle.wait().await.unwrap();
    assert_eq!(report.status, Status::Cancelled);
    let rows = fx.rows();
    assert_eq!(rows.len(), 111);
    let open: Vec<_> = rows
        .iter()
        .filter(|r| !r.status.is_terminal())
        .map(|r| (&r.id, &r.status))
        .collect();
    assert!(open.is_empty(), "registry rows left open: {open:?}");
    for r in &rows {
        let doc = fx.doc(&r.id);
        assert!(
            doc.status.is_terminal(),
            "{} thread.json is {:?}",
            r.id,
            doc.status
        );
        let last = fx
            .events(&r.id)
            .into_iter()
            .rev()
            .find(|e| e["type"] != "checkpoint");
        assert_eq!(
            last.as_ref().map(|e| e["type"].clone()),
            Some(serde_json::json!("thread_finished")),
            "{}: {last:?}",
            r.id
        );
    }
    let bad = fx.verify_all();
    let lines: Vec<String> = bad
        .iter()
        .flat_map(|v| fx.events(&v.id))
        .map(|e| format!("{} {} {}", e["seq"], e["type"], e["ts"]))
        .collect();
    assert!(bad.is_empty(), "{bad:?}\n{}", lines.join("\n"));
    let (violations, open) = rt.audit().await;
    assert!(violations.is_empty() && open == 0, "{violations:?} {open}");
}

/// A process killed after a thread's terminal thread.json but before its registry commit leaves
/// a `running` row: recovery brings the row in line and never relabels the thread (nothing
/// leaves a terminal state) nor appends a second `thread_finished`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_never_relabels_a_thread_that_finished() {
    let fx = Fixture::new(
        &[("solo", &directive("", "Answer."))],
        "solo:\n  - text: the answer\n",
        "",
    );
    let (report, rt) = fx.run("solo", serde_json::json!({})).await;
    assert_eq!(report.status, Status::Completed);
    rt.shutdown();
    let id = report.thread_id.to_string();
    let db = rusqlite::Connection::open(fx.root().join(".weft/state/registry.db")).unwrap();
    // pid 4194305 is above Linux's pid_max: no process has it.
    db.execute(
        "UPDATE threads SET status='running', owner_pid=4194305 WHERE id=?1",
        [&id],
    )
    .unwrap();
    drop(db);
    let rt = fx.runtime().await;
    let row = fx.rows().into_iter().find(|r| r.id == id).unwrap();
    assert_eq!(row.status, "completed", "{row:?}");
    assert_eq!(fx.doc(&id).status, Status::Completed);
    let finished = fx
        .events(&id)
        .iter()
        .filter(|e| e["type"] == "thread_finished")
        .count();
    assert_eq!(finished, 1);
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
    rt.shutdown();
}

/// A program embedding the library is as alive as `weft`: recovery run by another process
/// (here `weft recover`, while this test binary runs a thread) leaves its threads alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_never_steals_a_thread_from_a_live_program_embedding_the_library() {
    let fx = Fixture::new(
        &[("solo", &directive("", "Answer."))],
        "solo:\n  - text: the answer\n    delay: 2s\n",
        "",
    );
    let rt = fx.runtime().await;
    let handle = rt
        .start("solo", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().to_string();
    wait_until("the thread running", || {
        fx.rows()
            .iter()
            .any(|r| r.id == id && r.status == "running")
    })
    .await;
    let o = weft_cmd(fx.root())
        .args(["recover", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let recovered: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert!(recovered.is_empty(), "stole a live thread: {recovered:?}");
    let report = handle.wait().await.unwrap();
    assert_eq!(report.status, Status::Completed);
    let row = fx.rows().into_iter().find(|r| r.id == id).unwrap();
    assert_eq!(row.status, "completed");
    assert_eq!(
        fx.events(&id)
            .iter()
            .filter(|e| e["type"] == "thread_finished")
            .count(),
        1
    );
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
}

/// Pids are reused (in a container every run may be pid 1): a row left running by a dead
/// process that had this process's pid is repaired, not taken for one of ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_left_by_a_dead_process_with_our_pid_is_repaired() {
    let fx = Fixture::new(
        &[("solo", &directive("", "Answer."))],
        "solo:\n  - text: the answer\n",
        "",
    );
    let (report, rt) = fx.run("solo", serde_json::json!({})).await;
    assert_eq!(report.status, Status::Completed);
    rt.shutdown();
    let id = report.thread_id.to_string();
    let db = rusqlite::Connection::open(fx.root().join(".weft/state/registry.db")).unwrap();
    db.execute(
        "UPDATE threads SET status='running', owner_pid=?2 WHERE id=?1",
        rusqlite::params![&id, std::process::id()],
    )
    .unwrap();
    drop(db);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let rt = fx.runtime().await;
    let row = fx.rows().into_iter().find(|r| r.id == id).unwrap();
    assert_eq!(row.status, "completed", "{row:?}");
    rt.shutdown();
}

/// A root that asks for 400 children at once and is cancelled while they start: the children
/// still waiting for a spawn slot are withdrawn, never started only to be cancelled; the cancel
/// ends everything quickly, with nothing reserved or running and every record verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_withdraws_the_children_still_waiting_to_start() {
    let perms =
        "permissions: [\"thread.spawn.**\"]\nlimits: { spawns: 400, concurrency: 400, spend: 5 }";
    let script = format!(
        "root:\n  - tool_calls:\n{}\n  - tool_calls: [ {{ name: wait_threads, input: {{}} }} ]\n  - text: root done\nleaf:\n  - text: leaf done\n    delay: 60s\n    usage: {{ input_tokens: 10, output_tokens: 5 }}\n",
        spawn_calls("leaf", 400)
    );
    let fx = Fixture::new(
        &[
            ("root", &directive(perms, "Root.")),
            ("leaf", &directive("", "Leaf.")),
        ],
        &script,
        "",
    );
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", Map::new(), LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().clone();
    let done = handle.wait();
    wait_until("a first child", || fx.rows_so_far().len() > 1).await;
    let started = Instant::now();
    assert!(rt.cancel(&id, "test"));
    let report = done.await.unwrap();
    let took = started.elapsed();
    assert_eq!(report.status, Status::Cancelled);
    let rows = fx.rows();
    assert!(
        rows.len() < 401,
        "all 400 children were started although their parent was cancelled"
    );
    assert!(rows.iter().all(|r| r.status == "cancelled"), "{rows:?}");
    let (violations, open) = rt.audit().await;
    assert!(
        violations.is_empty() && open == 0,
        "open reservations: {open}"
    );
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
    eprintln!(
        "{} of 400 children had started; cancel took {took:?}",
        rows.len() - 1
    );
    assert!(took < Duration::from_secs(3), "cancel took {took:?}");
}

/// A child whose start waits on a slow MCP server stops when its parent is cancelled: its
/// start gives up waiting at once and is undone (its row `cancelled`, no account left open),
/// and its parent ends without waiting for it. The server's start goes on for whoever else
/// waits on it. (Before: the start
/// waited out the server — up to its 60 s start timeout — and the child ran or failed after
/// its tree had ended.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_starting_on_a_slow_mcp_server_stops_at_its_parents_cancel() {
    let r = directive(
        "permissions: [\"thread.spawn.k\", \"mcp.stuck.*\"]",
        "Root.",
    );
    let k = directive("permissions: [\"mcp.stuck.*\"]", "Kid.");
    let script = "r:\n  - delay: 1s\n    tool_calls: [ { name: spawn_thread, input: { directive: k } } ]\n  - text: root done\nk:\n  - text: kid done\n";
    // Once the test has made the mark, a start of the server hangs (r's own start, before it,
    // fails at once).
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("hang");
    let config = crate::support::stuck_server(&mark);
    let fx = Fixture::new(&[("r", &r), ("k", &k)], script, &config);
    let rt = fx.runtime().await;
    let handle = rt
        .start("r", Map::new(), LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().clone();
    std::fs::write(&mark, "").unwrap();
    wait_until("k to be starting", || {
        fx.rows_so_far().iter().any(|r| r.directive == "k")
    })
    .await;
    let server_runs = || crate::support::server_runs(&mark);
    wait_until("k's server to be starting", server_runs).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    assert!(rt.cancel(&id, "test"));
    let report = tokio::time::timeout(Duration::from_secs(30), handle.wait())
        .await
        .expect("the tree ends")
        .unwrap();
    assert_eq!(report.status, Status::Cancelled);
    wait_until("k to end", || {
        fx.rows().iter().all(|r| r.status.is_terminal())
    })
    .await;
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "k ended {took:?} after the cancel"
    );
    let kid = fx.rows().into_iter().find(|r| r.directive == "k").unwrap();
    assert_eq!(kid.status, "cancelled", "{:?}", kid.error);
    let (violations, open) = rt.audit().await;
    assert!(violations.is_empty() && open == 0, "{violations:?} {open}");
    // Its spawn was undone (no records): `weft verify --all` and `--tree` still pass.
    crate::support::verify_cli_clean(fx.root());
    let tree = weft_cmd(fx.root())
        .args(["verify", "--tree", id.as_str()])
        .output()
        .unwrap();
    assert!(
        tree.status.success(),
        "{}",
        String::from_utf8_lossy(&tree.stdout)
    );
}

/// A root whose start waits on a slow MCP server stops at its own cancel (`Runtime::cancel`,
/// what `weft cancel`, the API and Ctrl-C use): the start gives up at once, is undone, and its
/// row ends `cancelled`. (Before: the cancel waited in the actor's mailbox behind the start,
/// up to the server's 60 s start timeout, and the thread then ran.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_starting_on_a_slow_mcp_server_stops_at_its_own_cancel() {
    let (fx, _marks, mark) = kid_on_a_stuck_server();
    let rt = fx.runtime().await;
    let start = rt.start("k", Map::new(), LimitSet::default());
    let server_runs = || crate::support::server_runs(&mark);
    let cancel = async {
        wait_until("k's server to be starting", server_runs).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let id = ThreadId::parse(&fx.id_of("k")).unwrap();
        assert!(rt.cancel(&id, "test"), "the cancel found k's start");
        Instant::now()
    };
    let (started, asked) = tokio::join!(start, cancel);
    let took = asked.elapsed();
    assert!(
        matches!(started, Err(weft::SpawnError::Withdrawn(_))),
        "{:?}",
        started.map(|h| h.id().to_string())
    );
    assert!(
        took < Duration::from_secs(5),
        "k's start ended {took:?} after the cancel"
    );
    let row = fx.rows().into_iter().next().unwrap();
    assert_eq!(row.status, "cancelled", "{:?}", row.error);
    let (violations, open) = rt.audit().await;
    assert!(violations.is_empty() && open == 0, "{violations:?} {open}");
    crate::support::verify_cli_clean(fx.root());
}

/// Ctrl-C in `weft run` while its root's start waits on a slow MCP server withdraws the start:
/// the process exits 130 at once and the row ends `cancelled`. (Before: the signal handler was
/// installed once the start had returned, so the default SIGINT killed the process and left the
/// row `created`, for a later recovery to end as `error`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_in_weft_run_withdraws_a_root_starting_on_a_slow_mcp_server() {
    let (fx, _marks, _mark, child) = weft_run_starting_on_a_stuck_server().await;
    let pid = child.id().to_string();
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    let out = crate::support::exits_within(child, 10, "Ctrl-C during the root's start");
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = fx.rows().into_iter().next().unwrap();
    assert_eq!(row.status, "cancelled", "{:?}", row.error);
    crate::support::verify_cli_clean(fx.root());
}

/// An MCP server's process dies with weft however weft dies: after `kill -9` of `weft run`
/// whose root waits on the server's start, nothing of the server runs on. (Before: the server
/// was started without a process group or a parent-death signal and ran on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_servers_process_dies_with_weft_at_kill_9() {
    let (_fx, _marks, mark, child) = weft_run_starting_on_a_stuck_server().await;
    let pid = child.id().to_string();
    let server_runs = || crate::support::server_runs(&mark);
    std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap();
    let _ = crate::support::exits_within(child, 10, "kill -9");
    wait_until("the server's processes to end with weft", || !server_runs()).await;
}

/// `weft run k` whose root's start waits on the stuck MCP server (its mark in the temporary
/// folder returned), once the server runs.
async fn weft_run_starting_on_a_stuck_server() -> (
    Fixture,
    tempfile::TempDir,
    std::path::PathBuf,
    std::process::Child,
) {
    let (fx, marks, mark) = kid_on_a_stuck_server();
    let child = crate::support::spawn_run(&fx, "k");
    wait_until("k's server to be starting", || {
        crate::support::server_runs(&mark)
    })
    .await;
    (fx, marks, mark, child)
}

/// A project whose directive `k` may use the stuck MCP server, its start hanging while the
/// returned mark (in the returned folder) exists.
fn kid_on_a_stuck_server() -> (Fixture, tempfile::TempDir, std::path::PathBuf) {
    let k = directive("permissions: [\"mcp.stuck.*\"]", "Kid.");
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("hang");
    std::fs::write(&mark, "").unwrap();
    let config = crate::support::stuck_server(&mark);
    let fx = Fixture::new(&[("k", &k)], "k:\n  - text: kid done\n", &config);
    (fx, marks, mark)
}
