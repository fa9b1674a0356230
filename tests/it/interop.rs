//! Interop (issue 13): nova thread files and deepagents-cli `threads.json` import as read-only
//! history — searchable, forkable, re-import skipped — with broken files and lines reported, not
//! fatal; export to nova (which imports back) and markdown. Fixtures: tests/fixtures/formats
//! (synthetic, byte-for-byte the originals' serializers; see its SOURCES.txt).

use crate::support::{directive, weft_cmd, Fixture};
use serde_json::{json, Value};
use std::path::PathBuf;

fn fixture(name: &str) -> String {
    let p: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests/fixtures/formats", name]
        .iter()
        .collect();
    p.to_string_lossy().to_string()
}

fn weft(fx: &Fixture, args: &[&str]) -> (i32, Value, String) {
    let out = weft_cmd(fx.root()).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let v = serde_json::from_str(&text).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        v,
        text + &String::from_utf8_lossy(&out.stderr),
    )
}

fn imported(v: &Value) -> Vec<(String, String)> {
    v["imported"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["threads"].as_array().unwrap().clone())
        .map(|p| {
            (
                p[0].as_str().unwrap().to_string(),
                p[1].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `weft fork <id> -m <message>` under this project's `chat` directive and its script; the
/// fork's JSON (the command must succeed).
fn fork_under_chat(fx: &Fixture, id: &str, message: &str) -> Value {
    let script = fx.root().join("script.yaml");
    let args = ["fork", id, "-m", message, "--directive", "chat", "--script"];
    let mut args: Vec<&str> = args.to_vec();
    args.extend([script.to_str().unwrap(), "--json"]);
    let (code, forked, msg) = weft(fx, &args);
    assert_eq!(code, 0, "{msg}");
    forked
}

#[test]
fn nova_threads_import_as_searchable_forkable_history() {
    let chat = directive("limits: { turns: 1 }", "unused");
    let fx = Fixture::new(
        &[("chat", &chat)],
        "chat:\n  - text: Try the Haukankierros loop.\n",
        "",
    );
    let files = [
        "legacy_v0_thread",
        "mixed_v1_thread",
        "current_thread_with_edge_cases",
        "invalid_manifest_thread",
    ]
    .map(|f| fixture(&format!("nova/{f}.jsonl")));
    let mut args = vec!["import", "nova"];
    args.extend(files.iter().map(String::as_str));
    args.push("--json");
    let (code, v, all) = weft(&fx, &args);
    assert_eq!(code, 1, "a file failed, so the exit says so: {all}");
    let threads = imported(&v);
    assert_eq!(threads.len(), 3, "{v}");
    let failed = v["failed"].to_string();
    assert!(
        failed.contains("invalid_manifest_thread") && failed.contains("createdAt"),
        "{failed}"
    );
    let skipped = v["imported"].to_string();
    assert!(
        skipped.contains("current_thread_with_edge_cases.jsonl:8: not JSON"),
        "the torn line is reported: {skipped}"
    );

    // Legacy lines without `type` are messages; the manifest's title and times are kept.
    let legacy = &threads
        .iter()
        .find(|(o, _)| o == "legacy_v0_thread")
        .unwrap()
        .1;
    let lines = fx.events(legacy);
    let said: Vec<(&str, &str)> = lines
        .iter()
        .filter_map(|l| match l["type"].as_str()? {
            "message" => Some(("user", l["text"].as_str()?)),
            "assistant_text" => Some(("assistant", l["text"].as_str()?)),
            _ => None,
        })
        .collect();
    assert_eq!(said.len(), 4, "{said:?}");
    assert_eq!(
        said[2],
        ("user", "find me a 10km loop near Nuuksio for Saturday")
    );
    let (_, shown, _) = weft(&fx, &["show", legacy, "--json"]);
    assert_eq!(
        shown["row"]["meta"]["title"],
        "Planning weekend hiking trip"
    );
    assert_eq!(shown["row"]["created_at"], "2026-02-03T08:15:02.114Z");
    assert_eq!(shown["thread"]["imported"]["format"], "nova", "{shown}");

    // The engine's copy of a final answer is not imported twice.
    let mixed = &threads
        .iter()
        .find(|(o, _)| o == "mixed_v1_thread")
        .unwrap()
        .1;
    let finals = fx
        .events(mixed)
        .iter()
        .filter(|l| l["text"] == "Yesterday you covered three topics...")
        .count();
    assert_eq!(finals, 1);

    // Searchable; read-only; re-import skipped; forkable under a directive of ours.
    let (_, hits, _) = weft(&fx, &["search", "Nuuksio", "--json"]);
    assert_eq!(hits[0]["thread_id"], legacy.as_str(), "{hits}");
    let (code, _, msg) = weft(&fx, &["message", legacy, "delete", "1"]);
    assert_eq!(code, 2);
    assert!(msg.contains("read-only"), "{msg}");
    let (_, again, _) = weft(&fx, &["import", "nova", &files[0], "--json"]);
    assert!(
        imported(&again).is_empty() && again.to_string().contains("already imported"),
        "{again}"
    );
    let (code, _, msg) = weft(&fx, &["fork", legacy, "-m", "And on Sunday?"]);
    assert_eq!(code, 2);
    assert!(msg.contains("--directive"), "{msg}");
    let forked = fork_under_chat(&fx, legacy, "And on Sunday?");
    let conv = fx.events(forked["thread_id"].as_str().unwrap());
    let conv = conv.iter().find(|l| l["type"] == "conversation").unwrap()["messages"].to_string();
    assert!(conv.contains("Nuuksio"), "{conv}");

    // Export: markdown for people, nova that imports back with the same messages.
    let (code, _, md) = weft(&fx, &["export", legacy, "--format", "markdown"]);
    assert_eq!(code, 0);
    assert!(md.starts_with("# Planning weekend hiking trip"), "{md}");
    assert!(
        md.contains("**user**: find me a 10km loop near Nuuksio for Saturday"),
        "{md}"
    );
    let (_, _, nova) = weft(&fx, &["export", legacy, "--format", "nova"]);
    let back = fx.root().join("back.jsonl");
    std::fs::write(&back, &nova).unwrap();
    let (code, v, all) = weft(&fx, &["import", "nova", back.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{all}");
    let round = fx.events(&imported(&v)[0].1);
    let texts = |ls: &[Value]| -> Vec<Value> {
        ls.iter()
            .filter(|l| l["type"] == "message" || l["type"] == "assistant_text")
            .map(|l| l["text"].clone())
            .collect()
    };
    assert_eq!(texts(&round), texts(&lines));
    let (code, _, msg) = weft(&fx, &["export", legacy, "--format", "pdf"]);
    assert_eq!(code, 2);
    assert!(msg.contains("nova or markdown"));
    assert!(fx.verify_all().is_empty());
}

#[test]
fn deepagents_metadata_and_lineage_import_and_broken_files_are_reported() {
    let fx = Fixture::new(&[], "", "");
    let files = [
        "threads.json",
        "threads.corrupt.json",
        "threads.threads_not_list.json",
        "threads.missing_current.json",
    ]
    .map(|f| fixture(&format!("deepagents/{f}")));
    let mut args = vec!["import", "deepagents"];
    args.extend(files.iter().map(String::as_str));
    args.push("--json");
    let (code, v, all) = weft(&fx, &args);
    assert_eq!(code, 1, "{all}");
    let failed = v["failed"].to_string();
    assert!(
        failed.contains("threads.corrupt.json") && failed.contains("corrupt"),
        "{failed}"
    );
    assert!(failed.contains("not a list"), "{failed}");
    let threads = imported(&v);
    assert_eq!(
        threads.len(),
        6 + 2,
        "six of threads.json (its non-dict entry dropped), two of missing_current: {v}"
    );
    let notes = v["imported"].to_string();
    assert!(
        notes.contains("threads[6] is not a thread entry"),
        "{notes}"
    );
    assert!(notes.contains("unparsable `created`"), "{notes}");
    assert!(
        notes.contains("ffffffff-dead-4000-8000-000000000000 names no thread"),
        "{notes}"
    );
    let id_of = |o: &str| threads.iter().find(|(x, _)| x == o).unwrap().1.clone();
    let root = id_of("0b6f2c1e-8d8a-4a57-9f3b-1c2d3e4f5a6b");
    let child = id_of("5a1e9d70-3c2b-4e8f-a1d2-b3c4d5e6f708");
    let rows = fx.rows();
    let row = rows.iter().find(|r| r.id == child).unwrap();
    assert_eq!(
        row.forked_from.as_deref(),
        Some(root.as_str()),
        "lineage kept"
    );
    assert_eq!(row.meta.as_ref().unwrap()["name"], "Escalation: flaky CI");
    assert_eq!(
        row.meta.as_ref().unwrap()["deepagents"]["handoff"]["tldr"],
        json!("CI flakes traced to shared tmp dir; fix pending")
    );
    assert!(row.parent_id.is_none(), "lineage, not a budget tree");
    assert!(fx.verify_all().is_empty());
}

/// nova's contract names a message line `{"type":"message","role":…,"text":…}`; nova's own code
/// writes it without `type`. A file holding both forms imports every message of either.
#[test]
fn nova_message_events_import_as_well_as_untyped_messages() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("both.jsonl");
    std::fs::write(
        &file,
        [
            r#"{"id":"both-1","agentId":"nova","createdAt":"2026-02-17T10:00:00.000Z","updatedAt":"2026-02-17T10:01:00.000Z"}"#,
            r#"{"type":"message","role":"user","text":"typed question","timestamp":"2026-02-17T10:00:01.000Z"}"#,
            r#"{"type":"message","role":"assistant","text":"typed answer","timestamp":"2026-02-17T10:00:02.000Z"}"#,
            r#"{"role":"user","text":"untyped question","timestamp":"2026-02-17T10:00:03.000Z"}"#,
            r#"{"role":"assistant","text":"untyped answer","timestamp":"2026-02-17T10:00:04.000Z"}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let store = weft::MemoryStore::new();
    let out = weft::import_nova(&store, &file).unwrap();
    assert!(out.skipped.is_empty(), "{:?}", out.skipped);
    let id = &out.threads[0].1;
    let page = weft::ThreadStore::load(&store, id, None, 100).unwrap();
    let said: Vec<(String, String)> = page
        .lines
        .iter()
        .filter(|l| l["type"] == "message" || l["type"] == "assistant_text")
        .map(|l| {
            let who = l["role"].as_str().unwrap_or("assistant").to_string();
            (who, l["text"].as_str().unwrap().to_string())
        })
        .collect();
    let want = [
        ("user", "typed question"),
        ("assistant", "typed answer"),
        ("user", "untyped question"),
        ("assistant", "untyped answer"),
    ]
    .map(|(w, t)| (w.to_string(), t.to_string()));
    assert_eq!(said, want);
}

/// A nova file whose tool call and result nest as deep as JSON can be read (the file's own
/// lines parse) imports as a transcript that stays readable, and a fork of it (its
/// conversation rebuilt one line lower) verifies: weft bounds what it keeps of them, as it
/// bounds a model's arguments.
#[test]
fn a_deeply_nested_nova_import_stays_readable_and_forks() {
    let chat = directive("limits: { turns: 1 }", "unused");
    let fx = Fixture::new(&[("chat", &chat)], "chat:\n  - text: Fine.\n", "");
    let mut deep = json!("leaf");
    for _ in 0..124 {
        deep = json!([deep]);
    }
    let lines = [
        json!({"id":"deep-1","agentId":"nova","createdAt":"2026-02-17T10:00:00.000Z","updatedAt":"2026-02-17T10:01:00.000Z"}),
        json!({"type":"message","role":"user","text":"go deep","timestamp":"2026-02-17T10:00:01.000Z"}),
        json!({"type":"tool_use","name":"dig","input":{"x": deep.clone()},"timestamp":"2026-02-17T10:00:02.000Z"}),
        json!({"type":"result","turns":1,"cost":0.01,"x": deep,"timestamp":"2026-02-17T10:00:03.000Z"}),
    ];
    let file = fx.root().join("deep.jsonl");
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&file, text.join("\n")).unwrap();
    let (code, v, msg) = weft(&fx, &["import", "nova", file.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{msg}");
    let id = imported(&v)[0].1.clone();
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
    let forked = fork_under_chat(&fx, &id, "Again?");
    assert!(forked["thread_id"].is_string(), "{forked}");
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
}
