//! Trees of threads: completion, exact spend, inheritance, depth, spawn admission, waiting.

use crate::support::{directive, expected_spend, Backend, Fixture, BACKENDS};
use serde_json::json;
use weft::Status;

fn three_level_on(backend: Backend) -> Option<Fixture> {
    let root = directive(
        "limits: { turns: 5, spend: 0.50, depth: 3, spawns: 5, concurrency: 5 }\npermissions: [\"thread.spawn.**\"]\noutputs:\n  n: { type: integer, required: true }",
        "Fan out.",
    );
    let mid = directive(
        "limits: { turns: 30, spend: 5.00 }\ninputs:\n  k: { type: integer, required: true }",
        "Middle {input:k}.",
    );
    let leaf = directive("limits: { turns: 3 }", "Leaf.");
    let script = r#"
root:
  - usage: { input_tokens: 1000, output_tokens: 100 }
    tool_calls:
      - { name: spawn_thread, input: { directive: mid, inputs: { k: 1 }, wait: false } }
      - { name: spawn_thread, input: { directive: mid, inputs: { k: 2 }, wait: false } }
  - usage: { input_tokens: 1500, output_tokens: 20 }
    tool_calls: [ { name: wait_threads, input: {} } ]
  - usage: { input_tokens: 2000, output_tokens: 50 }
    tool_calls: [ { name: directive_return, input: { n: 2 } } ]
mid:
  - usage: { input_tokens: 300, output_tokens: 30 }
    tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]
  - text: done
    usage: { input_tokens: 500, output_tokens: 40 }
leaf:
  - text: leaf answer
    delay: 20ms
    usage: { input_tokens: 123, output_tokens: 45 }
"#;
    Fixture::on(
        backend,
        &[("root", &root), ("mid", &mid), ("leaf", &leaf)],
        script,
        "",
    )
}

fn three_level() -> Fixture {
    three_level_on(Backend::Sqlite).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_level_tree_completes_verified_with_exact_spend() {
    for backend in BACKENDS {
        let Some(fx) = three_level_on(backend) else {
            return;
        };
        let (report, rt) = fx.run("root", json!({})).await;
        assert_eq!(report.status, Status::Completed, "{report:?}");
        assert_eq!(report.outputs, Some(json!({ "n": 2 })));
        let rows = fx.rows();
        assert_eq!(rows.len(), 5, "root + 2 mid + 2 leaves");
        assert!(rows.iter().all(|r| r.status == "completed"), "{rows:?}");
        assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
        let expected = expected_spend(&fx);
        assert_eq!(
            report.spend_nanos.0, expected,
            "root spend = Σ usage × price"
        );
        // Hand check of the same sum: root 4500 in/170 out, each mid 800/70, each leaf 123/45.
        assert_eq!(
            expected,
            (4500 + 2 * 800 + 2 * 123) * 1000 + (170 + 2 * 70 + 2 * 45) * 4000
        );
        let (violations, open) = rt.audit().await;
        assert!(violations.is_empty() && open == 0, "{violations:?} {open}");
        rt.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_inherit_capped_limits() {
    let fx = three_level();
    let (report, _rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed);
    for r in fx.rows().iter().filter(|r| r.directive == "mid") {
        let d = fx.doc(&r.id);
        assert_eq!(d.limits.turns, 5, "mid asked 30, root caps at 5");
        assert_eq!(
            d.limits.spend.0, 500_000_000,
            "mid asked $5, root caps at $0.50"
        );
        assert_eq!(d.limits.depth, 2);
        assert_eq!(
            d.capabilities,
            vec!["thread.spawn.**".to_string()],
            "inherited when none declared"
        );
    }
    for r in fx.rows().iter().filter(|r| r.directive == "leaf") {
        let d = fx.doc(&r.id);
        assert_eq!((d.limits.turns, d.limits.depth), (3, 1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_exhaustion_is_refused_before_any_llm_call() {
    let root = directive(
        "limits: { depth: 1 }\npermissions: [\"thread.spawn.**\"]",
        "Go deep.",
    );
    let mid = directive("", "Go deeper.");
    let script = r#"
root:
  - tool_calls: [ { name: spawn_thread, input: { directive: mid } } ]
  - text: root carried on
mid:
  - tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]
  - text: mid carried on
leaf:
  - text: should never run
"#;
    let leaf = directive("", "Leaf.");
    let fx = Fixture::new(
        &[("root", &root), ("mid", &mid), ("leaf", &leaf)],
        script,
        "",
    );
    let (report, _rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed);
    assert_eq!(report.result.as_deref(), Some("root carried on"));
    let rows = fx.rows();
    assert!(
        rows.iter().all(|r| r.directive != "leaf"),
        "no leaf thread registered"
    );
    let mid = rows.iter().find(|r| r.directive == "mid").unwrap();
    let refused = fx
        .events(&mid.id)
        .into_iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap();
    assert_eq!(refused["is_error"], true);
    assert!(
        refused["content"]
            .as_str()
            .unwrap()
            .contains("limit exceeded: depth"),
        "{refused}"
    );
}

fn fan(n: usize, wait: bool, delay: &str) -> String {
    let calls: Vec<String> = (0..n)
        .map(|_| {
            format!("      - {{ name: spawn_thread, input: {{ directive: kid, wait: {wait} }} }}")
        })
        .collect();
    format!(
        "parent:\n  - tool_calls:\n{}\n  - tool_calls: [ {{ name: wait_threads, input: {{}} }} ]\n  - text: parent done\nkid:\n  - text: kid done\n    delay: {delay}\n    usage: {{ input_tokens: 10, output_tokens: 10 }}\n",
        calls.join("\n")
    )
}

fn refusals(fx: &Fixture, parent: &str, needle: &str) -> usize {
    fx.events(parent)
        .iter()
        .filter(|e| {
            e["type"] == "tool_result" && e["content"].as_str().unwrap_or("").contains(needle)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawns_limit_holds_under_concurrent_spawn_calls() {
    for backend in BACKENDS {
        let parent = directive(
            "limits: { spawns: 3, concurrency: 20 }\npermissions: [\"thread.spawn.kid\"]",
            "Fan.",
        );
        let kid = directive("", "Kid.");
        let Some(fx) = Fixture::on(
            backend,
            &[("parent", &parent), ("kid", &kid)],
            &fan(12, false, "1ms"),
            "",
        ) else {
            return;
        };
        let (report, _rt) = fx.run("parent", json!({})).await;
        assert_eq!(
            report.status,
            Status::Completed,
            "the parent goes on after refusals: {report:?}"
        );
        let kids = fx.rows().iter().filter(|r| r.directive == "kid").count();
        assert_eq!(kids, 3);
        assert_eq!(
            refusals(&fx, report.thread_id.as_str(), "limit exceeded: spawns"),
            9
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limit_holds_under_concurrent_spawn_calls() {
    for backend in BACKENDS {
        let parent = directive(
            "limits: { spawns: 50, concurrency: 2 }\npermissions: [\"thread.spawn.kid\"]",
            "Fan.",
        );
        let kid = directive("", "Kid.");
        let Some(fx) = Fixture::on(
            backend,
            &[("parent", &parent), ("kid", &kid)],
            &fan(10, false, "300ms"),
            "",
        ) else {
            return;
        };
        let (report, _rt) = fx.run("parent", json!({})).await;
        assert_eq!(report.status, Status::Completed);
        assert_eq!(fx.rows().iter().filter(|r| r.directive == "kid").count(), 2);
        assert_eq!(
            refusals(
                &fx,
                report.thread_id.as_str(),
                "limit exceeded: concurrency"
            ),
            8
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capability_denial_goes_back_to_the_model() {
    let parent = directive("permissions: [\"thread.spawn.allowed\"]", "Try.");
    let script = r#"
parent:
  - tool_calls: [ { name: spawn_thread, input: { directive: forbidden } } ]
  - text: "noted the denial"
"#;
    let fx = Fixture::new(
        &[("parent", &parent), ("forbidden", &directive("", "x"))],
        script,
        "",
    );
    let (report, _rt) = fx.run("parent", json!({})).await;
    assert_eq!(report.status, Status::Completed);
    assert_eq!(
        refusals(
            &fx,
            report.thread_id.as_str(),
            "permission denied: `thread.spawn.forbidden`"
        ),
        1
    );
    assert_eq!(fx.rows().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directive_return_validates_outputs_and_accepts_falsy_values() {
    let d = directive("outputs:\n  count: { type: integer, required: true }\n  ok: { type: boolean, required: true }", "Count.");
    let script = r#"
counter:
  - tool_calls: [ { name: directive_return, input: { ok: true } } ]
  - tool_calls: [ { name: directive_return, input: { count: "three", ok: true } } ]
  - text: "I am done"
  - tool_calls: [ { name: directive_return, input: { count: 0, ok: false } } ]
"#;
    let fx = Fixture::new(&[("counter", &d)], script, "");
    let (report, _rt) = fx.run("counter", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(report.outputs, Some(json!({ "count": 0, "ok": false })));
    assert_eq!(report.turns, 4);
    let results = fx.tool_results(report.thread_id.as_str());
    assert!(results[0].contains("`count` is required"), "{results:?}");
    assert!(
        results[1].contains("`count` must be of type integer"),
        "{results:?}"
    );
}

/// Inputs nested deeper than weft takes (63 levels under the inputs object: 64 in all) are
/// refused before anything is written, naming the input and the limit; the same shape one
/// level shallower starts. (serde_json reads at most 127 levels back, and inputs sit lower in a
/// transcript line: deeper ones would be written and never read.) Every road into a thread —
/// the API, `weft run`, `spawn_thread`, a hook, a schedule — resolves its inputs in one place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_nested_too_deep_are_refused_before_anything_is_written() {
    let d = directive(
        "inputs:\n  tree: { type: array, required: true }",
        "Look at {input:tree}.",
    );
    let fx = Fixture::new(&[("deep", &d)], "deep:\n  - text: done\n", "");
    let rt = fx.runtime().await;
    let nested = |levels: usize| {
        let mut v = json!("leaf");
        for _ in 0..levels {
            v = json!([v]);
        }
        let mut m = serde_json::Map::new();
        m.insert("tree".into(), v);
        m
    };
    let refused = rt
        .start("deep", nested(64), weft::LimitSet::default())
        .await
        .err()
        .expect("64 levels under the inputs object are refused")
        .to_string();
    assert!(
        refused.contains("input `tree` nests deeper than 63 levels"),
        "{refused}"
    );
    assert!(fx.rows_so_far().is_empty(), "nothing registered");
    let handle = rt
        .start("deep", nested(63), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(handle.wait().await.unwrap().status, Status::Completed);
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_script_turns_ends_the_thread_with_a_clear_error() {
    let fx = Fixture::new(
        &[("solo", &directive("", "Hi."))],
        "solo:\n  - tool_calls: [ { name: nope, input: {} } ]\n",
        "",
    );
    let (report, _rt) = fx.run("solo", json!({})).await;
    assert_eq!(report.status, Status::Error);
    let err = report.error.unwrap();
    assert!(
        err.contains("ran out of turns for `solo`") && err.contains("turn 2"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_limit_ends_the_thread_with_limit_exceeded() {
    let d = directive("limits: { turns: 2 }", "Loop.");
    let script = "looper:\n  - tool_calls: [ { name: nope, input: {} } ]\n  - tool_calls: [ { name: nope, input: {} } ]\n  - text: never\n";
    let fx = Fixture::new(&[("looper", &d)], script, "");
    let (report, _rt) = fx.run("looper", json!({})).await;
    assert_eq!(report.status, Status::Error);
    assert_eq!(report.error.as_deref(), Some("limit exceeded: turns 2/2"));
    assert!(fx
        .events(report.thread_id.as_str())
        .iter()
        .any(|e| e["type"] == "limit_hit" && e["limit"] == "turns"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_errors_are_retried_and_recorded() {
    let d = directive("", "Try.");
    let script = r#"
flaky:
  - error: { kind: rate_limited, retry_after: 10ms }
  - error: { kind: overloaded, retry_after: 10ms }
  - text: "third time lucky"
    usage: { input_tokens: 10, output_tokens: 10 }
"#;
    let fx = Fixture::new(&[("flaky", &d)], script, "retries: 2\n");
    let (report, _rt) = fx.run("flaky", json!({})).await;
    assert_eq!(report.status, Status::Completed);
    assert_eq!(report.turns, 1);
    let retries = fx
        .events(report.thread_id.as_str())
        .iter()
        .filter(|e| e["type"] == "llm_retry")
        .count();
    assert_eq!(retries, 2);
    let fx = Fixture::new(&[("flaky", &d)], script, "retries: 1\n");
    let (report, _rt) = fx.run("flaky", json!({})).await;
    assert_eq!(report.status, Status::Error, "retries are bounded");
    assert!(report.error.unwrap().contains("Overloaded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_limit_fires_during_a_slow_call() {
    let d = directive("limits: { duration: 200ms }", "Slow.");
    let fx = Fixture::new(
        &[("slow", &d)],
        "slow:\n  - text: late\n    delay: 30s\n",
        "",
    );
    let started = std::time::Instant::now();
    let (report, _rt) = fx.run("slow", json!({})).await;
    assert_eq!(report.status, Status::Error);
    assert!(report
        .error
        .unwrap()
        .starts_with("limit exceeded: duration"));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "the timer cancels the in-flight call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_that_finishes_cancels_its_live_children() {
    let parent = directive(
        "permissions: [\"thread.spawn.**\"]",
        "Spawn, then stop waiting.",
    );
    let slow = directive("", "Slow.");
    let script = r#"
parent:
  - tool_calls: [ { name: spawn_thread, input: { directive: slow, wait: false } } ]
  - tool_calls: [ { name: wait_threads, input: { timeout: 0.1 } } ]
  - text: done without the slow child
slow:
  - text: never
    delay: 60s
"#;
    let fx = Fixture::new(&[("parent", &parent), ("slow", &slow)], script, "");
    let (report, rt) = fx.run("parent", json!({})).await;
    assert_eq!(report.status, Status::Completed);
    let slow_row = fx
        .rows()
        .into_iter()
        .find(|r| r.directive == "slow")
        .unwrap();
    assert_eq!(
        slow_row.status, "cancelled",
        "a thread's subtree never outlives it"
    );
    let waited = fx
        .events(report.thread_id.as_str())
        .into_iter()
        .find(|e| {
            e["type"] == "tool_result" && e["content"].as_str().unwrap().contains("timed_out")
        })
        .unwrap();
    assert!(
        waited["content"]
            .as_str()
            .unwrap()
            .contains("\"timed_out\":true"),
        "{waited}"
    );
    let (violations, open) = rt.audit().await;
    assert!(violations.is_empty() && open == 0);
    assert!(fx.verify_all().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_root_cancels_the_whole_tree() {
    let root = directive(
        "permissions: [\"thread.spawn.**\"]\nlimits: { concurrency: 10, spawns: 10 }",
        "Fan out.",
    );
    let mid = directive("", "Mid.");
    let script = r#"
root:
  - tool_calls:
      - { name: spawn_thread, input: { directive: mid, wait: false } }
      - { name: spawn_thread, input: { directive: mid, wait: false } }
  - tool_calls: [ { name: wait_threads, input: {} } ]
  - text: never
mid:
  - tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]
  - text: never
leaf:
  - text: never
    delay: 60s
"#;
    let fx = Fixture::new(
        &[
            ("root", &root),
            ("mid", &mid),
            ("leaf", &directive("", "Leaf.")),
        ],
        script,
        "",
    );
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().clone();
    let done = handle.wait();
    // Wait until both leaves are live.
    for _ in 0..200 {
        if fx
            .rows()
            .iter()
            .filter(|r| r.directive == "leaf" && r.status == "running")
            .count()
            == 2
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let started = std::time::Instant::now();
    assert!(rt.cancel(&id, "test"));
    let report = done.await.unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "cancel is prompt: {:?}",
        started.elapsed()
    );
    assert_eq!(report.status, Status::Cancelled);
    let rows = fx.rows();
    assert_eq!(rows.len(), 5);
    assert!(rows.iter().all(|r| r.status == "cancelled"), "{rows:?}");
    let (violations, open) = rt.audit().await;
    assert!(
        violations.is_empty() && open == 0,
        "no reservation left: {open}"
    );
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
}
