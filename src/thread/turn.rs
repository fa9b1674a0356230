//! The turn loop (SPEC §6): limits, reservation, the LLM call as a task, recording and settling
//! every attempt, retries with backoff, and the answer that ends a thread.

use super::conversation::message_text;
use super::state::{Billed, Call, Ending, Phase, ThreadState};
use super::Event;
use super::{ThreadActor, ThreadMsg};
use crate::core::money::{Nanos, Usage};
use crate::core::status::Status;
use crate::ledger::LedgerMsg;
use crate::provider::{Block, ErrorKind, LlmRequest, LlmResponse, Message, ProviderError, Role};
use crate::registry::RegistryMsg;
use ractor::ActorRef;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

impl ThreadActor {
    pub(super) async fn start(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState) {
        // Announced before anything else of the thread, so a subtree's watchers know it as theirs.
        let _ = s.ctx.events.send(Event::Started {
            id: s.id().clone(),
            parent: s.doc.parent_id.clone(),
            directive: s.doc.directive.clone(),
        });
        s.doc.transition(Status::Running);
        s.log("status", json!({ "status": "running" }));
        let continued = s.doc.continuation_of.clone();
        // A child's continuation tells the parent it takes its predecessor's place before it can
        // report anything (one sender: the parent sees this before this thread's end).
        if let (Some(old), Some((_, parent))) = (&continued, &s.parent) {
            let _ = parent.cast(ThreadMsg::ChildContinued {
                old: old.clone(),
                new: s.doc.id.clone(),
                actor: me.clone(),
            });
        }
        let event = if continued.is_some() {
            "thread_continued"
        } else {
            "thread_started"
        };
        if super::hook_run::wants(s, event) {
            let ctx = json!({
                "thread_id": s.doc.id, "directive": s.doc.directive, "directive_body": s.directive.body,
                "model": s.doc.model, "limits": s.limits, "inputs": s.inputs, "previous_thread_id": continued,
            });
            let fired = super::hook_run::fire(me, s, event, ctx);
            super::hook_run::inject_into_conversation(s, fired.injected);
        }
        // A continuation records the conversation it inherits, so it can be continued in turn.
        if let Some((last, inherited)) = s.messages.split_last() {
            if !inherited.is_empty() {
                let inherited = serde_json::to_value(inherited).unwrap_or(Value::Null);
                let text = message_text(last);
                let calls = s.calls_made;
                s.log(
                    "conversation",
                    json!({ "messages": inherited, "calls_made": calls }),
                );
                s.log("message", json!({ "role": "user", "text": text }));
            } else {
                let text = message_text(last);
                s.log("message", json!({ "role": "user", "text": text }));
            }
        }
        s.sign_doc(false);
        let row = s.row();
        let _ = s.ctx.registry.cast(RegistryMsg::Update {
            row: Box::new(row),
            reply: None,
        });
        let me2 = me.clone();
        let d = s.limits.duration();
        s.timers.push(tokio::spawn(async move {
            tokio::time::sleep(d).await;
            let _ = me2.cast(ThreadMsg::DurationExpired);
        }));
        let _ = me.cast(ThreadMsg::NextTurn);
    }

    /// A provider billed more than the call's reservation: the ledger has settled the actual
    /// cost; the overrun is recorded and this thread's subtree makes no further call.
    pub(super) async fn overran(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        reservation: crate::ledger::ReservationId,
        cost: Nanos,
        overrun: Nanos,
    ) {
        s.doc.cost.overrun_nanos += overrun.0;
        let model = s.doc.model.clone();
        s.log(
            "spend_overrun",
            json!({ "reservation": reservation, "cost_nanos": cost, "overrun_nanos": overrun, "model": model }),
        );
        if matches!(s.phase, Phase::Draining(_) | Phase::Done) {
            return;
        }
        let msg = format!(
            "spend overrun: a call to `{model}` was billed {cost}, {overrun} more than reserved for it; this thread's subtree makes no further call (if `{model}`'s chat template is larger than assumed, raise prompt_overhead_tokens for it)"
        );
        self.fail(me, s, msg).await;
    }

    pub(super) async fn limit_hit(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        limit: &str,
        used: String,
        max: String,
    ) {
        s.log(
            "limit_hit",
            json!({ "limit": limit, "used": used, "max": max }),
        );
        s.span.record("weft.limit", limit);
        let ctx = json!({ "thread_id": s.doc.id, "limit_code": limit, "current_value": used, "current_max": max });
        let fired = super::hook_run::fire(me, s, "limit", ctx);
        if fired.control == Some(crate::hooks::Control::Continue) && lift_once(s, limit) {
            let _ = me.cast(ThreadMsg::NextTurn);
            return;
        }
        let money = matches!(limit, "spend");
        if fired.control == Some(crate::hooks::Control::Handoff)
            && !money
            && super::handoff::possible(s)
        {
            s.log(
                "hook_control",
                json!({ "action": "handoff", "limit": limit }),
            );
            let window = s.ctx.config.context_window_of(&s.doc.model);
            return self.hand_off(me, s, window).await;
        }
        let e = Ending {
            status: Status::Error,
            result: None,
            outputs: None,
            error: Some(format!("limit exceeded: {limit} {used}/{max}")),
        };
        self.finalize(me, s, e).await;
    }

    /// Ends this thread `continued`; its continuation starts from the trimmed conversation
    /// (half the window, when there is one).
    pub(super) async fn hand_off(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        window: Option<u64>,
    ) {
        let budget = window.map_or(usize::MAX, |w| (w / 2) as usize);
        s.handoff = Some(super::handoff::trimmed(&s.messages, budget, s.id()));
        let e = Ending {
            status: Status::Continued,
            result: None,
            outputs: None,
            error: None,
        };
        self.finalize(me, s, e).await;
    }

    pub(super) async fn next_turn(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState) {
        if !matches!(s.phase, Phase::Idle) {
            return;
        }
        super::messages::deliver(s);
        if !s.announce.is_empty() {
            let reports: Vec<Value> = s.announce.drain(..).map(|r| json!(r)).collect();
            let text = format!("Children finished: {}", Value::Array(reports));
            s.log("message", json!({ "role": "user", "text": text }));
            Arc::make_mut(&mut s.messages).push(Message::user(text));
        }
        let turns = s.doc.cost.turns;
        if turns >= s.limits.turns {
            let max = s.limits.turns.to_string();
            return self.limit_hit(me, s, "turns", turns.to_string(), max).await;
        }
        let used_tokens = s.usage.input_tokens + s.usage.output_tokens + s.usage.cache_read_tokens;
        if used_tokens >= s.limits.tokens {
            let max = s.limits.tokens.to_string();
            return self
                .limit_hit(me, s, "tokens", used_tokens.to_string(), max)
                .await;
        }
        if s.cancel.is_cancelled() {
            return;
        }
        let mut req = LlmRequest {
            model: s.doc.model.clone(),
            system: s.system.clone(),
            messages: s.messages.clone(),
            tools: s.tools.clone(),
            max_tokens: 0,
            directive: s.directive.name.clone(),
            thread_id: s.id().clone(),
            call_index: s.calls_made,
            on_text: None,
        };
        let (sink, flush) = s.ctx.text_stream(s.id());
        req.on_text = sink;
        let prompt_bytes = crate::provider::prompt_bytes(&req);
        let prompt_tokens = prompt_bound(s, &req, prompt_bytes);
        let token_room = s.limits.tokens - used_tokens;
        if prompt_tokens >= token_room {
            let max = s.limits.tokens.to_string();
            return self
                .limit_hit(
                    me,
                    s,
                    "tokens",
                    (used_tokens + prompt_tokens).to_string(),
                    max,
                )
                .await;
        }
        let mut want = s
            .ctx
            .config
            .max_output_tokens
            .min(token_room - prompt_tokens);
        if let Some(window) = s.ctx.config.context_window_of(&s.doc.model) {
            if super::hook_run::wants(s, "context_window_pressure") {
                let ctx = json!({ "thread_id": s.doc.id, "pressure_ratio": prompt_tokens as f64 / window as f64,
                                  "tokens_used": prompt_tokens, "window": window });
                super::hook_run::fire(me, s, "context_window_pressure", ctx);
            }
            let threshold = (window as f64 * s.ctx.config.continuation_threshold) as u64;
            if prompt_tokens > threshold
                && s.ctx.config.builtin_hooks.continuation
                && super::handoff::possible(s)
            {
                s.log(
                    "context_filling",
                    json!({ "prompt_tokens": prompt_tokens, "window": window, "threshold": threshold }),
                );
                return self.hand_off(me, s, Some(window)).await;
            }
            if prompt_tokens >= window {
                let msg = format!(
                    "context overflow: the prompt (~{prompt_tokens} tokens) does not fit the {window}-token window of `{}`",
                    s.doc.model
                );
                return self.fail(me, s, msg).await;
            }
            want = want.min(window - prompt_tokens);
        }
        let min_out = crate::thread::MIN_OUTPUT_TOKENS.min(want);
        // Every prompt token is reserved at the dearer of the input and cache-read prices: the
        // bound covers both, and the provider decides which it bills.
        let mut reserve_price = s.price;
        reserve_price.input = reserve_price.input.max(reserve_price.cache_read);
        let grant = ractor::call!(s.ctx.ledger, |reply| LedgerMsg::Reserve {
            id: s.doc.id.clone(),
            price: reserve_price,
            prompt_tokens,
            want_output: want,
            min_output: min_out,
            reply
        });
        let grant = match grant {
            Ok(Ok(g)) => g,
            Ok(Err(crate::ledger::LedgerError::Insufficient {
                needed, available, ..
            })) => {
                return self
                    .limit_hit(
                        me,
                        s,
                        "spend",
                        format!("{} used, {} needed", s.own_spend, needed),
                        format!("{} available", available),
                    )
                    .await;
            }
            Ok(Err(e)) => return self.fail(me, s, format!("ledger: {e}")).await,
            Err(e) => return self.fail(me, s, format!("ledger unreachable: {e}")).await,
        };
        crate::core::failpoint::hit("turn.reserved");
        req.max_tokens = grant.max_output_tokens;
        s.call = Some(Call {
            reservation: grant.reservation,
            reserved: grant.amount,
            prompt_bytes,
            messages: req.messages.len(),
            prompt_tokens,
            max_output: grant.max_output_tokens,
        });
        s.phase = Phase::Thinking;
        s.chat_span = Some(super::spans::chat(
            &s.span,
            &s.doc.provider,
            &req.model,
            req.max_tokens,
            grant.amount.0,
        ));
        let provider = s.provider.clone();
        let token = s.cancel.child_token();
        let me2 = me.clone();
        let reservation = grant.reservation;
        tokio::spawn(async move {
            let outcome = provider.complete(req, token).await;
            if let Some(flush) = flush {
                flush();
            }
            let _ = me2.cast(ThreadMsg::LlmDone {
                reservation,
                outcome,
            });
        });
    }

    pub(super) async fn llm_done(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        reservation: crate::ledger::ReservationId,
        outcome: Result<LlmResponse, ProviderError>,
    ) {
        // Every attempt is recorded and settled on its own, for what it actually cost: first the
        // transcript line (with the reservation id, so recovery can settle it if the ledger never
        // heard), then the settlement, cast: the next reservation queues behind it in the ledger.
        let (reported, incomplete) = match &outcome {
            Ok(r) => (r.usage, r.usage_incomplete),
            Err(e) => (e.usage, e.usage_incomplete),
        };
        let call = s.call.take().filter(|c| c.reservation == reservation);
        let usage = match (&call, incomplete) {
            (Some(c), true) => upper_bound(reported, c),
            _ => reported,
        };
        s.calls_made += 1;
        let cost = s.price.cost(&usage);
        add_usage(&mut s.usage, &usage);
        s.own_spend = s.own_spend.plus(cost);
        let ending = matches!(s.phase, Phase::Draining(_) | Phase::Done);
        let retry = match &outcome {
            Err(e)
                if !ending
                    && e.kind != ErrorKind::Cancelled
                    && e.kind.retryable()
                    && s.attempt < s.ctx.config.retries =>
            {
                Some(e.retry_after.unwrap_or_else(|| backoff(s.attempt)))
            }
            _ => None,
        };
        let model = s.doc.model.clone();
        let (kind, event) = match (&outcome, retry) {
            (Err(e), Some(wait)) => (
                "llm_retry",
                json!({
                    "attempt": s.attempt + 1, "kind": e.kind, "message": e.message, "model": model,
                    "retry_after_ms": e.retry_after.map(|d| d.as_millis() as u64), "wait_ms": wait.as_millis() as u64,
                    "usage": usage, "cost_nanos": cost, "reservation": reservation,
                    "usage_incomplete": incomplete,
                }),
            ),
            (Err(e), None) => (
                "llm_call",
                json!({ "model": model, "usage": usage, "cost_nanos": cost, "reservation": reservation,
                        "usage_incomplete": incomplete, "error": { "kind": e.kind, "message": e.message } }),
            ),
            (Ok(r), _) => (
                "llm_call",
                json!({ "model": model, "provider": s.doc.provider, "usage": usage, "cost_nanos": cost, "reservation": reservation,
                        "usage_incomplete": incomplete, "stop_reason": r.stop_reason, "stream_deltas": r.stream_deltas }),
            ),
        };
        s.log(kind, event);
        if let Some(span) = s.chat_span.take() {
            super::spans::chat_done(&span, &model, &outcome, &usage, cost.0);
        }
        crate::core::failpoint::hit("turn.recorded");
        let _ = s.ctx.ledger.cast(LedgerMsg::Settle {
            reservation,
            actual: cost,
            reply: None,
        });
        crate::core::failpoint::hit("settle.cast");
        if super::hook_run::wants(s, "after_step") {
            let step = json!({
                "thread_id": s.doc.id, "turn": s.calls_made,
                "cost": { "spend_nanos": s.own_spend, "input_tokens": s.usage.input_tokens, "output_tokens": s.usage.output_tokens },
            });
            super::hook_run::fire(me, s, "after_step", step);
        }
        let overrun = call
            .as_ref()
            .map_or(Nanos::ZERO, |c| cost.minus(c.reserved));
        if overrun > Nanos::ZERO {
            self.overran(me, s, reservation, cost, overrun).await;
            if ending {
                self.drained(me, s).await;
            }
            return;
        }
        if let (Ok(r), Some(c), false) = (&outcome, &call, incomplete) {
            let billed = r.usage.input_tokens + r.usage.cache_read_tokens;
            if billed > 0 {
                s.billed = Some(Billed {
                    prompt_tokens: billed,
                    prompt_bytes: c.prompt_bytes,
                    messages: c.messages,
                });
            }
        }
        if ending {
            self.drained(me, s).await;
            return;
        }
        s.phase = Phase::Idle;
        let mut resp = match outcome {
            Ok(r) => r,
            Err(e) if e.kind == ErrorKind::Cancelled => return,
            Err(_) if retry.is_some() => {
                s.attempt += 1;
                let wait = retry.unwrap_or_default();
                let me2 = me.clone();
                s.timers.push(tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    let _ = me2.cast(ThreadMsg::NextTurn);
                }));
                return;
            }
            Err(e) => {
                let msg = format!(
                    "LLM call failed ({:?}) after {} attempt(s): {}",
                    e.kind,
                    s.attempt + 1,
                    e.message
                );
                let class =
                    json!({ "category": "llm", "kind": e.kind, "retryable": e.kind.retryable() });
                return self.fail_classified(me, s, msg, class).await;
            }
        };
        s.attempt = 0;
        unique_call_ids(&mut resp.tool_calls);
        s.doc.cost.turns += 1;
        let row = s.row();
        let _ = s.ctx.registry.cast(RegistryMsg::Update {
            row: Box::new(row),
            reply: None,
        });
        let _ = s.ctx.events.send(Event::Turn {
            id: s.id().clone(),
            turns: s.doc.cost.turns,
            spend: s.own_spend,
        });
        let mut content = Vec::new();
        if !resp.text.is_empty() {
            s.log("assistant_text", json!({ "text": resp.text }));
            content.push(Block::Text {
                text: resp.text.clone(),
            });
        }
        for c in &resp.tool_calls {
            let input = super::state_tools::loggable_input(c);
            s.log(
                "tool_use",
                json!({ "id": c.id, "name": c.name, "input": input }),
            );
            content.push(Block::ToolUse {
                id: c.id.clone(),
                name: c.name.clone(),
                input: c.input.clone(),
            });
        }
        Arc::make_mut(&mut s.messages).push(Message {
            role: Role::Assistant,
            content,
        });
        if resp.tool_calls.is_empty() {
            return self.answer_without_tools(me, s, resp.text).await;
        }
        s.phase = Phase::Tools {
            order: resp.tool_calls.iter().map(|c| c.id.clone()).collect(),
            results: HashMap::new(),
            returned: None,
        };
        for call in resp.tool_calls {
            if let Some(outcome) = super::tool_phase::dispatch(me, s, call.clone()).await {
                self.tool_done(me, s, call.id, outcome).await;
            }
        }
    }

    /// A call still under way when the thread ends regardless (its provider ignored the cancel
    /// past the grace): recorded and settled at its upper bound.
    pub(super) fn abandon_call(&self, s: &mut ThreadState) {
        let Some(c) = s.call.take() else {
            return;
        };
        let usage = upper_bound(Usage::default(), &c);
        let cost = s.price.cost(&usage);
        add_usage(&mut s.usage, &usage);
        s.own_spend = s.own_spend.plus(cost);
        s.calls_made += 1;
        let model = s.doc.model.clone();
        s.log(
            "llm_call",
            json!({ "model": model, "usage": usage, "cost_nanos": cost, "reservation": c.reservation, "usage_incomplete": true,
                    "error": { "kind": ErrorKind::Cancelled, "message": "abandoned: the provider did not return within cancel_grace" } }),
        );
        let _ = s.ctx.ledger.cast(LedgerMsg::Settle {
            reservation: c.reservation,
            actual: cost,
            reply: None,
        });
    }

    pub(super) async fn answer_without_tools(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        text: String,
    ) {
        let missing = s.directive.check_outputs(&serde_json::Map::new()).is_err();
        if missing {
            let nudge =
                "You must call directive_return with the declared outputs to finish.".to_string();
            s.log("message", json!({ "role": "user", "text": nudge }));
            Arc::make_mut(&mut s.messages).push(Message::user(nudge));
            let _ = me.cast(ThreadMsg::NextTurn);
            return;
        }
        let e = Ending {
            status: Status::Completed,
            result: Some(text),
            outputs: None,
            error: None,
        };
        self.finalize(me, s, e).await;
    }
}

/// Gives every tool call of one response its own id: a model (or server) that repeats an id or
/// sends none would otherwise leave one call without its result, and the thread waiting for it.
/// A renamed id is what the transcript and the conversation carry from then on.
fn unique_call_ids(calls: &mut [crate::provider::ToolCall]) {
    let mut seen = std::collections::HashSet::new();
    for (i, c) in calls.iter_mut().enumerate() {
        if c.id.is_empty() || seen.contains(&c.id) {
            let base = if c.id.is_empty() { "call" } else { &c.id };
            let mut n = i + 1;
            let mut id = format!("{base}_{n}");
            while seen.contains(&id) {
                n += 1;
                id = format!("{base}_{n}");
            }
            c.id = id;
        }
        seen.insert(c.id.clone());
    }
}

/// What a call the provider did not fully report may have been billed: the prompt tokens it
/// reported, else the prompt bound; and every output token granted.
fn upper_bound(reported: Usage, c: &Call) -> Usage {
    let prompt_reported = reported.input_tokens + reported.cache_read_tokens > 0;
    Usage {
        input_tokens: if prompt_reported {
            reported.input_tokens
        } else {
            c.prompt_tokens
        },
        output_tokens: reported.output_tokens.max(c.max_output),
        cache_read_tokens: reported.cache_read_tokens,
    }
}

fn add_usage(total: &mut Usage, u: &Usage) {
    total.input_tokens += u.input_tokens;
    total.output_tokens += u.output_tokens;
    total.cache_read_tokens += u.cache_read_tokens;
}

/// Exponential backoff with jitter: 250 ms × 2^n (±25 %), capped at 30 s.
fn backoff(attempt: u32) -> Duration {
    let base = 250u64.saturating_mul(1 << attempt.min(7)).min(30_000);
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    let jitter = u64::from(u16::from_le_bytes(b)) % (base / 2 + 1);
    Duration::from_millis(base - base / 4 + jitter)
}

/// An upper bound on the prompt tokens of `req`: the provider's bound, tightened by what the
/// previous call's prompt was actually billed plus at most one token per byte appended since
/// (and the template's tokens again). Never an estimate: the ledger reserves it as a worst case.
fn prompt_bound(s: &ThreadState, req: &LlmRequest, prompt_bytes: u64) -> u64 {
    let overhead = s.ctx.config.prompt_overhead_of(&s.doc.model);
    let bound = s.provider.prompt_token_bound(req, overhead);
    let Some(b) = s.billed else {
        return bound;
    };
    let new_messages = req.messages.len().saturating_sub(b.messages) as u64 + 1;
    let grown = prompt_bytes.saturating_sub(b.prompt_bytes)
        + crate::provider::PER_MESSAGE_TOKENS * new_messages;
    bound.min(b.prompt_tokens + grown + overhead)
}

/// `control: continue` on a limit: lifts `limit` once (a turn or a tenth more tokens); spend,
/// duration and depth are never lifted (money and time are not a hook's to give).
fn lift_once(s: &mut ThreadState, limit: &str) -> bool {
    if s.lifted.iter().any(|l| l == limit) {
        s.log(
            "hook_control",
            json!({ "action": "continue", "limit": limit, "refused": "already lifted once" }),
        );
        return false;
    }
    match limit {
        "turns" => s.limits.turns += 1,
        "tokens" => s.limits.tokens += (s.limits.tokens / 10).max(1),
        other => {
            s.log("hook_control", json!({ "action": "continue", "limit": other, "refused": "this limit is never lifted" }));
            return false;
        }
    }
    s.lifted.push(limit.to_string());
    s.log(
        "hook_control",
        json!({ "action": "continue", "limit": limit }),
    );
    true
}
