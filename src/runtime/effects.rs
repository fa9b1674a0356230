//! Running scheduled effects (see `store/effects.rs`): every runtime that can run threads keeps
//! one task that claims the effects due, runs them and sleeps until the next is due (at most
//! 2 s, so effects scheduled by other processes are seen; a `schedule` call in this process
//! wakes it at once). A directive effect starts its thread as the deferred child of the
//! scheduling thread that it is (`thread::spawn::defer`: its budget was set aside from the
//! scheduler's tree when it was scheduled, and is given back if it cannot start); a tool effect
//! runs the command tool in the scheduling thread's file area with its environment. Both are
//! tracked like hook work: `Runtime::drain_hooks` waits for them.

use crate::core::ids::{now_ts, ThreadId};
use crate::ledger::LedgerMsg;
use crate::store::{Effect, EffectKind};
use crate::thread::{give_back, Ctx, Deferred, Origin, SpawnRequest};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Longest sleep between looks at store.db.
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// Starts the effects task of a runtime (it ends when the runtime is gone).
pub(super) fn start(ctx: &Arc<Ctx>) {
    let weak = Arc::downgrade(ctx);
    let wake = ctx.effects_wake.clone();
    tokio::spawn(async move {
        loop {
            let Some(wait) = round(&weak).await else {
                return;
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = wake.notified() => {}
            }
        }
    });
}

/// Effects left `running` by a process that died are failed, never run again; a budget set
/// aside for work that never started (its effect failed, was cancelled or is gone) is given back.
/// Run when the runtime opens, before any of its threads can set a budget aside (one whose
/// effect is not stored yet would look gone).
pub(super) async fn settle_orphans(ctx: &Arc<Ctx>, first_owner: bool) {
    fail_orphaned(ctx, first_owner);
    let waiting: Vec<String> = ctx
        .store
        .pending_effects(None)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| e.child)
        .collect();
    let open =
        ractor::call!(ctx.ledger, |reply| LedgerMsg::OpenAccounts { reply }).unwrap_or_default();
    for (id, owner) in open {
        // Its tree taken first: a live holder's book holds the set-aside budget too (and its
        // journal the tree's latest rows); that process gives it back itself.
        if owner == 0
            && !waiting.iter().any(|w| *w == id.as_str())
            && super::recovery::take_tree(ctx, &id).await
        {
            give_back(ctx, id).await;
        }
    }
}

/// Fails the effects left `running` by an owner that is gone (a process, or a node whose lease
/// ran out): never run again.
pub(super) fn fail_orphaned(ctx: &Ctx, first_owner: bool) {
    let judge = super::owner::Judge::new(&ctx.project, first_owner);
    fail_orphaned_of(ctx, &|owner: u32| judge.dead(owner));
}

/// [`fail_orphaned`] for the owners `dead` says are gone.
pub(super) fn fail_orphaned_of(ctx: &Ctx, dead: &dyn Fn(u32) -> bool) {
    for e in ctx.store.orphaned_effects(dead).unwrap_or_default() {
        let who = e.claimed_by.unwrap_or(0);
        let why = match crate::core::owner::is_node(who) {
            true => format!(
                "interrupted: the node (owner {who}) that ran it lost its lease; not run again"
            ),
            false => format!("interrupted: process {who} ended while it ran; not run again"),
        };
        let _ = ctx.store.finish_effect(&e.id, false, &why);
    }
}

/// Runs what is due (and in this runtime's scope); returns how long to sleep, or None when the
/// runtime is gone. Claims and starts under the effects gate (see `Runtime::drain_hooks`).
async fn round(weak: &Weak<Ctx>) -> Option<Duration> {
    let ctx = weak.upgrade()?;
    let gate = ctx.effects_gate.lock().await;
    if gate.closed {
        return Some(LOOK_EVERY);
    }
    let (scope, c2) = (gate.scope.clone(), ctx.clone());
    let wanted = move |e: &Effect| in_scope(&c2, scope.as_ref(), e);
    let store = ctx.store.clone();
    let w2 = wanted.clone();
    let due = tokio::task::spawn_blocking(move || store.claim_due(crate::core::owner::me(), &w2))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    for e in due {
        run(&ctx, e).await;
    }
    drop(gate);
    let next = ctx.store.next_due(&wanted).ok().flatten();
    let now = now_ts();
    Some(match next {
        Some(t) if t <= now => Duration::from_millis(20),
        Some(t) => humantime::parse_rfc3339(&t)
            .ok()
            .and_then(|t| t.duration_since(std::time::SystemTime::now()).ok())
            .map_or(LOOK_EVERY, |d| d.min(LOOK_EVERY)),
        None => LOOK_EVERY,
    })
}

/// Whether effect `e` is one this runtime runs: any, or only those of tree `scope`.
fn in_scope(ctx: &Ctx, scope: Option<&std::collections::HashSet<ThreadId>>, e: &Effect) -> bool {
    let Some(roots) = scope else {
        return true;
    };
    ThreadId::parse(&e.thread)
        .ok()
        .and_then(|t| ctx.verified_doc(&t).ok())
        .is_some_and(|d| roots.contains(&d.root_id))
}

/// Why effect `e` of the tree of `root` is not run: the tree is stopped, or the thread that
/// scheduled it was of a run of the tree that was cancelled (a resume opened it again since).
fn cancelled_before(ctx: &Ctx, root: &ThreadId, e: &Effect) -> Option<String> {
    let by = ThreadId::parse(&e.thread).ok();
    (ctx.stopped(root) || by.is_some_and(|t| ctx.caused.refuses(root, &t)))
        .then(|| format!("the tree of {root} was cancelled: not run"))
}

async fn run(ctx: &Arc<Ctx>, e: Effect) {
    match e.kind {
        EffectKind::Directive => start_directive(ctx, e).await,
        EffectKind::Tool => {
            let ctx2 = ctx.clone();
            let task = tokio::spawn(async move { run_tool(&ctx2, e).await });
            ctx.track(task);
        }
    }
}

async fn start_directive(ctx: &Arc<Ctx>, e: Effect) {
    let (Ok(parent), Some(Ok(child))) = (
        ThreadId::parse(&e.thread),
        e.child.as_deref().map(ThreadId::parse),
    ) else {
        let why =
            "scheduled without a budget set aside (by an older weft): not run; schedule it again";
        let _ = ctx.store.finish_effect(&e.id, false, why);
        return;
    };
    let inputs = e.inputs.as_object().cloned().unwrap_or_default();
    // Counted as its tree's work from the start: the tree's cancel withdraws it while it is
    // still starting, and reaches it once it runs.
    let root = ctx.verified_doc(&parent).map(|d| d.root_id.clone());
    if let Some(why) = root
        .as_ref()
        .ok()
        .and_then(|r| cancelled_before(ctx, r, &e))
    {
        give_back(ctx, child).await;
        let _ = ctx.store.finish_effect(&e.id, false, &why);
        return;
    }
    let origin = Origin::Deferred(Deferred {
        parent,
        id: Some(child.clone()),
    });
    let mut req = SpawnRequest::new(e.target.clone(), inputs, origin);
    let mut caused = root.ok().map(|r| ctx.caused.enter(&r));
    req.withdrawn = caused.as_ref().map(|c| c.token.clone());
    let (tx, rx) = tokio::sync::oneshot::channel();
    match crate::thread::spawn(ctx, req, Some(tx)).await {
        Ok((id, actor)) => {
            let _ = ctx
                .store
                .finish_effect(&e.id, true, &format!("started thread {id}"));
            tracing::info!(effect = %e.id, thread = %id, "scheduled effect started its thread");
            if caused.as_mut().is_some_and(|c| c.is_thread(id.clone())) {
                ctx.send_cancel(&id, &actor, crate::thread::CANCELLED_AS_IT_STARTED);
            }
            let task = tokio::spawn(async move {
                let _ = rx.await;
                drop(caused);
            });
            ctx.track(task);
        }
        Err(crate::thread::SpawnError::Ledger(crate::ledger::LedgerError::Busy {
            pid, ..
        })) => {
            // Another live process holds the tree: it runs the effect (the budget stays).
            let retry = std::time::SystemTime::now() + LOOK_EVERY;
            let retry = humantime::format_rfc3339_millis(retry).to_string();
            let _ = ctx.store.release_effect(&e.id, &retry);
            tracing::info!(effect = %e.id, "its tree is held by process {pid}: left to it");
        }
        Err(err) => {
            give_back(ctx, child).await;
            let _ = ctx.store.finish_effect(
                &e.id,
                false,
                &format!("the thread could not start: {err}"),
            );
        }
    }
}

async fn run_tool(ctx: &Arc<Ctx>, e: Effect) {
    let Some(tool) = ctx.commands.get(&e.target).cloned() else {
        let _ = ctx.store.finish_effect(
            &e.id,
            false,
            &format!("no command tool `{}` in this project any more", e.target),
        );
        return;
    };
    let Ok(thread) = ThreadId::parse(&e.thread) else {
        let _ = ctx
            .store
            .finish_effect(&e.id, false, "its thread id is not valid");
        return;
    };
    let store = ctx.store.clone();
    let t2 = thread.clone();
    let vars = tokio::task::spawn_blocking(move || store.env_resolve(&t2)).await;
    let vars = match vars {
        Ok(Ok(v)) => v
            .into_values()
            .filter_map(|v| Some((v.name, v.value?)))
            .collect(),
        _ => Default::default(),
    };
    ctx.refresh_secrets();
    let env = crate::tools::CallEnv {
        vars,
        redactor: ctx.redactor(),
        procs: Some(ctx.project.procs_dir()),
    };
    // It carries the cancel of the tree that scheduled it.
    let root = ctx
        .verified_doc(&thread)
        .map_or_else(|_| thread.clone(), |d| d.root_id.clone());
    if let Some(why) = cancelled_before(ctx, &root, &e) {
        let _ = ctx.store.finish_effect(&e.id, false, &why);
        return;
    }
    let caused = ctx.caused.enter(&root);
    let area = ctx.store.files_dir(&thread);
    let r = crate::tools::run_command(
        &tool,
        &e.inputs,
        &ctx.project.root,
        &area,
        &e.id,
        caused.token.clone(),
        &env,
    )
    .await;
    drop(caused);
    let mut out = r.content;
    if out.len() > 4096 {
        let mut cut = 4096;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str(" […]");
    }
    let _ = ctx.store.finish_effect(&e.id, !r.is_error, &out);
}
