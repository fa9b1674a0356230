//! The spawn procedure of SPEC §4, the one way a thread starts (root, child or continuation),
//! as typed stages: a [`Plan`](plan::Plan) resolved without changing anything (parent,
//! directive, inputs, limits, capabilities, provider, price, hooks), then the ledger account,
//! the registry row and the thread's files, each a guard that undoes its work if a later stage
//! fails, and last the actor, started through the runtime's launcher (`Ctx::launch`, so the
//! stages need not know the actor that runs what they start).
//!
//! "A failed spawn leaves nothing behind" is a property of the guards: nothing is kept until
//! the actor runs.

mod error;
mod plan;
mod request;
mod stages;

pub use error::SpawnError;
pub(crate) use plan::stays_in_tree;
pub(crate) use request::{
    ClientBounds, Continuation, Deferred, Origin, ParentLink, Seed, SpawnRequest,
};
pub(crate) use stages::MIN_OUTPUT_TOKENS;

use crate::core::ids::ThreadId;
use crate::core::status::Status;
use crate::provider::Message;
use crate::record::thread_doc::{Cost, ThreadDoc, Transition};
use crate::thread::ctx::{Ctx, Starting};
use crate::thread::msg::{ThreadArgs, ThreadMsg};
use crate::thread::report::ThreadReport;
use plan::Plan;
use ractor::ActorRef;
use serde_json::Value;
use stages::{Account, Files, Registered};
use std::sync::Arc;
use tokio::sync::oneshot;

/// What a thread actor's start fails with when it was withdrawn while it waited.
pub(crate) const WITHDRAWN: &str = "withdrawn as it started";

/// SPEC §4 steps 1–6: resolve, open the ledger account, admit and register, write the first
/// records and start the actor. On any failure nothing is left running, reserved or
/// half-written.
pub(crate) async fn spawn(
    ctx: &Arc<Ctx>,
    req: SpawnRequest,
    on_finish: Option<oneshot::Sender<ThreadReport>>,
) -> Result<(ThreadId, ActorRef<ThreadMsg>), SpawnError> {
    // Counted among this runtime's threads from now on (see `placer::Slot`).
    let mut req = req;
    let place = req.slot.take().unwrap_or_else(|| ctx.placement.slot());
    // A bounded number of spawns run their stages at once; the others queue here, holding
    // nothing yet (see `Ctx::spawn_slots`).
    let slot = match req.withdrawn.clone() {
        Some(token) => tokio::select! {
            // Biased: a request already withdrawn makes nothing of its stages.
            biased;
            _ = token.cancelled() => {
                // Its parent's, its tree's, its predecessor's or its caller's cancel.
                let why = "what started it was cancelled before it started";
                return Err(SpawnError::Withdrawn(why.into()));
            }
            slot = ctx.spawn_slots.acquire() => slot,
        },
        None => ctx.spawn_slots.acquire().await,
    };
    // Boxed: the stages' future is kilobytes, and a spawn waiting above for a slot (thousands
    // at once in a wide tree) would hold all of it while it waits.
    Box::pin(stages(ctx, req, on_finish, place, slot)).await
}

/// The stages of [`spawn`] once it holds a spawn slot.
async fn stages(
    ctx: &Arc<Ctx>,
    req: SpawnRequest,
    on_finish: Option<oneshot::Sender<ThreadReport>>,
    place: crate::thread::slot::Slot,
    slot: Result<tokio::sync::SemaphorePermit<'_>, tokio::sync::AcquireError>,
) -> Result<(ThreadId, ActorRef<ThreadMsg>), SpawnError> {
    let mut plan = Plan::make(ctx, &req)?;
    // A start that may wait on an MCP server can be withdrawn from here on (`ThreadArgs`): by
    // what withdraws the spawn, or by the thread's own cancel, which finds it once its row
    // is visible (`Runtime::cancel`) whether or not its actor has its name yet.
    let starting = ctx
        .mcp
        .wants(&plan.caps)
        .then(|| Starting::new(ctx, &plan.id, req.withdrawn.as_ref()));
    let account = Account::open(ctx, &mut plan, &req).await?;
    let registered = match Registered::admit(ctx, &plan, &req).await {
        Ok(r) => r,
        Err(e) => return Err(unwind(e, None, None, account).await),
    };
    let mut files = match Files::write(ctx, &plan, &req) {
        Ok(f) => f,
        Err(e) => return Err(unwind(e, None, Some(registered), account).await),
    };
    let Some(transcript) = files.transcript.take() else {
        let e = SpawnError::Storage("transcript: not opened".into());
        return Err(unwind(e, Some(files), Some(registered), account).await);
    };
    let id = plan.id.clone();
    let cell = req.parent_link().map(|p| p.actor.get_cell());
    let mut args = arguments(plan, req, transcript, on_finish, place);
    args.withdrawn = starting.as_ref().map(|s| s.token.clone());
    // The actor's start may wait on MCP servers it may use (a slow one, up to its start
    // timeout): not while holding a slot every other spawn of the runtime needs.
    drop(slot);
    let actor = match (ctx.launch)(ctx.clone(), args, cell).await {
        Ok(a) => a,
        Err(e) => {
            // Only the start's own withdrawal (not a failure that met a cancel) ends it cancelled.
            let withdrawn = starting.as_ref().map(|s| &s.token);
            let e = match withdrawn.filter(|w| w.is_cancelled() && e.contains(WITHDRAWN)) {
                Some(_) => {
                    SpawnError::Withdrawn("what started it was cancelled as it started".into())
                }
                None => SpawnError::Storage(format!("cannot start the thread actor: {e}")),
            };
            return Err(unwind(e, Some(files), Some(registered), account).await);
        }
    };
    files.keep();
    registered.keep();
    account.keep();
    if let Some(s) = starting {
        s.ran();
    }
    Ok((id, actor))
}

/// Sets aside, from the tree of the thread `req` hangs under, the budget of work that starts
/// later (a scheduled directive, an `after_complete` hook's spawn: `Origin::Deferred` with no id
/// yet): everything is resolved and checked now as for a child — the capability to spawn it, its
/// inputs, limits, depth and price — and an account is opened for it under that thread holding
/// its spend limit, taken from what the tree has left: a scheduled directive's whole (refused if
/// the tree has not that much: its scheduler goes on, and the call can ask less), a hook's at
/// most that (refused when not even a first call fits). Returns the id it will run as and the amount set aside; `spawn` with that id later
/// takes the account over, and closing the account unstarted gives the amount back.
pub(crate) async fn defer(
    ctx: &Arc<Ctx>,
    req: &SpawnRequest,
) -> Result<(ThreadId, crate::core::money::Nanos), SpawnError> {
    let plan = Plan::make(ctx, req)?;
    // A schedule's budget is set aside whole or refused; a hook's takes at most what is left.
    let amount = stages::set_aside(ctx, &plan, req.hook.is_none()).await?;
    Ok((plan.id, amount))
}

/// Whether `req` would be admitted now, as far as that can be known without changing anything
/// (SPEC §4 steps 1–3: the directive, the capability to start it, its inputs, limits, depth).
pub(crate) fn check(ctx: &Arc<Ctx>, req: &SpawnRequest) -> Result<(), SpawnError> {
    Plan::make(ctx, req).map(|_| ())
}

/// Closes the account set aside for a deferred child that will not start (its effect was
/// cancelled or failed, or is gone): its budget goes back to the tree. Closing twice changes
/// nothing.
pub(crate) async fn give_back(ctx: &Ctx, id: ThreadId) {
    let _ = ractor::call!(ctx.ledger, |reply| crate::ledger::LedgerMsg::Close {
        id,
        reply
    });
}

/// Undoes the stages a failed spawn got through, last first, waiting for each — a process that
/// exits on `e` leaves no folder, no `created` row and no open account — and clears the thread's
/// `in_spawn` mark last. Returns `e`.
async fn unwind(
    e: SpawnError,
    files: Option<Files>,
    mut registered: Option<Registered>,
    account: Account,
) -> SpawnError {
    drop(files);
    if let Some(r) = registered.as_mut() {
        r.undo_row(&e).await;
    }
    account.undo().await;
    drop(registered);
    e
}

/// The first thread.json (history: created). The actor signs it as it starts (created,
/// running: one file write instead of two); a crash before that leaves a registry row that
/// recovery completes from the registry and the ledger.
fn first_doc(plan: &Plan, req: &SpawnRequest, head: crate::record::transcript::Head) -> ThreadDoc {
    let now = plan.created_at.clone();
    ThreadDoc {
        version: 1,
        id: plan.id.clone(),
        directive: plan.directive.name.clone(),
        directive_hash: plan.directive.content_hash.clone(),
        parent_id: plan.parent_id.clone(),
        root_id: plan.root_id.clone(),
        status: Status::Created,
        history: vec![Transition {
            status: Status::Created,
            at: now.clone(),
        }],
        created_at: now.clone(),
        updated_at: now,
        model: plan.model.clone(),
        provider: plan.provider_name.clone(),
        limits: plan.limits.clone(),
        capabilities: plan.caps.clone(),
        approval: plan.approval.clone(),
        cost: Cost::default(),
        outputs: None,
        result: None,
        error: None,
        error_kind: None,
        continuation_of: plan.continuation_of.clone(),
        continued_by: None,
        chain_root: plan.chain_root.clone(),
        transcript_head: head,
        forked_from: req.seed().map(|s| s.from.clone()),
        imported: None,
        caused_by: plan.caused_by.clone(),
        directive_signature: plan.signature.clone(),
    }
}

/// What the actor starts from.
fn arguments(
    plan: Plan,
    req: SpawnRequest,
    transcript: crate::record::transcript::TranscriptWriter,
    on_finish: Option<oneshot::Sender<ThreadReport>>,
    place: crate::thread::slot::Slot,
) -> ThreadArgs {
    let doc = first_doc(&plan, &req, transcript.head().clone());
    let span = crate::thread::spans::thread(
        req.parent_span.as_ref(),
        &plan.id,
        &plan.directive.name,
        plan.parent_id.as_ref(),
        &plan.provider_name,
        &plan.model,
    );
    let report_to = req.placed.then(|| req.parent_id().cloned()).flatten();
    let (messages, calls_made, parent) = match req.origin {
        Origin::Continue(c, p) => (c.messages, c.calls_made, p),
        Origin::Fork(s) => (s.messages, s.calls_made, None),
        Origin::Child(p) => (vec![Message::user(plan.prompt)], 0, Some(p)),
        Origin::Person | Origin::Client(_) | Origin::Deferred(_) => {
            (vec![Message::user(plan.prompt)], 0, None)
        }
    };
    ThreadArgs {
        provider: plan.provider,
        directive: Arc::new(plan.directive),
        messages,
        calls_made,
        parent: parent.map(|p| (p.id, p.actor)),
        report_to,
        slot: place,
        limits: plan.limits,
        price: plan.price,
        doc,
        transcript,
        on_finish,
        hooks: plan.hooks,
        inputs: Value::Object(plan.inputs),
        route: req.route,
        span,
        withdrawn: None,
    }
}
