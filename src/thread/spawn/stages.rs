//! The spawn stages that change something — the ledger account, the registry row, the
//! thread's files — each returning a guard that undoes its work when dropped, unless the
//! spawn got through and called `keep`. So a spawn that fails at any later stage, or whose
//! future is dropped half-way, leaves nothing behind: no open account holding the parent's
//! guarantee, no `created` row, no half-written folder.
//!
//! A spawn that fails undoes them itself, last first, waiting for each (`spawn`'s `unwind`), so a
//! process that exits on the error leaves nothing behind. A drop is the fallback for a spawn
//! whose future is dropped half-way: it cannot wait, so it sends the undo, which the ledger and
//! registry actors take before any request made after it (their mailboxes are first in, first
//! out).

use super::error::SpawnError;
use super::plan::Plan;
use super::request::{Origin, SpawnRequest};
use crate::core::ids::{now_ts, ThreadId};
use crate::core::money::{Nanos, Usage};
use crate::core::status::Status;
use crate::ledger::LedgerMsg;
use crate::record::line::Line;
use crate::record::transcript::TranscriptWriter;
use crate::registry::{Admission, RegistryMsg, ThreadRow};
use crate::thread::ctx::Ctx;
use std::sync::Arc;

/// Output tokens of the smallest call worth making.
pub(crate) const MIN_OUTPUT_TOKENS: u64 = 16;

/// Step 5: the thread's ledger account, open (before admission, so a refusal there can be
/// undone by closing it). Closed again when dropped unless kept.
pub(crate) struct Account {
    ctx: Arc<Ctx>,
    id: Option<ThreadId>,
}

impl Account {
    /// Opens the account of `plan` under its parent's (or its chain's), with the guarantee
    /// `req.reserve` and room for at least the smallest first call; a deferred child takes over
    /// the account set aside for it, and its spend limit is what that holds.
    pub(crate) async fn open(
        ctx: &Arc<Ctx>,
        plan: &mut Plan,
        req: &SpawnRequest,
    ) -> Result<Account, SpawnError> {
        if let Some(p) = &plan.chain_parent {
            reopen(ctx, p).await?;
        }
        // Whatever goes wrong from here, no account of this id may stay open holding the
        // parent's guarantee (closing an account that was never opened changes nothing).
        let guard = Account {
            ctx: ctx.clone(),
            id: Some(plan.id.clone()),
        };
        let opened = match &req.origin {
            Origin::Deferred(_) if req.placed => adopt_placed(ctx, plan).await,
            Origin::Deferred(_) => adopt(ctx, plan).await,
            _ => open_new(ctx, plan, req.reserve).await,
        };
        if let Err(e) = opened {
            guard.undo().await;
            return Err(e);
        }
        crate::core::failpoint::hit("spawn.ledger");
        Ok(guard)
    }

    /// Closes the account now, waiting for the ledger (a spawn that failed).
    pub(crate) async fn undo(mut self) {
        if let Some(id) = self.id.take() {
            let _ = ractor::call!(self.ctx.ledger, |reply| LedgerMsg::Close { id, reply });
        }
    }

    /// The spawn got through: the account stays open.
    pub(crate) fn keep(mut self) {
        self.id = None;
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let (reply, _) = tokio::sync::oneshot::channel();
            let _ = self.ctx.ledger.cast(LedgerMsg::Close {
                id,
                reply: reply.into(),
            });
        }
    }
}

/// The ledger actor did not answer a call.
fn unanswered(e: impl std::fmt::Display) -> SpawnError {
    SpawnError::Storage(format!("ledger: {e}"))
}

/// Output tokens a minimal first call of `plan` costs.
pub(crate) fn min_first_call(plan: &Plan) -> Nanos {
    plan.price.cost(&Usage {
        input_tokens: (plan.prompt.len() as u64).div_ceil(3),
        output_tokens: MIN_OUTPUT_TOKENS,
        cache_read_tokens: 0,
        cache_write_tokens: 0,
    })
}

/// A new account for `plan`, under its parent's or its chain's.
async fn open_new(ctx: &Ctx, plan: &Plan, guarantee: Nanos) -> Result<(), SpawnError> {
    ractor::call!(ctx.ledger, |reply| LedgerMsg::Open {
        id: plan.id.clone(),
        parent: plan.parent_id.clone().or_else(|| plan.chain_parent.clone()),
        max: plan.limits.spend,
        guarantee,
        min_first_call: min_first_call(plan),
        reply
    })
    .map_or_else(|e| Err(unanswered(e)), |r| r.map_err(SpawnError::from))
}

/// A deferred child takes over the account set aside for it; its spend limit is what it holds.
async fn adopt(ctx: &Ctx, plan: &mut Plan) -> Result<(), SpawnError> {
    let Some(parent) = plan.parent_id.clone() else {
        return Err(SpawnError::Storage(
            "a deferred child without a parent".into(),
        ));
    };
    let held = ractor::call!(ctx.ledger, |reply| LedgerMsg::Adopt {
        id: plan.id.clone(),
        parent,
        reply
    })
    .map_or_else(|e| Err(unanswered(e)), |r| r.map_err(SpawnError::from))?;
    plan.limits.spend = plan.limits.spend.min(held);
    Ok(())
}

/// A placed child takes over the account its parent's node set aside and placed: the top of
/// what this node holds (see `ledger/placed.rs`); its spend limit is what it holds.
async fn adopt_placed(ctx: &Ctx, plan: &mut Plan) -> Result<(), SpawnError> {
    let held = ractor::call!(ctx.ledger, |reply| LedgerMsg::AdoptPlaced {
        id: plan.id.clone(),
        reply
    })
    .map_or_else(|e| Err(unanswered(e)), |r| r.map_err(SpawnError::from))?;
    plan.limits.spend = plan.limits.spend.min(held);
    Ok(())
}

/// Sets aside, out of `plan`'s parent's tree, the budget of work started later (see
/// `spawn::defer`): its spend limit `whole` or refused, else at most that; refused when not
/// even a first call fits. Returns the amount.
pub(crate) async fn set_aside(ctx: &Ctx, plan: &Plan, whole: bool) -> Result<Nanos, SpawnError> {
    let Some(parent) = plan.parent_id.clone() else {
        return Err(SpawnError::Storage("deferred work without a parent".into()));
    };
    reopen(ctx, &parent).await?;
    ractor::call!(ctx.ledger, |reply| LedgerMsg::Defer {
        id: plan.id.clone(),
        parent,
        want: plan.limits.spend,
        whole,
        min_first_call: min_first_call(plan),
        reply
    })
    .map_or_else(|e| Err(unanswered(e)), |r| r.map_err(SpawnError::from))
}

/// The closed accounts of a continuation's ancestors, opened again from ledger.db so every
/// ancestor's cap still bounds the chain.
async fn reopen(ctx: &Ctx, id: &ThreadId) -> Result<(), SpawnError> {
    ractor::call!(ctx.ledger, |reply| LedgerMsg::Reopen {
        id: id.clone(),
        reply
    })
    .map_err(|e| SpawnError::Storage(format!("ledger: {e}")))?
    .map_err(|e| match e {
        e @ crate::ledger::LedgerError::Busy { .. } => SpawnError::Ledger(e),
        e => SpawnError::Storage(format!(
            "the ledger account of {id}, under which this chain draws, cannot be read: {e}"
        )),
    })
}

/// Steps 4 + 6: admission and the registry row, in one registry transaction. While it lives the
/// thread is `in_spawn` (see `Ctx::in_spawn`); dropped unless kept, the row is marked `error`
/// with why the thread never ran.
pub(crate) struct Registered {
    ctx: Arc<Ctx>,
    /// The thread marked `in_spawn` while this lives.
    id: ThreadId,
    /// The row registered (None once kept, or when registration itself failed).
    row: Option<ThreadRow>,
    /// Why the spawn failed after registration (the row's error).
    why: String,
}

impl Registered {
    /// Registers `plan`'s row, admitted against its parent's `spawns` and `concurrency`
    /// (a continuation takes its predecessor's place: it is not a new spawn of the parent).
    pub(crate) async fn admit(
        ctx: &Arc<Ctx>,
        plan: &Plan,
        req: &SpawnRequest,
    ) -> Result<Registered, SpawnError> {
        let row = first_row(plan, req);
        let admit = plan
            .parent_doc
            .as_ref()
            .filter(|_| req.continuation().is_none())
            .zip(plan.parent_id.as_ref())
            .map(|(d, pid)| Admission {
                parent: pid.clone(),
                spawns: d.limits.spawns,
                concurrency: d.limits.concurrency,
            });
        mark_in_spawn(ctx, &plan.id, true);
        let mut guard = Registered {
            ctx: ctx.clone(),
            id: plan.id.clone(),
            row: None,
            why: "the spawn was abandoned before the thread started".into(),
        };
        ractor::call!(ctx.registry, |reply| RegistryMsg::Register {
            row: Box::new(row.clone()),
            admit,
            reply
        })
        .map_err(|e| SpawnError::Storage(format!("registry: {e}")))??;
        guard.row = Some(row);
        crate::core::failpoint::hit("spawn.registered");
        if let (Some(old), Some(root)) = (&plan.continuation_of, &plan.chain_root) {
            link_continuation(ctx, old, &plan.id, root).await;
        }
        Ok(guard)
    }

    /// Marks the row `error` with why the thread never ran, waiting for the registry (retried
    /// while registry.db is busy). The `in_spawn` mark stays until the guard drops.
    pub(crate) async fn undo_row(&mut self, why: &SpawnError) {
        if let Some(row) = self.row.take() {
            let mut row = error_row(row, why.to_string());
            if matches!(why, SpawnError::Withdrawn(_)) {
                row.status = Status::Cancelled; // its start was withdrawn, not failed
            }
            self.ctx.store_row(row).await;
        }
    }

    /// The spawn got through: the row stays as registered.
    pub(crate) fn keep(mut self) {
        self.row = None;
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(row) = self.row.take() {
            let row = error_row(row, std::mem::take(&mut self.why));
            let _ = self.ctx.registry.cast(RegistryMsg::Update {
                row: Box::new(row),
                reply: None,
            });
        }
        // Last: whoever waits for the thread to leave `in_spawn` finds the undo done.
        mark_in_spawn(&self.ctx, &self.id, false);
    }
}

/// The row of a thread that never ran.
fn error_row(mut row: ThreadRow, why: String) -> ThreadRow {
    row.status = Status::Error;
    row.error = Some(format!("{}{why}", crate::registry::UNDONE));
    row.updated_at = now_ts();
    row
}

/// From its row to its running actor, a thread is `in_spawn` (see `Ctx::in_spawn`).
pub(crate) fn mark_in_spawn(ctx: &Ctx, id: &ThreadId, on: bool) {
    if let Ok(mut s) = ctx.in_spawn.lock() {
        match on {
            true => s.insert(id.clone()),
            false => s.remove(id),
        };
    }
}

/// The row a thread is registered with (`created`).
fn first_row(plan: &Plan, req: &SpawnRequest) -> ThreadRow {
    ThreadRow {
        directive: plan.directive.name.clone(),
        parent_id: plan.parent_id.clone(),
        created_at: plan.created_at.clone(),
        updated_at: plan.created_at.clone(),
        model: plan.model.clone(),
        owner_pid: crate::core::owner::me(),
        forked_from: req.seed().map(|s| s.from.thread.clone()),
        continuation_of: plan.continuation_of.clone(),
        chain_root: plan.chain_root.clone(),
        ..ThreadRow::new(plan.id.clone(), plan.root_id.clone(), Status::Created)
    }
}

async fn link_continuation(ctx: &Ctx, old: &ThreadId, new: &ThreadId, root: &ThreadId) {
    let linked = ractor::call!(ctx.registry, |reply| RegistryMsg::LinkContinuation {
        old: old.clone(),
        new: new.clone(),
        chain_root: root.clone(),
        reply
    });
    if !matches!(linked, Ok(Ok(()))) {
        tracing::warn!(thread = %new, "could not link continuation in the registry: {linked:?}");
    }
}

/// Step 6's files: the thread's folder, the files attached from its parent's area, and the
/// transcript with its `thread_started` line. Removed whole when dropped unless kept.
pub(crate) struct Files {
    ctx: Arc<Ctx>,
    id: Option<ThreadId>,
    /// The transcript, opened (taken by the actor).
    pub(crate) transcript: Option<TranscriptWriter>,
}

impl Files {
    /// Writes the thread's folder, attachments and first transcript line.
    pub(crate) fn write(
        ctx: &Arc<Ctx>,
        plan: &Plan,
        req: &SpawnRequest,
    ) -> Result<Files, SpawnError> {
        let store = &ctx.store;
        let dir = store.thread_dir(&plan.id);
        std::fs::create_dir(&dir)
            .map_err(|e| SpawnError::Storage(format!("{}: {e}", dir.display())))?;
        let mut files = Files {
            ctx: ctx.clone(),
            id: Some(plan.id.clone()),
            transcript: None,
        };
        if crate::core::failpoint::fails("spawn.files") {
            return Err(SpawnError::Storage(format!(
                "{}: failpoint spawn.files",
                dir.display()
            )));
        }
        if let Some(p) = plan.parent_id.as_ref().filter(|_| !req.attach.is_empty()) {
            let (from, to) = (store.files_dir(p), store.files_dir(&plan.id));
            for rel in &req.attach {
                crate::tools::copy_between(&from, rel, &to, rel)
                    .map_err(|e| SpawnError::Storage(format!("attaching `{rel}`: {e}")))?;
            }
        }
        let mut transcript = TranscriptWriter::create(
            store.records(),
            &plan.id,
            ctx.signer.clone(),
            ctx.config.durability,
            ctx.config.checkpoint_every,
        )
        .map_err(|e| SpawnError::Storage(format!("transcript: {e}")))?;
        transcript
            .append_line(started_line(plan, req), &ctx.redactor())
            .map_err(|e| SpawnError::Storage(format!("transcript: {e}")))?;
        crate::core::failpoint::hit("spawn.transcript");
        files.transcript = Some(transcript);
        Ok(files)
    }

    /// The spawn got through: the files stay.
    pub(crate) fn keep(mut self) {
        self.id = None;
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        // No half-written files behind: the thread never ran.
        if let Some(id) = self.id.take() {
            let _ = self.ctx.store.remove_thread_files(&id);
        }
    }
}

/// The transcript's first line.
fn started_line(plan: &Plan, req: &SpawnRequest) -> Line {
    let d = &plan.directive;
    Line::ThreadStarted {
        directive: d.name.clone(),
        directive_hash: d.content_hash.clone(),
        source: d.source.clone(),
        parent: plan.parent_id.clone(),
        root: plan.root_id.clone(),
        model: plan.model.clone(),
        provider: plan.provider_name.clone(),
        limits: plan.limits.clone(),
        capabilities: plan.caps.clone(),
        inputs: plan.inputs.clone(),
        reserve_nanos: req.reserve,
        continuation_of: plan.continuation_of.clone(),
    }
}
