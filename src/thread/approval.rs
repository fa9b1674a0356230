//! Human approval (SPEC §8): a call of a tool that requires it (`approval: required` in the
//! tool's YAML, or the directive's `approval:` list of tool names and capability patterns) is
//! parked until a person answers with `weft approve` or `weft deny`.
//!
//! While parked the thread stays `running`, marked `waiting` (registry row, live tree, `weft
//! show`), its duration timer keeps running, and nothing of the call runs. Every request and
//! decision is a transcript event. A thread that ends while waiting records the parked calls as
//! not run.

use super::state::{Phase, ThreadState};
use super::{Event, ThreadActor, ThreadMsg};
use crate::provider::ToolCall;
use crate::tools::ToolOutcome;
use ractor::ActorRef;
use serde_json::json;

/// Whether `call` (needing capability `cap`) must wait for a person.
pub(super) fn required(s: &ThreadState, call: &ToolCall, cap: Option<&str>) -> bool {
    let by_tool = s.ctx.commands.get(&call.name).is_some_and(|t| t.approval);
    let listed = &s.directive.approval;
    by_tool
        || listed.contains(&call.name)
        || cap.is_some_and(|c| crate::core::capability::allowed(listed, c))
}

/// Parks `call` until a decision; the thread is marked waiting.
pub(super) fn park(s: &mut ThreadState, call: ToolCall) {
    s.log(
        "approval_requested",
        json!({ "id": call.id, "name": call.name, "input": call.input }),
    );
    s.pending_approvals.push(call);
    publish_waiting(s);
}

/// The waiting marker of the row (None when nothing is parked).
pub(super) fn marker(s: &ThreadState) -> Option<String> {
    let calls: Vec<String> = s
        .pending_approvals
        .iter()
        .map(|c| format!("{} (call {})", c.name, c.id))
        .collect();
    (!calls.is_empty()).then(|| format!("approval of {}", calls.join(", ")))
}

fn publish_waiting(s: &mut ThreadState) {
    let waiting = marker(s);
    let _ = s.ctx.registry.cast(crate::registry::RegistryMsg::Update {
        row: Box::new(s.row()),
        reply: None,
    });
    let _ = s.ctx.events.send(Event::Waiting {
        id: s.doc.id.clone(),
        waiting,
    });
}

/// Records the parked calls of a thread that ends as not run.
pub(super) fn abandon(s: &mut ThreadState) {
    for call in std::mem::take(&mut s.pending_approvals) {
        s.log(
            "tool_result",
            json!({ "id": call.id, "is_error": true,
                    "content": json!({"error": "not run: the thread ended while the call waited for approval"}).to_string() }),
        );
    }
}

impl ThreadActor {
    /// A person's decision on a parked call (`call` None: the only one parked).
    pub(super) async fn decide(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        call: Option<String>,
        approve: bool,
        reason: Option<String>,
    ) -> Result<String, String> {
        if matches!(s.phase, Phase::Draining(_) | Phase::Done) {
            return Err(format!("thread {} is ending", s.doc.id));
        }
        let ids: Vec<String> = s.pending_approvals.iter().map(|c| c.id.clone()).collect();
        let pick = match (&call, ids.len()) {
            (_, 0) => {
                return Err(format!(
                    "thread {} has no call waiting for approval",
                    s.doc.id
                ))
            }
            (Some(c), _) => ids.iter().position(|i| i == c).ok_or_else(|| {
                format!(
                    "no call {c} waits for approval (waiting: {})",
                    ids.join(", ")
                )
            })?,
            (None, 1) => 0,
            (None, _) => {
                return Err(format!(
                    "{} calls wait for approval ({}); name one with --call",
                    ids.len(),
                    ids.join(", ")
                ))
            }
        };
        let parked = s.pending_approvals.remove(pick);
        s.log(
            "approval_decided",
            json!({ "id": parked.id, "name": parked.name, "approved": approve, "reason": reason, "by": "person" }),
        );
        publish_waiting(s);
        let id = parked.id.clone();
        if approve {
            if let Some(outcome) = super::tool_phase::run(me, s, parked).await {
                self.tool_done(me, s, id.clone(), outcome).await;
            }
        } else {
            let why = reason.unwrap_or_else(|| "no reason given".into());
            self.tool_done(
                me,
                s,
                id.clone(),
                ToolOutcome::err(format!("denied by a person: {why}")),
            )
            .await;
        }
        Ok(id)
    }
}
