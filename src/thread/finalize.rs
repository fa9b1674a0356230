//! Ending a thread: abort in-flight work, drain children (bounded by `cancel_grace`), then settle
//! the ledger exactly once, write the last transcript lines, the registry row and the signed
//! thread.json, and tell the parent. Also the report of a child whose actor died.

use super::state::{Ending, Phase, ThreadState};
use super::{end_subtree, DeadEnd, Event};
use super::{ThreadActor, ThreadMsg};
use crate::core::status::Status;
use crate::ledger::LedgerMsg;
use ractor::ActorRef;
use serde_json::json;

/// Copies the files a completed thread returned into its parent's file area under
/// `from/<thread id>/`; the report then names them there (a root's stay where they are).
fn hand_files_up(s: &mut ThreadState) {
    let Some(parent) = s.doc.parent_id.clone() else {
        return;
    };
    let own = s.ctx.store.files_dir(s.id());
    let theirs = s.ctx.store.files_dir(&parent);
    let mut handed = Vec::new();
    for rel in std::mem::take(&mut s.returned_files) {
        let to = format!("from/{}/{rel}", s.id());
        match crate::tools::copy_between(&own, &rel, &theirs, &to) {
            Ok(_) => handed.push(to),
            Err(e) => s.log("files_not_returned", json!({ "path": rel, "error": e })),
        }
    }
    if !handed.is_empty() {
        s.log("files_returned", json!({ "to": parent, "paths": handed }));
    }
    s.returned_files = handed;
}

impl ThreadActor {
    /// While draining: completes the finalization once no child is live and no spawn is under
    /// way. Returns whether the thread is draining (or done).
    pub(super) async fn drained(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState) -> bool {
        match &s.phase {
            Phase::Draining(e) => {
                if s.live_children().is_empty()
                    && s.spawning.is_empty()
                    && s.tool_tasks.is_empty()
                    && s.call.is_none()
                {
                    let e = e.clone();
                    self.complete_finalize(me, s, e).await;
                }
                true
            }
            Phase::Done => true,
            _ => false,
        }
    }

    pub(super) async fn fail(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState, error: String) {
        let class = json!({ "category": "permanent", "retryable": false });
        self.fail_classified(me, s, error, class).await;
    }

    /// Ends the thread with `error` unless an `error` hook orders a retry (bounded).
    pub(super) async fn fail_classified(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        error: String,
        classification: serde_json::Value,
    ) {
        s.log("error", json!({ "message": error }));
        let ctx = json!({ "thread_id": s.doc.id, "error": { "message": error }, "classification": classification });
        let fired = super::hook_run::fire(me, s, "error", ctx);
        let may_retry = matches!(s.phase, Phase::Idle | Phase::Thinking)
            && s.call.is_none()
            && s.hook_retries < crate::hooks::MAX_HOOK_RETRIES;
        if fired.control == Some(crate::hooks::Control::Retry) && may_retry {
            s.hook_retries += 1;
            s.log(
                "hook_control",
                json!({ "action": "retry", "retry": s.hook_retries }),
            );
            s.phase = Phase::Idle;
            let _ = me.cast(ThreadMsg::NextTurn);
            return;
        }
        let e = Ending {
            status: Status::Error,
            result: None,
            outputs: None,
            error: Some(error),
        };
        self.finalize(me, s, e).await;
    }

    /// Ends the thread: aborts in-flight work, cancels live children and waits (bounded) for
    /// them, then [`Self::complete_finalize`].
    pub(super) async fn finalize(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState, e: Ending) {
        if matches!(s.phase, Phase::Draining(_) | Phase::Done) {
            return;
        }
        // Cancelling also cuts the LLM call under way short; the thread waits (bounded by the
        // grace) for its outcome, so what the provider may have billed is settled, never $0.
        s.cancel.cancel();
        super::approval::abandon(s);
        let live = s.live_children();
        if live.is_empty() && s.spawning.is_empty() && s.tool_tasks.is_empty() && s.call.is_none() {
            return self.complete_finalize(me, s, e).await;
        }
        if !live.is_empty() {
            s.log("cancelling_children", json!({ "children": live }));
        }
        for id in &live {
            if let Some(a) = s.children.get(id).and_then(|c| c.actor.clone()) {
                let _ = a.cast(ThreadMsg::Cancel {
                    reason: format!("parent {} is ending", s.doc.id),
                });
            }
        }
        s.phase = Phase::Draining(e);
        let me2 = me.clone();
        let grace = s.ctx.config.cancel_grace;
        s.timers.push(tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let _ = me2.cast(ThreadMsg::GraceExpired);
        }));
    }

    /// The grace ran out: every live child's subtree is killed and finalized deepest first
    /// (terminal transcript line, ledger closed, registry row, signed thread.json).
    pub(super) async fn kill_stragglers(&self, s: &mut ThreadState) {
        let grace = humantime::format_duration(s.ctx.config.cancel_grace).to_string();
        for id in s.live_children() {
            let end = DeadEnd {
                status: Status::Cancelled,
                kind: "killed",
                error: format!(
                    "killed: its subtree did not end within cancel_grace ({grace}) after {} asked it to",
                    s.doc.id
                ),
            };
            let r = end_subtree(&s.ctx, &id, &end).await;
            s.log(
                "child_finished",
                json!({ "id": id, "status": r.status, "error": r.error }),
            );
            if let Some(c) = s.children.get_mut(&id) {
                c.report = Some(r);
            }
        }
    }

    /// Settles the ledger (exactly once), writes the last transcript lines, the registry row
    /// and the signed thread.json, tells the parent (or the root's waiter) and stops.
    pub(super) async fn complete_finalize(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        e: Ending,
    ) {
        s.phase = Phase::Done;
        for t in s.timers.drain(..) {
            t.abort();
        }
        self.abandon_call(s);
        let acct = ractor::call!(s.ctx.ledger, |reply| LedgerMsg::Close {
            id: s.doc.id.clone(),
            reply
        });
        crate::core::failpoint::hit("finalize.closed");
        match acct {
            Ok(Ok(a)) => s.doc.cost.spend_nanos = a.spent.0,
            other => {
                tracing::error!(thread = %s.doc.id, "ledger close failed: {other:?}");
                s.doc.cost.spend_nanos = s.own_spend.0;
            }
        }
        if e.status == Status::Completed {
            hand_files_up(s);
        } else {
            s.returned_files.clear();
        }
        // The signed state, the registry row and the report hold no secret either.
        let redactor = s.ctx.redactor();
        let clean = |t: Option<String>| t.map(|t| redactor.redact(&t).into_owned());
        s.doc.result = clean(e.result);
        s.doc.outputs = e.outputs.map(|mut o| {
            redactor.redact_value(&mut o);
            o
        });
        s.doc.error = clean(e.error);
        s.doc.transition(e.status);
        // A handoff: the continuation starts now (it needs this thread's final spend) and takes
        // over the parent link or the root's waiter.
        if let (Status::Continued, Some(messages)) = (e.status, s.handoff.take()) {
            match super::handoff::start(s, messages).await {
                Ok(next) => {
                    s.log("continued_by", json!({ "id": next }));
                    s.doc.continued_by = Some(next);
                }
                Err(err) => {
                    s.log(
                        "error",
                        json!({ "message": format!("the continuation could not start: {err}") }),
                    );
                    s.doc.error = Some(format!(
                        "continued, but the continuation could not start: {err}"
                    ));
                }
            }
        }
        let fin = json!({
            "status": e.status, "result": s.doc.result, "outputs": s.doc.outputs, "error": s.doc.error,
            "turns": s.doc.cost.turns, "usage": s.usage, "own_spend_nanos": s.own_spend, "spend_nanos": s.doc.cost.spend_nanos, "overrun_nanos": s.doc.cost.overrun_nanos,
        });
        // after_complete hooks are recorded before the terminal line, which stays the last.
        let done = json!({
            "thread_id": s.doc.id, "directive": s.doc.directive, "status": e.status,
            "result": s.doc.result, "outputs": s.doc.outputs, "duration_ms": s.started.elapsed().as_millis() as u64,
            "cost": { "turns": s.doc.cost.turns, "input_tokens": s.usage.input_tokens, "output_tokens": s.usage.output_tokens,
                      "cache_read_tokens": s.usage.cache_read_tokens, "own_spend_nanos": s.own_spend, "spend_nanos": s.doc.cost.spend_nanos },
        });
        super::hook_run::fire(me, s, "after_complete", done);
        s.log("thread_finished", fin);

        crate::core::failpoint::hit("finalize.line");
        // The terminal fsyncs (transcript, then thread.json) run on the blocking pool, so many
        // threads ending together overlap their fsyncs instead of queueing on the workers.
        if let Err(err) = s.transcript.checkpoint_line() {
            tracing::error!(thread = %s.doc.id, "transcript checkpoint failed: {err}");
        }
        s.refresh_doc();
        let file = s.transcript.file_handle();
        let doc = s.doc.clone();
        let signer = s.ctx.signer.clone();
        let path = s.ctx.store.doc_path(s.id());
        let written = tokio::task::spawn_blocking(move || {
            file.and_then(|f| f.sync_data())?;
            doc.write_signed(&path, &signer, true)
        })
        .await;
        if !matches!(written, Ok(Ok(()))) {
            tracing::error!(thread = %s.doc.id, "final thread.json or transcript sync failed: {written:?}");
        }
        crate::core::failpoint::hit("finalize.doc");
        s.ctx.store_row(s.row()).await;
        crate::core::failpoint::hit("finalize.row");
        s.ctx.store.index_later(crate::store::Ended {
            id: s.id().clone(),
            directive: s.doc.directive.clone(),
            head: s.transcript.head().seq,
            said: Some(std::mem::take(&mut s.said)),
        });
        let report = s.report();
        end_span(s, &report);
        let _ = s.ctx.events.send(Event::Finished(Box::new(report.clone())));
        if let Some((_, parent)) = &s.parent {
            let _ = parent.cast(ThreadMsg::ChildFinished(Box::new(report.clone())));
        }
        if let Some(ended) = s.ended.take() {
            let _ = ended.send(());
        }
        s.ctx.forget(s.id());
        if let Some(tx) = s.on_finish.take() {
            let _ = tx.send(report);
        }
        me.stop(None);
    }
}

/// Records the thread's end on its `invoke_agent` span and closes it (with any call spans left).
fn end_span(s: &mut ThreadState, report: &super::ThreadReport) {
    let span = std::mem::replace(&mut s.span, tracing::Span::none());
    span.record("weft.status", report.status.as_str());
    span.record("weft.spend_nanos", report.own_spend_nanos.0);
    span.record("weft.tree_spend_nanos", report.spend_nanos.0);
    span.record("gen_ai.usage.input_tokens", report.input_tokens as i64);
    span.record("gen_ai.usage.output_tokens", report.output_tokens as i64);
    if report.status != crate::core::status::Status::Completed {
        span.record("error.type", report.status.as_str());
    }
    s.chat_span = None;
    s.tool_spans.clear();
}
