//! weft's promises under hostile input and faults: what a model sends is untrusted.

use crate::support::{directive, wait_until, Fixture};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_spawn_leaves_the_registry_writable_by_other_processes() {
    // The parent may spawn nothing: its one spawn is refused in the registry's transaction;
    // its next call then thinks for a while, and meanwhile another process must be able to write.
    let script = "root:\n  - tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]\n  - text: done\n    delay: 3s\nleaf:\n  - text: leaf\n";
    let root = directive(
        "permissions: [\"thread.spawn.**\"]\nlimits: { spawns: 0 }",
        "Spawn.",
    );
    let leaf = directive("", "Leaf.");
    let fx = Fixture::new(&[("root", &root), ("leaf", &leaf)], script, "");
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().to_string();
    wait_until("the refusal", || {
        fx.events(&id).iter().any(|e| e["type"] == "tool_result")
    })
    .await;
    let refusal = fx
        .events(&id)
        .into_iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap();
    assert!(
        refusal["content"].as_str().unwrap().contains("spawns"),
        "{refusal}"
    );
    writable(&fx);
    // The same, deterministically: a refusal reaching an idle registry actor (in the run above,
    // a commit already queued for an earlier write may close the transaction by luck).
    let (registry, _) = weft::internals::actors(&rt);
    let row = weft::internals::ThreadRow {
        id: "leaf-1-1".into(),
        directive: "leaf".into(),
        root_id: id.clone(),
        status: "created".into(),
        ..Default::default()
    };
    let refused = ractor::call!(registry, |reply| weft::internals::RegistryMsg::Register {
        row: Box::new(row),
        admit: Some(weft::internals::Admission {
            parent: weft::ThreadId::parse(&id).unwrap(),
            spawns: 0,
            concurrency: 5,
        }),
        reply
    })
    .unwrap();
    assert!(refused.is_err());
    writable(&fx);
    let report = handle.wait().await.unwrap();
    assert_eq!(report.status, Status::Completed);
}

/// Another process can take registry.db's write lock within half a second.
fn writable(fx: &Fixture) {
    let db = rusqlite::Connection::open(fx.root().join(".weft/state/registry.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_millis(500))
        .unwrap();
    db.execute_batch("BEGIN IMMEDIATE; COMMIT;")
        .expect("another process can write registry.db");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_row_is_stored_even_when_another_process_holds_the_registry_past_its_timeout() {
    let script = "root:\n  - text: done\n    delay: 300ms\n";
    let fx = Fixture::new(&[("root", &directive("", "Hi."))], script, "");
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().to_string();
    wait_until("the thread running", || {
        fx.rows()
            .iter()
            .any(|r| r.id == id && r.status == "running")
    })
    .await;
    // Another process holds the write lock longer than the registry's 5 s busy timeout.
    let path = fx.root().join(".weft/state/registry.db");
    let holder = std::thread::spawn(move || {
        let db = rusqlite::Connection::open(path).unwrap();
        db.execute_batch("BEGIN IMMEDIATE").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(12_000));
        db.execute_batch("COMMIT").unwrap();
    });
    let report = handle.wait().await.unwrap();
    holder.join().unwrap();
    assert_eq!(report.status, Status::Completed);
    let row = fx.rows().into_iter().find(|r| r.id == id).unwrap();
    assert_eq!(
        row.status, "completed",
        "the final update was retried, not dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_thread_json_copied_into_another_thread_lends_it_nothing() {
    // A generous thread, finished, whose signed thread.json is valid under the same key.
    let rich = directive(
        "permissions: [\"thread.spawn.**\", \"fs.**\"]\nlimits: { spend: 5 }",
        "Rich.",
    );
    // A narrow parent that may spawn `leaf` only; while it thinks, the rich document is copied
    // over its own.
    let narrow = directive("permissions: [\"thread.spawn.leaf\"]", "Narrow.");
    let leaf = directive("permissions: [\"thread.spawn.**\"]", "Leaf.");
    let script = "rich:\n  - text: rich done\nnarrow:\n  - text: thinking\n    delay: 600ms\n    tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]\n  - text: narrow done\nleaf:\n  - text: leaf done\n";
    let fx = Fixture::new(
        &[("rich", &rich), ("narrow", &narrow), ("leaf", &leaf)],
        script,
        "",
    );
    let (rich_report, rt) = fx.run("rich", json!({})).await;
    assert_eq!(rich_report.status, Status::Completed);
    let handle = rt
        .start("narrow", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let narrow_id = handle.id().to_string();
    let threads = fx.root().join(".weft/threads");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    std::fs::copy(
        threads
            .join(rich_report.thread_id.as_str())
            .join("thread.json"),
        threads.join(&narrow_id).join("thread.json"),
    )
    .unwrap();
    let report = handle.wait().await.unwrap();
    let result = fx
        .events(&narrow_id)
        .into_iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap();
    assert_eq!(result["is_error"], true, "{result}");
    assert!(
        result["content"].as_str().unwrap().contains("not of"),
        "the spawn names the misplaced document: {result}"
    );
    assert!(
        fx.rows().iter().all(|r| r.directive != "leaf"),
        "no child ran on borrowed capabilities"
    );
    assert_eq!(report.status, Status::Completed);
}
