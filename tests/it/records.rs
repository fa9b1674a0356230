//! Transcripts keep reading as they did: a committed transcript of a real run (the research
//! fan-out, scripted) and a file of old and partial lines (fields missing or of another type,
//! a kind this build does not know, edits, a thread ended without its actor) are rebuilt into a
//! conversation, shown as people read them and taken for the search index, and each reading
//! is compared with what weft gave when the files were committed (`*.expected.json`).
//!
//! A deliberate change of a reading is blessed with `WEFT_BLESS=1 cargo test records`, which
//! rewrites the expected files; review their diff like code.

use serde_json::{json, Value};
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/it/data")
        .join(name)
}

/// Every reading of `lines`: each line as people read it, the conversation rebuilt from them
/// (and the LLM calls counted), and the messages the search index takes.
fn readings(lines: &[Value]) -> Value {
    let (conversation, calls) = weft::internals::rebuild_conversation(lines);
    let described: Vec<Option<(String, String)>> = lines.iter().map(weft::describe_line).collect();
    json!({
        "described": described,
        "conversation": conversation,
        "calls": calls,
        "search_messages": weft::internals::search_messages(lines),
    })
}

/// Compares `got` with the committed `name` (or rewrites it under `WEFT_BLESS`).
fn check(got: Value, name: &str) {
    let path = data(name);
    if std::env::var_os("WEFT_BLESS").is_some() {
        let text = serde_json::to_string_pretty(&got).unwrap() + "\n";
        std::fs::write(&path, text).unwrap();
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let want: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        got, want,
        "{name} reads differently than when it was committed"
    );
}

#[test]
fn a_committed_transcript_of_a_real_run_reads_as_before() {
    let path = data("research-fanout.jsonl");
    let read = weft::internals::check_transcript(
        &std::fs::read(&path).unwrap(),
        "research.fanout-1795579556501-50b358770000",
        None,
    );
    assert!(read.broken.is_none() && !read.torn_last_line, "{read:?}");
    assert_eq!(read.events.len(), 26);
    check(readings(&read.events), "research-fanout.expected.json");
}

#[test]
fn old_and_partial_lines_read_as_before() {
    let text = std::fs::read_to_string(data("old-lines.jsonl")).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    check(readings(&lines), "old-lines.expected.json");
}

/// Lines of the earliest builds, or partial ones, still read as what they are: an `llm_retry`
/// without `cost_nanos` (the first retry lines had none) and an `llm_call` whose usage lacks a
/// field still count as calls (so a resume's scripted call index does not shift) and read as
/// calls; a message whose text is null is still a message.
#[test]
fn early_and_partial_call_lines_still_count_as_calls() {
    let lines = vec![
        json!({"seq":0,"type":"message","role":"user","text":"Go."}),
        json!({"seq":1,"type":"llm_retry","attempt":1,"kind":"rate_limited","message":"429","model":"m","wait_ms":500,"usage":{"input_tokens":0,"output_tokens":0}}),
        json!({"seq":2,"type":"llm_call","model":"m","usage":{"input_tokens":10},"cost_nanos":100}),
        json!({"seq":3,"type":"message","role":"user","text":null}),
    ];
    let (_, calls) = weft::internals::rebuild_conversation(&lines);
    assert_eq!(calls, 2);
    let kinds: Vec<String> = lines
        .iter()
        .map(|l| weft::describe_line(l).map(|(k, _)| k).unwrap_or_default())
        .collect();
    assert_eq!(kinds[1], "llm retry", "{kinds:?}");
    assert_eq!(kinds[2], "llm", "{kinds:?}");
}
