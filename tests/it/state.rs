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

/// A watcher of progress only (an MCP client's run, `weft run --json` or piped) asks for no
/// transcript line and no streamed text: threads send none for it. `weft run`'s live tree on a
/// terminal asks for the streamed text only; a watcher of every event gets each line too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_watcher_is_sent_no_transcript_lines() {
    let go = directive("", "Go.");
    let script = "first:\n  - text: one\nsecond:\n  - text: two\nthird:\n  - text: three\n";
    let fx = Fixture::new(
        &[("first", &go), ("second", &go), ("third", &go)],
        script,
        "",
    );
    let rt = fx.runtime().await;
    let heard = |rx: &mut tokio::sync::broadcast::Receiver<weft::Event>| {
        let (mut started, mut lines, mut text) = (0, 0, String::new());
        while let Ok(ev) = rx.try_recv() {
            match ev {
                weft::Event::Started { .. } => started += 1,
                weft::Event::Line { .. } => lines += 1,
                weft::Event::Token { text: t, .. } => text.push_str(&t),
                _ => {}
            }
        }
        (started, lines, text)
    };
    let run = |d: &'static str| rt.run(d, Default::default(), weft::LimitSet::default());
    let mut progress = rt.progress_events();
    assert_eq!(run("first").await.unwrap().status, Status::Completed);
    let quiet = heard(&mut progress);
    assert_eq!(
        quiet,
        (1, 0, String::new()),
        "progress only: a start, no line, no text"
    );
    let mut text = rt.progress_and_text_events();
    assert_eq!(run("second").await.unwrap().status, Status::Completed);
    let (started, lines, said) = heard(&mut text);
    assert_eq!((started, lines), (1, 0), "with text: a start, no line");
    assert_eq!(said, "two", "the model's streamed text");
    let mut all = rt.events();
    assert_eq!(run("third").await.unwrap().status, Status::Completed);
    let (started, lines, said) = heard(&mut all);
    assert_eq!((started, said.as_str()), (1, "three"));
    assert!(
        lines >= 2,
        "every event: each transcript line ({lines} heard)"
    );
    rt.shutdown();
}
