//! Messages into live threads (Standard Agents' contract): `weft inject` from any terminal,
//! `notify_parent` from a child, and a thread's own short status line (`set_status`).
//!
//! A message is queued in the thread's inbox and delivered as a user message before its next
//! turn (a thread between turns takes its next turn at once); every one is in the transcript.

use super::state::{Phase, ThreadState};
use super::{Event, ThreadMsg};
use crate::provider::{Message, ToolSpec};
use crate::tools::ToolOutcome;
use serde_json::{json, Value};
use std::sync::Arc;

/// Longest status line a thread may set.
const MAX_STATUS: usize = 200;
/// Longest message one `inject` or `notify_parent` may carry.
const MAX_MESSAGE: usize = 64 * 1024;

/// The child tools, offered to every thread that has a parent (built once).
pub(super) fn child_tools() -> Vec<ToolSpec> {
    static TOOLS: std::sync::LazyLock<Vec<ToolSpec>> = std::sync::LazyLock::new(build);
    TOOLS.clone()
}

fn build() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "notify_parent".into(),
            description: "Send your parent thread a message now, without finishing (it reads it before its next turn).".into(),
            input_schema: json!({"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}),
        },
        ToolSpec {
            name: "set_status".into(),
            description: "Set a short status line about your progress, shown to the people watching.".into(),
            input_schema: json!({"type":"object","properties":{"status":{"type":"string"}},"required":["status"]}),
        },
    ]
}

/// Queues `text` (from `from`: "person" or a child's id) for the next turn.
pub(super) fn queue(s: &mut ThreadState, from: &str, text: String) -> Result<(), String> {
    if matches!(s.phase, Phase::Draining(_) | Phase::Done) {
        return Err(format!("thread {} is ending", s.doc.id));
    }
    if text.len() > MAX_MESSAGE {
        return Err(format!(
            "the message has {} bytes; at most {MAX_MESSAGE} may be sent",
            text.len()
        ));
    }
    s.log("message_queued", json!({ "from": from, "text": text }));
    s.inbox.push((from.to_string(), text));
    Ok(())
}

/// Delivers the queued messages as user messages (called before each turn).
pub(super) fn deliver(s: &mut ThreadState) {
    for (from, text) in std::mem::take(&mut s.inbox) {
        let text = if from == "person" {
            text
        } else {
            format!("Message from child thread {from}: {text}")
        };
        s.log(
            "message",
            json!({ "role": "user", "text": text, "from": from }),
        );
        Arc::make_mut(&mut s.messages).push(Message::user(text));
    }
}

/// `notify_parent {text}`.
pub(super) fn notify_parent(s: &mut ThreadState, input: &Value) -> ToolOutcome {
    let Some(text) = input.get("text").and_then(Value::as_str) else {
        return ToolOutcome::err("notify_parent needs `text` (a string)");
    };
    let Some((parent, actor)) = s.parent.clone() else {
        return ToolOutcome::err("this thread has no parent to notify");
    };
    let sent = actor.cast(ThreadMsg::Inject {
        from: s.doc.id.to_string(),
        text: text.to_string(),
        reply: None,
    });
    match sent {
        Ok(()) => ToolOutcome::ok(json!({ "delivered_to": parent })),
        Err(_) => ToolOutcome::err(format!("parent {parent} is no longer running")),
    }
}

/// `set_status {status}`.
pub(super) fn set_status(s: &mut ThreadState, input: &Value) -> ToolOutcome {
    let Some(status) = input.get("status").and_then(Value::as_str) else {
        return ToolOutcome::err("set_status needs `status` (a string)");
    };
    let status: String = status
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_STATUS)
        .collect();
    s.log("status_set", json!({ "status": status }));
    s.status_text = Some(status.clone());
    let _ = s.ctx.registry.cast(crate::registry::RegistryMsg::Update {
        row: Box::new(s.row()),
        reply: None,
    });
    let _ = s.ctx.events.send(Event::Status {
        id: s.doc.id.clone(),
        text: status.clone(),
    });
    ToolOutcome::ok(json!({ "status": status }))
}
