//! A thread's own state (SPEC §10): its durable key-value store through the `kv_get`/`kv_set`
//! tools (capability `kv`, not shared with children, shown by `weft kv`) and `emit`, a custom
//! event that reaches live listeners and the transcript.

use crate::support::{directive, tool_values, weft_cmd, Fixture};
use serde_json::{json, Value};
use weft::{Status, ThreadStore};

const SCRIPT: &str = r#"keeper:
  - tool_calls:
      - { name: kv_set, input: { key: plan, value: { steps: 3, done: [] } } }
      - { name: kv_set, input: { key: scratch, value: 1 } }
  - tool_calls:
      - { name: kv_set, input: { key: scratch, value: null } }
      - { name: kv_get, input: { key: plan } }
      - { name: emit, input: { event: "progress", data: { done: 1, of: 3 } } }
      - { name: spawn_thread, input: { directive: peeker } }
  - text: kept
peeker:
  - tool_calls: [ { name: kv_get, input: { key: plan } } ]
  - text: peeked
nokv:
  - tool_calls: [ { name: kv_set, input: { key: k, value: 1 } } ]
  - text: refused
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_keeps_its_own_values_and_emits_events() {
    let keeper = directive(
        "permissions: [ kv, emit, \"thread.spawn.peeker\" ]",
        "Keep notes.",
    );
    let peeker = directive("permissions: [ kv ]", "Peek.");
    let nokv = directive("limits: { turns: 2 }", "No store.");
    let fx = Fixture::new(
        &[("keeper", &keeper), ("peeker", &peeker), ("nokv", &nokv)],
        SCRIPT,
        "",
    );
    let rt = fx.runtime().await;
    let mut live = rt.events();
    let report = rt
        .run("keeper", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let id = report.thread_id.to_string();

    // Calls in order: kv_set ×2, then kv_set (null), kv_get, emit, spawn_thread.
    let got = tool_values(&fx, &id);
    assert_eq!(
        got[3].0["value"],
        json!({ "steps": 3, "done": [] }),
        "{got:?}"
    );
    let stored = rt.store().kv_list(&report.thread_id).unwrap();
    assert_eq!(
        Value::Object(stored),
        json!({ "plan": { "steps": 3, "done": [] } }),
        "null deleted `scratch`"
    );

    // Not copied to children: the child's store is its own, and empty.
    let child = fx.id_of("peeker");
    let peeked = tool_values(&fx, &child);
    assert_eq!(peeked[0].0["value"], Value::Null, "{peeked:?}");

    // emit: in the transcript and to live listeners.
    let line = fx
        .events(&id)
        .into_iter()
        .find(|l| l["type"] == "emit")
        .expect("an emit line");
    assert_eq!(line["event"], "progress");
    assert_eq!(line["data"], json!({ "done": 1, "of": 3 }));
    let mut heard = false;
    while let Ok(ev) = live.try_recv() {
        if let weft::Event::Line { kind, data, .. } = ev {
            heard |= kind == "emit" && data["event"] == "progress";
        }
    }
    assert!(heard, "live listeners got the emit");

    // Without the capability, the store is not there for the model.
    let denied = rt
        .run("nokv", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    let r = tool_values(&fx, denied.thread_id.as_str());
    assert!(r[0].1 && r[0].0.to_string().contains("kv"), "{r:?}");
    rt.shutdown();

    // `weft kv` shows it from any process.
    let out = weft_cmd(fx.root())
        .args(["kv", &id, "--json"])
        .output()
        .unwrap();
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown, json!({ "plan": { "steps": 3, "done": [] } }));
    let one = weft_cmd(fx.root())
        .args(["kv", &id, "plan"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&one.stdout).trim(),
        r#"{"done":[],"steps":3}"#
    );
    let none = weft_cmd(fx.root())
        .args(["kv", &id, "nope"])
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(2));
}

/// A watcher of progress only (what `weft run` and an MCP client's run show) asks for no
/// transcript line: threads send none for it. One that asks for every event gets each line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_watcher_is_sent_no_transcript_lines() {
    let go = directive("", "Go.");
    let script = "first:\n  - text: one\nsecond:\n  - text: two\n";
    let fx = Fixture::new(&[("first", &go), ("second", &go)], script, "");
    let rt = fx.runtime().await;
    let heard = |rx: &mut tokio::sync::broadcast::Receiver<weft::Event>| {
        let (mut started, mut lines) = (0, 0);
        while let Ok(ev) = rx.try_recv() {
            match ev {
                weft::Event::Started { .. } => started += 1,
                weft::Event::Line { .. } => lines += 1,
                _ => {}
            }
        }
        (started, lines)
    };
    let mut progress = rt.progress_events();
    let quiet = rt.run("first", Default::default(), weft::LimitSet::default());
    assert_eq!(quiet.await.unwrap().status, Status::Completed);
    assert_eq!(
        heard(&mut progress),
        (1, 0),
        "progress only: a start, no line"
    );
    let mut all = rt.events();
    let loud = rt.run("second", Default::default(), weft::LimitSet::default());
    assert_eq!(loud.await.unwrap().status, Status::Completed);
    let (started, lines) = heard(&mut all);
    assert_eq!(started, 1);
    assert!(
        lines >= 2,
        "every event: each transcript line ({lines} heard)"
    );
    rt.shutdown();
}
