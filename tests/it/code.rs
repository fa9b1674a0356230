//! `run_code` (issue 13): JavaScript in the embedded QuickJS — values, console output and the
//! thread's own KV and file area through helpers its capabilities allow; nothing else reachable
//! (no require/process/fetch/modules, no path out of the area); a runaway loop, a memory hog and
//! deep recursion stopped by their limits; a cancel stops a script at once.

use crate::support::{directive, tool_values, weft_cmd, Fixture};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const SCRIPT: &str = r#"coder:
  - tool_calls:
      - { name: run_code, input: { source: "console.log('squares', [1,2,3]); kv.set('plan', {steps: 2}); files.write('notes/out.txt', 'hi there'); ({ sum: [1,2,3].map(x => x * x).reduce((a, b) => a + b), back: kv.get('plan'), text: files.read('notes/out.txt'), listed: files.list('notes').length })" } }
      - { name: run_code, input: { source: "({ require: typeof require, process: typeof process, fetch: typeof fetch, std: typeof std, os: typeof os, load: typeof load, XMLHttpRequest: typeof XMLHttpRequest })" } }
      - { name: run_code, input: { source: "import('fs')" } }
      - { name: run_code, input: { source: "files.read('../../../../etc/passwd')" } }
      - { name: run_code, input: { source: "while (true) {}", timeout: 1 } }
      - { name: run_code, input: { source: "let a = []; while (true) a.push(new Array(100000).fill(7));" } }
      - { name: run_code, input: { source: "function f(n) { return f(n + 1) + 1; } f(0)" } }
      - { name: run_code, input: { source: "throw new Error('on purpose')" } }
  - text: coded
nokv:
  - tool_calls: [ { name: run_code, input: { source: "kv.set('x', 1)" } } ]
  - text: refused
spinner:
  - tool_calls: [ { name: run_code, input: { source: "while (true) {}", timeout: 30 } } ]
  - text: never
"#;

fn fixture() -> Fixture {
    let coder = directive(
        "permissions: [ code.run, kv, fs.read, fs.write ]",
        "Compute.",
    );
    let nokv = directive("permissions: [ code.run ]", "No store.");
    let spinner = directive("permissions: [ code.run ]", "Spin.");
    Fixture::new(
        &[("coder", &coder), ("nokv", &nokv), ("spinner", &spinner)],
        SCRIPT,
        "",
    )
}

/// Each call's (is_error, result), in call order (calls of one turn run at once and may
/// finish in any).
fn results(fx: &Fixture, id: &str) -> Vec<(bool, Value)> {
    tool_values(fx, id)
        .into_iter()
        .map(|(v, e)| (e, v))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_compute_with_their_helpers_and_reach_nothing_else() {
    let fx = fixture();
    let rt = fx.runtime().await;
    let t0 = Instant::now();
    let report = rt
        .run("coder", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    let r = results(&fx, report.thread_id.as_str());
    assert_eq!(r.len(), 8, "{r:?}");
    assert!(!r[0].0, "{:?}", r[0]);
    assert_eq!(
        r[0].1["result"],
        json!({ "sum": 14, "back": { "steps": 2 }, "text": "hi there", "listed": 1 })
    );
    assert_eq!(r[0].1["logs"], "squares [1,2,3]\n");
    let area = fx
        .root()
        .join(".weft/threads")
        .join(report.thread_id.as_str())
        .join("files/notes/out.txt");
    assert_eq!(std::fs::read_to_string(area).unwrap(), "hi there");
    let kv = weft_cmd(fx.root())
        .args(["kv", report.thread_id.as_str(), "plan"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&kv.stdout).trim(), r#"{"steps":2}"#);

    // The sandbox: nothing of the host is there.
    assert!(
        r[1].1["result"]
            .as_object()
            .unwrap()
            .values()
            .all(|v| v == "undefined"),
        "{:?}",
        r[1]
    );
    assert!(r[2].0, "no modules: {:?}", r[2]);
    assert!(
        r[3].0 && r[3].1.to_string().contains(".."),
        "no path out of the area: {:?}",
        r[3]
    );
    // Limits stop a runaway script, a memory hog and deep recursion — as errors, not crashes.
    assert!(
        r[4].0 && r[4].1.to_string().contains("ran out of time"),
        "{:?}",
        r[4]
    );
    assert!(
        r[5].0 && r[5].1.to_string().contains("32 MiB"),
        "{:?}",
        r[5]
    );
    assert!(
        r[6].0 && r[6].1.to_string().to_lowercase().contains("stack"),
        "{:?}",
        r[6]
    );
    assert!(
        r[7].0 && r[7].1.to_string().contains("on purpose"),
        "{:?}",
        r[7]
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());

    // Helpers follow the thread's capabilities.
    let denied = rt
        .run("nokv", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    let d = results(&fx, denied.thread_id.as_str());
    assert!(
        d[0].0 && d[0].1.to_string().contains("`kv` is not granted"),
        "{d:?}"
    );
    rt.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_running_script() {
    let fx = fixture();
    let rt = fx.runtime().await;
    let h = rt
        .start("spinner", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    let id = h.id().clone();
    let start = Instant::now();
    while !fx
        .events(id.as_str())
        .iter()
        .any(|l| l["type"] == "tool_use")
    {
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cancelled = Instant::now();
    assert!(rt.cancel(&id, "enough"));
    let report = h.wait().await.unwrap();
    assert_eq!(report.status, weft::Status::Cancelled);
    assert!(
        cancelled.elapsed() < Duration::from_secs(3),
        "the 30 s script stopped at the cancel: {:?}",
        cancelled.elapsed()
    );
    rt.shutdown();
}
