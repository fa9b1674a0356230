//! Messages into live threads: `weft inject` from another terminal, a child's `notify_parent`
//! and `set_status`.

use crate::support::{directive, rows_json as rows, weft_cmd, Fixture};
use serde_json::json;
use weft::Status;

/// A message sent from another process reaches the running thread as a user message before its
/// next call, and a finished thread refuses one clearly.
#[test]
fn inject_reaches_a_thread_running_in_another_process() {
    let root = directive("limits: { turns: 5 }", "Work slowly.");
    let script = r#"
root:
  - text: thinking
    delay: 1500ms
    tool_calls: [ { name: thread_status, input: { id: "nobody-1" } } ]
  - text: done
"#;
    let fx = Fixture::new(&[("root", &root)], script, "");
    let script_path = fx.root().join("script.yaml");
    let run = weft_cmd(fx.root())
        .args(["run", "root", "--json", "--script"])
        .arg(&script_path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let id = loop {
        if let Some(r) = rows(fx.root())
            .into_iter()
            .find(|r| r["status"] == "running")
        {
            break r["id"].as_str().unwrap().to_string();
        }
        assert!(start.elapsed().as_secs() < 30);
        std::thread::sleep(std::time::Duration::from_millis(30));
    };
    let o = weft_cmd(fx.root())
        .args(["inject", &id, "please also mention the weft"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = run.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = fx.events(&id);
    let delivered = events
        .iter()
        .position(|e| e["type"] == "message" && e["text"] == "please also mention the weft")
        .expect("the message was delivered as a user message");
    let calls: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e["type"] == "llm_call")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(calls.len(), 2);
    assert!(
        calls[0] < delivered && delivered < calls[1],
        "delivered before the next call"
    );
    let o = weft_cmd(fx.root())
        .args(["inject", &id, "too late"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is completed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_notifies_its_parent_and_sets_its_status() {
    let root = directive("permissions: [\"thread.spawn.**\"]", "Delegate.");
    let kid = directive("", "Work.");
    let script = r#"
root:
  - tool_calls: [ { name: spawn_thread, input: { directive: kid, wait: false } } ]
  - tool_calls: [ { name: wait_threads, input: {} } ]
  - text: done
kid:
  - tool_calls:
      - { name: set_status, input: { status: "halfway there" } }
      - { name: notify_parent, input: { text: "found something early" } }
  - text: kid done
    delay: 200ms
"#;
    let fx = Fixture::new(&[("root", &root), ("kid", &kid)], script, "");
    let (report, _rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let kid_row = fx
        .rows()
        .into_iter()
        .find(|r| r.directive == "kid")
        .unwrap();
    assert_eq!(kid_row.status_text.as_deref(), Some("halfway there"));
    let root_events = fx.events(report.thread_id.as_str());
    let msg = root_events
        .iter()
        .find(|e| e["type"] == "message" && e["from"] == kid_row.id.as_str())
        .expect("the parent got the child's message");
    assert!(msg["text"]
        .as_str()
        .unwrap()
        .contains("found something early"));
    let kid_events = fx.events(&kid_row.id);
    assert!(kid_events
        .iter()
        .any(|e| e["type"] == "status_set" && e["status"] == "halfway there"));
    // A root has no parent: the child tools are not offered to it.
    let o = weft_cmd(fx.root())
        .args(["show", &kid_row.id])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("says       halfway there"));
}
