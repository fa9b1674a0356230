//! The turn loop (SPEC §6): limits, reservation, the LLM call as a task, recording and settling
//! every attempt, retries with backoff, and the answer that ends a thread.

use super::conversation::message_text;
use super::ctx::Event;
use super::msg::ThreadMsg;
use super::parts::{backoff, unique_call_ids, Billed, Call};
use super::spawn::MIN_OUTPUT_TOKENS;
use super::state::{Ending, Phase, Thread};
use crate::core::money::{Nanos, Usage};
use crate::core::status::Status;
use crate::hooks::{Control, HookEvent};
use crate::ledger::{Grant, LedgerError, LedgerMsg, ReservationId};
use crate::provider::{Block, ErrorKind, LlmRequest, LlmResponse, Message, ProviderError, Role};
use crate::record::line::{CallError, Line};
use serde_json::{json, Value};
use std::time::Duration;

/// A call ready to start: its request, the flush of its streamed text, its reservation.
struct Prepared {
    req: LlmRequest,
    flush: Option<Box<dyn FnOnce() + Send>>,
    grant: Grant,
}

/// Why a turn does not make its call.
enum Stop {
    /// A limit was hit (`limit`, what was used, the maximum).
    Limit(&'static str, String, String),
    /// The thread fails with this message.
    Fail(String),
    /// The prompt passes the continuation threshold: hand off with this window.
    HandOff(u64),
    /// Nothing to do (cancelled).
    Quiet,
}

impl Thread {
    /// `Start`: the thread runs — its first records, its start hooks, its duration timer, then
    /// its first turn.
    pub(crate) async fn start(&mut self) {
        // Announced before anything else of the thread, so a subtree's watchers know it as theirs.
        let _ = self.ctx.events.send(Event::Started {
            id: self.id().clone(),
            parent: self.doc.parent_id.clone(),
            directive: self.doc.directive.clone(),
        });
        self.doc.transition(Status::Running);
        self.log(Line::Status {
            status: Status::Running,
        });
        let continued = self.doc.continuation_of.clone();
        // A cancel its predecessor was sent but never took (it was busy starting this thread)
        // is this thread's, before any call.
        let inherited = continued
            .as_ref()
            .and_then(|old| self.ctx.forget_cancel(old));
        if let Some(reason) = inherited {
            self.ctx.send_cancel(&self.doc.id, &self.me, &reason);
        }
        // A child's continuation tells the parent it takes its predecessor's place before it can
        // report anything (one sender: the parent sees this before this thread's end).
        if let (Some(old), Some((_, parent))) = (&continued, &self.parent) {
            let _ = parent.cast(ThreadMsg::ChildContinued {
                old: old.clone(),
                new: self.doc.id.clone(),
                actor: self.me.clone(),
            });
        }
        let event = match continued {
            Some(_) => HookEvent::ThreadContinued,
            None => HookEvent::ThreadStarted,
        };
        if self.hooks.wants(event) {
            let ctx = json!({
                "thread_id": self.doc.id, "directive": self.doc.directive, "directive_body": self.directive.body,
                "model": self.doc.model, "limits": self.limits, "inputs": self.inputs, "previous_thread_id": continued,
            });
            let fired = self.fire(event, ctx);
            self.inject_context(fired.injected);
        }
        self.log_first_messages();
        self.sign_doc(false);
        self.publish_row();
        let deadline = self
            .ctx
            .deadlines
            .set(self.limits.duration(), self.me.clone());
        self.life.deadline = Some(deadline);
        let _ = self.me.cast(ThreadMsg::NextTurn);
    }

    /// The prompt as the transcript's first message; a continuation also records the
    /// conversation it inherits, so it can be continued in turn.
    fn log_first_messages(&mut self) {
        let Some((last, inherited)) = self.talk.messages.split_last() else {
            return;
        };
        let text = message_text(last);
        if !inherited.is_empty() {
            let messages = serde_json::to_value(inherited).unwrap_or(Value::Null);
            let calls_made = self.calls.made;
            self.log(Line::Conversation {
                messages,
                calls_made,
            });
        }
        self.log(Line::user(text));
    }

    /// A provider billed more than the call's reservation: the ledger has settled the actual
    /// cost; the overrun is recorded and this thread's subtree makes no further call.
    async fn overran(&mut self, reservation: ReservationId, cost: Nanos, overrun: Nanos) {
        self.doc.cost.overrun_nanos += overrun.0;
        let model = self.doc.model.clone();
        self.log(Line::SpendOverrun {
            reservation,
            cost_nanos: cost,
            overrun_nanos: overrun,
            model: model.clone(),
        });
        if self.phase.ending() {
            return;
        }
        let msg = format!(
            "spend overrun: a call to `{model}` was billed {cost}, {overrun} more than reserved for it; this thread's subtree makes no further call (if `{model}`'s chat template is larger than assumed, raise prompt_overhead_tokens for it)"
        );
        self.fail(msg).await;
    }

    /// A limit was hit: a `limit` hook may lift it once or hand off; otherwise the thread ends.
    async fn limit_hit(&mut self, limit: &str, used: String, max: String) {
        self.log(Line::LimitHit {
            limit: limit.to_string(),
            used: Some(used.clone()),
            max: max.clone(),
        });
        self.life.span.record("weft.limit", limit);
        let ctx = json!({ "thread_id": self.doc.id, "limit_code": limit, "current_value": used, "current_max": max });
        let fired = self.fire(HookEvent::Limit, ctx);
        if fired.control == Some(Control::Continue) && self.lift_once(limit) {
            let _ = self.me.cast(ThreadMsg::NextTurn);
            return;
        }
        let money = matches!(limit, "spend");
        if fired.control == Some(Control::Handoff) && !money && self.can_hand_off() {
            self.log(Line::HookControl {
                action: "handoff".into(),
                limit: Some(limit.to_string()),
                refused: None,
                retry: None,
            });
            let window = self.ctx.config.context_window_of(&self.doc.model);
            return self.hand_off(window).await;
        }
        let msg = format!("limit exceeded: {limit} {used}/{max}");
        self.finalize(Ending::error(msg)).await;
    }

    /// Ends this thread `continued`; its continuation starts from the trimmed conversation
    /// (half the window, when there is one).
    async fn hand_off(&mut self, window: Option<u64>) {
        let budget = window.map_or(usize::MAX, |w| (w / 2) as usize);
        let trimmed = super::handoff::trimmed(&self.talk.messages, budget, self.id());
        self.life.handoff = Some(trimmed);
        self.finalize(Ending::with(Status::Continued)).await;
    }

    /// `NextTurn`: messages delivered, limits checked, the worst case reserved, the call
    /// started as a task.
    pub(crate) async fn next_turn(&mut self) {
        if !matches!(self.phase, Phase::Idle) || self.record.failed.is_some() {
            return;
        }
        self.deliver_inbox();
        self.announce_children();
        let req = match self.prepare_call().await {
            Ok(req) => req,
            Err(stop) => return self.stop_turn(stop).await,
        };
        self.call_llm(req);
    }

    /// Reports of children nobody waits for, as one user message.
    fn announce_children(&mut self) {
        if self.kids.announce.is_empty() {
            return;
        }
        let reports: Vec<Value> = self.kids.announce.drain(..).map(|r| json!(r)).collect();
        let text = format!("Children finished: {}", Value::Array(reports));
        self.log(Line::user(text.clone()));
        self.talk.push(Message::user(text));
    }

    async fn stop_turn(&mut self, stop: Stop) {
        match stop {
            Stop::Limit(limit, used, max) => self.limit_hit(limit, used, max).await,
            Stop::Fail(msg) => self.fail(msg).await,
            Stop::HandOff(window) => self.hand_off(Some(window)).await,
            Stop::Quiet => {}
        }
    }

    /// The request of the next call, its prompt bounded and its worst case reserved.
    async fn prepare_call(&mut self) -> Result<Prepared, Stop> {
        let turns = self.doc.cost.turns;
        if turns >= self.limits.turns {
            return Err(Stop::Limit(
                "turns",
                turns.to_string(),
                self.limits.turns.to_string(),
            ));
        }
        let used_tokens = self.calls.tokens_used();
        if used_tokens >= self.limits.tokens {
            let max = self.limits.tokens.to_string();
            return Err(Stop::Limit("tokens", used_tokens.to_string(), max));
        }
        if self.life.cancel.is_cancelled() {
            return Err(Stop::Quiet);
        }
        let mut req = self.request();
        let (sink, flush) = self.ctx.text_stream(self.id());
        req.on_text = sink;
        let prompt_bytes = crate::provider::prompt_bytes(&req);
        let prompt_tokens = self.prompt_bound(&req, prompt_bytes);
        let token_room = self.limits.tokens - used_tokens;
        if prompt_tokens >= token_room {
            let used = (used_tokens + prompt_tokens).to_string();
            return Err(Stop::Limit("tokens", used, self.limits.tokens.to_string()));
        }
        let want = self
            .ctx
            .config
            .max_output_tokens
            .min(token_room - prompt_tokens);
        let want = self.fit_window(prompt_tokens, want)?;
        let grant = self.reserve(prompt_tokens, want).await?;
        crate::core::failpoint::hit("turn.reserved");
        req.max_tokens = grant.max_output_tokens;
        self.calls.current = Some(Call {
            reservation: grant.reservation,
            reserved: grant.amount,
            prompt_bytes,
            messages: req.messages.len(),
            prompt_tokens,
            max_output: grant.max_output_tokens,
        });
        Ok(Prepared { req, flush, grant })
    }

    /// The next call's request (`max_tokens` and the text sink set later).
    fn request(&self) -> LlmRequest {
        LlmRequest {
            model: self.doc.model.clone(),
            system: self.talk.system.clone(),
            messages: self.talk.messages.clone(),
            tools: self.talk.tools.clone(),
            max_tokens: 0,
            directive: self.directive.name.clone(),
            thread_id: self.id().clone(),
            call_index: self.calls.made,
            on_text: None,
            known_prompt_bytes: Some(self.talk.prompt_bytes()),
        }
    }

    /// The output tokens a call may ask for within the model's context window (when known):
    /// past the continuation threshold the thread hands off; a prompt that does not fit fails.
    fn fit_window(&mut self, prompt_tokens: u64, want: u64) -> Result<u64, Stop> {
        let Some(window) = self.ctx.config.context_window_of(&self.doc.model) else {
            return Ok(want);
        };
        if self.hooks.wants(HookEvent::ContextWindowPressure) {
            let ctx = json!({ "thread_id": self.doc.id, "pressure_ratio": prompt_tokens as f64 / window as f64,
                              "tokens_used": prompt_tokens, "window": window });
            self.fire(HookEvent::ContextWindowPressure, ctx);
        }
        let threshold = (window as f64 * self.ctx.config.continuation_threshold) as u64;
        if prompt_tokens > threshold
            && self.ctx.config.builtin_hooks.continuation
            && self.can_hand_off()
        {
            self.log(Line::ContextFilling {
                prompt_tokens,
                window,
                threshold,
            });
            return Err(Stop::HandOff(window));
        }
        if prompt_tokens >= window {
            return Err(Stop::Fail(format!(
                "context overflow: the prompt (~{prompt_tokens} tokens) does not fit the {window}-token window of `{}`",
                self.doc.model
            )));
        }
        Ok(want.min(window - prompt_tokens))
    }

    /// Reserves the call's worst case up the ancestor chain.
    async fn reserve(&mut self, prompt_tokens: u64, want: u64) -> Result<Grant, Stop> {
        let min_out = MIN_OUTPUT_TOKENS.min(want);
        // Every prompt token is reserved at the dearest of the input, cache-read and cache-write
        // prices: the bound covers all three, and the provider decides which it bills.
        let mut price = self.price;
        price.input = price.input.max(price.cache_read).max(price.cache_write);
        let grant = ractor::call!(self.ctx.ledger, |reply| LedgerMsg::Reserve {
            id: self.doc.id.clone(),
            price,
            prompt_tokens,
            want_output: want,
            min_output: min_out,
            reply
        });
        match grant {
            Ok(Ok(g)) => Ok(g),
            Ok(Err(LedgerError::Insufficient {
                needed, available, ..
            })) => Err(Stop::Limit(
                "spend",
                format!("{} used, {} needed", self.calls.own_spend, needed),
                format!("{} available", available),
            )),
            Ok(Err(e)) => Err(Stop::Fail(format!("ledger: {e}"))),
            Err(e) => Err(Stop::Fail(format!("ledger unreachable: {e}"))),
        }
    }

    /// Starts the call as a task; it reports back as [`ThreadMsg::LlmDone`].
    fn call_llm(&mut self, prepared: Prepared) {
        let Prepared { req, flush, grant } = prepared;
        self.phase = Phase::Thinking;
        self.calls.span = Some(super::spans::chat(
            &self.life.span,
            &self.doc.provider,
            &req.model,
            req.max_tokens,
            grant.amount.0,
        ));
        let provider = self.provider.clone();
        let token = self.life.cancel.child_token();
        let me = self.me.clone();
        let reservation = grant.reservation;
        tokio::spawn(async move {
            let outcome = provider.complete(req, token).await;
            if let Some(flush) = flush {
                flush();
            }
            let _ = me.cast(ThreadMsg::LlmDone {
                reservation,
                outcome,
            });
        });
    }

    /// `LlmDone`: every attempt is recorded and settled on its own, for what it actually cost;
    /// then a retry, the end, or the model's answer.
    pub(crate) async fn llm_done(
        &mut self,
        reservation: ReservationId,
        outcome: Result<LlmResponse, ProviderError>,
    ) {
        let call = self
            .calls
            .current
            .take()
            .filter(|c| c.reservation == reservation);
        let ending = self.phase.ending();
        let (cost, retry) = self.record_attempt(reservation, call.as_ref(), &outcome, ending);
        let overrun = call
            .as_ref()
            .map_or(Nanos::ZERO, |c| cost.minus(c.reserved));
        if overrun > Nanos::ZERO {
            self.overran(reservation, cost, overrun).await;
            if ending {
                self.drained().await;
            }
            return;
        }
        self.remember_billed(&outcome, call.as_ref());
        if ending {
            self.drained().await;
            return;
        }
        self.phase = Phase::Idle;
        match outcome {
            Ok(resp) => self.answered(resp).await,
            Err(e) if e.kind == ErrorKind::Cancelled => {}
            Err(_) if retry.is_some() => {
                self.calls.attempt += 1;
                self.after(retry.unwrap_or_default(), ThreadMsg::NextTurn);
            }
            Err(e) => self.call_failed(e).await,
        }
    }

    /// The attempt's transcript line (with the reservation id, so recovery can settle it if the
    /// ledger never heard), then its settlement — cast: the next reservation queues behind it in
    /// the ledger. Returns its cost and, when it is to be retried, the wait.
    fn record_attempt(
        &mut self,
        reservation: ReservationId,
        call: Option<&Call>,
        outcome: &Result<LlmResponse, ProviderError>,
        ending: bool,
    ) -> (Nanos, Option<Duration>) {
        let (reported, incomplete) = match outcome {
            Ok(r) => (r.usage, r.usage_incomplete),
            Err(e) => (e.usage, e.usage_incomplete),
        };
        let usage = match (call, incomplete) {
            (Some(c), true) => c.upper_bound(reported),
            _ => reported,
        };
        let cost = self.price.cost(&usage);
        self.calls.count(&usage, cost);
        let retry = match outcome {
            Err(e)
                if !ending
                    && e.kind != ErrorKind::Cancelled
                    && e.kind.retryable()
                    && self.calls.attempt < self.ctx.config.retries =>
            {
                Some(e.retry_after.unwrap_or_else(|| backoff(self.calls.attempt)))
            }
            _ => None,
        };
        let line = self.attempt_line(outcome, retry, &usage, cost, reservation, incomplete);
        self.log(line);
        if let Some(span) = self.calls.span.take() {
            super::spans::chat_done(&span, &self.doc.model, outcome, &usage, cost.0);
        }
        crate::core::failpoint::hit("turn.recorded");
        let _ = self.ctx.ledger.cast(LedgerMsg::Settle {
            reservation,
            actual: cost,
            reply: None,
        });
        crate::core::failpoint::hit("settle.cast");
        if self.hooks.wants(HookEvent::AfterStep) {
            let step = json!({
                "thread_id": self.doc.id, "turn": self.calls.made,
                "cost": { "spend_nanos": self.calls.own_spend, "input_tokens": self.calls.usage.input_tokens, "output_tokens": self.calls.usage.output_tokens },
            });
            self.fire(HookEvent::AfterStep, step);
        }
        (cost, retry)
    }

    /// An attempt's transcript line: `llm_retry` when it is retried, else `llm_call`.
    fn attempt_line(
        &self,
        outcome: &Result<LlmResponse, ProviderError>,
        retry: Option<Duration>,
        usage: &Usage,
        cost: Nanos,
        reservation: ReservationId,
        incomplete: bool,
    ) -> Line {
        let model = self.doc.model.clone();
        let usage = *usage;
        let reservation = Some(reservation);
        match (outcome, retry) {
            (Err(e), Some(wait)) => Line::LlmRetry {
                attempt: self.calls.attempt + 1,
                kind: e.kind.as_str().into(),
                message: e.message.clone(),
                model,
                retry_after_ms: e.retry_after.map(|d| d.as_millis() as u64),
                wait_ms: wait.as_millis() as u64,
                usage,
                cost_nanos: Some(cost),
                reservation,
                usage_incomplete: incomplete,
            },
            (Err(e), None) => Line::LlmCall {
                model,
                provider: None,
                usage,
                cost_nanos: Some(cost),
                reservation,
                usage_incomplete: incomplete,
                error: Some(CallError {
                    kind: e.kind.as_str().into(),
                    message: e.message.clone(),
                }),
                stop_reason: None,
                stream_deltas: None,
            },
            (Ok(r), _) => Line::LlmCall {
                model,
                provider: Some(self.doc.provider.clone()),
                usage,
                cost_nanos: Some(cost),
                reservation,
                usage_incomplete: incomplete,
                error: None,
                stop_reason: Some(r.stop_reason.clone()),
                stream_deltas: Some(r.stream_deltas),
            },
        }
    }

    /// What a fully reported call's prompt was billed, for a tighter bound on the next one.
    fn remember_billed(
        &mut self,
        outcome: &Result<LlmResponse, ProviderError>,
        call: Option<&Call>,
    ) {
        let (Ok(r), Some(c)) = (outcome, call) else {
            return;
        };
        let billed = r.usage.input_tokens + r.usage.cache_read_tokens;
        if !r.usage_incomplete && billed > 0 {
            self.calls.billed = Some(Billed {
                prompt_tokens: billed,
                prompt_bytes: c.prompt_bytes,
                messages: c.messages,
            });
        }
    }

    /// The call failed for good (retries used up or not retryable).
    async fn call_failed(&mut self, e: ProviderError) {
        let msg = format!(
            "LLM call failed ({:?}) after {} attempt(s): {}",
            e.kind,
            self.calls.attempt + 1,
            e.message
        );
        let class = json!({ "category": "llm", "kind": e.kind, "retryable": e.kind.retryable() });
        self.fail_classified(msg, class).await;
    }

    /// The model answered: its text and tool calls join the conversation; the calls start, or
    /// a text-only answer ends the thread.
    async fn answered(&mut self, mut resp: LlmResponse) {
        self.calls.attempt = 0;
        unique_call_ids(&mut resp.tool_calls);
        crate::provider::bound_nesting(&mut resp.tool_calls);
        self.doc.cost.turns += 1;
        self.publish_row();
        let _ = self.ctx.events.send(Event::Turn {
            id: self.id().clone(),
            turns: self.doc.cost.turns,
            spend: self.calls.own_spend,
        });
        let mut content = Vec::new();
        if !resp.text.is_empty() {
            self.log(Line::AssistantText {
                text: resp.text.clone(),
            });
            content.push(Block::Text {
                text: resp.text.clone(),
            });
        }
        for c in &resp.tool_calls {
            let input = super::builtin::loggable_input(c);
            content.push(Block::ToolUse {
                id: c.id.clone(),
                name: c.name.clone(),
                input: c.input.clone(),
            });
            self.log(Line::ToolUse {
                id: c.id.clone(),
                name: c.name.clone(),
                input,
            });
        }
        self.talk.push(Message {
            role: Role::Assistant,
            content,
        });
        if self.record.failed.is_some() {
            return; // the actor ends the thread once this message is handled
        }
        if resp.tool_calls.is_empty() {
            return self.answer_without_tools(resp.text).await;
        }
        self.start_tools(resp.tool_calls).await;
    }

    /// A call still under way when the thread ends regardless (its provider ignored the cancel
    /// past the grace): recorded and settled at its upper bound.
    pub(crate) fn abandon_call(&mut self) {
        let Some(c) = self.calls.current.take() else {
            return;
        };
        let usage = c.upper_bound(Usage::default());
        let cost = self.price.cost(&usage);
        self.calls.count(&usage, cost);
        self.log(Line::LlmCall {
            model: self.doc.model.clone(),
            provider: None,
            usage,
            cost_nanos: Some(cost),
            reservation: Some(c.reservation),
            usage_incomplete: true,
            error: Some(CallError {
                kind: ErrorKind::Cancelled.as_str().into(),
                message: "abandoned: the provider did not return within cancel_grace".into(),
            }),
            stop_reason: None,
            stream_deltas: None,
        });
        let _ = self.ctx.ledger.cast(LedgerMsg::Settle {
            reservation: c.reservation,
            actual: cost,
            reply: None,
        });
    }

    /// A text-only answer: the thread completes with it, unless its directive declares
    /// required outputs (then the model is asked once more for `directive_return`).
    async fn answer_without_tools(&mut self, text: String) {
        let missing = self
            .directive
            .check_outputs(&serde_json::Map::new())
            .is_err();
        if missing {
            let nudge =
                "You must call directive_return with the declared outputs to finish.".to_string();
            self.log(Line::user(nudge.clone()));
            self.talk.push(Message::user(nudge));
            let _ = self.me.cast(ThreadMsg::NextTurn);
            return;
        }
        let e = Ending {
            result: Some(text),
            ..Ending::with(Status::Completed)
        };
        self.finalize(e).await;
    }

    /// An upper bound on the prompt tokens of `req`: the provider's bound, tightened by what the
    /// previous call's prompt was actually billed plus at most one token per byte appended since
    /// (and the template's tokens again). Never an estimate: the ledger reserves it as a worst
    /// case.
    fn prompt_bound(&self, req: &LlmRequest, prompt_bytes: u64) -> u64 {
        let overhead = self.ctx.config.prompt_overhead_of(&self.doc.model);
        let bound = self.provider.prompt_token_bound(req, overhead);
        let Some(b) = self.calls.billed else {
            return bound;
        };
        let new_messages = req.messages.len().saturating_sub(b.messages) as u64 + 1;
        let grown = prompt_bytes.saturating_sub(b.prompt_bytes)
            + crate::provider::PER_MESSAGE_TOKENS * new_messages;
        bound.min(b.prompt_tokens + grown + overhead)
    }
}
