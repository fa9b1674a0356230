//! Children and waits: a child starts as a task and joins the thread's state when it runs, a
//! finished child's report resolves waiters or is announced, and `on_child_error` decides what
//! a failure does.

use super::msg::ThreadMsg;
use super::report::ThreadReport;
use super::spawn::{Origin, ParentLink, SpawnRequest};
use super::state::{Phase, Thread};
use crate::core::ids::ThreadId;
use crate::core::status::Status;
use crate::directive::OnChildError;
use crate::hooks::HookEvent;
use crate::record::line::Line;
use crate::tools::ToolOutcome;
use ractor::ActorRef;
use serde_json::json;

impl Thread {
    /// The origin of a thread this one starts as its child: every child request is built with
    /// it, so none is ever anything else, even for a moment.
    pub(crate) fn as_parent(&self) -> Origin {
        Origin::Child(ParentLink {
            id: self.doc.id.clone(),
            actor: self.me.clone(),
        })
    }

    /// Starts `req` (built with [`Thread::as_parent`]) as a task (`spawn_thread`, a hook's
    /// `spawn`); it reports
    /// back as [`ThreadMsg::ChildSpawned`] or [`ThreadMsg::SpawnRefused`] under `call_id`, and
    /// the thread does not end while it is under way.
    pub(crate) fn start_child(&mut self, call_id: String, mut req: SpawnRequest, wait: bool) {
        if self.record.failed.is_some() {
            return; // the thread ends once this message is handled: no child starts now
        }
        self.kids.spawning.insert(call_id.clone());
        req.parent_span = self.work.spans.get(&call_id).cloned();
        req.withdrawn = Some(self.life.cancel.clone());
        let (ctx, me) = (self.ctx.clone(), self.me.clone());
        let parent = self.doc.id.clone();
        tokio::spawn(async move {
            // Boxed: a start's future is large (the whole spawn pipeline, kilobytes); inline,
            // tokio copied all of it into the task and again when the task ended.
            let start = Box::pin(super::placed::start_child(&ctx, req, (parent, me.clone())));
            let started = start.await;
            match started {
                Ok((child, actor)) => {
                    let msg = ThreadMsg::ChildSpawned {
                        call_id,
                        child: child.clone(),
                        actor: actor.clone(),
                        wait,
                    };
                    if me.cast(msg).is_err() {
                        // The parent is already gone (e.g. killed after its cancel grace): the
                        // child must not outlive it.
                        let why = "its parent ended before it started";
                        ctx.send_cancel(&child, &actor, why);
                    }
                }
                Err(e) => {
                    let _ = me.cast(ThreadMsg::SpawnRefused {
                        call_id,
                        error: format!("spawn refused: {e}"),
                    });
                }
            }
        });
    }

    /// A child's spawn reported it running.
    pub(crate) async fn child_spawned(
        &mut self,
        call_id: String,
        child: ThreadId,
        actor: ActorRef<ThreadMsg>,
        wait: bool,
    ) {
        self.kids.spawning.remove(&call_id);
        // The child may have handed off before its spawn was reported: act on its continuation.
        let (child, actor) = self.kids.latest(child, actor);
        let doomed = self.kids.doomed.remove(&call_id);
        let entry = self.kids.entry(&child);
        entry.actor = Some(actor.clone());
        let reported = entry.report.is_some();
        if doomed && !reported {
            let why = "a sibling failed (on_child_error: cancel_siblings)";
            self.ctx.send_cancel(&child, &actor, why);
        }
        if matches!(self.phase, Phase::Draining(_)) {
            if !reported {
                self.ctx.send_cancel(&child, &actor, "parent is ending");
            }
            self.drained().await;
            return;
        }
        self.log(Line::ChildSpawned {
            id: child.clone(),
            wait,
            call_id: call_id.clone(),
        });
        if !wait {
            let running = ToolOutcome::ok(json!({ "thread_id": child, "status": "running" }));
            return self.tool_done(call_id, running).await;
        }
        self.kids.claim(&child);
        // A child that ended before its spawn was reported had its report announced: this
        // call delivers it instead (as `wait_threads` does), never both.
        self.kids.announce.retain(|r| r.thread_id != child);
        self.kids.wait(call_id, vec![child.clone()], true);
        self.resolve_waiters(&child).await;
    }

    /// A child's spawn was refused: the call (or the hook) that asked gets the error.
    pub(crate) async fn spawn_refused(&mut self, call_id: String, error: String) {
        self.kids.spawning.remove(&call_id);
        if let Some(hook) = call_id.strip_prefix("hook:") {
            self.log(Line::HookFailed {
                id: hook.to_string(),
                event: None,
                error: error.clone(),
                source: None,
            });
        }
        self.kids.doomed.remove(&call_id);
        if !self.drained().await {
            self.tool_done(call_id, ToolOutcome::err(error)).await;
        }
    }

    /// A child ended.
    pub(crate) async fn child_finished(&mut self, r: ThreadReport) {
        let id = r.thread_id.clone();
        self.log(Line::ChildFinished {
            id: id.clone(),
            status: r.status,
            spend_nanos: Some(r.spend_nanos),
            error: r.error.clone(),
            head: r.final_head.clone(),
        });
        if r.status == Status::Continued && r.error.is_none() {
            // Handed off: its continuation answers in its place (`ChildContinued` re-keys the
            // waits, whichever of the two messages comes first); this report is nobody's result.
            self.kids.entry(&id).report = Some(r);
            self.drained().await;
            return;
        }
        if self.hooks.wants(HookEvent::ChildFinished) {
            let ctx = json!({ "thread_id": self.doc.id, "child": {
                "id": id, "directive": r.directive, "status": r.status, "spend_nanos": r.spend_nanos,
                "outputs": r.outputs, "error": r.error } });
            self.fire(HookEvent::ChildFinished, ctx);
        }
        let entry = self.kids.entry(&id);
        if entry.report.is_some() {
            return;
        }
        entry.report = Some(r.clone());
        let claimed = entry.claimed;
        if self.drained().await {
            return;
        }
        if r.status == Status::Error && self.on_child_error(&r).await {
            return;
        }
        // A claimed report is some wait's (spawn's) result; only an unclaimed one is looked up
        // in the waits (a scan of every waited id, kept off the common road).
        if !claimed && !self.kids.waiters.iter().any(|w| w.ids().contains(&id)) {
            self.kids.announce.push(r);
        }
        self.resolve_waiters(&id).await;
    }

    /// What the directive's `on_child_error` does about child `r`'s failure. Returns whether
    /// the thread is ending.
    async fn on_child_error(&mut self, r: &ThreadReport) -> bool {
        let id = &r.thread_id;
        match self.directive.on_child_error {
            OnChildError::Continue => false,
            OnChildError::CancelSiblings => {
                // Siblings still being spawned are cancelled as they arrive.
                let spawning: Vec<String> = self.kids.spawning.iter().cloned().collect();
                self.kids.doomed.extend(spawning);
                self.cancel_kids(&format!("sibling {id} failed"));
                false
            }
            OnChildError::Fail => {
                let msg = format!("child {id} failed: {}", r.error.clone().unwrap_or_default());
                self.fail(msg).await;
                true
            }
        }
    }

    /// Asks every live child to cancel, for `reason`, as every cancel is sent
    /// (`Ctx::send_cancel`): noted, so a child busy starting its continuation hands it on, and
    /// withdrawing a start that waits.
    pub(crate) fn cancel_kids(&self, reason: &str) {
        for (id, actor) in self.kids.live_actors() {
            self.ctx.send_cancel(&id, &actor, reason);
        }
    }

    /// Answers every wait whose children have all reported, now that `id` has.
    pub(crate) async fn resolve_waiters(&mut self, id: &ThreadId) {
        for w in self.kids.take_ready(id) {
            let outcome = self.kids.wait_result(w.ids(), w.single(), false);
            self.tool_done(w.call_id, outcome).await;
        }
    }

    /// A `wait_threads` timeout fired.
    pub(crate) async fn wait_timeout(&mut self, call_id: String, wait: u64) {
        let Some(w) = self.kids.take_waiter(&call_id, wait) else {
            return;
        };
        let outcome = self.kids.wait_result(w.ids(), w.single(), true);
        self.tool_done(w.call_id, outcome).await;
    }

    /// A child handed off: its continuation takes its place (waits included).
    pub(crate) fn child_continued(
        &mut self,
        old: ThreadId,
        new: ThreadId,
        actor: ActorRef<ThreadMsg>,
    ) {
        self.kids.rekey(&old, new.clone(), actor.clone());
        // Ending: the continuation is told too (its predecessor's noted cancel reaches it as
        // well; a second cancel is a no-op).
        if matches!(self.phase, Phase::Draining(_)) {
            self.ctx.send_cancel(&new, &actor, "parent is ending");
        }
        self.log(Line::ChildContinued { old, new });
    }
}
