//! What a root's cancel reaches beyond its actors' cascade: the work its tree caused. Deferred
//! children (a scheduled directive, an `after_complete` hook's spawn) are not their parent
//! actor's children, so the cascade cannot find them; pending effects wait in store.db with budgets set aside.
//! After this, nothing the tree caused runs or starts (`Ctx::stopped`), and every budget set
//! aside for work that will not start is back in the tree's account.

use crate::core::ids::ThreadId;
use crate::registry::RegistryMsg;
use crate::thread::{give_back, Ctx};
use std::sync::Arc;

/// `Runtime::cancel`: the thread `id` (or the continuation that took over from it), its
/// subtree through its actors' cascade, and the work its tree caused.
pub(super) fn thread(ctx: &Arc<Ctx>, id: &ThreadId, reason: &str) -> bool {
    let actor = ctx.current_actor(id);
    // `id`'s tree and those of the continuations that took over from it (each link of a
    // root's chain is a root of its own).
    let mut trees = ctx.chain_of(id);
    if actor.is_none() {
        // A chain that ended: its links here are gone with its last actor.
        let last = trees.last().unwrap_or(id).clone();
        trees.extend(handed_off_after(ctx, &last));
        if !trees.iter().any(|t| ctx.caused.live(t)) {
            // A start under way before its actor has its name: withdrawn (it may wait).
            return ctx.withdraw_start(id);
        }
    }
    // The trees are marked stopped before any actor hears of it, so nothing they cause
    // meanwhile starts.
    for t in &trees {
        ctx.caused.cancel(t);
    }
    let sent = actor
        .as_ref()
        .is_none_or(|(to, a)| ctx.send_cancel(to, a, reason));
    let (ctx2, reason) = (ctx.clone(), reason.to_string());
    // On the runtime's own tokio runtime: a caller may be outside it (a signal handler's thread).
    let task = ctx.tokio.spawn(async move {
        for t in trees {
            caused_work(&ctx2, &t, &reason).await;
        }
    });
    ctx.track(task);
    sent
}

/// The threads that took over from `last` by handoffs, as their thread.json files record them
/// (`continued` and `continued_by`; a resume's continuation, a person's new order, is not one).
fn handed_off_after(ctx: &Ctx, last: &ThreadId) -> Vec<ThreadId> {
    let mut links = Vec::new();
    let mut at = last.clone();
    while links.len() < 1_000 {
        let Ok(doc) = ctx.verified_doc(&at) else {
            break;
        };
        match (doc.status, doc.continued_by) {
            (crate::core::status::Status::Continued, Some(next)) => {
                links.push(next.clone());
                at = next;
            }
            _ => break,
        }
    }
    links
}

/// Stops the work the tree of `id` caused, when `id` is its tree's root, once the caller has
/// marked the tree stopped (`Caused::cancel`: its token fired, so what enters later is
/// stopped). The in-memory steps need not know whether it is: every record of caused work is
/// keyed by its tree's root, so for any other thread they find nothing (a subtree's cancel
/// reaches all of it through its actors' cascade). The registry is asked only when some effect
/// is pending (below), which spares a root's cancel a round trip and a read, and stops a tree
/// whose root's row is not committed yet as well.
pub(super) async fn caused_work(ctx: &Arc<Ctx>, id: &ThreadId, reason: &str) {
    // The deferred threads of the tree this process runs: not in their parent actor's
    // children (even while that parent runs), so its cascade does not reach them. (Every other
    // thread is reached by its parent's cascade: a second cancel from here would race its
    // parent's kill after the grace.)
    for t in ctx.caused.threads(id) {
        if let Some((to, actor)) = ctx.current_actor(&t) {
            // Noted (`Ctx::send_cancel`): a thread busy starting its continuation hands it on.
            let reason = format!("its tree was cancelled: {reason}");
            ctx.send_cancel(&to, &actor, &reason);
        }
    }
    cancel_pending_effects(ctx, id).await;
}

/// The tree's pending effects are cancelled and the budgets set aside for them given back.
/// Only when some effect is pending at all is the registry asked whether `id` is a root (a
/// lookup by key), and only a root's tree is read (`root` has no index of its own: reading
/// the tree of every thread a shutdown cancels would scan the registry once each).
async fn cancel_pending_effects(ctx: &Arc<Ctx>, id: &ThreadId) {
    if !ctx.store.any_effect_pending().await {
        return;
    }
    let root = ractor::call!(ctx.registry, |reply| RegistryMsg::Get {
        id: id.clone(),
        reply
    });
    if !matches!(&root, Ok(Ok(Some(row))) if row.root_id == *id) {
        return;
    }
    let Ok(Ok(rows)) = ractor::call!(ctx.registry, |reply| RegistryMsg::Tree {
        root: id.clone(),
        reply
    }) else {
        return;
    };
    let ids: Vec<ThreadId> = rows.iter().map(|r| r.id.clone()).collect();
    let store = ctx.store.clone();
    let cancelled = tokio::task::spawn_blocking(move || store.cancel_effects_of(&ids))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    for e in cancelled {
        if let Some(child) = e.child.as_deref().and_then(|c| ThreadId::parse(c).ok()) {
            give_back(ctx, child).await;
        }
    }
}
