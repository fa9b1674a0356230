//! The thread actor: one per thread, owning its conversation, transcript and thread.json, and
//! running the turn loop of SPEC §6 — plus the spawn procedure of SPEC §4 and the services
//! every thread uses ([`Ctx`], [`Event`]).
//!
//! It never awaits an LLM call, a tool or a child inside `handle`: those run as tasks holding a
//! cancellation token and report back by message, so `Cancel` and `Status` are answered at once.
//! The awaits it does make are short calls to the ledger and the registry.
//!
//! Tree rules enforced here: a thread's subtree never outlives it (live children are cancelled
//! and awaited — bounded by `cancel_grace` — before it finalizes), and every exit path goes
//! through [`ThreadActor::finalize`], which settles the ledger exactly once, writes the final
//! registry row and signed thread.json, and tells the parent.
//!
//! Rooms: `msg` (messages, arguments, reports), `state` (actor state and its records),
//! `turn` (turn loop and retries), `tool_phase` (collecting tool results), `manage` (the
//! thread-management tools acting on the actor's own state), `children` (children and waits),
//! `finalize` (ending), `conversation` (system prompt, rebuild), `spawn` (SPEC §4), `ctx`.

mod approval;
mod children;
mod conversation;
mod ctx;
mod dead;
mod finalize;
mod handoff;
mod hook_run;
mod manage;
mod messages;
mod msg;
mod schedule;
mod spans;
mod spawn;
mod state;
mod state_tools;
mod tool_phase;
mod turn;

pub(crate) use conversation::rebuild_conversation;
pub(crate) use ctx::Ctx;
pub use ctx::Event;
pub use dead::Recovered;
pub(crate) use dead::{end_subtree, finalize_dead, DeadEnd};
pub use msg::ThreadReport;
pub(crate) use msg::{StatusSnapshot, ThreadArgs, ThreadMsg};
pub(crate) use spans::TARGET as SPAN_TARGET;
pub use spawn::SpawnError;
pub(crate) use spawn::{spawn, Continuation, ParentLink, Seed, SpawnRequest, MIN_OUTPUT_TOKENS};

use crate::core::ids::ThreadId;
use crate::core::money::{Nanos, Usage};
use crate::core::status::Status;
use crate::tools::ToolOutcome;
use manage as manage_tools;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use serde_json::json;
use state::{Child, Ending, Phase, ThreadState, Waiter};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// The thread actor.
pub(crate) struct ThreadActor;

impl Actor for ThreadActor {
    type Msg = ThreadMsg;
    type State = ThreadState;
    type Arguments = ThreadArgs;

    async fn pre_start(
        &self,
        me: ActorRef<ThreadMsg>,
        a: ThreadArgs,
    ) -> Result<ThreadState, ActorProcessingErr> {
        let mut tools = manage::offered(&a.directive, &a.doc.capabilities, &a.ctx.commands);
        if a.parent.is_some() {
            tools.extend(messages::child_tools());
        }
        // MCP servers this thread may use start now (first use), so their tools can be offered.
        let (mcp_tools, mcp_problems) = a.ctx.mcp.offered(&a.doc.capabilities).await;
        tools.extend(mcp_tools);
        let system = conversation::system_prompt(&a.directive, &a.doc.id, &a.limits);
        let messages = a.messages;
        let mut s = ThreadState {
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
            tool_tasks: Default::default(),
            returned_files: Vec::new(),
            pending_approvals: Vec::new(),
            files_lock: Default::default(),
            inbox: Vec::new(),
            hooks: Arc::new(a.hooks),
            inputs: a.inputs,
            route: a.route,
            span: a.span,
            chat_span: None,
            tool_spans: HashMap::new(),
            hook_retries: 0,
            handoff: None,
            ended: None,
            continued_children: HashMap::new(),
            lifted: Vec::new(),
            status_text: None,
            doomed: Default::default(),
            said: Vec::new(),
            attempt: 0,
            call: None,
            billed: None,
        };
        for problem in mcp_problems {
            tracing::warn!(thread = %s.doc.id, "{problem}");
            s.log("mcp_unavailable", json!({ "message": problem }));
        }
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
                if let Some(hook) = call_id.strip_prefix("hook:") {
                    s.log("hook_failed", json!({ "id": hook, "error": error }));
                }
                s.doomed.remove(&call_id);
                if !self.drained(&me, s).await {
                    self.tool_done(&me, s, call_id, ToolOutcome::err(error))
                        .await;
                }
            }
            ThreadMsg::ToolFinished { call_id, outcome } => {
                s.tool_tasks.remove(&call_id);
                if matches!(s.phase, Phase::Draining(_)) {
                    // Ending anyway, but what the tool did (or that it was killed) is recorded.
                    s.log(
                        "tool_result",
                        json!({ "id": call_id, "is_error": outcome.is_error, "content": outcome.content }),
                    );
                }
                if !self.drained(&me, s).await {
                    self.tool_done(&me, s, call_id, outcome).await;
                }
            }
            ThreadMsg::Decide {
                call,
                approve,
                reason,
                reply,
            } => {
                let r = self.decide(&me, s, call, approve, reason).await;
                let _ = reply.send(r);
            }
            ThreadMsg::Inject { from, text, reply } => {
                let queued = messages::queue(s, &from, text);
                if let Some(r) = reply {
                    let _ = r.send(queued);
                }
            }
            ThreadMsg::ChildContinued { old, new, actor } => handoff::rekey(s, &old, new, actor),
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
                    let report = end_subtree(
                        &s.ctx,
                        &id,
                        &DeadEnd {
                            status: Status::Error,
                            kind: "failed",
                            error: format!("thread actor failed: {err}"),
                        },
                    )
                    .await;
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
