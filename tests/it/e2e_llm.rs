//! End to end against a real llama.cpp server (`../shared/tools/llm-server.sh start`), through
//! a recording proxy: the `openai` and the `anthropic` providers complete a thread, weft records
//! exactly the usage the server reported, spend is tokens × price, deltas were streamed, and
//! cancelling a long generation stops it. Asserts protocol and accounting, never the wording.
//!
//! `.ci/run` starts the server and sets `WEFT_LLM_URL`; without it the test says why it did not
//! run (e.g. a plain local `cargo test`).

use crate::support::{directive, Fixture};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft::LimitSet;
use weft::Status;

#[derive(Default)]
struct Proxy {
    upstream: String,
    /// Raw response text of each request, as the server sent it.
    streams: Mutex<Vec<Arc<Mutex<String>>>>,
    /// Responses whose client went away before the server finished.
    closed_early: AtomicUsize,
}

struct Guard(Arc<Proxy>, bool);
impl Drop for Guard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.closed_early.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn forward(
    State(p): State<Arc<Proxy>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let client = reqwest::Client::new();
    let mut req = client
        .post(format!("{}{}", p.upstream, uri.path()))
        .body(body.to_vec());
    for (k, v) in headers.iter() {
        if k == "content-type"
            || k.as_str().starts_with("anthropic")
            || k == "authorization"
            || k == "x-api-key"
        {
            req = req.header(k.as_str(), v.as_bytes());
        }
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            return Response::builder()
                .status(502)
                .body(Body::from(e.to_string()))
                .unwrap()
        }
    };
    let status = resp.status().as_u16();
    let log = Arc::new(Mutex::new(String::new()));
    p.streams.lock().unwrap().push(log.clone());
    let upstream = resp.bytes_stream();
    let state = (upstream, log, Guard(p.clone(), false));
    // Marks the stream finished when the server's body ended (read by Guard's Drop).
    fn finish(mut g: Guard) {
        g.1 = true;
    }
    let stream = futures_util::stream::unfold(state, |(mut up, log, guard)| async move {
        match up.next().await {
            Some(Ok(b)) => {
                log.lock().unwrap().push_str(&String::from_utf8_lossy(&b));
                Some((Ok::<Bytes, std::io::Error>(b), (up, log, guard)))
            }
            Some(Err(e)) => Some((Err(std::io::Error::other(e.to_string())), (up, log, guard))),
            None => {
                finish(guard);
                None
            }
        }
    });
    Response::builder()
        .status(status)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

async fn start_proxy(upstream: &str) -> (String, Arc<Proxy>) {
    let p = Arc::new(Proxy {
        upstream: upstream.trim_end_matches('/').to_string(),
        ..Default::default()
    });
    let app = axum::Router::new().fallback(forward).with_state(p.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), p)
}

/// (input, output, cache_read) as the server reported them in one recorded stream.
fn reported_usage(kind: &str, raw: &str) -> (u64, u64, u64) {
    let mut u = (0, 0, 0);
    for line in raw.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let n = |p: &str| v.pointer(p).and_then(Value::as_u64);
        if kind == "openai" {
            if let Some(prompt) = n("/usage/prompt_tokens") {
                let cached = n("/usage/prompt_tokens_details/cached_tokens").unwrap_or(0);
                u = (
                    prompt - cached,
                    n("/usage/completion_tokens").unwrap_or(0),
                    cached,
                );
            }
        } else {
            if v["type"] == "message_start" {
                u.0 = n("/message/usage/input_tokens").unwrap_or(0)
                    + n("/message/usage/cache_creation_input_tokens").unwrap_or(0);
                u.2 = n("/message/usage/cache_read_input_tokens").unwrap_or(0);
                u.1 = n("/message/usage/output_tokens").unwrap_or(0);
            }
            if v["type"] == "message_delta" {
                if let Some(o) = n("/usage/output_tokens") {
                    u.1 = o;
                }
            }
        }
    }
    u
}

/// The server has one slot: the e2e tests take turns.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn server() -> Option<String> {
    match std::env::var("WEFT_LLM_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            crate::support::skip(
                "e2e_llm: SKIPPED — WEFT_LLM_URL is not set. `.ci/run` starts the real server with ../shared/tools/llm-server.sh and sets it; to run here: WEFT_LLM_URL=$(../shared/tools/llm-server.sh start) cargo test e2e_llm"
            );
            None
        }
    }
}

pub fn config(kind: &str, base: &str, max_out: u64) -> String {
    let base = if kind == "openai" {
        format!("{base}/v1")
    } else {
        base.to_string()
    };
    format!(
        "defaults:\n  provider: local\n  max_output_tokens: {max_out}\nproviders:\n  local: {{ kind: {kind}, base_url: \"{base}\", tiers: {{ fast: smollm2 }}, read_timeout: 60s }}\npricing:\n  smollm2: {{ input: 0.10, output: 0.40, cache_read: 0.01 }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_server_through_both_providers() {
    let Some(url) = server() else { return };
    let _serial = SERIAL.lock().await;
    for kind in ["openai", "anthropic"] {
        let (base, proxy) = start_proxy(&url).await;
        let d = directive(
            "model: { tier: fast }\nlimits: { turns: 2 }",
            "Name three colours.",
        );
        let fx = Fixture::raw(&[("colours", &d)], "", &config(kind, &base, 48));
        // A secret is set, so streamed text goes through the redactor's hold-back (a secret's
        // possible start is kept until the next delta or the end of the call).
        weft::FileStore::open(&fx.project())
            .unwrap()
            .env_set(
                &weft::Scope::Project,
                "NEVER_SAID",
                "zq-never-said-41f7",
                true,
            )
            .unwrap();
        let rt = fx.runtime_configured().await;
        let mut live = rt.events();
        let report = rt
            .run("colours", Map::new(), LimitSet::default())
            .await
            .unwrap();
        assert_eq!(report.status, Status::Completed, "{kind}: {report:?}");
        // Streamed text reaches live clients as it arrives, delta by delta, and adds up to
        // exactly the text the transcript keeps (nothing held back is lost or doubled).
        let (mut streamed, mut deltas) = (String::new(), 0);
        while let Ok(ev) = live.try_recv() {
            if let weft::Event::Token { text, .. } = ev {
                streamed.push_str(&text);
                deltas += 1;
            }
        }
        let kept: String = fx
            .events(report.thread_id.as_str())
            .iter()
            .filter(|e| e["type"] == "assistant_text")
            .map(|e| e["text"].as_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(streamed, kept, "{kind}: streamed text = kept text");
        if kept.chars().count() > 8 {
            assert!(deltas > 1, "{kind}: {deltas} delta(s) for {kept:?}");
        }
        let calls: Vec<Value> = fx
            .events(report.thread_id.as_str())
            .into_iter()
            .filter(|e| e["type"] == "llm_call")
            .collect();
        let streams = proxy.streams.lock().unwrap().clone();
        assert_eq!(
            calls.len(),
            streams.len(),
            "{kind}: one recorded stream per call"
        );
        let mut expected = 0i64;
        for (call, raw) in calls.iter().zip(&streams) {
            let (i, o, c) = reported_usage(kind, &raw.lock().unwrap());
            assert!(i + c > 0 && o > 0, "{kind}: the server reported usage");
            let u = &call["usage"];
            assert_eq!(
                (
                    u["input_tokens"].as_u64().unwrap(),
                    u["output_tokens"].as_u64().unwrap(),
                    u["cache_read_tokens"].as_u64().unwrap()
                ),
                (i, o, c),
                "{kind}: recorded usage equals the server's"
            );
            assert!(
                call["stream_deltas"].as_u64().unwrap() > 1,
                "{kind}: deltas streamed"
            );
            let call_cost =
                (i as i64 * 100_000_000 + o as i64 * 400_000_000 + c as i64 * 10_000_000 + 999_999)
                    / 1_000_000;
            assert_eq!(call["cost_nanos"].as_i64().unwrap(), call_cost);
            expected += call_cost;
        }
        assert_eq!(
            report.spend_nanos.0, expected,
            "{kind}: spend = tokens × price"
        );
        assert!(fx.verify_all().is_empty());
        eprintln!(
            "e2e_llm {kind}: {} calls, {} in / {} out tokens, {}",
            calls.len(),
            report.input_tokens,
            report.output_tokens,
            report.spend_nanos
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_long_real_generation_stops_it() {
    let Some(url) = server() else { return };
    let _serial = SERIAL.lock().await;
    for kind in ["openai", "anthropic"] {
        let (base, proxy) = start_proxy(&url).await;
        let d = directive(
            "model: { tier: fast }",
            "Write a very long story about a lighthouse keeper, with many chapters.",
        );
        let fx = Fixture::raw(&[("story", &d)], "", &config(kind, &base, 3000));
        let rt = fx.runtime_configured().await;
        let handle = rt
            .start("story", Map::new(), LimitSet::default())
            .await
            .unwrap();
        let id = handle.id().clone();
        let done = handle.wait();
        // Wait until text is streaming.
        let t0 = Instant::now();
        loop {
            let streamed = proxy
                .streams
                .lock()
                .unwrap()
                .first()
                .map_or(0, |s| s.lock().unwrap().len());
            if streamed > 400 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{kind}: no stream from the server"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let started = Instant::now();
        rt.cancel(&id, "test");
        let report = done.await.unwrap();
        assert_eq!(report.status, Status::Cancelled);
        // Prompt even while the model saturates both cores (alone it is ~50 ms).
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{kind}: cancel took {:?}",
            started.elapsed()
        );
        // The server billed the prompt and what it generated before the cancel: recorded at
        // the call's bound, never as a free call.
        let streamed = proxy.streams.lock().unwrap()[0].lock().unwrap().clone();
        let deltas = streamed.matches("\"content\":\"").count() as u64
            + streamed.matches("text_delta").count() as u64;
        let call = fx
            .events(id.as_str())
            .into_iter()
            .find(|e| e["type"] == "llm_call")
            .expect("the cancelled call is recorded");
        assert_eq!(call["usage_incomplete"], true, "{kind}: {call}");
        assert!(
            report.output_tokens >= deltas && report.input_tokens > 0,
            "{kind}: {deltas} deltas streamed, recorded {report:?}"
        );
        assert!(report.spend_nanos.0 > 0);
        let t1 = Instant::now();
        while proxy.closed_early.load(Ordering::SeqCst) == 0 {
            assert!(
                t1.elapsed() < Duration::from_secs(5),
                "{kind}: the connection was not closed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The server's only slot is free again: a tiny request answers at once instead of
        // queueing behind thousands of tokens of story.
        let t2 = Instant::now();
        let tiny = serde_json::json!({"model":"x","messages":[{"role":"user","content":"Hi"}],"max_tokens":4});
        let r = reqwest::Client::new()
            .post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(tiny.to_string())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        let waited = t2.elapsed();
        assert!(
            waited < Duration::from_secs(5),
            "{kind}: generation went on after cancel ({waited:?} for a 4-token reply)"
        );
        eprintln!(
            "e2e_llm cancel {kind}: finalized in {:?}, next request answered in {waited:?}",
            started.elapsed()
        );
    }
}

/// SPEC §5 against a real tokenizer: leaves run on the real model under a root cap their prompts
/// nearly fill (1,000 hex digits tokenize to about one token per byte). Every reservation is an
/// upper bound, so the tree ends within its cap and no call overruns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_on_the_real_model_ends_within_its_root_cap() {
    let Some(url) = server() else { return };
    let _serial = SERIAL.lock().await;
    let hex: String = (0..1000u32)
        .map(|i| char::from_digit((i * 7 + 3) % 16, 16).unwrap())
        .collect();
    let root = directive(
        "model: { provider: script }\nlimits: { spend: 0.004, turns: 4 }\npermissions: [\"thread.spawn.leaf\"]",
        "Fan out.",
    );
    let leaf = directive(
        "model: { tier: fast }\nlimits: { turns: 1 }",
        &format!("Repeat these digits: {hex}"),
    );
    let script = r#"
root:
  - usage: { input_tokens: 10, output_tokens: 10 }
    tool_calls:
      - { name: spawn_thread, input: { directive: leaf, wait: false } }
      - { name: spawn_thread, input: { directive: leaf, wait: false } }
      - { name: spawn_thread, input: { directive: leaf, wait: false } }
  - usage: { input_tokens: 10, output_tokens: 10 }
    tool_calls: [ { name: wait_threads, input: {} } ]
  - text: done
    usage: { input_tokens: 10, output_tokens: 10 }
"#;
    let config = format!(
        "defaults:\n  provider: local\n  max_output_tokens: 400\nproviders:\n  local: {{ kind: openai, base_url: \"{url}/v1\", tiers: {{ fast: smollm2 }}, read_timeout: 60s }}\n  script: {{ kind: scripted, script: script.yaml }}\npricing:\n  smollm2: {{ input: 1.00, output: 2.00 }}\n  scripted: {{ input: 1.00, output: 2.00 }}\n"
    );
    // The same promise with the ledger on either backend.
    for backend in crate::support::BACKENDS {
        let Some(fx) = Fixture::raw_on(
            backend,
            &[("root", &root), ("leaf", &leaf)],
            script,
            &config,
        ) else {
            return;
        };
        let rt = fx.runtime_configured().await;
        let report = rt
            .run("root", Map::new(), LimitSet::default())
            .await
            .unwrap();
        let cap = 4_000_000;
        let mut real_calls = 0;
        for r in fx.rows() {
            for e in fx.events(&r.id) {
                assert_ne!(e["type"], "spend_overrun", "{}: {e}", r.id);
                if e["type"] == "llm_call" && r.directive == "leaf" {
                    real_calls += 1;
                }
            }
            assert!(r.status.is_terminal(), "{} {}", r.id, r.status);
            eprintln!("e2e_llm cap: {} {} {:?}", r.directive, r.status, r.error);
        }
        eprintln!(
        "e2e_llm cap ({backend:?}): root {:?}, tree spent {} of {cap} nanos in {real_calls} real calls",
        report.status, report.spend_nanos.0
    );
        assert!(real_calls > 0, "at least one leaf called the real model");
        assert!(
            report.spend_nanos.0 <= cap,
            "the tree spent {} > its cap {cap}",
            report.spend_nanos.0
        );
        assert_eq!(report.overrun_nanos.0, 0);
        let (violations, open) = rt.audit().await;
        assert!(violations.is_empty() && open == 0, "{violations:?} {open}");
        rt.shutdown();
    }
}

/// The built-in `openai` and `anthropic` providers of a project made by `weft init`, configured
/// only through the official SDKs' environment variables, run on the real server and are billed
/// at the built-in price of the model asked for.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_providers_run_from_the_sdk_environment_variables() {
    let Some(url) = server() else { return };
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let weft = |args: &[&str], env: &[(&str, String)]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_weft"));
        c.args(args)
            .env("WEFT_HOME", crate::support::weft_home())
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ANTHROPIC_BASE_URL");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let root = dir.path().to_str().unwrap().to_string();
    assert!(weft(&["init", "--project", &root], &[]).status.success());
    std::fs::write(
        dir.path().join("directives/hello.md"),
        directive("limits: { turns: 1 }", "Say hello."),
    )
    .unwrap();
    // (provider, env, model asked for, built-in price in nanos per token: in, out, cache)
    let cases = [
        (
            "openai",
            vec![
                ("OPENAI_BASE_URL", format!("{url}/v1")),
                ("OPENAI_API_KEY", "sk-local-test".to_string()),
            ],
            Some("gpt-4o-mini"),
            (150, 600, 75),
        ),
        (
            "anthropic",
            vec![
                ("ANTHROPIC_BASE_URL", url.clone()),
                ("ANTHROPIC_API_KEY", "sk-ant-local-test".to_string()),
            ],
            None, // the built-in default tier: claude-haiku-4-5
            (1000, 5000, 100),
        ),
    ];
    for (provider, env, model, (pi, po, pc)) in cases {
        let mut args = vec!["run", "hello", "--project", &root, "--provider", provider];
        args.extend(["--limit", "spend=0.05", "--limit", "tokens=1500", "--json"]);
        if let Some(m) = model {
            args.extend(["--model", m]);
        }
        let o = weft(&args, &env);
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            o.status.success(),
            "{provider}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["status"], "completed", "{provider}: {v}");
        let c = &v["cost"];
        let (i, o_, ca) = (
            c["input_tokens"].as_i64().unwrap(),
            c["output_tokens"].as_i64().unwrap(),
            c["cache_read_tokens"].as_i64().unwrap(),
        );
        assert!(i + ca > 0 && o_ > 0, "{provider}: {v}");
        assert_eq!(
            c["spend_nanos"].as_i64().unwrap(),
            i * pi + o_ * po + ca * pc,
            "{provider}: billed at the built-in price: {v}"
        );
        eprintln!("e2e_llm built-in {provider}: {c}");
    }
    // Without the key, the provider names the variable to set.
    let o = weft(
        &["run", "hello", "--project", &root, "--provider", "openai"],
        &[("OPENAI_BASE_URL", format!("{url}/v1"))],
    );
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !o.status.success() && err.contains("OPENAI_API_KEY"),
        "{err}"
    );
}
