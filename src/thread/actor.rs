//! The thread actor: starts a [`Thread`] from its arguments and routes each message to the
//! thread method that handles it. Holds no logic of its own beyond that routing, the
//! supervision of its children and the check that the transcript lost no line.
//!
//! It never awaits an LLM call, a tool or a child inside `handle`: those run as tasks holding a
//! cancellation token and report back by message, so `Cancel` and `Status` are answered at once.
//! The awaits it does make are short calls to the ledger and the registry.

use super::builtin::Offer;
use super::ctx::Ctx;
use super::dead::{end_subtree, DeadEnd, DeadKind};
use super::msg::{ThreadArgs, ThreadMsg};
use super::parts::{Calls, HookState, Kids, Life, Record, Talk, ToolWork};
use super::report::StatusSnapshot;
use super::state::{Phase, Thread};
use crate::core::ids::ThreadId;
use crate::core::status::Status;
use crate::provider::BoxFuture;
use crate::record::line::Line;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// The thread actor.
pub(crate) struct ThreadActor;

/// Starts a thread actor (named by its thread id), linked under `parent` when given: the
/// runtime's [`Ctx::launch`].
pub(crate) fn launch(
    ctx: Arc<Ctx>,
    args: ThreadArgs,
    parent: Option<ActorCell>,
) -> BoxFuture<Result<ActorRef<ThreadMsg>, String>> {
    Box::pin(async move {
        let name = Some(args.doc.id.to_string());
        let started = match parent {
            Some(cell) => Actor::spawn_linked(name, ThreadActor, (ctx, args), cell).await,
            None => Actor::spawn(name, ThreadActor, (ctx, args)).await,
        };
        started.map(|(actor, _)| actor).map_err(|e| e.to_string())
    })
}

impl Actor for ThreadActor {
    type Msg = ThreadMsg;
    type State = Thread;
    type Arguments = (Arc<Ctx>, ThreadArgs);

    async fn pre_start(
        &self,
        me: ActorRef<ThreadMsg>,
        (ctx, a): (Arc<Ctx>, ThreadArgs),
    ) -> Result<Thread, ActorProcessingErr> {
        let offer = Offer {
            directive: &a.directive,
            caps: &a.doc.capabilities,
            has_parent: a.parent.is_some(),
        };
        let (mut tools, mut tools_bytes) =
            super::builtin::offered(&offer, &ctx.commands, &ctx.tool_specs);
        // MCP servers this thread may use start now (first use), so their tools can be offered.
        // A start withdrawn meanwhile (its parent, or its tree, cancelled) gives up waiting:
        // the spawn then undoes what it wrote (`spawn::unwind`).
        let (mcp_tools, mcp_problems) = match a.withdrawn.clone() {
            Some(w) => {
                // A task of its own: a withdrawn start stops waiting while the server's start
                // goes on for every other thread waiting on it.
                let (hub, caps) = (ctx.clone(), a.doc.capabilities.clone());
                let offered = tokio::spawn(async move { hub.mcp.offered(&caps).await });
                // Biased to the withdrawal: one that came first is never passed over.
                tokio::select! {
                    biased;
                    () = w.cancelled() => return Err(super::spawn::WITHDRAWN.into()),
                    o = offered => o.unwrap_or_else(|e| (Vec::new(), vec![format!("MCP servers: {e}")])),
                }
            }
            None => ctx.mcp.offered(&a.doc.capabilities).await,
        };
        if !mcp_tools.is_empty() {
            tools_bytes += crate::provider::tools_bytes(&mcp_tools);
            Arc::make_mut(&mut tools).extend(mcp_tools);
        }
        let system = super::conversation::system_prompt(&a.directive, &a.doc.id, &a.limits);
        let mut t = Thread {
            me: me.clone(),
            ctx,
            provider: a.provider,
            directive: a.directive,
            parent: a.parent,
            report_to: a.report_to,
            _slot: a.slot,
            limits: a.limits,
            price: a.price,
            inputs: a.inputs,
            route: a.route,
            doc: a.doc,
            status_text: None,
            phase: Phase::Idle,
            record: Record::new(a.transcript),
            talk: Talk::new(system.into(), a.messages, (tools, tools_bytes)),
            calls: Calls::new(a.calls_made),
            kids: Kids::default(),
            work: ToolWork::default(),
            hooks: HookState::new(a.hooks),
            life: Life {
                started: Instant::now(),
                cancel: CancellationToken::new(),
                timers: Vec::new(),
                deadline: None,
                span: a.span,
                on_finish: a.on_finish,
                ended: None,
                handoff: None,
            },
        };
        for problem in mcp_problems {
            tracing::warn!(thread = %t.doc.id, "{problem}");
            t.log(Line::McpUnavailable { message: problem });
        }
        me.cast(ThreadMsg::Start)?;
        Ok(t)
    }

    async fn handle(
        &self,
        _me: ActorRef<ThreadMsg>,
        msg: ThreadMsg,
        t: &mut Thread,
    ) -> Result<(), ActorProcessingErr> {
        if matches!(t.phase, Phase::Done) {
            if let ThreadMsg::Status(reply) = msg {
                let _ = reply.send(snapshot(t, vec![]));
            }
            return Ok(());
        }
        // Boxed: an idle actor's task then holds only the thread, not room for the largest
        // handler's state (several KiB per thread at 10⁵ threads).
        Box::pin(route(t, msg)).await;
        if let Some(why) = t.record_failure() {
            Box::pin(t.record_failed(why)).await;
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _me: ActorRef<ThreadMsg>,
        evt: SupervisionEvent,
        t: &mut Thread,
    ) -> Result<(), ActorProcessingErr> {
        // Not ractor's default (which stops the supervisor when a child exits): a child that
        // panicked is finalized here as `error` and reported like any other failure.
        let SupervisionEvent::ActorFailed(cell, err) = evt else {
            return Ok(());
        };
        let name = cell.get_name().unwrap_or_default();
        let Ok(id) = ThreadId::parse(&name) else {
            return Ok(());
        };
        if t.kids.map.get(&id).is_some_and(|c| c.report.is_none()) {
            Box::pin(child_failed(t, id, err.to_string())).await;
        }
        if let Some(why) = t.record_failure() {
            Box::pin(t.record_failed(why)).await;
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _me: ActorRef<ThreadMsg>,
        t: &mut Thread,
    ) -> Result<(), ActorProcessingErr> {
        t.life.cancel.cancel();
        t.life.stop_timers();
        if let Some(d) = t.life.deadline.take() {
            t.ctx.deadlines.clear(d);
        }
        t.ctx.hand_on_cancel(&t.doc.id);
        if t.doc.continuation_of.is_some() || t.doc.continued_by.is_some() {
            t.ctx.end_chain(&t.doc.id);
        }
        // However the actor stopped, the document it vouched for goes (see `Ctx::vouch_for`).
        t.ctx.forget(&t.doc.id);
        Ok(())
    }
}

/// A child whose actor failed (panicked) is finalized here as `error` and reported like any
/// other failure.
async fn child_failed(t: &mut Thread, id: ThreadId, err: String) {
    let end = DeadEnd {
        status: Status::Error,
        kind: DeadKind::Failed,
        error: format!("thread actor failed: {err}"),
    };
    let report = end_subtree(&t.ctx, &id, &end).await;
    t.child_finished(report).await;
}

/// One message to the thread method that handles it.
async fn route(t: &mut Thread, msg: ThreadMsg) {
    match msg {
        ThreadMsg::Start => t.start().await,
        ThreadMsg::NextTurn => t.next_turn().await,
        ThreadMsg::LlmDone {
            reservation,
            outcome,
        } => t.llm_done(reservation, outcome).await,
        ThreadMsg::ChildSpawned {
            call_id,
            child,
            actor,
            wait,
        } => t.child_spawned(call_id, child, actor, wait).await,
        ThreadMsg::SpawnRefused { call_id, error } => t.spawn_refused(call_id, error).await,
        ThreadMsg::ToolFinished { call_id, outcome } => t.tool_finished(call_id, outcome).await,
        ThreadMsg::Decide {
            call,
            approve,
            reason,
            reply,
        } => {
            let r = t.decide(call, approve, reason).await;
            let _ = reply.send(r);
        }
        ThreadMsg::Inject { from, text, reply } => {
            let queued = t.queue_message(&from, text);
            if let Some(r) = reply {
                let _ = r.send(queued);
            }
        }
        ThreadMsg::ChildContinued { old, new, actor } => t.child_continued(old, new, actor),
        ThreadMsg::ChildFinished(r) => t.child_finished(*r).await,
        ThreadMsg::WaitTimeout { call_id, wait } => t.wait_timeout(call_id, wait).await,
        ThreadMsg::Cancel { reason } => t.cancel(reason).await,
        ThreadMsg::DurationExpired => t.duration_expired().await,
        ThreadMsg::GraceExpired => t.grace_expired().await,
        ThreadMsg::Status(reply) => {
            let _ = reply.send(snapshot(t, t.kids.live()));
        }
    }
}

fn snapshot(t: &Thread, live_children: Vec<ThreadId>) -> StatusSnapshot {
    StatusSnapshot {
        status: t.doc.status,
        turns: t.doc.cost.turns,
        live_children,
    }
}
