//! OpenTelemetry: `weft run` exports its spans over OTLP (HTTP/protobuf) to a real receiver
//! process — `tests/fixtures/otel/receiver.py` decoding with `opentelemetry-proto` from PyPI,
//! installed by `.ci/run` into `$WEFT_MCP_DIR/venv` — and nothing when no endpoint is set.

use super::support::{directive, mcp_dir, skip, weft_cmd, Fixture};
use serde_json::Value;

/// The venv's Python if it can decode OTLP, else None (the test says SKIPPED).
fn otlp_python() -> Option<std::path::PathBuf> {
    let py = mcp_dir().join("venv/bin/python");
    let ok = std::process::Command::new(&py)
        .args([
            "-c",
            "import opentelemetry.proto.collector.trace.v1.trace_service_pb2",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    skip(&format!(
        "otel: SKIPPED — {} cannot import opentelemetry-proto. `.ci/run` installs it (pip install opentelemetry-proto)",
        py.display()
    ));
    None
}

struct Receiver {
    child: std::process::Child,
    port: u16,
    out: std::path::PathBuf,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    fn start(py: &std::path::Path, out: std::path::PathBuf) -> Receiver {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/otel/receiver.py"
        );
        let (child, line) =
            super::support::spawn_announcing(std::process::Command::new(py).arg(script).arg(&out));
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("receiver said {line:?}"));
        Receiver { child, port, out }
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A scripted tree's spans reach a real OTLP receiver with the GenAI names, parentage (a child's
/// `invoke_agent` under its parent's `execute_tool spawn_thread`) and token and cost attributes
/// that add up to the tree's spend; without an endpoint, nothing is sent.
#[test]
fn a_trees_spans_reach_a_real_otlp_receiver() {
    let Some(py) = otlp_python() else {
        return;
    };
    let fan = directive("permissions: [\"thread.spawn.leaf\"]", "Fan out.");
    let leaf = directive("inputs: { n: { type: integer } }", "Answer {input:n}.");
    let script = r#"
fan:
  - tool_calls:
      - { name: spawn_thread, input: { directive: leaf, inputs: { n: 1 }, wait: true } }
      - { name: spawn_thread, input: { directive: leaf, inputs: { n: 2 }, wait: true } }
  - text: all done
leaf:
  - text: leaf answer
"#;
    let fx = Fixture::new(&[("fan", &fan), ("leaf", &leaf)], script, "");
    let rx = Receiver::start(&py, fx.root().join("spans.jsonl"));
    let run = |endpoint: Option<String>| {
        let mut c = weft_cmd(fx.root());
        c.args(["run", "fan", "--json", "--script"])
            .arg(fx.root().join("script.yaml"))
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        if let Some(e) = endpoint {
            c.env("OTEL_EXPORTER_OTLP_ENDPOINT", e);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<Value>(&o.stdout).unwrap()
    };
    run(None);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(rx.spans().is_empty(), "exported without an endpoint");
    let report = run(Some(format!("http://127.0.0.1:{}", rx.port)));
    let root = report["thread_id"].as_str().unwrap();
    // The process flushed before it exited.
    let spans = rx.spans();
    let named = |n: &str| -> Vec<&Value> { spans.iter().filter(|s| s["name"] == n).collect() };
    let agents: Vec<&Value> = spans
        .iter()
        .filter(|s| s["attributes"]["gen_ai.operation.name"] == "invoke_agent")
        .collect();
    assert_eq!(agents.len(), 3, "{spans:#?}");
    assert_eq!(named("invoke_agent fan").len(), 1);
    assert_eq!(named("invoke_agent leaf").len(), 2);
    let fan_span = named("invoke_agent fan")[0];
    assert_eq!(fan_span["attributes"]["gen_ai.agent.id"], root);
    assert_eq!(fan_span["attributes"]["gen_ai.conversation.id"], root);
    assert_eq!(fan_span["attributes"]["gen_ai.agent.name"], "fan");
    assert_eq!(fan_span["parent_span_id"], "");
    assert_eq!(fan_span["service"], "weft");
    // One trace; each leaf under one of the fan's spawn_thread tool spans.
    assert!(spans.iter().all(|s| s["trace_id"] == fan_span["trace_id"]));
    let spawns = named("execute_tool spawn_thread");
    assert_eq!(spawns.len(), 2);
    for sp in &spawns {
        assert_eq!(sp["parent_span_id"], fan_span["span_id"]);
        assert_eq!(sp["attributes"]["gen_ai.tool.name"], "spawn_thread");
        assert!(sp["attributes"]["gen_ai.tool.call.id"].is_string());
    }
    for leaf in named("invoke_agent leaf") {
        assert!(
            spawns
                .iter()
                .any(|sp| sp["span_id"] == leaf["parent_span_id"]),
            "{leaf}"
        );
        assert_eq!(leaf["attributes"]["weft.parent_id"], root);
    }
    // LLM calls: model, tokens, cost; their cost adds up to the tree's spend.
    let chats = named("chat scripted");
    assert_eq!(chats.len(), 4, "{spans:#?}");
    let mut cost = 0;
    for c in &chats {
        let a = &c["attributes"];
        assert_eq!(a["gen_ai.operation.name"], "chat");
        assert_eq!(a["gen_ai.request.model"], "scripted");
        assert!(
            a["gen_ai.usage.input_tokens"]
                .as_i64()
                .is_some_and(|n| n > 0),
            "{c}"
        );
        assert!(a["gen_ai.usage.output_tokens"].as_i64().unwrap() > 0, "{c}");
        assert!(a["gen_ai.request.max_tokens"].as_i64().unwrap() > 0, "{c}");
        assert!(
            a["weft.reserved_nanos"].as_i64().unwrap() >= a["weft.spend_nanos"].as_i64().unwrap()
        );
        assert!(agents.iter().any(|g| g["span_id"] == c["parent_span_id"]));
        cost += a["weft.spend_nanos"].as_i64().unwrap();
    }
    assert_eq!(cost, report["cost"]["spend_nanos"].as_i64().unwrap());
    assert_eq!(
        fan_span["attributes"]["weft.tree_spend_nanos"].as_i64(),
        Some(cost),
        "{fan_span}"
    );
    assert_eq!(fan_span["attributes"]["weft.status"], "completed");
}
