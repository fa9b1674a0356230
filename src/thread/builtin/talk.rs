//! The tools of a thread talking to the people and the parent around it: `notify_parent` (a
//! message its parent reads before its next turn) and `set_status` (its short status line).

use super::tool::Builtin;
use crate::provider::ToolSpec;
use crate::record::line::Line;
use crate::thread::ctx::Event;
use crate::thread::msg::ThreadMsg;
use crate::thread::state::Thread;
use crate::tools::ToolOutcome;
use serde_json::{json, Value};

/// Longest status line a thread may set.
const MAX_STATUS: usize = 200;

/// The spec of `notify_parent` or `set_status`.
pub(super) fn spec(b: Builtin) -> ToolSpec {
    let (description, input_schema) = match b {
        Builtin::NotifyParent => (
            "Send your parent thread a message now, without finishing (it reads it before its next turn).",
            json!({"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}),
        ),
        _ => (
            "Set a short status line about your progress, shown to the people watching.",
            json!({"type":"object","properties":{"status":{"type":"string"}},"required":["status"]}),
        ),
    };
    ToolSpec {
        name: b.name().into(),
        description: description.into(),
        input_schema,
    }
}

impl Thread {
    /// `notify_parent {text}`.
    pub(crate) fn notify_parent(&mut self, input: &Value) -> ToolOutcome {
        let Some(text) = input.get("text").and_then(Value::as_str) else {
            return ToolOutcome::err("notify_parent needs `text` (a string)");
        };
        let Some((parent, actor)) = self.parent.clone() else {
            return ToolOutcome::err("this thread has no parent to notify");
        };
        let sent = actor.cast(ThreadMsg::Inject {
            from: self.doc.id.to_string(),
            text: text.to_string(),
            reply: None,
        });
        match sent {
            Ok(()) => ToolOutcome::ok(json!({ "delivered_to": parent })),
            Err(_) => ToolOutcome::err(format!("parent {parent} is no longer running")),
        }
    }

    /// `set_status {status}`.
    pub(crate) fn set_status(&mut self, input: &Value) -> ToolOutcome {
        let Some(status) = input.get("status").and_then(Value::as_str) else {
            return ToolOutcome::err("set_status needs `status` (a string)");
        };
        let status: String = status
            .chars()
            .filter(|c| !c.is_control())
            .take(MAX_STATUS)
            .collect();
        self.log(Line::StatusSet {
            status: status.clone(),
        });
        self.status_text = Some(status.clone());
        self.publish_row();
        let _ = self.ctx.events.send(Event::Status {
            id: self.doc.id.clone(),
            text: status.clone(),
        });
        ToolOutcome::ok(json!({ "status": status }))
    }
}
