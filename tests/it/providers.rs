//! The HTTP providers against a loopback fake server: wire formats, exact spend, retries,
//! dropped streams, cancellation, and configuration errors before a thread starts.

use crate::fake_llm::{self, Reply};
use crate::support::{directive, Fixture};
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weft::LimitSet;
use weft::Status;

const KEY: &str = "sk-test-do-not-leak-0123456789";

/// Prices of model `m1`: $2/M in, $8/M out, $0.5/M cached → 2000, 8000, 500 nanos per token.
fn config(kind: &str, base: &str, extra: &str) -> String {
    std::env::set_var("WEFT_TEST_FAKE_KEY", KEY);
    let base = if kind == "openai" {
        format!("{base}/v1")
    } else {
        base.to_string()
    };
    format!(
        "defaults:\n  provider: fake\n  max_output_tokens: 500\nproviders:\n  fake: {{ kind: {kind}, base_url: \"{base}\", api_key_env: WEFT_TEST_FAKE_KEY, tiers: {{ fast: m1 }}, headers: {{ x-extra: yes }} }}\npricing:\n  m1: {{ input: 2.00, output: 8.00, cache_read: 0.50 }}\n{extra}"
    )
}

fn tree_directives() -> Vec<(&'static str, String)> {
    vec![
        (
            "root",
            directive(
                "model: { tier: fast }\npermissions: [\"thread.spawn.child\"]",
                "Ask the child.",
            ),
        ),
        (
            "child",
            directive("model: { tier: fast }", "Answer briefly."),
        ),
    ]
}

fn cost(input: i64, cached: i64, output: i64) -> i64 {
    input * 2000 + cached * 500 + output * 8000
}

fn project(d: &[(&'static str, String)], config: &str) -> Fixture {
    let dirs: Vec<(&str, &str)> = d.iter().map(|(n, t)| (*n, t.as_str())).collect();
    Fixture::raw(&dirs, "", config)
}

async fn run_root(fx: &Fixture) -> (weft::ThreadReport, weft::Runtime) {
    let rt = fx.runtime_configured().await;
    let report = rt
        .run("root", Map::new(), LimitSet::default())
        .await
        .unwrap();
    (report, rt)
}

fn no_key_on_disk(fx: &Fixture) {
    for entry in walk(&fx.root().join(".weft")) {
        let text = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(KEY),
            "API key found in {}",
            entry.display()
        );
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_tool_tree_runs_with_exact_spend() {
    let (base, fake) = fake_llm::start().await;
    let spawn_args = json!({ "directive": "child", "inputs": {}, "wait": true });
    fake.stream(fake_llm::openai(
        "",
        Some(("spawn_thread", spawn_args)),
        120,
        20,
        30,
    ));
    fake.stream(fake_llm::openai(
        "The child's answer is 42.",
        None,
        50,
        0,
        10,
    ));
    fake.stream(fake_llm::openai("Done: 42.", None, 300, 100, 15));
    let fx = project(&tree_directives(), &config("openai", &base, ""));
    let (report, rt) = run_root(&fx).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(report.result.as_deref(), Some("Done: 42."));
    // Usage: root (100 + 20 cached, 30) + (200 + 100 cached, 15); child (50, 10).
    assert_eq!((report.input_tokens, report.output_tokens), (300, 45));
    assert_eq!(
        report.spend_nanos.0,
        cost(100, 20, 30) + cost(200, 100, 15) + cost(50, 0, 10)
    );
    let seen = fake.seen();
    assert_eq!(seen.len(), 3);
    let first = &seen[0];
    assert_eq!(first.path, "/v1/chat/completions");
    assert_eq!(
        first.headers["authorization"],
        format!("Bearer {KEY}").as_str()
    );
    assert_eq!(first.headers["x-extra"], "yes");
    assert_eq!(first.body["model"], "m1");
    assert_eq!(first.body["stream"], true);
    assert_eq!(first.body["stream_options"]["include_usage"], true);
    assert!(first.body["max_tokens"].as_u64().unwrap() <= 500);
    assert!(first.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["function"]["name"] == "spawn_thread"));
    // The third request carries the assistant's tool call (null content) and the tool result.
    let msgs = seen[2].body["messages"].as_array().unwrap();
    let assistant = msgs.iter().find(|m| m["role"] == "assistant").unwrap();
    assert!(assistant["content"].is_null());
    assert_eq!(assistant["tool_calls"][0]["id"], "call_abc");
    assert_eq!(
        serde_json::from_str::<Value>(
            assistant["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap()
        )
        .unwrap()["directive"],
        "child"
    );
    let tool = msgs.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool["tool_call_id"], "call_abc");
    assert!(tool["content"]
        .as_str()
        .unwrap()
        .contains("The child's answer is 42."));
    let calls: Vec<Value> = fx
        .events(report.thread_id.as_str())
        .into_iter()
        .filter(|e| e["type"] == "llm_call")
        .collect();
    assert!(
        calls
            .iter()
            .all(|c| c["stream_deltas"].as_u64().unwrap() > 1),
        "deltas were streamed"
    );
    let (v, open) = rt.audit().await;
    assert!(v.is_empty() && open == 0);
    assert!(fx.verify_all().is_empty());
    no_key_on_disk(&fx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_tool_tree_runs_with_exact_spend() {
    let (base, fake) = fake_llm::start().await;
    let spawn_args = json!({ "directive": "child", "wait": true });
    fake.stream(fake_llm::anthropic(
        "Let me ask.",
        Some(("spawn_thread", spawn_args)),
        100,
        20,
        30,
    ));
    fake.stream(fake_llm::anthropic("42", None, 50, 0, 10));
    fake.stream(fake_llm::anthropic("Done: 42.", None, 200, 100, 15));
    let fx = project(&tree_directives(), &config("anthropic", &base, ""));
    let (report, rt) = run_root(&fx).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(
        report.spend_nanos.0,
        cost(100, 20, 30) + cost(200, 100, 15) + cost(50, 0, 10)
    );
    let seen = fake.seen();
    assert_eq!(seen[0].path, "/v1/messages");
    assert_eq!(seen[0].headers["x-api-key"], KEY);
    assert_eq!(
        seen[0].headers["anthropic-version"],
        weft::internals::ANTHROPIC_API_VERSION
    );
    assert_eq!(seen[0].body["stream"], true);
    assert!(seen[0].body["system"].as_str().unwrap().contains("root"));
    let msgs = seen[2].body["messages"].as_array().unwrap();
    let assistant = &msgs[1];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["content"][1]["type"], "tool_use");
    assert_eq!(
        assistant["content"][1]["input"]["directive"], "child",
        "input_json_delta pieces assembled"
    );
    let result = &msgs[2]["content"][0];
    assert_eq!(
        (result["type"].as_str(), result["tool_use_id"].as_str()),
        (Some("tool_result"), Some("toolu_1"))
    );
    let (v, open) = rt.audit().await;
    assert!(v.is_empty() && open == 0);
    no_key_on_disk(&fx);
}

fn solo() -> Vec<(&'static str, String)> {
    vec![("root", directive("model: { tier: fast }", "Say hi."))]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_errors_are_retried_with_retry_after_and_bounded() {
    for kind in ["openai", "anthropic"] {
        let (base, fake) = fake_llm::start().await;
        let ok = fake_llm::reply(kind, "hi", 10, 0, 2);
        fake.push(Reply::Status {
            code: 429,
            retry_after: Some("0.05"),
            body: r#"{"error":{"message":"slow down"}}"#.into(),
        });
        fake.push(Reply::Status {
            code: 529,
            retry_after: None,
            body: r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
                .into(),
        });
        fake.push(Reply::Status {
            code: 500,
            retry_after: None,
            body: "oops".into(),
        });
        fake.push(Reply::Sse {
            events: ok,
            gap: Duration::ZERO,
            drop_after: None,
        });
        let fx = project(&solo(), &config(kind, &base, "retries: 3\n"));
        let started = Instant::now();
        let (report, _rt) = run_root(&fx).await;
        assert_eq!(report.status, Status::Completed, "{kind}: {report:?}");
        assert_eq!(fake.seen().len(), 4);
        let retries: Vec<Value> = fx
            .events(report.thread_id.as_str())
            .into_iter()
            .filter(|e| e["type"] == "llm_retry")
            .collect();
        let kinds: Vec<&str> = retries
            .iter()
            .map(|e| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["rate_limited", "overloaded", "server"], "{kind}");
        assert_eq!(retries[0]["retry_after_ms"], 50, "retry-after honoured");
        assert!(started.elapsed() >= Duration::from_millis(50));
        // Bounded: with one retry, the second failure ends the thread.
        let (base, fake) = fake_llm::start().await;
        fake.push(Reply::Status {
            code: 503,
            retry_after: Some("0"),
            body: "down".into(),
        });
        fake.push(Reply::Status {
            code: 503,
            retry_after: Some("0"),
            body: "down".into(),
        });
        fake.push(Reply::Status {
            code: 503,
            retry_after: Some("0"),
            body: "down".into(),
        });
        let fx = project(&solo(), &config(kind, &base, "retries: 1\n"));
        let (report, _rt) = run_root(&fx).await;
        assert_eq!(report.status, Status::Error);
        assert_eq!(fake.seen().len(), 2, "{kind}: one try + one retry");
        assert!(report.error.unwrap().contains("HTTP 503"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_errors_end_the_thread_with_what_to_fix() {
    let (base, fake) = fake_llm::start().await;
    fake.push(Reply::Status {
        code: 401,
        retry_after: None,
        body: r#"{"error":{"message":"invalid api key"}}"#.into(),
    });
    let fx = project(&solo(), &config("openai", &base, ""));
    let (report, _rt) = run_root(&fx).await;
    assert_eq!(report.status, Status::Error);
    let err = report.error.unwrap();
    assert!(err.contains("Auth") && err.contains("api_key_env"), "{err}");
    assert!(!err.contains(KEY));
    assert_eq!(fake.seen().len(), 1, "auth errors are not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dropped_midway_is_retried_and_partial_usage_is_settled() {
    let (base, fake) = fake_llm::start().await;
    // Anthropic reports input usage at message_start: the dropped attempt still costs that.
    fake.push(Reply::Sse {
        events: fake_llm::anthropic("this will be cut", None, 70, 0, 9),
        gap: Duration::from_millis(20),
        drop_after: Some(4),
    });
    fake.push(Reply::Sse {
        events: fake_llm::anthropic("whole", None, 70, 0, 3),
        gap: Duration::ZERO,
        drop_after: None,
    });
    let fx = project(&solo(), &config("anthropic", &base, "retries: 2\n"));
    let (report, rt) = run_root(&fx).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(report.result.as_deref(), Some("whole"));
    let retry = fx
        .events(report.thread_id.as_str())
        .into_iter()
        .find(|e| e["type"] == "llm_retry")
        .unwrap();
    assert_eq!(retry["kind"], "connection", "{retry}");
    assert!(
        retry["message"]
            .as_str()
            .unwrap()
            .contains("stream interrupted"),
        "{retry}"
    );
    // First attempt: 70 in (reported at message_start) and, its output never reported, every
    // output token granted (500); second: 70 in + 3 out.
    assert_eq!(report.spend_nanos.0, cost(70, 0, 500) + cost(70, 0, 3));
    let (v, open) = rt.audit().await;
    assert!(v.is_empty() && open == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_a_slow_stream_ends_promptly_and_closes_the_connection() {
    for kind in ["openai", "anthropic"] {
        let (base, fake) = fake_llm::start().await;
        let slow = fake_llm::reply(kind, "a very slow answer", 10, 0, 5);
        fake.push(Reply::Sse {
            events: slow,
            gap: Duration::from_secs(5),
            drop_after: None,
        });
        let fx = project(&solo(), &config(kind, &base, ""));
        let rt = fx.runtime_configured().await;
        let handle = rt
            .start("root", Map::new(), LimitSet::default())
            .await
            .unwrap();
        let id = handle.id().clone();
        let done = handle.wait();
        let t0 = Instant::now();
        while fake.seen().is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(5));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await; // the first chunk is out
        let started = Instant::now();
        rt.cancel(&id, "test");
        let report = done.await.unwrap();
        assert_eq!(report.status, Status::Cancelled);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{kind}: cancel took {:?}",
            started.elapsed()
        );
        let t1 = Instant::now();
        while fake.closed_early.load(Ordering::SeqCst) == 0 {
            assert!(
                t1.elapsed() < Duration::from_secs(3),
                "{kind}: the server never saw the connection close"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(fake.seen().len(), 1, "a cancelled call is not retried");
        // The server took the call and may bill it: never recorded as free.
        let call = fx
            .events(id.as_str())
            .into_iter()
            .find(|e| e["type"] == "llm_call")
            .unwrap();
        assert_eq!(call["usage_incomplete"], true, "{kind}: {call}");
        assert!(
            report.spend_nanos.0 >= cost(0, 0, 500),
            "{kind}: {report:?}"
        );
        let (v, open) = rt.audit().await;
        assert!(v.is_empty() && open == 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_errors_stop_before_any_thread_starts() {
    let d = solo();
    let dirs: Vec<(&str, &str)> = d.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let base = "http://127.0.0.1:9";
    // Missing key.
    let cfg = config("openai", base, "").replace("WEFT_TEST_FAKE_KEY", "WEFT_TEST_UNSET_KEY_VAR");
    let fx = Fixture::raw(&dirs, "", &cfg);
    let rt = fx.runtime_configured().await;
    let e = rt
        .run("root", Map::new(), LimitSet::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("WEFT_TEST_UNSET_KEY_VAR") && e.contains("not set"),
        "{e}"
    );
    assert!(fx.rows().is_empty());
    // Unknown provider.
    let fx = Fixture::raw(
        &[(
            "root",
            &directive("model: { id: m1, provider: nowhere }", "x"),
        )],
        "",
        &config("openai", base, ""),
    );
    let rt = fx.runtime_configured().await;
    let e = rt
        .run("root", Map::new(), LimitSet::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("provider `nowhere`") && e.contains("not configured"),
        "{e}"
    );
    // Unpriced model.
    let fx = Fixture::raw(
        &[("root", &directive("model: { id: m2 }", "x"))],
        "",
        &config("openai", base, ""),
    );
    let rt = fx.runtime_configured().await;
    let e = rt
        .run("root", Map::new(), LimitSet::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("model `m2` has no price"), "{e}");
    assert!(fx.rows().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spend_a_provider_does_not_report_is_settled_at_its_bound_never_free() {
    // OpenAI-compatible server that ignores stream_options.include_usage: the whole answer is
    // kept (not retried as a connection error), settled at the prompt bound + every granted
    // output token.
    let (base, fake) = fake_llm::start().await;
    let mut no_usage = fake_llm::openai("hello there", None, 10, 0, 2);
    no_usage.retain(|e| !e.contains("\"usage\""));
    fake.stream(no_usage);
    let fx = project(&solo(), &config("openai", &base, "retries: 2\n"));
    let (report, rt) = run_root(&fx).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(report.result.as_deref(), Some("hello there"));
    assert_eq!(fake.seen().len(), 1, "a whole answer is not retried");
    let call = fx
        .events(report.thread_id.as_str())
        .into_iter()
        .find(|e| e["type"] == "llm_call")
        .unwrap();
    assert_eq!(call["usage_incomplete"], true, "{call}");
    let input = call["usage"]["input_tokens"].as_i64().unwrap();
    assert!(input > 10, "the prompt bound, not a guess: {call}");
    assert_eq!(call["usage"]["output_tokens"], 500, "{call}");
    assert_eq!(report.spend_nanos.0, cost(input, 0, 500));
    let (v, open) = rt.audit().await;
    assert!(v.is_empty() && open == 0);

    // Anthropic stream that ends without message_stop: cut short, retried, and the cut attempt
    // costs its reported input plus every granted output token.
    let (base, fake) = fake_llm::start().await;
    let mut cut = fake_llm::anthropic("half an ans", None, 70, 0, 9);
    cut.retain(|e| !e.contains("message_stop") && !e.contains("message_delta"));
    fake.stream(cut);
    fake.stream(fake_llm::anthropic("whole", None, 70, 0, 3));
    let fx = project(&solo(), &config("anthropic", &base, "retries: 2\n"));
    let (report, _rt) = run_root(&fx).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(report.result.as_deref(), Some("whole"));
    let retry = fx
        .events(report.thread_id.as_str())
        .into_iter()
        .find(|e| e["type"] == "llm_retry")
        .expect("the cut stream is retried");
    assert!(
        retry["message"].as_str().unwrap().contains("message_stop"),
        "{retry}"
    );
    assert_eq!(report.spend_nanos.0, cost(70, 0, 500) + cost(70, 0, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tool_calls_with_one_id_each_get_an_answer() {
    let (base, fake) = fake_llm::start().await;
    let data = |v: Value| format!("data: {v}\n\n");
    let mut events = vec![data(
        json!({"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}),
    )];
    for i in 0..2 {
        events.push(data(json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":i,"id":"call_same","type":"function","function":{"name":"no_such_tool","arguments":"{}"}}]}}]})));
    }
    events.push(data(
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
    ));
    events.push(data(
        json!({"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":4}}),
    ));
    events.push("data: [DONE]\n\n".into());
    fake.stream(events);
    fake.stream(fake_llm::openai("done", None, 30, 0, 1));
    let fx = project(&solo(), &config("openai", &base, ""));
    let (report, _rt) = tokio::time::timeout(Duration::from_secs(20), run_root(&fx))
        .await
        .expect("the thread waited forever for a second result under the same id");
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let results: Vec<String> = fx
        .events(report.thread_id.as_str())
        .into_iter()
        .filter(|e| e["type"] == "tool_result")
        .map(|e| e["id"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert_ne!(results[0], results[1]);
    // The second request answers both calls, each under its own id.
    let second = &fake.seen()[1].body;
    let ids: Vec<&str> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
}

/// A provider that ignores cancellation and never answers.
struct Deaf;

impl weft::Provider for Deaf {
    fn name(&self) -> &str {
        "deaf"
    }
    fn prompt_token_bound(&self, _req: &weft::LlmRequest, _overhead: u64) -> u64 {
        100
    }
    fn complete(
        &self,
        _req: weft::LlmRequest,
        _cancel: weft::CancellationToken,
    ) -> weft::BoxFuture<Result<weft::LlmResponse, weft::ProviderError>> {
        Box::pin(std::future::pending())
    }
}

/// A call whose provider ignores the cancel past the grace is abandoned, not forgotten: the
/// thread ends `cancelled` within the grace, and the call is recorded and settled at its upper
/// bound (what the server may have billed), never as $0, with nothing left reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_ignores_the_cancel_is_abandoned_at_its_upper_bound() {
    let d = crate::support::directive("limits: { spend: 0.50 }", "Go.");
    let fx = crate::support::Fixture::raw(
        &[("stuck", &d)],
        "",
        "pricing:\n  m1: { input: 1.00, output: 2.00 }\ncancel_grace: 300ms\n",
    );
    let rt = weft::Runtime::builder(fx.project())
        .custom_provider(std::sync::Arc::new(Deaf))
        .model("m1")
        .open()
        .await
        .unwrap();
    let handle = rt
        .start("stuck", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().to_string();
    crate::support::wait_until("the call is under way", || {
        fx.events(&id).iter().any(|e| e["type"] == "turn_started")
            || fx.rows().iter().any(|r| r.status == "running")
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    handle.cancel("stop");
    let report = tokio::time::timeout(std::time::Duration::from_secs(5), handle.wait())
        .await
        .expect("the thread ends although its provider never returns")
        .unwrap();
    assert_eq!(report.status, weft::Status::Cancelled, "{report:?}");
    let call = fx
        .events(&id)
        .into_iter()
        .find(|e| e["type"] == "llm_call")
        .expect("the abandoned call is in the transcript");
    assert_eq!(call["usage_incomplete"], true, "{call}");
    let out = call["usage"]["output_tokens"].as_i64().unwrap();
    assert!(out > 0, "every output token granted is billed: {call}");
    let expected = 100 * 1_000 + out * 2_000;
    assert_eq!(call["cost_nanos"].as_i64(), Some(expected), "{call}");
    assert_eq!(report.spend_nanos.0, expected);
    let (violations, open) = rt.audit().await;
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(open, 0, "nothing left reserved");
}

/// Anthropic bills tokens written to its prompt cache at 1.25× the input price: a response
/// reporting `cache_creation_input_tokens` to a model of the built-in table is charged so, and
/// the table carries Anthropic's documented tool-use system prompt (346 tokens; 530 on Claude 3
/// models) as each call's overhead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_cache_writes_cost_a_quarter_more_than_input() {
    let (base, fake) = fake_llm::start().await;
    let mut events = fake_llm::anthropic("cached", None, 100, 20, 10);
    events[0] = events[0].replace(
        "\"cache_creation_input_tokens\":0",
        "\"cache_creation_input_tokens\":40",
    );
    assert!(events[0].contains(":40"), "{}", events[0]);
    fake.stream(events);
    // claude-haiku-4-5 as built in: $1/M in, $1.25/M cache write, $0.10/M cache read, $5/M out.
    let config = config("anthropic", &base, "").replace("fast: m1", "fast: claude-haiku-4-5");
    let fx = project(&solo(), &config);
    let (report, _rt) = run_root(&fx).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(
        report.spend_nanos.0,
        100 * 1000 + 40 * 1250 + 20 * 100 + 10 * 5000
    );

    let c = weft::Config::default();
    for (model, overhead) in [
        ("claude-haiku-4-5", 346),
        ("claude-sonnet-4-5-20250929", 346),
        ("claude-opus-4-1", 346),
        ("claude-3-5-haiku-latest", 530),
        ("claude-3-opus-20240229", 530),
    ] {
        assert!(c.prompt_overhead_of(model) >= overhead, "{model}");
    }
    assert_eq!(c.prompt_overhead_of("gpt-5-mini"), 256);
    for model in ["claude-haiku-4-5", "claude-sonnet-4-5", "claude-opus-4-1"] {
        let p = serde_json::to_value(c.price(model).unwrap()).unwrap();
        let (write, input) = (p["cache_write"].as_i64(), p["input"].as_i64().unwrap());
        assert_eq!(write, Some(input * 5 / 4), "{model}: {p}");
    }
}

/// A model's tool call whose arguments nest deeper than weft takes (64 levels) is answered
/// with an error naming the limit, and never stored: every transcript line and the thread.json
/// stay readable and verify (serde_json refuses to read JSON nested 128 deep, and the
/// arguments sit a level or two down in a line and in thread.json's outputs). The model's next,
/// shallow call completes the thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_nested_too_deep_are_refused_and_every_record_stays_readable() {
    let (base, fake) = fake_llm::start().await;
    let mut deep = json!("bottom");
    for _ in 0..126 {
        deep = json!([deep]);
    }
    // The deep call, then a shallow one.
    for args in [json!({ "ok": true, "x": deep }), json!({ "ok": true })] {
        let reply = fake_llm::openai("", Some(("directive_return", args)), 10, 0, 5);
        fake.stream(reply);
    }
    let root = directive(
        "model: { tier: fast }\noutputs:\n  ok: { type: boolean, required: true }",
        "Return ok.",
    );
    let fx = project(&[("root", root)], &config("openai", &base, ""));
    let (report, _rt) = run_root(&fx).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(
        report.outputs,
        Some(json!({ "ok": true })),
        "the shallow call's outputs"
    );
    let results = fx.tool_results(report.thread_id.as_str());
    assert!(
        results[0].contains("nest") && results[0].contains("64"),
        "the deep call is refused with the limit: {results:?}"
    );
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
}

/// A `set_env` whose arguments are not JSON is answered with an error that does not echo them,
/// and its arguments never reach the transcript: a secret in them cannot be hidden field by
/// field (a `set_env` that parses has its secret value hidden as `[secret:NAME]`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_env_that_is_not_json_never_writes_its_secret() {
    const SECRET: &str = "sk-live-0123456789abcdefSECRET";
    let (base, fake) = fake_llm::start().await;
    let raw = format!(r#"{{"name":"TOKEN","value":"{SECRET}","secret":true"#); // no closing brace
    fake.stream(fake_llm::openai_raw("", Some(("set_env", raw)), 10, 0, 5));
    fake.stream(fake_llm::openai("Done.", None, 10, 0, 5));
    let root = directive(
        "model: { tier: fast }\npermissions: [\"env.set\"]",
        "Set it.",
    );
    let fx = project(&[("root", root)], &config("openai", &base, ""));
    let (report, _rt) = run_root(&fx).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let results = fx.tool_results(report.thread_id.as_str());
    assert!(results[0].contains("were not used"), "{results:?}");
    for entry in walk(&fx.root().join(".weft")) {
        let text = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(SECRET),
            "the secret is in {}",
            entry.display()
        );
    }
}
