//! The rules every store applies to what it is given, and the reading of a conversation both
//! stores (and the thread's conversation rebuild) share: which lines are messages, and how
//! `message_edited` / `message_deleted` change them without touching the signed history.

use super::{SearchMessage, StoreError};
use crate::record::line::Line;
use serde_json::Value;
use std::collections::HashMap;

/// Event types a store accepts from outside a running thread, with the string fields each
/// needs. (A running thread's own lines are written by its actor, not through the store.)
pub const APPENDABLE: &[(&str, &[&str])] = &[
    ("message", &["role", "text"]),
    ("assistant_text", &["text"]),
    ("tool_use", &["name"]),
    ("tool_result", &["content"]),
    ("message_edited", &["text"]),
    ("message_deleted", &[]),
    ("emit", &["event"]),
    ("note", &["text"]),
];

/// Roles a `message` may have.
const ROLES: &[&str] = &["user", "assistant", "system"];

/// Fields the store itself sets on every line.
const RESERVED: &[&str] = &["seq", "prev", "ts", "sig"];

fn invalid(rule: &'static str, detail: String) -> StoreError {
    StoreError::Invalid { rule, detail }
}

/// Checks one event: an object of a known type, with the fields its type needs, a known role,
/// no field the store sets itself, and (for edits) a `seq` to edit.
pub fn check_event(event: &Value) -> Result<(), StoreError> {
    let Some(obj) = event.as_object() else {
        return Err(invalid(
            "event.object",
            format!("an event is a JSON object, not {event}"),
        ));
    };
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or_default();
    let Some((_, needs)) = APPENDABLE.iter().find(|(k, _)| *k == kind) else {
        let known: Vec<&str> = APPENDABLE.iter().map(|(k, _)| *k).collect();
        return Err(invalid(
            "event.type",
            format!("`{kind}` is not an event type the store accepts; use one of {known:?}"),
        ));
    };
    for field in *needs {
        if !obj.get(*field).is_some_and(Value::is_string) {
            return Err(invalid(
                "event.field",
                format!("a `{kind}` event needs a string `{field}`"),
            ));
        }
    }
    if let Some(f) = RESERVED.iter().find(|f| obj.contains_key(**f)) {
        return Err(invalid(
            "event.reserved",
            format!("`{f}` is set by the store; leave it out of a `{kind}` event"),
        ));
    }
    if kind == "message" {
        let role = obj.get("role").and_then(Value::as_str).unwrap_or_default();
        if !ROLES.contains(&role) {
            return Err(invalid(
                "event.role",
                format!("`{role}` is not a role; use one of {ROLES:?}"),
            ));
        }
    }
    if matches!(kind, "message_edited" | "message_deleted")
        && obj
            .get("target")
            .and_then(Value::as_i64)
            .is_none_or(|s| s < 0)
    {
        return Err(invalid(
            "event.target",
            format!("a `{kind}` event needs `target`, the seq of the message it changes"),
        ));
    }
    Ok(())
}

/// Checks that an edit's `target` is a message of the thread (`lines` so far, the edit's own
/// batch before it included) and not deleted already.
pub(crate) fn check_target(lines: &[Value], event: &Value) -> Result<(), StoreError> {
    let Some(target) = event.get("target").and_then(Value::as_i64) else {
        return Ok(());
    };
    let effective = messages(lines);
    if effective.iter().any(|m| m.seq == target) {
        return Ok(());
    }
    Err(invalid(
        "event.target",
        format!(
            "line {target} is not a message of this thread (or was deleted); `weft log` shows each line's seq"
        ),
    ))
}

/// The thread's lines as its conversation reads them: an edited message carries its new text,
/// a deleted one is gone, the edit lines themselves are left out. The signed lines stay as
/// they are in the transcript; this is a reading of them.
pub fn apply_edits(lines: &[Value]) -> Vec<Value> {
    // Each line's seq, and the new text of an edited one (None: deleted).
    let mut edits: HashMap<i64, Option<String>> = HashMap::new();
    let mut kept = Vec::with_capacity(lines.len());
    for l in lines {
        match Line::parse(l) {
            Line::MessageEdited { target, text } => {
                edits.insert(target, Some(text));
            }
            Line::MessageDeleted { target } => {
                edits.insert(target, None);
            }
            _ => kept.push(l),
        }
    }
    kept.into_iter()
        .filter_map(|l| match edits.get(&seq_of(l)) {
            None => Some(l.clone()),
            Some(None) => None,
            Some(Some(text)) => {
                let mut l = l.clone();
                l["text"] = Value::String(text.clone());
                Some(l)
            }
        })
        .collect()
}

/// A line's `seq` (−1 if it has none).
fn seq_of(line: &Value) -> i64 {
    line.get("seq").and_then(Value::as_i64).unwrap_or(-1)
}

/// The user and assistant messages of a thread's lines, edits applied, in order.
pub fn messages(lines: &[Value]) -> Vec<SearchMessage> {
    apply_edits(lines)
        .iter()
        .filter_map(|l| {
            let (role, text) = match Line::parse(l) {
                Line::Message { role, text, .. } if role.is_empty() => ("user".into(), text),
                Line::Message { role, text, .. } => (role, text),
                Line::AssistantText { text } => ("assistant".into(), text),
                _ => return None,
            };
            if text.trim().is_empty() {
                return None;
            }
            Some(SearchMessage {
                seq: seq_of(l),
                role,
                text,
            })
        })
        .collect()
}

/// The words of a query, lower-cased (letters and digits; everything else separates words,
/// so no query can be read as search syntax).
pub(crate) fn terms(query: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let w = w.to_lowercase();
        if !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

/// The messages of `all` within `n` of position `at`.
pub(crate) fn around(all: &[SearchMessage], at: usize, n: usize) -> Vec<SearchMessage> {
    let from = at.saturating_sub(n);
    let to = (at + n + 1).min(all.len());
    all[from..to].to_vec()
}

/// Longest key-value key, in bytes.
pub(super) const KV_KEY_MAX: usize = 128;
/// Largest key-value value, as JSON text, in bytes.
pub(super) const KV_VALUE_MAX: usize = 64 * 1024;

/// Checks a key-value key and value: a key of 1–128 bytes without control characters, a
/// value of at most 64 KiB as JSON.
pub(super) fn check_kv(key: &str, value: Option<&Value>) -> Result<(), StoreError> {
    if key.is_empty() || key.len() > KV_KEY_MAX || key.chars().any(char::is_control) {
        return Err(invalid(
            "kv.key",
            format!("a key is 1–{KV_KEY_MAX} bytes without control characters, not {key:?}"),
        ));
    }
    if let Some(v) = value {
        let size = v.to_string().len();
        if size > KV_VALUE_MAX {
            return Err(invalid(
                "kv.value",
                format!("the value of `{key}` is {size} bytes as JSON; at most {KV_VALUE_MAX} (keep big data in the file area)"),
            ));
        }
    }
    Ok(())
}

/// The status a thread is written whole with (`ThreadStore::create`): completed, error or
/// cancelled.
pub(crate) fn ended_status(status: &str) -> Result<crate::core::status::Status, StoreError> {
    crate::core::status::Status::parse(status)
        .filter(|s| s.is_terminal() && *s != crate::core::status::Status::Continued)
        .ok_or_else(|| {
            invalid(
                "thread.status",
                format!("`{status}` is not a status a thread can be written with; use completed, error or cancelled"),
            )
        })
}
