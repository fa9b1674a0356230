//! Ending a thread: abort in-flight work, drain children (bounded by `cancel_grace`), then settle
//! the ledger exactly once, write the last transcript lines, the registry row and the signed
//! thread.json, and tell the parent. Every exit path comes through [`Thread::finalize`].

use super::ctx::Event;
use super::dead::{end_subtree, DeadEnd, DeadKind};
use super::msg::ThreadMsg;
use super::report::ThreadReport;
use super::spawn::SpawnError;
use super::state::{Ending, Phase, Thread};
use crate::core::money::Nanos;
use crate::core::status::Status;
use crate::hooks::HookEvent;
use crate::ledger::LedgerMsg;
use crate::record::line::{Line, RunTotals};
use serde_json::json;

impl Thread {
    /// Whether nothing of the thread is under way any more: no live child, no spawn, no tool
    /// task, no LLM call.
    fn quiet(&self) -> bool {
        !self.kids.any_live()
            && self.kids.spawning.is_empty()
            && self.work.tasks.is_empty()
            && self.calls.current.is_none()
    }

    /// While draining: completes the finalization once the thread is quiet. Returns whether
    /// the thread is draining (or done).
    pub(crate) async fn drained(&mut self) -> bool {
        match &self.phase {
            Phase::Draining(e) => {
                if self.quiet() {
                    let e = e.clone();
                    self.complete_finalize(e).await;
                }
                true
            }
            Phase::Done => true,
            _ => false,
        }
    }

    /// Ends the thread with `error` (a permanent failure).
    pub(crate) async fn fail(&mut self, error: String) {
        let class = json!({ "category": "permanent", "retryable": false });
        self.fail_classified(error, class).await;
    }

    /// Ends the thread with `error` unless an `error` hook orders a retry (bounded).
    pub(crate) async fn fail_classified(
        &mut self,
        error: String,
        classification: serde_json::Value,
    ) {
        self.log(Line::Error {
            message: error.clone(),
        });
        let ctx = json!({ "thread_id": self.doc.id, "error": { "message": error }, "classification": classification });
        let fired = self.fire(HookEvent::Error, ctx);
        let may_retry = matches!(self.phase, Phase::Idle | Phase::Thinking)
            && self.calls.current.is_none()
            && self.hooks.retries < crate::hooks::MAX_HOOK_RETRIES;
        if fired.control == Some(crate::hooks::Control::Retry) && may_retry {
            self.hooks.retries += 1;
            self.log(Line::HookControl {
                action: "retry".into(),
                limit: None,
                refused: None,
                retry: Some(self.hooks.retries),
            });
            self.phase = Phase::Idle;
            let _ = self.me.cast(ThreadMsg::NextTurn);
            return;
        }
        self.finalize(Ending::error(error)).await;
    }

    /// `Cancel`: ends the thread `cancelled` (and its subtree with it).
    pub(crate) async fn cancel(&mut self, reason: String) {
        // Already ending (perhaps handing off): the noted cancel stays, for the actor's stop to
        // hand on to a continuation (`Ctx::hand_on_cancel`).
        if matches!(self.phase, Phase::Draining(_)) {
            return;
        }
        self.ctx.forget_cancel(&self.doc.id);
        self.log(Line::CancelRequested {
            reason: reason.clone(),
        });
        let e = Ending {
            error: Some(format!("cancelled: {reason}")),
            ..Ending::with(Status::Cancelled)
        };
        self.finalize(e).await;
    }

    /// The duration limit fired.
    pub(crate) async fn duration_expired(&mut self) {
        if matches!(self.phase, Phase::Draining(_)) {
            return;
        }
        let d = humantime::format_duration(self.limits.duration()).to_string();
        self.log(Line::LimitHit {
            limit: "duration".into(),
            used: None,
            max: d.clone(),
        });
        self.finalize(Ending::error(format!("limit exceeded: duration {d}")))
            .await;
    }

    /// A transcript append failed: the thread ends `error` rather than go on with a record that
    /// lost a line (a thread already ending ends `error` instead of how it was ending).
    pub(crate) async fn record_failed(&mut self, why: String) {
        tracing::error!(thread = %self.doc.id, "{why}");
        if let Phase::Draining(e) = &mut self.phase {
            *e = Ending::error(why);
            return;
        }
        self.finalize(Ending::error(why)).await;
    }

    /// A loss not yet acted on turns the ending into `error`.
    fn unless_record_failed(&mut self, e: Ending) -> Ending {
        match self.record.failed.take() {
            Some(why) => Ending::error(why),
            None => e,
        }
    }

    /// A final line lost after the terminal status was set (never signed yet): the thread ends
    /// `error` with the loss instead (a handed-off thread keeps `continued`, and the note).
    fn final_lines_lost(&mut self) {
        let Some(why) = self.record.failed.take() else {
            return;
        };
        tracing::error!(thread = %self.doc.id, "{why}");
        if self.doc.status != Status::Continued {
            self.doc.history.pop();
            self.doc.transition(Status::Error);
        }
        self.doc.error = Some(why);
    }

    /// Children did not acknowledge the cancel within the grace: they are killed, and the
    /// thread ends.
    pub(crate) async fn grace_expired(&mut self) {
        if let Phase::Draining(e) = &self.phase {
            let e = e.clone();
            self.kill_stragglers().await;
            self.complete_finalize(e).await;
        }
    }

    /// Ends the thread: aborts in-flight work, cancels live children and waits (bounded) for
    /// them, then [`Self::complete_finalize`].
    pub(crate) async fn finalize(&mut self, e: Ending) {
        if self.phase.ending() {
            return;
        }
        // Cancelling also cuts the LLM call under way short; the thread waits (bounded by the
        // grace) for its outcome, so what the provider may have billed is settled, never $0.
        self.life.cancel.cancel();
        self.abandon_approvals();
        if self.quiet() {
            return self.complete_finalize(e).await;
        }
        let live = self.kids.live();
        if !live.is_empty() {
            self.log(Line::CancellingChildren { children: live });
        }
        self.cancel_kids(&format!("parent {} is ending", self.doc.id));
        self.phase = Phase::Draining(e);
        self.after(self.ctx.config.cancel_grace, ThreadMsg::GraceExpired);
    }

    /// The grace ran out: every live child's subtree is killed and finalized deepest first
    /// (terminal transcript line, ledger closed, registry row, signed thread.json).
    async fn kill_stragglers(&mut self) {
        let grace = humantime::format_duration(self.ctx.config.cancel_grace).to_string();
        for id in self.kids.live() {
            let end = DeadEnd {
                status: Status::Cancelled,
                kind: DeadKind::Killed,
                error: format!(
                    "killed: its subtree did not end within cancel_grace ({grace}) after {} asked it to",
                    self.doc.id
                ),
            };
            let r = Box::pin(end_subtree(&self.ctx, &id, &end)).await;
            self.log(Line::ChildFinished {
                id: id.clone(),
                status: r.status,
                spend_nanos: None,
                error: r.error.clone(),
                head: r.final_head.clone(),
            });
            if let Some(c) = self.kids.map.get_mut(&id) {
                c.report = Some(r);
            }
        }
    }

    /// Settles the ledger (exactly once), writes the last transcript lines, the registry row
    /// and the signed thread.json, tells the parent (or the root's waiter) and stops.
    pub(crate) async fn complete_finalize(&mut self, e: Ending) {
        self.phase = Phase::Done;
        self.life.stop_timers();
        if let Some(d) = self.life.deadline.take() {
            self.ctx.deadlines.clear(d);
        }
        self.abandon_call();
        self.close_account().await;
        let e = self.unless_record_failed(e);
        if e.status == Status::Completed {
            self.hand_files_up();
        } else {
            self.work.returned_files.clear();
        }
        // A handoff: the continuation starts now (it needs this thread's final spend) and takes
        // over the parent link or the root's waiter.
        let e = match (e.status, self.life.handoff.take()) {
            (Status::Continued, Some(messages)) => self.continue_with(messages, e).await,
            _ => e,
        };
        self.set_outcome(&e);
        self.final_lines(e.status);
        self.final_lines_lost();
        crate::core::failpoint::hit("finalize.line");
        self.write_final_doc().await;
        crate::core::failpoint::hit("finalize.doc");
        self.ctx.store_row(self.row()).await;
        crate::core::failpoint::hit("finalize.row");
        self.ctx.store.index_later(crate::store::Ended {
            id: self.id().clone(),
            directive: self.doc.directive.clone(),
            head: self.record.transcript.head().seq,
            said: Some(std::mem::take(&mut self.record.said)),
        });
        self.tell_everyone();
    }

    /// Closes the ledger account: its final spend is the subtree's.
    async fn close_account(&mut self) {
        let acct = ractor::call!(self.ctx.ledger, |reply| LedgerMsg::Close {
            id: self.doc.id.clone(),
            reply
        });
        crate::core::failpoint::hit("finalize.closed");
        match acct {
            Ok(Ok(a)) => self.doc.cost.spend_nanos = a.spent.0,
            other => {
                tracing::error!(thread = %self.doc.id, "ledger close failed: {other:?}");
                self.doc.cost.spend_nanos = self.calls.own_spend.0;
            }
        }
    }

    /// The result, outputs and error of `e` in thread.json, and its terminal transition. The
    /// signed state, the registry row and the report hold no secret either.
    fn set_outcome(&mut self, e: &Ending) {
        let redactor = self.ctx.redactor();
        let clean = |t: &Option<String>| t.as_ref().map(|t| redactor.redact(t).into_owned());
        self.doc.result = clean(&e.result);
        self.doc.outputs = e.outputs.clone().map(|mut o| {
            redactor.redact_value(&mut o);
            o
        });
        self.doc.error = clean(&e.error);
        self.doc.transition(e.status);
    }

    /// Starts the continuation and records which thread it is (or why none could start).
    /// How this thread ends: `continued`, or `cancelled` when its cancel withdrew the start.
    async fn continue_with(
        &mut self,
        messages: Vec<crate::provider::Message>,
        e: Ending,
    ) -> Ending {
        match self.start_continuation(messages).await {
            Ok(next) => {
                self.log(Line::ContinuedBy { id: next.clone() });
                self.doc.continued_by = Some(next);
                e
            }
            Err(SpawnError::Withdrawn(why)) => {
                let reason = self.ctx.noted_cancel(self.id()).unwrap_or(why);
                self.log(Line::CancelRequested {
                    reason: reason.clone(),
                });
                Ending {
                    error: Some(format!(
                        "cancelled: {reason} (as its continuation started, which was withdrawn)"
                    )),
                    ..Ending::with(Status::Cancelled)
                }
            }
            Err(err) => {
                self.log(Line::Error {
                    message: format!("the continuation could not start: {err}"),
                });
                let error = format!("continued, but the continuation could not start: {err}");
                Ending {
                    error: Some(error),
                    ..e
                }
            }
        }
    }

    /// `after_complete` hooks, then the terminal `thread_finished` line (which stays the last).
    fn final_lines(&mut self, status: Status) {
        let usage = self.calls.usage;
        let (own, spend) = (self.calls.own_spend, self.doc.cost.spend_nanos);
        let fin = Line::ThreadFinished {
            status,
            error: self.doc.error.clone(),
            spend_nanos: Nanos(spend),
            own_spend_nanos: own,
            run: Some(RunTotals {
                result: self.doc.result.clone(),
                outputs: self.doc.outputs.clone(),
                turns: self.doc.cost.turns,
                usage,
                overrun_nanos: Nanos(self.doc.cost.overrun_nanos),
            }),
            error_kind: None,
        };
        let done = json!({
            "thread_id": self.doc.id, "directive": self.doc.directive, "status": status,
            "result": self.doc.result, "outputs": self.doc.outputs, "duration_ms": self.life.started.elapsed().as_millis() as u64,
            "cost": { "turns": self.doc.cost.turns, "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                      "cache_read_tokens": usage.cache_read_tokens, "own_spend_nanos": own, "spend_nanos": spend },
        });
        self.fire(HookEvent::AfterComplete, done);
        self.log(fin);
    }

    /// The terminal fsyncs (transcript, then thread.json) run on the runtime's writer threads,
    /// so many threads ending together overlap their fsyncs instead of queueing on the workers.
    async fn write_final_doc(&mut self) {
        if let Err(err) = self.record.transcript.checkpoint_line() {
            tracing::error!(thread = %self.doc.id, "transcript checkpoint failed: {err}");
        }
        self.refresh_doc();
        let sync_transcript = self.record.transcript.sync_later();
        // Signed here, stored there: the writer gets the bytes, not a copy of the document.
        let file = self.doc.signed_file(&self.ctx.signer);
        let (id, status, head) = (
            self.doc.id.clone(),
            self.doc.status,
            self.doc.transcript_head.clone(),
        );
        let signer = self.ctx.signer.clone();
        let records = self.ctx.store.records().clone();
        let linked = self.parent.is_some();
        let written = self
            .ctx
            .writers
            .run(self.id(), move || {
                sync_transcript()?;
                records.replace_doc(&id, &file?, true)?;
                crate::core::failpoint::hit("finalize.signed");
                // The final head of a thread no running parent records (a root, a deferred child,
                // their continuations) goes to the project's anchor log; a child's is in its
                // parent's `child_finished` line.
                match linked {
                    false => {
                        crate::record::anchors::anchor_root(&records, &signer, &id, status, &head)
                    }
                    true => Ok(()),
                }
            })
            .await;
        if !matches!(written, Some(Ok(()))) {
            tracing::error!(thread = %self.doc.id, "final thread.json or transcript sync failed: {written:?}");
        }
    }

    /// The report to live watchers, the parent (or the root's waiter), then the actor stops.
    fn tell_everyone(&mut self) {
        let report = self.report();
        self.end_span(&report);
        // Nobody subscribed: the send would only drop the copy.
        if self.ctx.events.receiver_count() > 0 {
            let _ = self
                .ctx
                .events
                .send(Event::Finished(Box::new(report.clone())));
        }
        if let Some((_, parent)) = &self.parent {
            let _ = parent.cast(ThreadMsg::ChildFinished(Box::new(report.clone())));
        }
        if let (Some(parent), Some(placer)) =
            (self.report_to.clone(), self.ctx.placement.placer.get())
        {
            let told = placer.report(parent, report.clone());
            self.ctx.track(tokio::spawn(told));
        }
        if let Some(ended) = self.life.ended.take() {
            let _ = ended.send(());
        }
        self.ctx.forget(self.id());
        if let Some(tx) = self.life.on_finish.take() {
            let _ = tx.send(report);
        }
        self.me.stop(None);
    }

    /// Copies the files a completed thread returned into its parent's file area under
    /// `from/<thread id>/`; the report then names them there (a root's stay where they are).
    fn hand_files_up(&mut self) {
        let Some(parent) = self.doc.parent_id.clone() else {
            return;
        };
        if self.work.returned_files.is_empty() {
            return;
        }
        let own = self.ctx.store.files_dir(self.id());
        let theirs = self.ctx.store.files_dir(&parent);
        let mut handed = Vec::new();
        for rel in std::mem::take(&mut self.work.returned_files) {
            let to = format!("from/{}/{rel}", self.id());
            match crate::tools::copy_between(&own, &rel, &theirs, &to) {
                Ok(_) => handed.push(to),
                Err(error) => self.log(Line::FilesNotReturned { path: rel, error }),
            }
        }
        if !handed.is_empty() {
            self.log(Line::FilesReturned {
                to: parent,
                paths: handed.clone(),
            });
        }
        self.work.returned_files = handed;
    }

    /// Records the thread's end on its `invoke_agent` span and closes it (with any call spans
    /// left).
    fn end_span(&mut self, report: &ThreadReport) {
        let span = std::mem::replace(&mut self.life.span, tracing::Span::none());
        span.record("weft.status", report.status.as_str());
        span.record("weft.spend_nanos", report.own_spend_nanos.0);
        span.record("weft.tree_spend_nanos", report.spend_nanos.0);
        span.record("gen_ai.usage.input_tokens", report.input_tokens as i64);
        span.record("gen_ai.usage.output_tokens", report.output_tokens as i64);
        if report.status != Status::Completed {
            span.record("error.type", report.status.as_str());
        }
        self.calls.span = None;
        self.work.spans.clear();
    }
}
