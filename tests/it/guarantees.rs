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
