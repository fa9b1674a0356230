//! Human approval (SPEC §8): a call of a tool that requires it (`approval: required` in the
//! tool's YAML, or the directive's `approval:` list of tool names and capability patterns) is
//! parked until a person answers with `weft approve` or `weft deny` (`tool_phase.rs` runs or
//! refuses it then).
//!
//! While parked the thread stays `running`, marked `waiting` (registry row, live tree, `weft
//! show`), its duration timer keeps running, and nothing of the call runs. Every request and
//! decision is a transcript event. A thread that ends while waiting records the parked calls as
//! not run.

use super::ctx::Event;
use super::state::Thread;
use crate::provider::ToolCall;
use crate::record::line::Line;
use serde_json::json;

impl Thread {
    /// Whether `call` (needing capability `cap`) must wait for a person.
    pub(crate) fn needs_approval(&self, call: &ToolCall, cap: Option<&str>) -> bool {
        self.approval_needed(&call.name, cap)
    }

    /// Whether a call of tool `name` (needing capability `cap`) waits for a person: the tool
    /// says so, or this thread's approval list (its directive's and every ancestor's) names it.
    pub(crate) fn approval_needed(&self, name: &str, cap: Option<&str>) -> bool {
        let by_tool = self.ctx.commands.get(name).is_some_and(|t| t.approval);
        let listed = &self.doc.approval;
        by_tool
            || listed.iter().any(|a| a == name)
            || cap.is_some_and(|c| crate::core::capability::allowed(listed, c))
    }

    /// Parks `call` until a decision; the thread is marked waiting.
    pub(crate) fn park_for_approval(&mut self, call: ToolCall) {
        self.log(Line::ApprovalRequested {
            id: call.id.clone(),
            name: call.name.clone(),
            input: call.input.clone(),
        });
        self.work.approvals.push(call);
        self.publish_waiting();
    }

    /// Tells the registry and live watchers what the thread waits for now.
    pub(crate) fn publish_waiting(&mut self) {
        let waiting = self.work.waiting_marker();
        self.publish_row();
        let _ = self.ctx.events.send(Event::Waiting {
            id: self.doc.id.clone(),
            waiting,
        });
    }

    /// Records the parked calls of a thread that ends as not run.
    pub(crate) fn abandon_approvals(&mut self) {
        for call in std::mem::take(&mut self.work.approvals) {
            let error = "not run: the thread ended while the call waited for approval";
            self.log(Line::ToolResult {
                id: call.id,
                is_error: true,
                content: json!({ "error": error }).to_string(),
            });
        }
    }
}
