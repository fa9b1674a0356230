//! Children and waits: a spawned child joins the thread's state, a finished child's report
//! resolves waiters or is announced, and `on_child_error` decides what a failure does.

use super::state::{Phase, ThreadState};
use super::{manage_tools, Child, ThreadReport, ToolOutcome, Waiter};
use super::{ThreadActor, ThreadMsg};
use crate::core::ids::ThreadId;
use crate::core::status::Status;
use crate::directive::OnChildError;
use ractor::ActorRef;
use serde_json::json;

impl ThreadActor {
    pub(super) async fn child_spawned(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        call_id: String,
        child: ThreadId,
        actor: ActorRef<ThreadMsg>,
        wait: bool,
    ) {
        s.spawning.remove(&call_id);
        // The child may have handed off before its spawn was reported: act on its continuation.
        let (mut child, mut actor) = (child, actor);
        while let Some(next) = s.continued_children.get(&child).cloned() {
            if let Some(a) = s.children.get(&next).and_then(|c| c.actor.clone()) {
                actor = a;
            }
            child = next;
        }
        let doomed = s.doomed.remove(&call_id);
        let entry = s.children.entry(child.clone()).or_insert(Child {
            actor: None,
            report: None,
            claimed: false,
        });
        entry.actor = Some(actor.clone());
        if doomed && entry.report.is_none() {
            let _ = actor.cast(ThreadMsg::Cancel {
                reason: "a sibling failed (on_child_error: cancel_siblings)".into(),
            });
        }
        if matches!(s.phase, Phase::Draining(_)) {
            if entry.report.is_none() {
                let _ = actor.cast(ThreadMsg::Cancel {
                    reason: "parent is ending".into(),
                });
            }
            self.drained(me, s).await;
            return;
        }
        s.log(
            "child_spawned",
            json!({ "id": child, "wait": wait, "call_id": call_id }),
        );
        if !wait {
            return self
                .tool_done(
                    me,
                    s,
                    call_id,
                    ToolOutcome::ok(json!({ "thread_id": child, "status": "running" })),
                )
                .await;
        }
        entry_claim(s, &child);
        s.waiters.push(Waiter {
            call_id,
            ids: vec![child],
        });
        self.resolve_waiters(me, s).await;
    }

    pub(super) async fn child_finished(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        r: ThreadReport,
    ) {
        let id = r.thread_id.clone();
        s.log(
            "child_finished",
            json!({ "id": id, "status": r.status, "spend_nanos": r.spend_nanos, "error": r.error }),
        );
        if r.status == Status::Continued && r.error.is_none() {
            // Handed off: its continuation answers in its place (`ChildContinued` re-keys the
            // waits, whichever of the two messages comes first); this report is nobody's result.
            let entry = s.children.entry(id).or_insert(Child {
                actor: None,
                report: None,
                claimed: false,
            });
            entry.report = Some(r);
            self.drained(me, s).await;
            return;
        }
        if super::hook_run::wants(s, "child_finished") {
            let ctx = json!({ "thread_id": s.doc.id, "child": {
                "id": id, "directive": r.directive, "status": r.status, "spend_nanos": r.spend_nanos,
                "outputs": r.outputs, "error": r.error } });
            super::hook_run::fire(me, s, "child_finished", ctx);
        }
        let entry = s.children.entry(id.clone()).or_insert(Child {
            actor: None,
            report: None,
            claimed: false,
        });
        if entry.report.is_some() {
            return;
        }
        entry.report = Some(r.clone());
        let claimed = entry.claimed;
        if self.drained(me, s).await {
            return;
        }
        if r.status == Status::Error {
            match s.directive.on_child_error {
                OnChildError::Continue => {}
                OnChildError::CancelSiblings => {
                    // Siblings still being spawned are cancelled as they arrive.
                    let spawning: Vec<String> = s.spawning.iter().cloned().collect();
                    s.doomed.extend(spawning);
                    for c in s.live_children() {
                        if let Some(a) = s.children.get(&c).and_then(|c| c.actor.clone()) {
                            let _ = a.cast(ThreadMsg::Cancel {
                                reason: format!("sibling {id} failed"),
                            });
                        }
                    }
                }
                OnChildError::Fail => {
                    let msg = format!("child {id} failed: {}", r.error.clone().unwrap_or_default());
                    return self.fail(me, s, msg).await;
                }
            }
        }
        let waited = s.waiters.iter().any(|w| w.ids.contains(&id));
        if !claimed && !waited {
            s.announce.push(r);
        }
        self.resolve_waiters(me, s).await;
    }

    pub(super) async fn resolve_waiters(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState) {
        let ready: Vec<usize> = s
            .waiters
            .iter()
            .enumerate()
            .filter(|(_, w)| {
                w.ids
                    .iter()
                    .all(|id| s.children.get(id).is_some_and(|c| c.report.is_some()))
            })
            .map(|(i, _)| i)
            .collect();
        for i in ready.into_iter().rev() {
            let w = s.waiters.remove(i);
            let outcome = manage_tools::wait_result(s, &w.ids, false);
            self.tool_done(me, s, w.call_id, outcome).await;
        }
    }

    pub(super) async fn wait_timeout(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        call_id: String,
    ) {
        let Some(i) = s.waiters.iter().position(|w| w.call_id == call_id) else {
            return;
        };
        let w = s.waiters.remove(i);
        let outcome = manage_tools::wait_result(s, &w.ids, true);
        self.tool_done(me, s, w.call_id, outcome).await;
    }
}

pub(super) fn entry_claim(s: &mut ThreadState, id: &ThreadId) {
    if let Some(c) = s.children.get_mut(id) {
        c.claimed = true;
    }
}
