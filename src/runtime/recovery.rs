//! Crash recovery (SPEC §7): threads left `created`/`running` by a process that is gone are
//! finalized as `error` with kind `interrupted`.
//!
//! For each such thread, deepest first: its ledger account is closed (open reservations released
//! unspent — what a dead process spent in flight is unknown; what it settled stays), a torn last
//! transcript line is set aside in `transcript.torn`, the transcript gets an `interrupted` and a
//! `thread_finished` event and a signed checkpoint, thread.json is re-signed as `error`, and the
//! registry row is closed. Runs at the start of every command that opens a project for writing.
//! Must never touch a thread whose owner process is alive (decided by its owner lock,
//! `owner.rs`), and claims each thread in the registry before repairing it.

use crate::core::ids::ThreadId;
use crate::core::status::Status;
use crate::ledger::LedgerMsg;
use crate::registry::{RegistryMsg, ThreadRow};
use crate::thread::{finalize_dead, Ctx, DeadEnd, DeadKind, Recovered};
use std::collections::HashMap;
use std::sync::Arc;

/// Finalizes every thread of the project whose owner process is gone (see `owner.rs`; with
/// `first_owner`, rows carrying this process's own pid are from a dead process that had it).
/// Each is claimed in the registry before it is touched, so two processes recovering at once
/// never repair one thread twice.
pub(crate) async fn recover(ctx: &Arc<Ctx>, first_owner: bool) -> Vec<Recovered> {
    let judge = super::owner::Judge::new(&ctx.project, first_owner);
    recover_where(ctx, &|owner: u32| judge.dead(owner)).await
}

/// [`recover`], for the threads of the owners `buried` only (nodes whose lease ran out and that
/// `node::bury` has put past writing): what a node adopts while it runs. Rows of processes
/// (pids) are left to a runtime's start, which judges them by this machine's owner locks.
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) async fn recover_owners(
    ctx: &Arc<Ctx>,
    buried: &std::collections::HashSet<u32>,
) -> Vec<Recovered> {
    recover_where(ctx, &|owner: u32| buried.contains(&owner)).await
}

/// Finalizes every unfinished thread whose owner `dead` says is gone.
async fn recover_where(ctx: &Arc<Ctx>, dead: &(dyn Fn(u32) -> bool + Sync)) -> Vec<Recovered> {
    let rows = match ractor::call!(ctx.registry, |reply| RegistryMsg::Unfinished { reply }) {
        Ok(Ok(rows)) => rows,
        other => {
            tracing::error!("recovery: cannot list unfinished threads: {other:?}");
            return vec![];
        }
    };
    // Tool process groups a dead process left running die first (nothing outlives its owner).
    for pgid in crate::tools::reap_groups(&ctx.project.procs_dir(), dead) {
        tracing::warn!("killed tool process group {pgid} left running by a dead weft process");
    }
    let orphans: Vec<ThreadRow> = rows.into_iter().filter(|r| dead(r.owner_pid)).collect();
    // Deepest first, so every child is closed before its parent.
    let parents: HashMap<ThreadId, Option<ThreadId>> = orphans
        .iter()
        .map(|r| (r.id.clone(), r.parent_id.clone()))
        .collect();
    let depth = |id: &ThreadId| -> usize {
        let mut d = 0;
        let mut cur = id.clone();
        while let Some(Some(p)) = parents.get(&cur) {
            d += 1;
            cur = p.clone();
            if d > 10_000 {
                break;
            }
        }
        d
    };
    let mut order: Vec<(usize, ThreadRow)> =
        orphans.iter().map(|r| (depth(&r.id), r.clone())).collect();
    order.sort_by_key(|o| std::cmp::Reverse(o.0));
    let mut out = Vec::new();
    for (_, row) in order {
        let id = row.id.clone();
        // Per thread, not per root: a tree's subtrees placed on other nodes are held apart
        // (taking a tree already held is one read).
        if !take_tree(ctx, &id).await {
            continue;
        }
        let claimed = ractor::call!(ctx.registry, |reply| RegistryMsg::Claim {
            id,
            from: row.owner_pid,
            reply
        });
        match claimed {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => continue, // another process is repairing it, or it finished
            other => {
                tracing::error!(thread = %row.id, "recovery: cannot claim: {other:?}");
                continue;
            }
        }
        let end = DeadEnd {
            status: Status::Error,
            kind: DeadKind::Interrupted,
            error: format!(
                "interrupted: {} while this thread was {}; `weft resume {}` continues it",
                owner_gone(row.owner_pid),
                row.status,
                row.id
            ),
        };
        out.push(finalize_dead(ctx, &row, &end).await.recovered);
    }
    close_orphan_accounts(ctx, dead).await;
    out
}

/// Makes this process the holder of `id`'s tree in the ledger before it claims the thread,
/// reading what a dead holder left open (see `ledger/trees.rs`). False when another live process
/// holds the tree — it is recovering the tree itself: two books writing one tree's accounts
/// would each overwrite the other's settlements.
pub(super) async fn take_tree(ctx: &Ctx, id: &ThreadId) -> bool {
    let taken = ractor::call!(ctx.ledger, |reply| LedgerMsg::TakeOver {
        id: id.clone(),
        reply
    });
    match taken {
        Ok(Ok(())) => true,
        Ok(Err(crate::ledger::LedgerError::Busy { .. })) => false,
        // Never repair from copies of a tree that may be stale: left for the next recovery.
        other => {
            tracing::warn!(thread = %id, "recovery: cannot take its tree over in the ledger (left for the next recovery): {other:?}");
            false
        }
    }
}

/// How the owner of a thread went: its process ended, or its node's lease ran out.
fn owner_gone(owner: u32) -> String {
    if crate::core::owner::is_node(owner) {
        format!("the node that ran this thread (owner {owner}) lost its lease")
    } else {
        format!("the process that ran this thread (pid {owner}) ended")
    }
}

/// Closes ledger accounts left open by dead processes that never registered their thread (the
/// process died between opening the account and registering): nothing was spent on them.
async fn close_orphan_accounts(ctx: &Arc<Ctx>, dead: &(dyn Fn(u32) -> bool + Sync)) {
    let open =
        ractor::call!(ctx.ledger, |reply| LedgerMsg::OpenAccounts { reply }).unwrap_or_default();
    for (id, owner) in open {
        // Owner 0: a deferred child's budget, held for its effect in store.db (see effects.rs).
        if owner == 0 || !dead(owner) || !take_tree(ctx, &id).await {
            continue;
        }
        tracing::warn!(thread = %id, "closing the ledger account of a thread whose process (pid {owner}) died before registering it");
        let _ = ractor::call!(ctx.ledger, |reply| LedgerMsg::Close { id, reply });
    }
}
