//! Adopting the threads of a dead node (SPEC §13). While a runtime serves as a node on a shared
//! database, it looks every half lease: it puts the fence (`fence.rs`) on any table still without
//! it — adopting nothing while one lacks it — and reads which leases run. Unfinished threads whose
//! owner is a node with no running lease are then adopted: the owner is buried first
//! (`node::bury`: its writes still in flight are waited for, and its lease can never run again),
//! then crash recovery (`recovery.rs`) runs for that owner's rows only: each thread is claimed in
//! the registry (one conditional update, so exactly one node repairs it), its tree taken over in
//! the ledger, its calls in flight charged at their bound, and it is finalized as `interrupted`,
//! deepest first. Nothing is killed: the dead node's processes are not this node's to see. With
//! `auto_resume: true` each interrupted tree's root is then resumed here as a continuation, which
//! draws on the tree's one account.

// Used by `weft serve --node` (the `cli` feature) only.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use super::{fence, node, Runtime};
use crate::core::ids::ThreadId;
use crate::core::limits::LimitSet;
use crate::registry::RegistryMsg;
use crate::sql::Db;
use crate::thread::Recovered;
use std::collections::HashSet;
use std::time::Duration;

/// What a resumed thread is told.
const RESUMED: &str = "weft: the node that ran this thread stopped (its lease ran out) while the thread was running, and another node adopted it. Continue the task from where it stopped.";

impl Runtime {
    /// Watches the nodes every `every` while this runtime serves as a node (see the module's
    /// doc); ends when the runtime is gone.
    pub(crate) fn watch_nodes(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak = self.downgrade();
        let project = self.ctx.project.clone();
        tokio::spawn(async move {
            let mut db: Option<Db> = None;
            loop {
                tokio::time::sleep(every).await;
                let Some(rt) = Runtime::upgrade(&weak) else {
                    return;
                };
                let (back, live) = look(project.clone(), db.take()).await;
                db = back;
                let Some(live) = live else { continue };
                let dead = rt.dead_owners(&live).await;
                if dead.is_empty() {
                    continue;
                }
                let (back, buried) = bury(db.take(), dead).await;
                db = back;
                if !buried.is_empty() {
                    rt.adopt(&buried).await;
                }
            }
        })
    }

    /// Node owners of unfinished threads whose lease does not run (not in `live`).
    async fn dead_owners(&self, live: &HashSet<u32>) -> Vec<u32> {
        let owners = ractor::call!(self.ctx.registry, |reply| RegistryMsg::UnfinishedOwners {
            reply
        });
        let me = crate::core::owner::node();
        match owners {
            Ok(Ok(o)) => o
                .into_iter()
                .filter(|o| crate::core::owner::is_node(*o) && Some(*o) != me)
                .filter(|o| !live.contains(o))
                .collect(),
            other => {
                tracing::warn!("cannot list the owners of unfinished threads: {other:?}");
                Vec::new()
            }
        }
    }

    /// Adopts the threads of the `buried` owners (and fails the effects they left running).
    async fn adopt(&self, buried: &HashSet<u32>) {
        let recovered = super::recovery::recover_owners(&self.ctx, buried).await;
        for r in &recovered {
            tracing::warn!(thread = %r.id, owner = r.owner_pid, "adopted and finalized as interrupted: its node's lease ran out");
        }
        let ids = recovered.iter().filter_map(|r| ThreadId::parse(&r.id).ok());
        self.end_orphaned_placed(&ids.collect()).await;
        let (ctx, owners) = (self.ctx.clone(), buried.clone());
        let _ = tokio::task::spawn_blocking(move || {
            super::effects::fail_orphaned_of(&ctx, &|o| owners.contains(&o))
        })
        .await;
        self.resume_adopted(&recovered).await;
    }

    /// With `auto_resume: true`, resumes every adopted thread that a node left interrupted and
    /// that is the root of its tree (its children were adopted with it; the root's continuation
    /// does again what it still needs). Threads whose records say they had ended are not.
    pub(crate) async fn resume_adopted(&self, adopted: &[Recovered]) {
        if !self.ctx.config.auto_resume {
            return;
        }
        for r in adopted {
            let of_node = crate::core::owner::is_node(r.owner_pid);
            let Ok(id) = ThreadId::parse(&r.id) else {
                continue;
            };
            let root = matches!(self.get(&id), Ok(Some(v)) if v.row.parent_id.is_none());
            if r.had_ended || !of_node || !root {
                continue;
            }
            match self.resume(&id, RESUMED, LimitSet::default()).await {
                Ok(h) => {
                    tracing::warn!(thread = %id, continuation = %h.id(), "resumed after adoption")
                }
                Err(e) => tracing::warn!(thread = %id, "cannot resume after adoption: {e}"),
            }
        }
    }
}

/// Runs `work` on `db` (opened first when None) off the async threads; the connection comes back
/// unless it could not be opened (then `T`'s default).
async fn blocking<T: Default + Send + 'static>(
    project: Option<crate::project::Project>,
    db: Option<Db>,
    work: impl FnOnce(&mut Db) -> T + Send + 'static,
) -> (Option<Db>, T) {
    let done = tokio::task::spawn_blocking(move || {
        let db = match (db, project) {
            (Some(db), _) => Some(db),
            (None, Some(p)) => node::open(&p, false)
                .map_err(|e| tracing::warn!("cannot open the nodes table: {e}"))
                .ok()
                .flatten(),
            (None, None) => None,
        };
        match db {
            Some(mut db) => {
                let out = work(&mut db);
                (Some(db), out)
            }
            None => (None, T::default()),
        }
    })
    .await;
    done.unwrap_or_default()
}

/// One look at the nodes: fences the tables still unfenced, then reads which leases run (None
/// when either fails: adopt nothing this time).
async fn look(
    project: crate::project::Project,
    db: Option<Db>,
) -> (Option<Db>, Option<HashSet<u32>>) {
    blocking(Some(project), db, |db| {
        if let Err(e) = fence::install(db) {
            tracing::warn!("cannot fence the tables (adopting nothing until they are): {e}");
            return None;
        }
        node::live_owners_in(db)
            .map_err(|e| tracing::warn!("cannot read the nodes' leases: {e}"))
            .ok()
    })
    .await
}

/// Buries each of `dead` (see `node::bury`); the owners buried.
async fn bury(db: Option<Db>, dead: Vec<u32>) -> (Option<Db>, HashSet<u32>) {
    blocking(None, db, move |db| {
        dead.into_iter()
            .filter(|o| match node::bury(db, *o) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!("cannot bury node owner {o} (adopting its threads later): {e}");
                    false
                }
            })
            .collect()
    })
    .await
}
