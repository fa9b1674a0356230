//! weft's promises under hostile input and faults: what a model sends is untrusted.

use crate::support::{directive, Fixture};
use serde_json::json;
use weft::Status;

/// Runs a root whose one turn asks for `requested` children and returns (the tool results, the
/// directives that ran as children).
async fn spawn_requests(
    requested: &[&str],
    extra: &[(&str, &str)],
    perms: &str,
) -> (Vec<serde_json::Value>, Vec<String>) {
    let calls: Vec<String> = requested
        .iter()
        .map(|d| {
            format!(
                "      - {{ name: spawn_thread, input: {{ directive: {} }} }}",
                json!(d)
            )
        })
        .collect();
    let script = format!(
        "root:\n  - tool_calls:\n{}\n  - text: done\ndefault:\n  - text: child ran\n",
        calls.join("\n")
    );
    let root = directive(&format!("permissions: {perms}"), "Spawn.");
    let mut dirs = vec![("root", root.as_str())];
    dirs.extend_from_slice(extra);
    let fx = Fixture::new(&dirs, &script, "");
    let (report, _rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let root_id = report.thread_id.to_string();
    // Results in the order the calls were made (they are recorded as they complete).
    let events = fx.events(&root_id);
    let results = events
        .iter()
        .filter(|e| e["type"] == "tool_use")
        .filter_map(|u| {
            events
                .iter()
                .find(|r| r["type"] == "tool_result" && r["id"] == u["id"])
                .cloned()
        })
        .collect();
    let children = fx
        .rows()
        .into_iter()
        .filter(|r| r.id != root_id)
        .map(|r| r.directive)
        .collect();
    (results, children)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_can_spawn_library_names_only_never_a_file() {
    let outside = tempfile::tempdir().unwrap();
    let notes = outside.path().join("notes.md");
    std::fs::write(&notes, directive("description: private", "SECRET BODY")).unwrap();
    let leaf = directive("", "Leaf.");
    let absolute = notes.display().to_string();
    let requested = [
        absolute.as_str(),
        "directives/../../outside/notes.md",
        "leaf.md",
        "../leaf",
        "a//leaf",
        "/leaf",
        "",
        "leaf",
    ];
    let (results, children) =
        spawn_requests(&requested, &[("leaf", &leaf)], "[\"thread.spawn.**\"]").await;
    assert_eq!(results.len(), requested.len(), "{results:#?}");
    for (asked, r) in requested.iter().zip(&results).take(requested.len() - 1) {
        assert_eq!(r["is_error"], true, "{asked}: {r}");
        let content = r["content"].as_str().unwrap();
        assert!(
            content.contains("not a directive name"),
            "{asked}: a clear refusal, got {content}"
        );
    }
    assert_eq!(
        results.last().unwrap()["is_error"],
        false,
        "a plain name still works"
    );
    assert_eq!(children, vec!["leaf".to_string()], "only `leaf` ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spawn_capability_is_checked_on_the_name_a_directive_resolves_to() {
    // `innocent.md` renames itself in its front matter: holding `thread.spawn.innocent` does
    // not grant what it really is.
    let renamed = directive("name: admin/nuke", "Dangerous.");
    let (results, children) = spawn_requests(
        &["innocent"],
        &[("innocent", &renamed)],
        "[\"thread.spawn.innocent\"]",
    )
    .await;
    assert_eq!(results[0]["is_error"], true, "{results:?}");
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .contains("thread.spawn.admin.nuke"),
        "{results:?}"
    );
    assert!(children.is_empty(), "{children:?}");
}

/// A provider that claims a small prompt bound and bills far beyond it (a broken tokenizer
/// assumption): SPEC §5's one way past the cap. The overrun is settled, recorded, and the
/// thread makes no further call.
struct Overbiller;

impl weft::Provider for Overbiller {
    fn name(&self) -> &str {
        "overbiller"
    }
    fn prompt_token_bound(&self, _req: &weft::LlmRequest, _overhead: u64) -> u64 {
        10
    }
    fn complete(
        &self,
        _req: weft::LlmRequest,
        _cancel: weft::CancellationToken,
    ) -> weft::BoxFuture<Result<weft::LlmResponse, weft::ProviderError>> {
        Box::pin(async {
            Ok(weft::LlmResponse {
                text: String::new(),
                tool_calls: vec![weft::ToolCall {
                    id: "c1".into(),
                    name: "thread_status".into(),
                    input: json!({ "id": "x-1-1" }),
                }],
                usage: weft::Usage {
                    input_tokens: 1_000_000,
                    output_tokens: 1,
                    cache_read_tokens: 0,
                },
                stop_reason: "tool_use".into(),
                ..Default::default()
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_billing_past_its_reservation_is_recorded_and_stopped() {
    let d = directive("limits: { turns: 5, spend: 0.50 }", "Go.");
    let fx = Fixture::raw(
        &[("greedy", &d)],
        "",
        "pricing:\n  m1: { input: 1.00, output: 1.00 }\n",
    );
    let rt = weft::Runtime::builder(fx.project())
        .custom_provider(std::sync::Arc::new(Overbiller))
        .model("m1")
        .open()
        .await
        .unwrap();
    let report = rt
        .run("greedy", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(report.status, Status::Error, "{report:?}");
    assert!(
        report
            .error
            .as_deref()
            .unwrap_or("")
            .contains("spend overrun"),
        "{report:?}"
    );
    let events = fx.events(report.thread_id.as_str());
    let calls = events.iter().filter(|e| e["type"] == "llm_call").count();
    assert_eq!(calls, 1, "no call after the overrun");
    let overrun = events
        .iter()
        .find(|e| e["type"] == "spend_overrun")
        .expect("the overrun is in the transcript");
    assert!(overrun["overrun_nanos"].as_i64().unwrap() > 0);
    assert_eq!(
        report.overrun_nanos.0,
        overrun["overrun_nanos"].as_i64().unwrap()
    );
    assert_eq!(
        report.spend_nanos.0, 1_000_001_000,
        "the actual cost was settled"
    );
    assert_eq!(
        fx.doc(report.thread_id.as_str()).cost.overrun_nanos,
        report.overrun_nanos.0
    );
}
