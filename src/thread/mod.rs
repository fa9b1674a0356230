//! The thread actor: one per thread, owning its conversation, transcript and thread.json, and
//! running the turn loop of SPEC §6.
//!
//! It never awaits an LLM call, a tool or a child inside `handle`: those run as tasks holding a
//! cancellation token and report back by message, so `Cancel` and `Status` are answered at once.
//! The awaits it does make are short calls to the ledger and the supervisor.
//!
//! Tree rules enforced here: a thread's subtree never outlives it (live children are cancelled
//! and awaited — bounded by `cancel_grace` — before it finalizes), and every exit path goes
//! through [`ThreadActor::finalize`], which settles the ledger exactly once, writes the final
//! registry row and signed thread.json, and tells the parent.

mod tools;

use crate::directive::{Directive, OnChildError};
use crate::ids::ThreadId;
use crate::ledger::LedgerMsg;
use crate::limits::Limits;
use crate::money::{Nanos, Price, Usage};
use crate::provider::{
    Block, ErrorKind, LlmRequest, LlmResponse, Message, ProviderError, Role, ToolSpec,
};
use crate::registry::{RegistryMsg, ThreadRow};
use crate::runtime::{Ctx, Event};
use crate::state::{Status, ThreadDoc};
use crate::transcript::TranscriptWriter;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

pub use tools::ToolOutcome;

/// What a finished thread reports to its parent (and to `weft run`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadReport {
    /// Thread id.
    pub thread_id: ThreadId,
    /// Directive name.
    pub directive: String,
    /// Terminal status.
    pub status: Status,
    /// Final text.
    pub result: Option<String>,
    /// Structured outputs.
    pub outputs: Option<Value>,
    /// Error message.
    pub error: Option<String>,
    /// LLM calls made.
    pub turns: u64,
    /// Prompt tokens of the thread's own calls.
    pub input_tokens: u64,
    /// Output tokens of the thread's own calls.
    pub output_tokens: u64,
    /// The thread's own spend.
    pub own_spend_nanos: Nanos,
    /// The whole subtree's spend.
    pub spend_nanos: Nanos,
}

/// A snapshot for `Status` queries.
#[derive(Debug, Clone, Serialize)]
pub struct StatusSnapshot {
    /// Current status.
    pub status: Status,
    /// Turns so far.
    pub turns: u64,
    /// Live children.
    pub live_children: Vec<ThreadId>,
}

/// Messages of a thread actor.
pub enum ThreadMsg {
    /// Begin the turn loop.
    Start,
    /// Run the next turn.
    NextTurn,
    /// An LLM call ended.
    LlmDone {
        /// The reservation it ran under.
        reservation: u64,
        /// What the call returned.
        outcome: Result<LlmResponse, ProviderError>,
    },
    /// A tool task ended.
    ToolDone {
        /// The call answered.
        call_id: String,
        /// Its result.
        outcome: ToolOutcome,
    },
    /// A `spawn_thread` task started a child.
    ChildSpawned {
        /// The tool call.
        call_id: String,
        /// The child.
        child: ThreadId,
        /// Its actor.
        actor: ActorRef<ThreadMsg>,
        /// Whether the call waits for the child.
        wait: bool,
    },
    /// A `spawn_thread` task could not start its child.
    SpawnRefused {
        /// The tool call.
        call_id: String,
        /// Why, for the model.
        error: String,
    },
    /// A child ended.
    ChildFinished(Box<ThreadReport>),
    /// A `wait_threads` timeout fired.
    WaitTimeout {
        /// The tool call.
        call_id: String,
    },
    /// Cancel this thread and its subtree.
    Cancel {
        /// Why (recorded in the transcript).
        reason: String,
    },
    /// The duration limit fired.
    DurationExpired,
    /// Children did not acknowledge a cancel in time.
    GraceExpired,
    /// Report status.
    Status(RpcReplyPort<StatusSnapshot>),
}

/// Everything a thread actor starts from (built by [`crate::runtime::spawn`]).
pub struct ThreadArgs {
    /// Runtime wiring.
    pub ctx: Arc<Ctx>,
    /// The LLM backend this thread calls.
    pub provider: Arc<dyn crate::provider::Provider>,
    /// The directive.
    pub directive: Arc<Directive>,
    /// The conversation to start from: the rendered prompt, or a continuation's history.
    pub messages: Vec<Message>,
    /// LLM calls already made by the chain (a continuation's scripted turns play on from there).
    pub calls_made: u64,
    /// Parent id and actor.
    pub parent: Option<(ThreadId, ActorRef<ThreadMsg>)>,
    /// Resolved limits.
    pub limits: Limits,
    /// Model price.
    pub price: Price,
    /// thread.json as first signed.
    pub doc: ThreadDoc,
    /// The transcript, opened.
    pub transcript: TranscriptWriter,
    /// Where a root reports.
    pub on_finish: Option<oneshot::Sender<ThreadReport>>,
}

/// How a thread is ending.
#[derive(Debug, Clone)]
struct Ending {
    status: Status,
    result: Option<String>,
    outputs: Option<Value>,
    error: Option<String>,
}

enum Phase {
    /// Between turns.
    Idle,
    /// Waiting for the LLM.
    Thinking,
    /// Waiting for tool results.
    Tools {
        order: Vec<String>,
        results: HashMap<String, ToolOutcome>,
        returned: Option<Value>,
    },
    /// Ending: waiting for children to acknowledge a cancel.
    Draining(Ending),
    /// Finalized.
    Done,
}

struct Child {
    actor: Option<ActorRef<ThreadMsg>>,
    report: Option<ThreadReport>,
    /// Some call (spawn wait=true or wait_threads) has consumed or will consume the report.
    claimed: bool,
}

struct Waiter {
    call_id: String,
    ids: Vec<ThreadId>,
}

/// The thread actor.
pub struct ThreadActor;

/// State of a thread actor.
pub struct ThreadState {
    ctx: Arc<Ctx>,
    provider: Arc<dyn crate::provider::Provider>,
    directive: Arc<Directive>,
    parent: Option<(ThreadId, ActorRef<ThreadMsg>)>,
    limits: Limits,
    price: Price,
    doc: ThreadDoc,
    transcript: TranscriptWriter,
    on_finish: Option<oneshot::Sender<ThreadReport>>,
    /// Shared with in-flight requests (no copy per call); appended through `Arc::make_mut`.
    system: Arc<str>,
    messages: Arc<Vec<Message>>,
    tools: Arc<Vec<ToolSpec>>,
    phase: Phase,
    calls_made: u64,
    usage: Usage,
    own_spend: Nanos,
    started: Instant,
    cancel: CancellationToken,
    children: HashMap<ThreadId, Child>,
    waiters: Vec<Waiter>,
    announce: Vec<ThreadReport>,
    timers: Vec<tokio::task::JoinHandle<()>>,
    /// Retries used for the current turn's call.
    attempt: u32,
    /// `spawn_thread` calls whose task is still under way (by call id): a thread never
    /// finalizes before they report, so no child can start after its parent has ended.
    spawning: std::collections::HashSet<String>,
    /// Spawns under way when `cancel_siblings` fired: their child is cancelled on arrival.
    doomed: std::collections::HashSet<String>,
}

impl ThreadState {
    fn id(&self) -> &ThreadId {
        &self.doc.id
    }

    fn log(&mut self, kind: &str, payload: Value) {
        if let Err(e) = self.transcript.append(kind, payload) {
            tracing::error!(thread = %self.doc.id, "transcript append failed: {e}");
        }
    }

    fn live_children(&self) -> Vec<ThreadId> {
        self.children
            .iter()
            .filter(|(_, c)| c.report.is_none() && c.actor.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Brings thread.json's cost and head up to date (before signing).
    fn refresh_doc(&mut self) {
        self.doc.cost.input_tokens = self.usage.input_tokens;
        self.doc.cost.output_tokens = self.usage.output_tokens;
        self.doc.cost.cache_read_tokens = self.usage.cache_read_tokens;
        self.doc.cost.own_spend_nanos = self.own_spend.0;
        self.doc.cost.elapsed_ms = self.started.elapsed().as_millis() as u64;
        self.doc.transcript_head = self.transcript.head().clone();
    }

    fn sign_doc(&mut self, fsync: bool) {
        self.refresh_doc();
        let path = self.ctx.project.thread_dir(self.id()).join("thread.json");
        let strict = self.ctx.config.durability == crate::config::Durability::Strict;
        if let Err(e) = self
            .doc
            .write_signed(&path, &self.ctx.signer, fsync || strict)
        {
            tracing::error!(thread = %self.doc.id, "thread.json write failed: {e}");
        }
    }

    fn row(&self) -> ThreadRow {
        ThreadRow {
            id: self.doc.id.to_string(),
            directive: self.doc.directive.clone(),
            parent_id: self.doc.parent_id.as_ref().map(ToString::to_string),
            root_id: self.doc.root_id.to_string(),
            status: self.doc.status.as_str().into(),
            created_at: self.doc.created_at.clone(),
            updated_at: crate::transcript::now_ts(),
            model: self.doc.model.clone(),
            turns: self.doc.cost.turns,
            input_tokens: self.usage.input_tokens,
            output_tokens: self.usage.output_tokens,
            own_spend_nanos: self.own_spend.0,
            spend_nanos: self.doc.cost.spend_nanos.max(self.own_spend.0),
            result: self.doc.result.clone(),
            outputs: self.doc.outputs.clone(),
            error: self.doc.error.clone(),
            owner_pid: std::process::id(),
            ..Default::default()
        }
    }

    fn report(&self) -> ThreadReport {
        ThreadReport {
            thread_id: self.doc.id.clone(),
            directive: self.doc.directive.clone(),
            status: self.doc.status,
            result: self.doc.result.clone(),
            outputs: self.doc.outputs.clone(),
            error: self.doc.error.clone(),
            turns: self.doc.cost.turns,
            input_tokens: self.usage.input_tokens,
            output_tokens: self.usage.output_tokens,
            own_spend_nanos: self.own_spend,
            spend_nanos: Nanos(self.doc.cost.spend_nanos),
        }
    }
}

fn system_prompt(d: &Directive, id: &ThreadId, limits: &Limits) -> String {
    let mut s = format!(
        "You are thread {id} of the weft runtime, running directive `{}`.{}\nLimits: {} turns, {} spend, depth {}.",
        d.name,
        if d.description.is_empty() { String::new() } else { format!(" {}", d.description) },
        limits.turns,
        limits.spend,
        limits.depth
    );
    if !d.outputs.is_empty() {
        let outs: Vec<String> = d
            .outputs
            .iter()
            .map(|(k, o)| {
                format!(
                    "{k} ({}{})",
                    o.kind,
                    if o.required { ", required" } else { "" }
                )
            })
            .collect();
        s.push_str(&format!(
            "\nWhen done, call directive_return with: {}.",
            outs.join(", ")
        ));
    }
    s
}

impl Actor for ThreadActor {
    type Msg = ThreadMsg;
    type State = ThreadState;
    type Arguments = ThreadArgs;

    async fn pre_start(
        &self,
        me: ActorRef<ThreadMsg>,
        a: ThreadArgs,
    ) -> Result<ThreadState, ActorProcessingErr> {
        let tools = tools::offered(&a.directive, &a.doc.capabilities);
        let system = system_prompt(&a.directive, &a.doc.id, &a.limits);
        let messages = a.messages;
        let s = ThreadState {
            ctx: a.ctx,
            provider: a.provider,
            directive: a.directive,
            parent: a.parent,
            limits: a.limits,
            price: a.price,
            doc: a.doc,
            transcript: a.transcript,
            on_finish: a.on_finish,
            system: system.into(),
            messages: Arc::new(messages),
            tools: Arc::new(tools),
            phase: Phase::Idle,
            calls_made: a.calls_made,
            usage: Usage::default(),
            own_spend: Nanos::ZERO,
            started: Instant::now(),
            cancel: CancellationToken::new(),
            children: HashMap::new(),
            waiters: Vec::new(),
            announce: Vec::new(),
            timers: Vec::new(),
            spawning: Default::default(),
            doomed: Default::default(),
            attempt: 0,
        };
        me.cast(ThreadMsg::Start)?;
        Ok(s)
    }

    async fn handle(
        &self,
        me: ActorRef<ThreadMsg>,
        msg: ThreadMsg,
        s: &mut ThreadState,
    ) -> Result<(), ActorProcessingErr> {
        if matches!(s.phase, Phase::Done) {
            if let ThreadMsg::Status(reply) = msg {
                let _ = reply.send(StatusSnapshot {
                    status: s.doc.status,
                    turns: s.doc.cost.turns,
                    live_children: vec![],
                });
            }
            return Ok(());
        }
        match msg {
            ThreadMsg::Start => self.start(&me, s).await,
            ThreadMsg::NextTurn => self.next_turn(&me, s).await,
            ThreadMsg::LlmDone {
                reservation,
                outcome,
            } => self.llm_done(&me, s, reservation, outcome).await,
            ThreadMsg::ToolDone { call_id, outcome } => {
                self.tool_done(&me, s, call_id, outcome).await
            }
            ThreadMsg::ChildSpawned {
                call_id,
                child,
                actor,
                wait,
            } => {
                self.child_spawned(&me, s, call_id, child, actor, wait)
                    .await
            }
            ThreadMsg::SpawnRefused { call_id, error } => {
                s.spawning.remove(&call_id);
                s.doomed.remove(&call_id);
                if !self.drained(&me, s).await {
                    self.tool_done(&me, s, call_id, ToolOutcome::err(error))
                        .await;
                }
            }
            ThreadMsg::ChildFinished(r) => self.child_finished(&me, s, *r).await,
            ThreadMsg::WaitTimeout { call_id } => self.wait_timeout(&me, s, call_id).await,
            ThreadMsg::Cancel { reason } => {
                if !matches!(s.phase, Phase::Draining(_)) {
                    s.log("cancel_requested", json!({ "reason": reason }));
                    let e = Ending {
                        status: Status::Cancelled,
                        result: None,
                        outputs: None,
                        error: Some(format!("cancelled: {reason}")),
                    };
                    self.finalize(&me, s, e).await;
                }
            }
            ThreadMsg::DurationExpired => {
                if !matches!(s.phase, Phase::Draining(_)) {
                    let d = humantime::format_duration(s.limits.duration()).to_string();
                    s.log("limit_hit", json!({ "limit": "duration", "max": d }));
                    let e = Ending {
                        status: Status::Error,
                        result: None,
                        outputs: None,
                        error: Some(format!("limit exceeded: duration {d}")),
                    };
                    self.finalize(&me, s, e).await;
                }
            }
            ThreadMsg::GraceExpired => {
                if let Phase::Draining(e) = &s.phase {
                    let e = e.clone();
                    self.kill_stragglers(s).await;
                    self.complete_finalize(&me, s, e).await;
                }
            }
            ThreadMsg::Status(reply) => {
                let _ = reply.send(StatusSnapshot {
                    status: s.doc.status,
                    turns: s.doc.cost.turns,
                    live_children: s.live_children(),
                });
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        me: ActorRef<ThreadMsg>,
        evt: SupervisionEvent,
        s: &mut ThreadState,
    ) -> Result<(), ActorProcessingErr> {
        // Not ractor's default (which stops the supervisor when a child exits): a child that
        // panicked is finalized here as `error` and reported like any other failure.
        if let SupervisionEvent::ActorFailed(cell, err) = evt {
            let name = cell.get_name().unwrap_or_default();
            if let Ok(id) = ThreadId::parse(&name) {
                if s.children.get(&id).is_some_and(|c| c.report.is_none()) {
                    let report =
                        crash_report(&s.ctx, &id, &format!("thread actor failed: {err}")).await;
                    self.child_finished(&me, s, report).await;
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _me: ActorRef<ThreadMsg>,
        s: &mut ThreadState,
    ) -> Result<(), ActorProcessingErr> {
        s.cancel.cancel();
        for t in s.timers.drain(..) {
            t.abort();
        }
        Ok(())
    }
}

/// Finalizes a child whose actor died without finalizing itself.
async fn crash_report(ctx: &Arc<Ctx>, id: &ThreadId, error: &str) -> ThreadReport {
    let acct = ractor::call!(ctx.ledger, |reply| LedgerMsg::Close {
        id: id.clone(),
        reply
    })
    .ok()
    .and_then(Result::ok);
    let row = ractor::call!(ctx.registry, |reply| RegistryMsg::Get {
        id: id.clone(),
        reply
    })
    .ok()
    .and_then(Result::ok)
    .flatten();
    let mut report = ThreadReport {
        thread_id: id.clone(),
        directive: row
            .as_ref()
            .map(|r| r.directive.clone())
            .unwrap_or_default(),
        status: Status::Error,
        result: None,
        outputs: None,
        error: Some(error.into()),
        turns: row.as_ref().map_or(0, |r| r.turns),
        input_tokens: row.as_ref().map_or(0, |r| r.input_tokens),
        output_tokens: row.as_ref().map_or(0, |r| r.output_tokens),
        own_spend_nanos: acct.as_ref().map_or(Nanos::ZERO, |a| a.own_spent),
        spend_nanos: acct.as_ref().map_or(Nanos::ZERO, |a| a.spent),
    };
    if let Some(mut row) = row {
        row.status = "error".into();
        row.error = report.error.clone();
        row.spend_nanos = report.spend_nanos.0;
        row.own_spend_nanos = report.own_spend_nanos.0;
        row.updated_at = crate::transcript::now_ts();
        let _ = ractor::call!(ctx.registry, |reply| RegistryMsg::Update {
            row: Box::new(row),
            reply: Some(reply)
        });
    }
    report.error = Some(error.into());
    report
}

impl ThreadActor {
    async fn start(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState) {
        s.doc.transition(Status::Running);
        s.log("status", json!({ "status": "running" }));
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
        let _ = s.ctx.events.send(Event::Started {
            id: s.id().clone(),
            parent: s.doc.parent_id.clone(),
            directive: s.doc.directive.clone(),
        });
        let me2 = me.clone();
        let d = s.limits.duration();
        s.timers.push(tokio::spawn(async move {
            tokio::time::sleep(d).await;
            let _ = me2.cast(ThreadMsg::DurationExpired);
        }));
        let _ = me.cast(ThreadMsg::NextTurn);
    }

    async fn limit_hit(
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
        let e = Ending {
            status: Status::Error,
            result: None,
            outputs: None,
            error: Some(format!("limit exceeded: {limit} {used}/{max}")),
        };
        self.finalize(me, s, e).await;
    }

    async fn next_turn(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState) {
        if !matches!(s.phase, Phase::Idle) {
            return;
        }
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
        };
        let prompt_tokens = s.provider.estimate_prompt_tokens(&req);
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
        if let Some(&window) = s.ctx.config.context_window.get(&s.doc.model) {
            if prompt_tokens >= window {
                let msg = format!(
                    "context overflow: the prompt (~{prompt_tokens} tokens) does not fit the {window}-token window of `{}`",
                    s.doc.model
                );
                return self.fail(me, s, msg).await;
            }
            want = want.min(window - prompt_tokens);
        }
        let min_out = crate::runtime::MIN_OUTPUT_TOKENS.min(want);
        let grant = ractor::call!(s.ctx.ledger, |reply| LedgerMsg::Reserve {
            id: s.doc.id.clone(),
            price: s.price,
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
        req.max_tokens = grant.max_output_tokens;
        s.phase = Phase::Thinking;
        let provider = s.provider.clone();
        let token = s.cancel.child_token();
        let me2 = me.clone();
        let reservation = grant.reservation;
        tokio::spawn(async move {
            let outcome = provider.complete(req, token).await;
            let _ = me2.cast(ThreadMsg::LlmDone {
                reservation,
                outcome,
            });
        });
    }

    async fn llm_done(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        reservation: u64,
        outcome: Result<LlmResponse, ProviderError>,
    ) {
        // Every attempt is recorded and settled on its own, for what it actually cost: first the
        // transcript line (with the reservation id, so recovery can settle it if the ledger never
        // heard), then the settlement, cast: the next reservation queues behind it in the ledger.
        let usage = match &outcome {
            Ok(r) => r.usage,
            Err(e) => e.usage,
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
                }),
            ),
            (Err(e), None) => (
                "llm_call",
                json!({ "model": model, "usage": usage, "cost_nanos": cost, "reservation": reservation,
                        "error": { "kind": e.kind, "message": e.message } }),
            ),
            (Ok(r), _) => (
                "llm_call",
                json!({ "model": model, "provider": s.doc.provider, "usage": usage, "cost_nanos": cost, "reservation": reservation,
                        "stop_reason": r.stop_reason, "stream_deltas": r.stream_deltas }),
            ),
        };
        s.log(kind, event);
        let _ = s.ctx.ledger.cast(LedgerMsg::Settle {
            reservation,
            actual: cost,
            reply: None,
        });
        if ending {
            return;
        }
        s.phase = Phase::Idle;
        let resp = match outcome {
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
                return self.fail(me, s, msg).await;
            }
        };
        s.attempt = 0;
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
            s.log(
                "tool_use",
                json!({ "id": c.id, "name": c.name, "input": c.input }),
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
            if let Some(outcome) = tools::dispatch(me, s, call.clone()).await {
                self.tool_done(me, s, call.id, outcome).await;
            }
        }
    }

    async fn answer_without_tools(
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

    async fn tool_done(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        call_id: String,
        outcome: ToolOutcome,
    ) {
        let Phase::Tools {
            order,
            results,
            returned,
        } = &mut s.phase
        else {
            return;
        };
        if !order.contains(&call_id) || results.contains_key(&call_id) {
            return;
        }
        if let Some(outputs) = &outcome.returned {
            *returned = Some(outputs.clone());
        }
        results.insert(call_id.clone(), outcome.clone());
        let done = results.len() == order.len();
        s.log(
            "tool_result",
            json!({ "id": call_id, "is_error": outcome.is_error, "content": outcome.content }),
        );
        if !done {
            return;
        }
        let Phase::Tools {
            order,
            mut results,
            returned,
        } = std::mem::replace(&mut s.phase, Phase::Idle)
        else {
            return;
        };
        let blocks: Vec<Block> = order
            .iter()
            .filter_map(|id| {
                results.remove(id).map(|r| Block::ToolResult {
                    id: id.clone(),
                    content: r.content,
                    is_error: r.is_error,
                })
            })
            .collect();
        Arc::make_mut(&mut s.messages).push(Message {
            role: Role::User,
            content: blocks,
        });
        if let Some(outputs) = returned {
            let e = Ending {
                status: Status::Completed,
                result: None,
                outputs: Some(outputs),
                error: None,
            };
            return self.finalize(me, s, e).await;
        }
        let _ = me.cast(ThreadMsg::NextTurn);
    }

    async fn child_spawned(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        call_id: String,
        child: ThreadId,
        actor: ActorRef<ThreadMsg>,
        wait: bool,
    ) {
        s.spawning.remove(&call_id);
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

    async fn child_finished(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState, r: ThreadReport) {
        let id = r.thread_id.clone();
        s.log(
            "child_finished",
            json!({ "id": id, "status": r.status, "spend_nanos": r.spend_nanos, "error": r.error }),
        );
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

    async fn resolve_waiters(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState) {
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
            let outcome = tools::wait_result(s, &w.ids, false);
            self.tool_done(me, s, w.call_id, outcome).await;
        }
    }

    async fn wait_timeout(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState, call_id: String) {
        let Some(i) = s.waiters.iter().position(|w| w.call_id == call_id) else {
            return;
        };
        let w = s.waiters.remove(i);
        let outcome = tools::wait_result(s, &w.ids, true);
        self.tool_done(me, s, w.call_id, outcome).await;
    }

    /// While draining: completes the finalization once no child is live and no spawn is under
    /// way. Returns whether the thread is draining (or done).
    async fn drained(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState) -> bool {
        match &s.phase {
            Phase::Draining(e) => {
                if s.live_children().is_empty() && s.spawning.is_empty() {
                    let e = e.clone();
                    self.complete_finalize(me, s, e).await;
                }
                true
            }
            Phase::Done => true,
            _ => false,
        }
    }

    async fn fail(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState, error: String) {
        s.log("error", json!({ "message": error }));
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
    async fn finalize(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState, e: Ending) {
        if matches!(s.phase, Phase::Draining(_) | Phase::Done) {
            return;
        }
        s.cancel.cancel();
        let live = s.live_children();
        if live.is_empty() && s.spawning.is_empty() {
            return self.complete_finalize(me, s, e).await;
        }
        s.log("cancelling_children", json!({ "children": live }));
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

    async fn kill_stragglers(&self, s: &mut ThreadState) {
        for id in s.live_children() {
            let actor = s.children.get(&id).and_then(|c| c.actor.clone());
            if let Some(a) = actor {
                a.kill();
            }
            let r = crash_report(
                &s.ctx,
                &id,
                "killed: did not acknowledge cancel within cancel_grace",
            )
            .await;
            s.log(
                "child_finished",
                json!({ "id": id, "status": "error", "error": r.error }),
            );
            if let Some(c) = s.children.get_mut(&id) {
                c.report = Some(r);
            }
        }
    }

    /// Settles the ledger (exactly once), writes the last transcript lines, the registry row
    /// and the signed thread.json, tells the parent (or the root's waiter) and stops.
    async fn complete_finalize(&self, me: &ActorRef<ThreadMsg>, s: &mut ThreadState, e: Ending) {
        s.phase = Phase::Done;
        for t in s.timers.drain(..) {
            t.abort();
        }
        let acct = ractor::call!(s.ctx.ledger, |reply| LedgerMsg::Close {
            id: s.doc.id.clone(),
            reply
        });
        match acct {
            Ok(Ok(a)) => s.doc.cost.spend_nanos = a.spent.0,
            other => {
                tracing::error!(thread = %s.doc.id, "ledger close failed: {other:?}");
                s.doc.cost.spend_nanos = s.own_spend.0;
            }
        }
        s.doc.result = e.result;
        s.doc.outputs = e.outputs;
        s.doc.error = e.error;
        s.doc.transition(e.status);
        let fin = json!({
            "status": e.status, "result": s.doc.result, "outputs": s.doc.outputs, "error": s.doc.error,
            "turns": s.doc.cost.turns, "usage": s.usage, "own_spend_nanos": s.own_spend, "spend_nanos": s.doc.cost.spend_nanos,
        });
        s.log("thread_finished", fin);
        // The terminal fsyncs (transcript, then thread.json) run on the blocking pool, so many
        // threads ending together overlap their fsyncs instead of queueing on the workers.
        if let Err(err) = s.transcript.checkpoint_line() {
            tracing::error!(thread = %s.doc.id, "transcript checkpoint failed: {err}");
        }
        s.refresh_doc();
        let file = s.transcript.file_handle();
        let doc = s.doc.clone();
        let signer = s.ctx.signer.clone();
        let path = s.ctx.project.thread_dir(s.id()).join("thread.json");
        let written = tokio::task::spawn_blocking(move || {
            file.and_then(|f| f.sync_data())?;
            doc.write_signed(&path, &signer, true)
        })
        .await;
        if !matches!(written, Ok(Ok(()))) {
            tracing::error!(thread = %s.doc.id, "final thread.json or transcript sync failed: {written:?}");
        }
        let row = s.row();
        let _ = ractor::call!(s.ctx.registry, |reply| RegistryMsg::Update {
            row: Box::new(row),
            reply: Some(reply)
        });
        let report = s.report();
        let _ = s.ctx.events.send(Event::Finished(Box::new(report.clone())));
        if let Some((_, parent)) = &s.parent {
            let _ = parent.cast(ThreadMsg::ChildFinished(Box::new(report.clone())));
        }
        s.ctx.forget(s.id());
        if let Some(tx) = s.on_finish.take() {
            let _ = tx.send(report);
        }
        me.stop(None);
    }
}

fn entry_claim(s: &mut ThreadState, id: &ThreadId) {
    if let Some(c) = s.children.get_mut(id) {
        c.claimed = true;
    }
}

fn add_usage(total: &mut Usage, u: &Usage) {
    total.input_tokens += u.input_tokens;
    total.output_tokens += u.output_tokens;
    total.cache_read_tokens += u.cache_read_tokens;
}

fn message_text(m: &Message) -> String {
    m.content
        .iter()
        .filter_map(|b| match b {
            Block::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Exponential backoff with jitter: 250 ms × 2^n (±25 %), capped at 30 s.
fn backoff(attempt: u32) -> Duration {
    let base = 250u64.saturating_mul(1 << attempt.min(7)).min(30_000);
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    let jitter = u64::from(u16::from_le_bytes(b)) % (base / 2 + 1);
    Duration::from_millis(base - base / 4 + jitter)
}

/// Rebuilds a conversation from transcript events (for continuations): user messages,
/// assistant text and tool calls, tool results. A tool call left without a result (the thread
/// ended mid-call) gets an error result. Also returns the LLM calls made, attempts included.
pub fn rebuild_conversation(events: &[Value]) -> (Vec<Message>, u64) {
    let mut msgs: Vec<Message> = Vec::new();
    let mut calls = 0u64;
    for e in events {
        let text = |k: &str| {
            e.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        match e.get("type").and_then(Value::as_str).unwrap_or_default() {
            "llm_call" | "llm_retry" => calls += 1,
            "conversation" => {
                msgs = serde_json::from_value(e.get("messages").cloned().unwrap_or(Value::Null))
                    .unwrap_or_default();
                calls += e.get("calls_made").and_then(Value::as_u64).unwrap_or(0);
            }
            "message" => {
                close_tool_round(&mut msgs);
                msgs.push(Message::user(text("text")));
            }
            "assistant_text" | "tool_use" => {
                let block = if e["type"] == "assistant_text" {
                    Block::Text { text: text("text") }
                } else {
                    Block::ToolUse {
                        id: text("id"),
                        name: text("name"),
                        input: e.get("input").cloned().unwrap_or(Value::Null),
                    }
                };
                match msgs.last_mut() {
                    Some(m) if m.role == Role::Assistant => m.content.push(block),
                    _ => msgs.push(Message {
                        role: Role::Assistant,
                        content: vec![block],
                    }),
                }
            }
            "tool_result" => {
                let block = Block::ToolResult {
                    id: text("id"),
                    content: text("content"),
                    is_error: e.get("is_error").and_then(Value::as_bool).unwrap_or(false),
                };
                match msgs.last_mut() {
                    Some(m)
                        if m.role == Role::User
                            && matches!(m.content.first(), Some(Block::ToolResult { .. })) =>
                    {
                        m.content.push(block)
                    }
                    _ => msgs.push(Message {
                        role: Role::User,
                        content: vec![block],
                    }),
                }
            }
            _ => {}
        }
    }
    close_tool_round(&mut msgs);
    (msgs, calls)
}

/// Gives every unanswered tool call of the last assistant message an error result.
fn close_tool_round(msgs: &mut Vec<Message>) {
    let answered: Vec<String> = match msgs.last() {
        Some(m) if m.role == Role::User => m
            .content
            .iter()
            .filter_map(|b| match b {
                Block::ToolResult { id, .. } => Some(id.clone()),
                _ => None,
            })
            .collect(),
        _ => vec![],
    };
    let assistant = match msgs.len() {
        0 => return,
        n if msgs[n - 1].role == Role::Assistant => n - 1,
        n if n >= 2 && msgs[n - 2].role == Role::Assistant && !answered.is_empty() => n - 2,
        _ => return,
    };
    let missing: Vec<Block> = msgs[assistant]
        .content
        .iter()
        .filter_map(|b| match b {
            Block::ToolUse { id, .. } if !answered.contains(id) => Some(Block::ToolResult {
                id: id.clone(),
                content: json!({ "error": "the thread ended before this tool call finished" })
                    .to_string(),
                is_error: true,
            }),
            _ => None,
        })
        .collect();
    if missing.is_empty() {
        return;
    }
    if assistant == msgs.len() - 1 {
        msgs.push(Message {
            role: Role::User,
            content: missing,
        });
    } else if let Some(last) = msgs.last_mut() {
        last.content.extend(missing);
    }
}
