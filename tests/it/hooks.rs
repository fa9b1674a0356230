//! The hooks engine (SPEC §9): layers in order, duplicate ids refused, conditions, inject and
//! run actions, every event once at its moment, and the built-in usage record.

use crate::support::{directive, Fixture};
use serde_json::{json, Value};
use weft::Status;

fn first_user_message(fx: &Fixture, id: &str) -> String {
    fx.events(id)
        .into_iter()
        .find(|e| e["type"] == "message" && e["role"] == "user")
        .and_then(|e| e["text"].as_str().map(str::to_string))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inject_hooks_run_in_layer_order_with_conditions() {
    let api = directive(
        "hooks:\n  - { id: note, event: thread_started, action: { inject: { text: \"DIRECTIVE NOTE for {input:who}\" } } }\ninputs:\n  who: { type: string, required: true }",
        "Serve {input:who}.",
    );
    let plain = directive("", "Plain.");
    let fx = Fixture::new(
        &[("api/users", &api), ("plain", &plain)],
        "default:\n  - text: ok\n",
        "",
    );
    std::fs::write(
        fx.root().join(".weft/hooks.yaml"),
        r#"hooks:
  - id: conventions
    event: thread_started
    action: { inject: { file: CONVENTIONS.md } }
  - id: api_only
    event: thread_started
    condition: { path: directive, op: contains, value: api }
    action: { inject: { text: "API TYPES" } }
"#,
    )
    .unwrap();
    std::fs::write(fx.root().join("CONVENTIONS.md"), "PROJECT RULES").unwrap();
    let (report, _rt) = fx.run("api/users", json!({"who": "ada"})).await;
    assert_eq!(report.status, Status::Completed);
    let text = first_user_message(&fx, report.thread_id.as_str());
    assert_eq!(
        text, "DIRECTIVE NOTE for ada\n\nPROJECT RULES\n\nAPI TYPES\nServe ada.",
        "layer 1 (directive) before layer 3 (project), then definition order"
    );
    let (report, _rt) = fx.run("plain", json!({})).await;
    let text = first_user_message(&fx, report.thread_id.as_str());
    assert_eq!(
        text, "PROJECT RULES\nPlain.",
        "the condition kept API TYPES out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_id_across_layers_is_refused_naming_both() {
    let d = directive(
        "hooks:\n  - { id: conventions, event: thread_started, action: { inject: { text: \"x\" } } }",
        "Hi.",
    );
    let fx = Fixture::new(&[("d", &d)], "default:\n  - text: ok\n", "");
    std::fs::write(
        fx.root().join(".weft/hooks.yaml"),
        "hooks:\n  - { id: conventions, event: thread_started, action: { inject: { text: \"y\" } } }\n",
    )
    .unwrap();
    let rt = fx.runtime().await;
    let err = rt
        .run("d", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("hook `conventions`"), "{err}");
    assert!(
        err.contains("hooks.yaml") && err.contains("d.md"),
        "names both: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_hook_file_is_refused_at_load() {
    let fx = Fixture::new(&[("d", &directive("", "Hi."))], "default: []\n", "");
    std::fs::write(
        fx.root().join(".weft/hooks.yaml"),
        "hooks:\n  - { id: odd, event: after_step, condition: { path: turn, op: like, value: 1 }, action: { run: { argv: [\"true\"] } } }\n",
    )
    .unwrap();
    let err = weft::Runtime::open(fx.project())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("hooks.yaml: hook `odd`: condition: unknown op `like`"),
        "{err}"
    );
}

/// Every event fires exactly once at its moment: a `run` hook per event appends the event it was
/// given (as JSON on its stdin) to a log, over a tree of a root and a child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_fires_once_at_its_moment_with_its_context() {
    let root = directive(
        "permissions: [\"thread.spawn.**\"]\nlimits: { turns: 3 }",
        "Root.",
    );
    let kid = directive("", "Kid.");
    let script = r#"
root:
  - tool_calls: [ { name: spawn_thread, input: { directive: kid } } ]
  - text: root done
kid:
  - text: kid done
"#;
    let fx = Fixture::new(&[("root", &root), ("kid", &kid)], script, "");
    let mut hooks = String::from("hooks:\n");
    for ev in [
        "thread_started",
        "after_step",
        "child_finished",
        "after_complete",
    ] {
        hooks += &format!(
            "  - {{ id: log_{ev}, event: {ev}, action: {{ run: {{ argv: [sh, \"-c\", \"line=$(cat); printf '%s\\\\n' \\\"$line\\\" >> events.log\"] }} }} }}\n"
        );
    }
    std::fs::write(fx.root().join(".weft/hooks.yaml"), hooks).unwrap();
    let (report, rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed);
    rt.drain_hooks().await;
    let log = std::fs::read_to_string(fx.root().join("events.log")).unwrap();
    let events: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let root_id = report.thread_id.as_str();
    let kid_id = fx
        .rows()
        .into_iter()
        .find(|r| r.directive == "kid")
        .unwrap()
        .id;
    let count = |ev: &str, id: &str| {
        events
            .iter()
            .filter(|e| e["event"] == ev && e["thread_id"] == id)
            .count()
    };
    assert_eq!(count("thread_started", root_id), 1);
    assert_eq!(count("thread_started", &kid_id), 1);
    assert_eq!(count("after_step", root_id), 2, "one per LLM call");
    assert_eq!(count("after_step", &kid_id), 1);
    assert_eq!(count("child_finished", root_id), 1);
    assert_eq!(count("after_complete", root_id), 1);
    assert_eq!(count("after_complete", &kid_id), 1);
    assert_eq!(events.len(), 8);
    let cf = events
        .iter()
        .find(|e| e["event"] == "child_finished")
        .unwrap();
    assert_eq!(cf["child"]["id"], kid_id.as_str());
    assert_eq!(cf["child"]["status"], "completed");
    let done = events
        .iter()
        .find(|e| e["event"] == "after_complete" && e["thread_id"] == root_id)
        .unwrap();
    assert_eq!(done["status"], "completed");
    assert_eq!(done["cost"]["turns"], 2);
    // Each firing is in the thread's transcript.
    let fired = fx
        .events(root_id)
        .iter()
        .filter(|e| e["type"] == "hook_fired")
        .count();
    assert_eq!(
        fired,
        1 + 2 + 1 + 1,
        "one per firing (the built-in usage record writes its own file instead)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_usage_record_is_written_and_can_be_switched_off() {
    let d = directive("", "Hi.");
    let script = "d:\n  - text: ok\n    usage: { input_tokens: 120, output_tokens: 30 }\n";
    let fx = Fixture::new(&[("d", &d)], script, "");
    let (report, _rt) = fx.run("d", json!({})).await;
    let text = std::fs::read_to_string(fx.root().join(".weft/usage.jsonl")).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    let u = &lines[0];
    assert_eq!(u["thread_id"], report.thread_id.as_str());
    assert_eq!(u["directive"], "d");
    assert_eq!(
        (u["input_tokens"].as_u64(), u["output_tokens"].as_u64()),
        (Some(120), Some(30))
    );
    assert_eq!(u["cost_nanos"].as_i64(), Some(120 * 1_000 + 30 * 4_000));
    assert_eq!(u["turns"], 1);
    assert!(u["duration_ms"].is_u64() && u["timestamp"].is_string());

    let off = Fixture::new(
        &[("d", &d)],
        script,
        "builtin_hooks: { usage_record: false }\n",
    );
    let (report, _rt) = off.run("d", json!({})).await;
    assert_eq!(report.status, Status::Completed);
    assert!(!off.root().join(".weft/usage.jsonl").exists());
}

fn rye_hooks(name: &str) -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/rye/config/hooks_examples")
            .join(name),
    )
    .unwrap()
}

/// Rye's hook files load and behave as their documents describe: conventions injected into every
/// thread, API types only into API directives, and learnings recorded (a `project/record-learnings`
/// thread started) after threads of three turns or more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rye_hook_files_load_and_behave_as_documented() {
    // The learnings thread is the tree's work, under its authority (#22): the tree may spawn it.
    let api = directive(
        "limits: { turns: 5 }\npermissions: [\"thread.spawn.project.*\"]",
        "Build the api.",
    );
    let quick = directive("", "Quick.");
    let learn = directive("", "Record what was learned.");
    let script = r#"
api/handler:
  - tool_calls: [ { name: thread_status, input: { id: "nobody-1" } } ]
  - tool_calls: [ { name: thread_status, input: { id: "nobody-2" } } ]
  - text: api done
quick:
  - text: quick done
project/record-learnings:
  - text: learned
"#;
    let fx = Fixture::new(
        &[
            ("api/handler", &api),
            ("quick", &quick),
            ("project/record-learnings", &learn),
        ],
        script,
        "",
    );
    std::fs::write(
        fx.root().join(".weft/hooks.yaml"),
        rye_hooks("project_hooks.from_thread-lifecycle_doc.yaml"),
    )
    .unwrap();
    std::fs::create_dir_all(fx.root().join("knowledge/project")).unwrap();
    std::fs::write(
        fx.root().join("knowledge/project/conventions.md"),
        "CONVENTIONS",
    )
    .unwrap();
    std::fs::write(
        fx.root().join("knowledge/project/api-types.md"),
        "API TYPES",
    )
    .unwrap();

    let (report, rt) = fx.run("api/handler", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(report.turns, 3);
    rt.drain_hooks().await;
    let text = first_user_message(&fx, report.thread_id.as_str());
    assert_eq!(text, "CONVENTIONS\n\nAPI TYPES\nBuild the api.");
    let learned: Vec<_> = fx
        .rows()
        .into_iter()
        .filter(|r| r.directive == "project/record-learnings")
        .collect();
    assert_eq!(
        learned.len(),
        1,
        "learnings recorded once after a 3-turn thread"
    );
    assert_eq!(learned[0].status, "completed");

    let (report, rt) = fx.run("quick", json!({})).await;
    rt.drain_hooks().await;
    assert_eq!(
        first_user_message(&fx, report.thread_id.as_str()),
        "CONVENTIONS\nQuick."
    );
    let learned = fx
        .rows()
        .into_iter()
        .filter(|r| r.directive == "project/record-learnings")
        .count();
    assert_eq!(learned, 1, "a 1-turn thread records nothing");

    // The other Rye hook files load too.
    for f in [
        "project_hooks.from_test_hooks_loader.yaml",
        "project_hooks.additive.from_context-injection_doc.yaml",
    ] {
        std::fs::write(fx.root().join(".weft/hooks.yaml"), rye_hooks(f)).unwrap();
        weft::Runtime::open(fx.project())
            .await
            .unwrap_or_else(|e| panic!("{f}: {e}"));
    }
}

/// A hook's `spawn` starts a child of the hooked thread under the usual rules: with the
/// capability it runs as a child; without it the hook fails, recorded, and the thread goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_hook_starts_a_child_under_the_capability_rules() {
    let hooks = "hooks:\n  - { id: helper, event: thread_started, action: { spawn: { directive: helper, inputs: { about: \"{directive}\" } } } }";
    let allowed = directive(
        &format!("permissions: [\"thread.spawn.helper\"]\n{hooks}"),
        "Main.",
    );
    let denied = directive(&format!("permissions: []\n{hooks}"), "Main.");
    let helper = directive(
        "inputs:\n  about: { type: string, required: true }",
        "Help with {input:about}.",
    );
    let script = "allowed:\n  - text: main done\n    delay: 100ms\ndenied:\n  - text: main done\nhelper:\n  - text: helped\n";
    let fx = Fixture::new(
        &[
            ("allowed", &allowed),
            ("denied", &denied),
            ("helper", &helper),
        ],
        script,
        "",
    );
    let (report, _rt) = fx.run("allowed", json!({})).await;
    assert_eq!(report.status, Status::Completed);
    let helper_row = fx
        .rows()
        .into_iter()
        .find(|r| r.directive == "helper")
        .unwrap();
    assert_eq!(
        helper_row.parent_id.as_deref(),
        Some(report.thread_id.as_str())
    );
    assert_eq!(
        first_user_message(&fx, &helper_row.id),
        "Help with allowed."
    );

    let (report, _rt) = fx.run("denied", json!({})).await;
    assert_eq!(report.status, Status::Completed);
    let failed = fx
        .events(report.thread_id.as_str())
        .into_iter()
        .find(|e| e["type"] == "hook_failed")
        .expect("the refused spawn is recorded");
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .contains("thread.spawn.helper"),
        "{failed}"
    );
}

fn with_hooks(fx: &Fixture, yaml: &str) {
    std::fs::write(fx.root().join(".weft/hooks.yaml"), yaml).unwrap();
}

/// `control: retry` on `error` takes the failed turn again, at most three times per thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_hook_retries_a_failed_call_a_bounded_number_of_times() {
    let hooks = "hooks:\n  - { id: retry_llm, event: error, condition: { path: classification.category, op: eq, value: llm }, action: { control: retry } }\n";
    let d = directive("", "Go.");
    let once = "d:\n  - error: { kind: invalid_request, message: bad }\n  - text: recovered\n";
    let fx = Fixture::new(&[("d", &d)], once, "");
    with_hooks(&fx, hooks);
    let (report, _rt) = fx.run("d", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(report.result.as_deref(), Some("recovered"));
    let retries = fx
        .events(report.thread_id.as_str())
        .iter()
        .filter(|e| e["type"] == "hook_control" && e["action"] == "retry")
        .count();
    assert_eq!(retries, 1);

    let always = "d:\n  - error: { kind: invalid_request }\n  - error: { kind: invalid_request }\n  - error: { kind: invalid_request }\n  - error: { kind: invalid_request }\n  - text: never\n";
    let fx = Fixture::new(&[("d", &d)], always, "");
    with_hooks(&fx, hooks);
    let (report, _rt) = fx.run("d", json!({})).await;
    assert_eq!(report.status, Status::Error, "{report:?}");
    let calls = fx
        .events(report.thread_id.as_str())
        .iter()
        .filter(|e| e["type"] == "llm_call")
        .count();
    assert_eq!(calls, 4, "the first call and three retries");
}

/// `control: continue` on `limit` lifts a turns limit once; spend is never lifted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_hook_lifts_a_turns_limit_once_and_never_spend() {
    let hooks = "hooks:\n  - { id: one_more, event: limit, action: { control: continue } }\n";
    let d = directive("limits: { turns: 1 }", "Go.");
    let script = "d:\n  - tool_calls: [ { name: thread_status, input: { id: nobody-1 } } ]\n  - text: done in two\n";
    let fx = Fixture::new(&[("d", &d)], script, "");
    with_hooks(&fx, hooks);
    let (report, _rt) = fx.run("d", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(report.turns, 2);

    let three = "d:\n  - tool_calls: [ { name: thread_status, input: { id: nobody-1 } } ]\n  - tool_calls: [ { name: thread_status, input: { id: nobody-2 } } ]\n  - text: never\n";
    let fx = Fixture::new(&[("d", &d)], three, "");
    with_hooks(&fx, hooks);
    let (report, _rt) = fx.run("d", json!({})).await;
    assert_eq!(report.status, Status::Error, "lifted once only: {report:?}");
    assert!(report.error.as_deref().unwrap().contains("turns"));

    let poor = directive("limits: { spend: 0.0000001 }", "Go.");
    let fx = Fixture::new(&[("poor", &poor)], "poor:\n  - text: never\n", "");
    with_hooks(&fx, hooks);
    let (report, _rt) = fx.run("poor", json!({})).await;
    assert_eq!(report.status, Status::Error, "{report:?}");
    assert!(fx
        .events(report.thread_id.as_str())
        .iter()
        .any(|e| e["type"] == "hook_control" && e["refused"] == "this limit is never lifted"));
}

/// The user's own hooks (`$WEFT_HOME/hooks.yaml`, layer 0) run first, through the real binary.
#[cfg(feature = "cli")]
#[test]
fn the_users_hooks_run_before_the_directives_and_the_projects() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("hooks.yaml"),
        "hooks:\n  - { id: mine, event: thread_started, action: { inject: { text: \"USER LAYER\" } } }\n",
    )
    .unwrap();
    let d = directive(
        "hooks:\n  - { id: its, event: thread_started, action: { inject: { text: \"DIRECTIVE LAYER\" } } }",
        "Go.",
    );
    let fx = Fixture::new(&[("d", &d)], "d:\n  - text: ok\n", "");
    with_hooks(
        &fx,
        "hooks:\n  - { id: ours, event: thread_started, action: { inject: { text: \"PROJECT LAYER\" } } }\n",
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["run", "d", "--json", "--script"])
        .arg(fx.root().join("script.yaml"))
        .arg("--project")
        .arg(fx.root())
        .env("WEFT_HOME", home.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v["thread_id"].as_str().unwrap();
    assert_eq!(
        first_user_message(&fx, id),
        "USER LAYER\n\nDIRECTIVE LAYER\n\nPROJECT LAYER\nGo."
    );
}

/// Rye's own hook file (its built-in, infrastructure and context hooks) loads too: its context
/// hook injects the knowledge it names, its emitters record their events in the transcript.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ryes_own_hook_file_loads_and_its_emitters_record() {
    let d = directive("outputs:\n  n: { type: integer, required: true }", "Count.");
    let script = "d:\n  - tool_calls: [ { name: directive_return, input: { n: 3 } } ]\n";
    let fx = Fixture::new(&[("d", &d)], script, "");
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rye/config/agent/hook_conditions.yaml");
    std::fs::copy(file, fx.root().join(".weft/hooks.yaml")).unwrap();
    std::fs::create_dir_all(fx.root().join("knowledge/rye/agent/core")).unwrap();
    std::fs::write(
        fx.root()
            .join("knowledge/rye/agent/core/DirectiveInstruction.md"),
        "FOLLOW THE DIRECTIVE",
    )
    .unwrap();
    let (report, _rt) = fx.run("d", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let id = report.thread_id.as_str();
    assert!(first_user_message(&fx, id).starts_with("FOLLOW THE DIRECTIVE"));
    let emitted: Vec<Value> = fx
        .events(id)
        .into_iter()
        .filter(|e| e["type"] == "hook_event")
        .collect();
    let kinds: Vec<&str> = emitted
        .iter()
        .map(|e| e["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["checkpoint_saved", "directive_return", "thread_completed"]
    );
    assert_eq!(emitted[1]["payload"]["payload"]["outputs"], json!({"n": 3}));
    assert_eq!(emitted[1]["payload"]["thread_id"], id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_on_an_unknown_event_is_refused_naming_the_file_the_hook_and_the_events() {
    let d = directive("", "Hi.");
    let fx = Fixture::new(&[("d", &d)], "default:\n  - text: ok\n", "");
    std::fs::write(
        fx.root().join(".weft/hooks.yaml"),
        "hooks:\n  - { id: late, event: after_everything, action: { inject: { text: \"x\" } } }\n",
    )
    .unwrap();
    let err = weft::Runtime::builder(fx.project())
        .script(fx.root().join("script.yaml"))
        .open()
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("hooks.yaml") && err.contains("hook `late`"),
        "names the file and the hook: {err}"
    );
    assert!(
        err.contains("unknown event `after_everything` (thread_started, thread_continued, after_step, child_finished, limit, error, after_complete, context_window_pressure, directive_return)"),
        "{err}"
    );
}
