//! Upkeep (issue 13): `weft gc` removes finished trees past their time, whole, and never a
//! running one; `weft doctor` reports health and every planted inconsistency between registry,
//! files and ledger, `--fix` repairs them, and a broken database is reported as broken — never
//! as every thread being stale.

use crate::support::{directive, weft_cmd, Fixture};
use serde_json::{json, Value};
use std::collections::BTreeSet;

const SCRIPT: &str = "chat:\n  - text: Oslo.\n    usage: { input_tokens: 1200, output_tokens: 10 }\nparent:\n  - tool_calls: [ { name: spawn_thread, input: { directive: chat } } ]\n  - text: done\nslow:\n  - text: late\n    delay: 30s\n";

fn fixture() -> Fixture {
    let chat = directive("limits: { turns: 1 }", "Capital of Norway?");
    let parent = directive("permissions: [ \"thread.spawn.chat\" ]", "Ask a child.");
    let slow = directive("limits: { turns: 1 }", "Wait.");
    Fixture::new(
        &[("chat", &chat), ("parent", &parent), ("slow", &slow)],
        SCRIPT,
        "",
    )
}

fn weft(fx: &Fixture, args: &[&str]) -> (i32, Value) {
    let out = weft_cmd(fx.root())
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "weft {args:?}: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

fn run(fx: &Fixture, directive: &str) -> String {
    let script = fx.root().join("script.yaml");
    let (code, v) = weft(
        fx,
        &["run", directive, "--script", script.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{v}");
    v["thread_id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_finished_trees_whole_and_never_a_running_one() {
    let fx = fixture();
    let tree = run(&fx, "parent");
    let single = run(&fx, "chat");
    let rt = fx.runtime().await;
    let live = rt
        .start("slow", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    let live_id = live.id().to_string();
    while fx
        .rows()
        .iter()
        .all(|r| r.id != live_id || r.status != "running")
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (_, young) = weft(&fx, &["gc", "--older-than", "1h"]);
    assert_eq!(young["threads"], 0, "nothing is an hour old: {young}");
    let (_, errors) = weft(&fx, &["gc", "--older-than", "0s", "--status", "error"]);
    assert_eq!(errors["threads"], 0, "no tree ended in error: {errors}");
    let (_, dry) = weft(&fx, &["gc", "--older-than", "0s", "--dry-run"]);
    assert_eq!(dry["threads"], 3, "{dry}");
    assert_eq!(fx.rows().len(), 4, "a dry run removes nothing");
    let (code, done) = weft(&fx, &["gc", "--older-than", "0s"]);
    assert_eq!(code, 0);
    let roots: BTreeSet<&str> = done["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(
        roots,
        BTreeSet::from([tree.as_str(), single.as_str()]),
        "{done}"
    );
    assert_eq!(done["threads"], 3, "the child went with its tree");
    assert!(done["databases"].is_array(), "VACUUM ran: {done}");
    let left: Vec<String> = fx.rows().into_iter().map(|r| r.id.to_string()).collect();
    assert_eq!(
        left,
        std::slice::from_ref(&live_id),
        "the running thread stays"
    );
    let folders = std::fs::read_dir(fx.root().join(".weft/threads"))
        .unwrap()
        .count();
    assert_eq!(folders, 1);
    let (_, hits) = weft(&fx, &["search", "Oslo"]);
    assert_eq!(hits, json!([]), "their index entries went too");
    rt.cancel(live.id(), "test over");
    live.wait().await.unwrap();
    rt.shutdown();
    let bad = weft_cmd(fx.root())
        .args(["gc", "--older-than", "soon"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

fn sql(path: &std::path::Path, statement: &str) {
    let db = rusqlite::Connection::open(path).unwrap();
    db.execute_batch(statement).unwrap();
}

#[test]
fn doctor_finds_planted_inconsistencies_and_fixes_them() {
    let fx = fixture();
    let [a, b, c, d, e] = [0; 5].map(|_| run(&fx, "chat"));
    let state = fx.root().join(".weft/state");
    let (code, clean) = weft(&fx, &["doctor"]);
    assert_eq!((code, clean["problems"].clone()), (0, json!([])), "{clean}");
    let h = &clean["health"];
    assert_eq!(
        (h["threads"].as_u64(), h["active"].as_u64()),
        (Some(5), Some(0)),
        "{h}"
    );
    assert!(h["context_max_tokens"].as_u64().unwrap() >= 1200, "{h}");
    assert!(
        h["transcript_lines"].as_u64().unwrap() > 8
            && h["databases"]["registry.db"].as_u64().unwrap() > 0
    );

    // Plant one of each.
    std::fs::remove_dir_all(fx.root().join(".weft/threads").join(&a)).unwrap();
    sql(
        &state.join("registry.db"),
        &format!("DELETE FROM threads WHERE id='{b}'"),
    );
    let junk = fx.root().join(".weft/threads/junk-1-00000000");
    std::fs::create_dir_all(&junk).unwrap();
    std::fs::write(junk.join("thread.json"), "{ not json").unwrap();
    sql(
        &state.join("registry.db"),
        &format!("UPDATE threads SET status='running', owner_pid=999999 WHERE id='{c}'"),
    );
    sql(
        &state.join("ledger.db"),
        &format!("UPDATE accounts SET closed=0 WHERE id='{d}'"),
    );
    // A reservation left open (as a process killed mid-call leaves one), on a finished thread.
    let body = json!({ "id": 999, "chain": [e], "amount": 5000, "edges": [] });
    sql(
        &state.join("ledger.db"),
        &format!("UPDATE accounts SET closed=0, inflight=5000 WHERE id='{e}'; INSERT INTO reservations(id, thread, body) VALUES(999, '{e}', '{body}')"),
    );

    let (code, sick) = weft(&fx, &["doctor"]);
    assert_eq!(code, 1, "{sick}");
    let found: BTreeSet<(String, String)> = sick["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["kind"].as_str().unwrap().to_string(),
                p["thread"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("row_without_folder", a.as_str()),
        ("folder_without_row", b.as_str()),
        ("folder_without_row", "junk-1-00000000"),
        ("status_mismatch", c.as_str()),
        ("open_account", d.as_str()),
        ("open_reservations", e.as_str()),
    ]
    .into_iter()
    .map(|(k, t)| (k.to_string(), t.to_string()))
    .collect();
    assert_eq!(found, expected, "{sick}");

    let (code, fixed) = weft(&fx, &["doctor", "--fix"]);
    assert_eq!(code, 0, "{fixed}");
    assert!(
        fixed["problems"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| !p["fixed"].as_str().unwrap().starts_with("not fixed")),
        "{fixed}"
    );
    assert!(
        fx.root()
            .join(".weft/lost+found/junk-1-00000000/thread.json")
            .exists(),
        "set aside, not deleted"
    );
    let (code, well) = weft(&fx, &["doctor"]);
    assert_eq!((code, well["problems"].clone()), (0, json!([])), "{well}");
    let rows = fx.rows();
    assert!(
        rows.iter().any(|r| r.id == b && r.status == "completed"),
        "re-registered from its thread.json"
    );
    assert!(rows.iter().all(|r| r.id != a));
    assert!(rows.iter().any(|r| r.id == c && r.status == "completed"));
    assert!(fx.verify_all().is_empty());
    assert_eq!(
        open_in_ledger(&state, &e),
        (0, 0),
        "reservation released, account closed"
    );
    assert_eq!(open_in_ledger(&state, &d), (0, 0));
}

#[test]
fn a_broken_registry_is_reported_as_broken_not_as_stale_threads() {
    let fx = fixture();
    run(&fx, "chat");
    run(&fx, "chat");
    let reg = fx.root().join(".weft/state/registry.db");
    let _ = std::fs::remove_file(reg.with_extension("db-wal"));
    let _ = std::fs::remove_file(reg.with_extension("db-shm"));
    std::fs::write(&reg, vec![0x5a; 8192]).unwrap();
    let (code, up) = weft(&fx, &["doctor"]);
    assert_eq!(code, 1);
    assert!(
        up["broken"][0].as_str().unwrap().contains("registry.db"),
        "{up}"
    );
    assert_eq!(up["problems"], json!([]), "no thread is called stale: {up}");
    assert!(up["health"].is_null());
    let human = weft_cmd(fx.root()).arg("doctor").output().unwrap();
    assert!(String::from_utf8_lossy(&human.stdout).contains("BROKEN"));
}

/// After `doctor --fix`, the planted reservation is released and its account closed in
/// ledger.db itself (checked from the file, not from what doctor says).
fn open_in_ledger(state: &std::path::Path, id: &str) -> (i64, i64) {
    let db = rusqlite::Connection::open(state.join("ledger.db")).unwrap();
    let res: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM reservations WHERE thread=?1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    let open: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM accounts WHERE id=?1 AND closed=0",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    (res, open)
}

/// A registry row weft never wrote (here a status it does not know) hides no other thread from
/// the lists, and `weft doctor` names it — not as a folder without a row for `--fix` to
/// register again over it.
#[test]
fn a_damaged_row_is_named_by_doctor_and_hides_no_other_thread() {
    let fx = fixture();
    let [a, b] = [0; 2].map(|_| run(&fx, "chat"));
    let state = fx.root().join(".weft/state");
    sql(
        &state.join("registry.db"),
        &format!("UPDATE threads SET status='exploded' WHERE id='{a}'"),
    );
    let (code, listed) = weft(&fx, &["threads"]);
    let ids: Vec<&str> = listed
        .as_array()
        .map(|l| l.iter().filter_map(|r| r["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!((code, ids), (0, vec![b.as_str()]), "{listed}");
    let (_, up) = weft(&fx, &["doctor"]);
    let problems = up["problems"].as_array().cloned().unwrap_or_default();
    let kinds: Vec<(&str, &str)> = problems
        .iter()
        .map(|p| {
            (
                p["kind"].as_str().unwrap_or(""),
                p["thread"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(kinds, vec![("damaged_row", a.as_str())], "{up}");
    assert!(
        problems[0]["detail"]
            .as_str()
            .unwrap_or("")
            .contains("exploded"),
        "{up}"
    );
}

/// `weft doctor` beside a live process whose tree is running: a child that has ended there,
/// whose account reached ledger.db open (a fold while it ran) and closed in the runtime's
/// journal, is not reported. The live holder's book is the ledger of its tree; its journal
/// reaches ledger.db when the tree finishes (it was reported as an open account, and `--fix`
/// could only be refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_nothing_of_a_tree_a_live_process_runs() {
    let root = directive("permissions: [ \"thread.spawn.kid\" ]", "Spawn.");
    let kid = directive("limits: { turns: 1 }", "Kid.");
    let other = directive("limits: { turns: 1 }", "Other.");
    let script = "root:\n  - tool_calls: [ { name: spawn_thread, input: { directive: kid } } ]\n  - tool_calls: [ { name: wait_threads, input: {} } ]\n  - text: done\n    delay: 3s\nkid:\n  - text: ok\n    delay: 700ms\nother:\n  - text: x\n";
    let fx = Fixture::new(
        &[("root", &root), ("kid", &kid), ("other", &other)],
        script,
        "",
    );
    let rt = fx.runtime().await;
    let running = rt
        .start("root", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    let status_of = |d: &str| {
        fx.rows_so_far()
            .into_iter()
            .find(|r| r.directive == d)
            .map(|r| r.status)
    };
    crate::support::wait_until("the kid runs", || {
        status_of("kid") == Some(weft::Status::Running)
    })
    .await;
    // Another tree's start commits, and folds the journal: the kid's account is stored open.
    let report = rt
        .run("other", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(report.status, weft::Status::Completed);
    let kid = fx.id_of("kid");
    let state = fx.root().join(".weft/state");
    assert_eq!(
        open_in_ledger(&state, &kid).1,
        1,
        "the kid's account is stored open"
    );
    crate::support::wait_until("the kid has ended", || {
        status_of("kid").is_some_and(|s| s.is_terminal())
    })
    .await;
    assert_eq!(status_of("root"), Some(weft::Status::Running));
    let (_, up) = weft(&fx, &["doctor"]);
    assert_eq!(up["problems"], json!([]), "{up}");
    let report = running.wait().await.unwrap();
    assert_eq!(report.status, weft::Status::Completed);
    assert_eq!(
        open_in_ledger(&state, &kid),
        (0, 0),
        "stored once the tree finished"
    );
    let (_, up) = weft(&fx, &["doctor"]);
    assert_eq!(up["problems"], json!([]), "{up}");
}
