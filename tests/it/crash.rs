//! Crash anywhere: a failpoint (`WEFT_FAILPOINT=<step>:<n>`) aborts `weft run` at the n-th time
//! any thread of a tree reaches one step of spawn, turn, tool, settlement or finalization — as a
//! `kill -9` would, no destructor run, nothing flushed. After each crash the next start
//! (`weft recover`) must leave: no `created`/`running` row, no open reservation or account,
//! every account balanced, every thread.json verifying and agreeing with its row, and every
//! status that was already terminal unchanged.

use crate::support::{directive, weft_home, Backend, Fixture};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// root → 2 mids (not waited, then `wait_threads`) → 2 leaves each (waited): 7 threads, each
/// step met 7 to 11 times.
fn tree_on(backend: Backend) -> Option<Fixture> {
    let perms =
        "permissions: [\"thread.spawn.**\"]\nlimits: { spawns: 5, concurrency: 5, spend: 5 }";
    let script = r#"
root:
  - usage: { input_tokens: 20, output_tokens: 5 }
    tool_calls:
      - { name: spawn_thread, input: { directive: mid, wait: false } }
      - { name: spawn_thread, input: { directive: mid, wait: false } }
  - usage: { input_tokens: 30, output_tokens: 5 }
    tool_calls: [ { name: wait_threads, input: {} } ]
  - text: root done
    usage: { input_tokens: 40, output_tokens: 5 }
mid:
  - usage: { input_tokens: 20, output_tokens: 5 }
    tool_calls:
      - { name: spawn_thread, input: { directive: leaf } }
      - { name: spawn_thread, input: { directive: leaf } }
  - text: mid done
    usage: { input_tokens: 30, output_tokens: 5 }
leaf:
  - text: leaf done
    usage: { input_tokens: 10, output_tokens: 5 }
"#;
    Fixture::on(
        backend,
        &[
            ("root", &directive(perms, "Root.")),
            ("mid", &directive(perms, "Mid.")),
            ("leaf", &directive("", "Leaf.")),
        ],
        script,
        "",
    )
}

fn weft(project: &Path, args: &[&str], failpoint: Option<&str>) -> std::process::Output {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(r#"ulimit -c 0; exec "$@""#)
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .arg("--project")
        .arg(project)
        .env("WEFT_HOME", weft_home())
        .env_remove("WEFT_FAILPOINT");
    if let Some(f) = failpoint {
        c.env("WEFT_FAILPOINT", f);
    }
    c.output().unwrap()
}

/// Registry rows: id → status.
fn row_statuses(fx: &Fixture) -> BTreeMap<String, String> {
    fx.query("registry.db", "SELECT id, status FROM threads")
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect()
}

/// thread.json statuses as written (read, not verified: a torn one reads as absent).
fn doc_statuses(fx: &Fixture) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let records = fx.records();
    for id in records.thread_ids().unwrap_or_default() {
        let doc: Option<Value> = records
            .doc(&id)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(status) = doc.as_ref().and_then(|d| d["status"].as_str()) {
            out.insert(id.to_string(), status.to_string());
        }
    }
    out
}

fn terminal(status: &str) -> bool {
    !matches!(status, "created" | "running")
}

/// One trial; returns whether the failpoint fired. Panics naming the trial on a broken promise.
fn trial(backend: Backend, step: &str, n: u32) -> bool {
    let fx = tree_on(backend).unwrap();
    let p = fx.root();
    let script = p.join("script.yaml");
    let fp = format!("{step}:{n}");
    let run = weft(
        p,
        &[
            "run",
            "root",
            "--json",
            "--script",
            script.to_str().unwrap(),
        ],
        Some(&fp),
    );
    let crashed = String::from_utf8_lossy(&run.stderr).contains("failpoint");
    assert!(
        crashed || run.status.success(),
        "{fp}: the run neither crashed nor succeeded: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let rows_before = row_statuses(&fx);
    let docs_before = doc_statuses(&fx);
    recover(p, &fp);
    let rows = row_statuses(&fx);
    let docs = doc_statuses(&fx);
    for (id, status) in &rows {
        assert!(terminal(status), "{fp}: {id} left {status} after recovery");
        assert_eq!(
            docs.get(id),
            Some(status),
            "{fp}: {id}'s thread.json disagrees with its row"
        );
    }
    for (id, before) in docs_before.iter().filter(|(_, s)| terminal(s)) {
        assert_eq!(
            docs.get(id),
            Some(before),
            "{fp}: {id} was {before} in its thread.json and recovery changed it"
        );
    }
    for (id, before) in rows_before.iter().filter(|(_, s)| terminal(s)) {
        assert_eq!(
            rows.get(id),
            Some(before),
            "{fp}: {id} was {before} in the registry and recovery changed it"
        );
    }
    let verify = weft(p, &["verify", "--all"], None);
    assert!(
        verify.status.success(),
        "{fp}: {}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let counts = fx.query(
        "ledger.db",
        "SELECT (SELECT COUNT(*) FROM reservations), (SELECT COUNT(*) FROM accounts WHERE closed=0),
                (SELECT COUNT(*) FROM accounts WHERE inflight<>0 OR guaranteed<>0 OR pool_left<>0 OR spent>max)",
    );
    assert_eq!(
        counts,
        [["0", "0", "0"]],
        "{fp}: open reservations, open accounts, unbalanced accounts"
    );
    crashed
}

#[test]
fn a_crash_at_any_step_is_repaired_by_the_next_start() {
    crash_anywhere(Backend::Sqlite);
}

/// The same on a Postgres database: its registry, ledger and store tables.
#[test]
fn a_crash_at_any_step_is_repaired_by_the_next_start_on_postgres() {
    if crate::pg::server().is_none() {
        return;
    }
    crash_anywhere(Backend::Postgres);
}

fn crash_anywhere(backend: Backend) {
    let steps = weft::internals::FAILPOINTS;
    let trials: Vec<(&str, u32)> = steps
        .iter()
        .flat_map(|s| (1..=8).map(move |n| (*s, n)))
        .collect();
    assert!(trials.len() >= 100);
    let queue = std::sync::Mutex::new(trials.clone());
    let fired = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| loop {
                let Some((step, n)) = queue.lock().unwrap().pop() else {
                    return;
                };
                if trial(backend, step, n) {
                    fired.lock().unwrap().push(step);
                }
            });
        }
    });
    let fired = fired.into_inner().unwrap();
    eprintln!("FIRED {} of {}", fired.len(), trials.len());
    for step in steps {
        assert!(
            fired.contains(step),
            "failpoint {step} never fired: the tree no longer reaches it"
        );
    }
    assert!(
        fired.len() >= 90,
        "only {} of {} trials crashed",
        fired.len(),
        trials.len()
    );
}

/// A transcript append that fails (a full disk, a dying drive: `transcript.append` makes the
/// n-th append of the process return an I/O error) ends the thread `error`, saying which line
/// was lost, instead of going on with a signed record that silently misses a line.
#[test]
fn a_lost_transcript_line_fails_the_thread() {
    let fx = solo();
    let p = fx.root();
    // Appends of the run: 1 `thread_started` (spawn), 2 `status`, 3 the prompt's `message`.
    let run = run_solo(p, "transcript.append:3");
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        !run.status.success(),
        "the run succeeded with a lost line: {out}"
    );
    let id = fx.id_of("solo");
    let doc = fx.doc(&id);
    assert_eq!(doc.status, weft::Status::Error, "{out}");
    let error = doc.error.unwrap_or_default();
    assert!(
        error.contains("transcript could not be written") && error.contains("`message` line"),
        "{error}"
    );
    let verify = weft(p, &["verify", "--all"], None);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let kinds: Vec<String> = fx
        .events(&id)
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default().to_string())
        .filter(|k| k != "checkpoint")
        .collect();
    assert!(
        !kinds.contains(&"assistant_text".to_string()),
        "the thread went on: {kinds:?}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("thread_finished"),
        "{kinds:?}"
    );
}

/// Open ledger accounts and (id, status, error) of every registry row, read from the databases.
fn leftovers(project: &Path) -> (i64, Vec<(String, String, String)>) {
    let ledger = rusqlite::Connection::open(project.join(".weft/state/ledger.db")).unwrap();
    let open: i64 = ledger
        .query_row("SELECT COUNT(*) FROM accounts WHERE closed=0", [], |r| {
            r.get(0)
        })
        .unwrap();
    let reg = rusqlite::Connection::open(project.join(".weft/state/registry.db")).unwrap();
    let mut stmt = reg
        .prepare("SELECT id, status, COALESCE(error, '') FROM threads")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    (open, rows)
}

/// A spawn that fails after its account and row exist (here its folder cannot be written:
/// `spawn.files` makes that stage fail) undoes both before `weft run` exits: no open account,
/// no `created` row, no folder — for a root (the run fails) and for a child (its parent gets
/// the refusal and finishes).
#[test]
fn a_spawn_that_fails_after_registration_leaves_nothing_behind() {
    let script = "root:\n  - tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]\n    usage: { input_tokens: 10, output_tokens: 5 }\n  - text: root done\n    usage: { input_tokens: 10, output_tokens: 5 }\nleaf:\n  - text: leaf done\n    usage: { input_tokens: 10, output_tokens: 5 }\n";
    for (n, what) in [(1, "root"), (2, "child")] {
        let fx = Fixture::new(
            &[
                (
                    "root",
                    &directive("permissions: [thread.spawn.leaf]", "Root."),
                ),
                ("leaf", &directive("", "Leaf.")),
            ],
            script,
            "",
        );
        let p = fx.root();
        let script = p.join("script.yaml");
        let args = [
            "run",
            "root",
            "--json",
            "--script",
            script.to_str().unwrap(),
        ];
        let run = weft(p, &args, Some(&format!("spawn.files:{n}")));
        let (open, rows) = leftovers(p);
        assert_eq!(open, 0, "{what}: accounts left open: {rows:?}");
        assert!(
            rows.iter()
                .all(|(_, s, _)| s != "created" && s != "running"),
            "{what}: {rows:?}"
        );
        let failed: Vec<_> = rows
            .iter()
            .filter(|(_, _, e)| e.contains("failpoint spawn.files"))
            .collect();
        assert_eq!(failed.len(), 1, "{what}: {rows:?}");
        let folder = p.join(".weft/threads").join(&failed[0].0);
        assert!(!folder.exists(), "{what}: {} left behind", folder.display());
        match what {
            "root" => assert!(!run.status.success(), "the root's run succeeded"),
            _ => assert!(
                run.status.success() && rows.iter().any(|(_, s, _)| s == "completed"),
                "the parent did not finish: {rows:?} {}",
                String::from_utf8_lossy(&run.stderr)
            ),
        }
    }
}

/// A crash never makes a call free (#22 finding 4): a process killed after a call's
/// reservation, before anything of the call was recorded, leaves a call the provider may have
/// billed; recovery charges it at its reservation (the upper bound), records it as
/// `unknown, charged at bound`, and `weft show` says so.
#[test]
fn recovery_charges_an_unrecorded_call_at_its_bound() {
    let fx = solo();
    let p = fx.root();
    let run = run_solo(p, "turn.reserved:1");
    assert!(String::from_utf8_lossy(&run.stderr).contains("failpoint"));
    let id = fx.id_of("solo");
    // The reservation was answered once written ahead to the journal, not to ledger.db.
    let ledger = rusqlite::Connection::open(p.join(".weft/state/ledger.db")).unwrap();
    let stored: i64 = ledger
        .query_row("SELECT COUNT(*) FROM reservations", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        stored, 0,
        "the reservation is in the dead process's journal only"
    );
    assert_eq!(
        journals(p),
        1,
        "the dead process's journal is left for the next opener"
    );
    recover(p, "recovery");
    assert_eq!(
        journals(p),
        0,
        "recovery folds a dead journal and removes it"
    );
    let spent: i64 = ledger
        .query_row("SELECT spent FROM accounts WHERE id=?1", [&id], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(spent > 0, "the interrupted call was settled at {spent}");
    let charged: Vec<Value> = fx
        .events(&id)
        .into_iter()
        .filter(|e| e["type"] == "llm_call")
        .collect();
    assert_eq!(charged.len(), 1, "{charged:?}");
    assert_eq!(
        charged[0]["cost_nanos"].as_i64(),
        Some(spent),
        "{charged:?}"
    );
    assert!(
        charged[0]["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("charged at bound"),
        "{charged:?}"
    );
    let show = weft(p, &["show", &id], None);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains("charged") && text.contains("unknown cost"),
        "{text}"
    );
}

/// One thread answering at once.
/// The runtimes' journals left in project `p` (`.weft/state/ledger.journal/`).
fn journals(p: &Path) -> usize {
    std::fs::read_dir(p.join(".weft/state/ledger.journal")).map_or(0, |d| d.count())
}

/// A runtime that was already open when another process died mid-call takes the dead process's
/// tree over (as it does to adopt, resume or recover a thread) and finds the reservation the
/// dead process had only journaled: its call is charged at its bound, never free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_open_before_a_crash_reads_the_dead_journal_when_it_takes_the_tree() {
    use weft::internals::LedgerMsg;
    let fx = solo();
    let p = fx.root();
    let rt = fx.runtime().await;
    let run = run_solo(p, "turn.reserved:1");
    assert!(String::from_utf8_lossy(&run.stderr).contains("failpoint"));
    assert_eq!(journals(p), 1);
    let id = weft::ThreadId::parse(&fx.id_of("solo")).unwrap();
    let (_, ledger) = weft::internals::actors(&rt);
    ractor::call!(ledger, |reply| LedgerMsg::TakeOver {
        id: id.clone(),
        reply
    })
    .unwrap()
    .expect("the dead process's tree is taken over");
    let open = ractor::call!(ledger, |reply| LedgerMsg::OpenOf {
        id: id.clone(),
        reply
    })
    .unwrap();
    assert_eq!(
        open.len(),
        1,
        "the journaled reservation is read with the tree: {open:?}"
    );
    assert!(open[0].1 .0 > 0, "{open:?}");
    assert_eq!(journals(p), 0, "folded into ledger.db, then removed");
}

/// The same for a child: a child's account is opened in its runtime's journal, so a dead
/// process's child may exist in its journal only. Taking the child's tree over folds the dead
/// journals before it looks the tree up (it found no account, took nothing, and recovery
/// closed the child's account later without charging its reserved call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_processs_journaled_child_is_found_when_its_tree_is_taken() {
    use weft::internals::LedgerMsg;
    let root = directive("permissions: [ \"thread.spawn.kid\" ]", "Spawn.");
    let script = "root:\n  - tool_calls: [ { name: spawn_thread, input: { directive: kid } } ]\n  - text: done\nkid:\n  - text: kid done\n    usage: { input_tokens: 10, output_tokens: 5 }\n";
    let fx = Fixture::new(
        &[("root", &root), ("kid", &directive("", "Kid."))],
        script,
        "",
    );
    let p = fx.root();
    let rt = fx.runtime().await;
    let path = p.join("script.yaml");
    let args = ["run", "root", "--json", "--script", path.to_str().unwrap()];
    // The root's call is the first reservation, the kid's the second.
    let run = weft(p, &args, Some("turn.reserved:2"));
    assert!(String::from_utf8_lossy(&run.stderr).contains("failpoint"));
    let kid = weft::ThreadId::parse(&fx.id_of("kid")).unwrap();
    let stored: i64 = rusqlite::Connection::open(p.join(".weft/state/ledger.db"))
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM accounts WHERE id=?1",
            [kid.as_str()],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored, 0, "the kid's account is in the dead journal only");
    let (_, ledger) = weft::internals::actors(&rt);
    ractor::call!(ledger, |reply| LedgerMsg::TakeOver {
        id: kid.clone(),
        reply
    })
    .unwrap()
    .expect("the dead process's tree is taken over");
    let open = ractor::call!(ledger, |reply| LedgerMsg::OpenOf {
        id: kid.clone(),
        reply
    })
    .unwrap();
    assert_eq!(open.len(), 1, "the kid's journaled reservation: {open:?}");
    assert_eq!(journals(p), 0, "folded into ledger.db, then removed");
}

/// A journal record that cannot be written (cut halfway, as a full disk leaves it) is cut off
/// and its batch committed to ledger.db instead: the run goes on, its call is settled and its
/// account closed, and the stop folds and removes the journal.
#[test]
fn a_journal_write_that_fails_falls_back_to_a_commit() {
    let fx = solo();
    let p = fx.root();
    let run = run_solo(p, "ledger.journal:1");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        stderr.contains("failpoint ledger.journal; this batch commits to ledger.db instead"),
        "the journal write failed and its batch was committed: {stderr}"
    );
    let id = fx.id_of("solo");
    let ledger = rusqlite::Connection::open(p.join(".weft/state/ledger.db")).unwrap();
    let (spent, closed, open): (i64, bool, i64) = ledger
        .query_row(
            "SELECT spent, closed, (SELECT COUNT(*) FROM reservations) FROM accounts WHERE id=?1",
            [&id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert!(spent > 0 && closed && open == 0, "{spent} {closed} {open}");
    assert_eq!(
        journals(p),
        0,
        "weft run's stop folds and removes its journal"
    );
}

/// Under `durability: strict` the journal is fsynced record by record (and its folder when it
/// is made): a call reserved there and killed is found by recovery and charged at its bound.
#[test]
fn under_strict_durability_a_journaled_reservation_survives_the_crash() {
    let fx = Fixture::new(
        &[("solo", &directive("", "Answer."))],
        "solo:\n  - text: all done\n    usage: { input_tokens: 10, output_tokens: 5 }\n",
        "durability: strict\n",
    );
    let p = fx.root();
    let run = run_solo(p, "turn.reserved:1");
    assert!(String::from_utf8_lossy(&run.stderr).contains("failpoint"));
    assert_eq!(journals(p), 1, "the reservation is journaled");
    recover(p, "strict recovery");
    let id = fx.id_of("solo");
    let ledger = rusqlite::Connection::open(p.join(".weft/state/ledger.db")).unwrap();
    let (spent, closed): (i64, bool) = ledger
        .query_row(
            "SELECT spent, closed FROM accounts WHERE id=?1",
            [&id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(
        spent > 0 && closed,
        "charged at bound: {spent}, closed: {closed}"
    );
    assert_eq!(journals(p), 0);
}

fn solo() -> Fixture {
    Fixture::new(
        &[("solo", &directive("", "Answer."))],
        "solo:\n  - text: all done\n    usage: { input_tokens: 10, output_tokens: 5 }\n",
        "",
    )
}

/// `weft recover` in `p`, which must succeed (`what` names the trial in the failure).
fn recover(p: &Path, what: &str) {
    let rec = weft(p, &["recover", "--json"], None);
    assert!(
        rec.status.success(),
        "{what}: recovery failed: {}",
        String::from_utf8_lossy(&rec.stderr)
    );
}

/// `weft run solo` with `solo()`'s script, the failpoint armed.
fn run_solo(p: &Path, failpoint: &str) -> std::process::Output {
    let script = p.join("script.yaml");
    let args = [
        "run",
        "solo",
        "--json",
        "--script",
        script.to_str().unwrap(),
    ];
    weft(p, &args, Some(failpoint))
}

/// A root whose process died after it signed its final thread.json, before its line reached
/// the project's anchor log, is anchored by recovery: once the log has begun, an unanchored
/// finished root is what a rollback looks like, and `weft verify --all` would say so.
#[test]
fn a_root_that_died_before_its_anchor_line_is_anchored_by_recovery() {
    let fx = solo();
    let p = fx.root();
    let first = run_solo(p, "no.such.step:1");
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let run = run_solo(p, "finalize.signed:1");
    assert!(String::from_utf8_lossy(&run.stderr).contains("failpoint"));
    recover(p, "recovery");
    let log = std::fs::read_to_string(p.join(".weft/state/anchors.jsonl")).unwrap();
    assert_eq!(log.lines().count(), 2, "both roots anchored:\n{log}");
    let verify = weft(p, &["verify", "--all"], None);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
}
