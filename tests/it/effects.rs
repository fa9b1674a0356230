//! Scheduled effects (issue 13): a thread schedules a directive and a tool and ends; the `weft
//! run` process exits before they are due; a later process (a restart) runs each exactly once
//! — the directive as a deferred child of the scheduler (its budget set aside from the tree when
//! it was scheduled, #22), the tool in the scheduler's
//! file area. Cancel, capabilities, and an effect orphaned by a dead process.

use crate::support::{directive, weft_cmd, Fixture};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const SCRIPT: &str = r#"planner:
  - tool_calls:
      - { name: schedule, input: { directive: reminder, inputs: { note: "water the plants" }, limits: { spend: 0.005 }, delay: "1s" } }
      - { name: schedule, input: { tool: stamp, inputs: { word: later }, delay: 1 } }
      - { name: schedule, input: { directive: reminder, limits: { spend: 0.004 }, delay: "1h" } }
      - { name: schedule, input: { directive: reminder, delay: "1h" } }
  - tool_calls: [ { name: scheduled_list, input: {} } ]
  - text: planned
reminder:
  - text: reminded
greedy:
  - tool_calls:
      - { name: schedule, input: { directive: planner, delay: "1s" } }
      - { name: schedule, input: { tool: stamp, delay: "40d" } }
  - text: refused
"#;

fn fixture() -> Fixture {
    let planner = directive(
        "limits: { spend: 0.02 }\npermissions: [ schedule, \"thread.spawn.reminder\", tool.stamp ]",
        "Plan.",
    );
    let reminder = directive(
        "limits: { spend: 5.00 }\ninputs:\n  note: { type: string }",
        "Remind me: {input:note?}",
    );
    let greedy = directive("permissions: [ schedule, tool.stamp ]", "Greedy.");
    let fx = Fixture::new(
        &[
            ("planner", &planner),
            ("reminder", &reminder),
            ("greedy", &greedy),
        ],
        SCRIPT,
        "",
    );
    std::fs::create_dir_all(fx.root().join("tools")).unwrap();
    std::fs::write(
        fx.root().join("tools/stamp.yaml"),
        "name: stamp\nargv: [sh, -c, 'printf \"%s\" \"$1\" > stamped.txt; echo stamped', sh, \"{input.word}\"]\ncwd: files\ninput_schema: { type: object, properties: { word: { type: string } } }\n",
    )
    .unwrap();
    fx
}

fn effects(fx: &Fixture) -> Vec<Value> {
    let out = weft_cmd(fx.root())
        .args(["schedule", "--json"])
        .output()
        .unwrap();
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effects_survive_the_process_that_scheduled_them_and_run_once() {
    let fx = fixture();
    let script = fx.root().join("script.yaml");
    let out = weft_cmd(fx.root())
        .args(["run", "planner", "--json", "--script"])
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let planner = serde_json::from_slice::<Value>(&out.stdout).unwrap()["thread_id"]
        .as_str()
        .unwrap()
        .to_string();
    let listed = fx
        .events(&planner)
        .into_iter()
        .rfind(|l| l["type"] == "tool_result")
        .unwrap();
    assert!(
        listed["content"].as_str().unwrap().contains("water")
            || listed["content"].as_str().unwrap().contains("reminder"),
        "{listed}"
    );
    let before = effects(&fx);
    assert_eq!(before.len(), 3, "{before:?}");
    assert!(
        before.iter().all(|e| e["status"] == "pending"),
        "the run ended before any was due: {before:?}"
    );
    let soon = before
        .iter()
        .find(|e| e["due_at"].as_str().unwrap() < before[2]["due_at"].as_str().unwrap())
        .unwrap()["id"]
        .clone();
    let later = before
        .iter()
        .max_by_key(|e| e["due_at"].as_str().unwrap().to_string())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(soon.is_string());

    // A restart: another process opens the project and runs what is due.
    let rt = fx.runtime().await;
    let start = Instant::now();
    loop {
        let now = effects(&fx);
        if now.iter().filter(|e| e["status"] == "done").count() == 2 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "effects not run: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rt.drain_hooks().await;
    let now = effects(&fx);
    let directive = now
        .iter()
        .find(|e| e["kind"] == "directive" && e["status"] == "done")
        .unwrap();
    let started = directive["result"]
        .as_str()
        .unwrap()
        .trim_start_matches("started thread ")
        .to_string();
    let row = fx
        .rows()
        .into_iter()
        .find(|r| r.id == started)
        .expect("the effect's thread");
    assert_eq!(row.status, "completed");
    assert_eq!(
        (row.parent_id.as_deref(), row.root_id.as_str()),
        (Some(planner.as_str()), planner.as_str()),
        "a deferred child of the scheduler, in its tree"
    );
    let doc = fx.doc(&started);
    assert_eq!(
        doc.limits.spend.0, 5_000_000,
        "the budget set aside for it: the schedule call's $0.005, not the directive's $5"
    );
    let refused = fx
        .events(&planner)
        .into_iter()
        .filter(|l| l["type"] == "tool_result" && l["is_error"] == true)
        .map(|l| l["content"].to_string())
        .collect::<Vec<_>>();
    assert!(
        refused.len() == 1 && refused[0].contains("set aside whole"),
        "the fourth, its whole $0.02 not left in the tree, was refused: {refused:?}"
    );
    let first = fx
        .events(&started)
        .into_iter()
        .find(|l| l["type"] == "message")
        .unwrap();
    assert_eq!(first["text"], "Remind me: water the plants");
    let tool = now.iter().find(|e| e["kind"] == "tool").unwrap();
    assert_eq!(
        (
            tool["status"].as_str(),
            tool["result"].as_str().map(str::trim)
        ),
        (Some("done"), Some("stamped"))
    );
    let stamped = fx
        .root()
        .join(".weft/threads")
        .join(&planner)
        .join("files/stamped.txt");
    assert_eq!(
        std::fs::read_to_string(stamped).unwrap(),
        "later",
        "ran in the scheduler's file area"
    );

    // The far one can be cancelled, once.
    let c = weft_cmd(fx.root())
        .args(["schedule", "cancel", &later])
        .output()
        .unwrap();
    assert!(c.status.success());
    let again = weft_cmd(fx.root())
        .args(["schedule", "cancel", &later])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("cancelled, not pending"));
    rt.shutdown();
    let threads = fx.rows().len();
    assert_eq!(threads, 2, "each due effect ran exactly once");

    // The budget set aside for the effect cancelled from the CLI goes back to the tree when a
    // runtime next opens the project (#22).
    let child = effects(&fx)
        .into_iter()
        .find(|e| e["id"] == later.as_str())
        .and_then(|e| e["child"].as_str().map(str::to_string))
        .expect("the cancelled directive effect names its deferred child");
    let closed = || -> bool {
        let db = rusqlite::Connection::open(fx.root().join(".weft/state/ledger.db")).unwrap();
        db.query_row("SELECT closed FROM accounts WHERE id=?1", [&child], |r| {
            r.get(0)
        })
        .unwrap()
    };
    assert!(!closed(), "still set aside until a runtime opens");
    let rt = fx.runtime().await;
    rt.shutdown();
    assert!(closed(), "given back once a runtime opened the project");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_thread_may_schedule_is_checked_and_orphans_are_failed() {
    let fx = fixture();
    let rt = fx.runtime().await;
    let r = rt
        .run("greedy", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    let results = fx.tool_results(r.thread_id.as_str());
    assert!(results[0].contains("thread.spawn.planner"), "{results:?}");
    assert!(results[1].contains("30 days"), "{results:?}");
    assert!(effects(&fx).is_empty());
    rt.shutdown();

    // An effect claimed by a process that died is failed, not run again.
    let store = weft::FileStore::open(&fx.project()).unwrap();
    let e = store
        .schedule(
            &r.thread_id,
            weft::EffectKind::Tool,
            "stamp",
            &json!({}),
            "2000-01-01T00:00:00.000Z",
            None,
        )
        .unwrap();
    let db = rusqlite::Connection::open(fx.root().join(".weft/state/store.db")).unwrap();
    db.execute(
        "UPDATE effects SET status='running', claimed_by=999999 WHERE id=?1",
        [&e.id],
    )
    .unwrap();
    let rt = fx.runtime().await;
    let now = effects(&fx);
    assert_eq!(now[0]["status"], "failed", "{now:?}");
    assert!(now[0]["result"].as_str().unwrap().contains("interrupted"));
    rt.shutdown();
}

/// The limit of pending effects holds against schedulers racing on separate connections to
/// store.db (two processes of one project): the count and the insert are one transaction.
#[test]
fn the_pending_limit_holds_under_concurrent_schedulers() {
    let fx = fixture();
    let thread = weft::ThreadId::parse("t-1-00000000").unwrap();
    let workers = 8;
    let start = std::sync::Arc::new(std::sync::Barrier::new(workers));
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (project, thread, start) = (fx.project(), thread.clone(), start.clone());
            std::thread::spawn(move || {
                let store = weft::FileStore::open(&project).unwrap();
                store.scheduled(None).unwrap();
                start.wait();
                (0..4)
                    .map(|_| {
                        store
                            .schedule(
                                &thread,
                                weft::EffectKind::Tool,
                                "stamp",
                                &json!({}),
                                "2999-01-01T00:00:00.000Z",
                                None,
                            )
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let refused: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        refused.iter().all(|e| e.contains("at most 16")),
        "{refused:?}"
    );
    let store = weft::FileStore::open(&fx.project()).unwrap();
    let pending = store.scheduled(Some(&thread)).unwrap().len();
    assert_eq!(pending, 16, "{} refused", refused.len());
}

/// `weft mcp` is a short-lived process its client starts: it runs the scheduled work of the
/// trees its clients start, and none of the project's other work (which it would cancel when
/// the client goes away).
#[cfg(feature = "mcp-server")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weft_mcp_runs_its_clients_scheduled_work_and_no_other() {
    let fx = fixture();
    let config = fx.root().join(".weft/config.yaml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text += "mcp_server: { max_spend: 0.05, directives: [planner] }\n";
    std::fs::write(&config, text).unwrap();
    let script = fx.root().join("script.yaml");
    let path = script.to_str().unwrap();
    let ran = crate::support::weft_json(fx.root(), &["run", "planner", "--json", "--script", path]);
    let theirs = ran["thread_id"].clone();
    let (mcp, stdin) = crate::support::mcp_running(fx.root(), &script, "planner");
    // Both trees' 1 s effects come due; only the client's run here.
    let start = Instant::now();
    let (mine, others) = loop {
        let now = effects(&fx);
        let (others, mine): (Vec<&Value>, Vec<&Value>) =
            now.iter().partition(|e| e["thread"] == theirs);
        let done = mine.iter().filter(|e| e["status"] == "done").count();
        if done == 2 || start.elapsed() > Duration::from_secs(20) {
            break (
                mine.len(),
                others
                    .iter()
                    .map(|e| e["status"].clone())
                    .collect::<Vec<_>>(),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(mine, 3, "the client's tree scheduled three");
    let due: Vec<Value> = effects(&fx)
        .into_iter()
        .filter(|e| e["thread"] == theirs && e["status"] == "done")
        .collect();
    assert!(due.is_empty(), "weft mcp ran another tree's work: {due:?}");
    assert!(others.iter().all(|s| s == "pending"), "{others:?}");
    drop(stdin);
    let out = tokio::task::spawn_blocking(move || {
        crate::support::exits_within(mcp, 20, "weft mcp after its client left")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left: Vec<Value> = effects(&fx)
        .into_iter()
        .filter(|e| e["thread"] == theirs)
        .collect();
    assert!(left.iter().all(|e| e["status"] == "pending"), "{left:?}");
}

/// `weft copy` beside a live runtime whose tree a scheduled directive keeps open: every thread
/// has ended, but the tree's last closes are in that runtime's journal, not yet in ledger.db
/// (a copy made then carried the root's account open with its spend stale). It is refused,
/// naming the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_is_refused_while_a_live_runtime_holds_unfolded_ledger_records() {
    let fx = fixture();
    std::fs::write(
        fx.root().join("script.yaml"),
        "planner:\n  - tool_calls:\n      - { name: schedule, input: { directive: reminder, limits: { spend: 0.004 }, delay: \"1h\" } }\n  - text: planned\n",
    )
    .unwrap();
    let rt = fx.runtime().await;
    let report = rt
        .run("planner", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    let out = weft_cmd(fx.root())
        .args(["copy", "--to", "postgres://weft@127.0.0.1:1/nowhere"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let me = std::process::id().to_string();
    assert!(
        stderr.contains("has this project's ledger open") && stderr.contains(&me),
        "{stderr}"
    );
}
