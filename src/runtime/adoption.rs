//! Adopting the threads of a dead node (SPEC §13). While a runtime serves as a node on a shared
//! database, it looks every half lease for unfinished threads whose owner is a node whose lease
//! ran out. When there are some it runs crash recovery (`recovery.rs`): each thread is claimed
//! in the registry first (one conditional update, so exactly one node repairs it), its calls in
//! flight are charged at their bound, and it is finalized as `interrupted` — records, ledger,
//! registry, parent — deepest first. Nothing is killed: the dead node's processes are not this
//! node's to see. With `auto_resume: true` each interrupted tree's root is then resumed here as a
//! continuation, which draws on the tree's one account. The fence (`fence.rs`) is put on every
//! table before the first look, so a node that comes back writes nothing over an adoption.

use super::{fence, node, Runtime};
use crate::core::ids::ThreadId;
use crate::core::limits::LimitSet;
use crate::registry::RegistryMsg;
use crate::sql::Db;
use std::time::Duration;

/// What a resumed thread is told.
const RESUMED: &str = "weft: the node that ran this thread stopped (its lease ran out) while the thread was running, and another node adopted it. Continue the task from where it stopped.";

impl Runtime {
    /// Watches the nodes every `every` while this runtime serves as a node (see the module's
    /// doc); ends when the runtime's last other handle is gone.
    pub(crate) fn watch_nodes(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak = self.downgrade();
        let project = self.ctx.project.clone();
        tokio::spawn(async move {
            let mut db: Option<Db> = None;
            let mut fenced = false;
            loop {
                tokio::time::sleep(every).await;
                let Some(rt) = Runtime::upgrade(&weak) else {
                    return;
                };
                let (back, live) = look(project.clone(), db.take(), &mut fenced).await;
                db = back;
                if let Some(live) = live {
                    rt.adopt_dead(&live).await;
                }
            }
        })
    }

    /// Adopts the threads of nodes not in `live` (owner numbers whose lease runs), if any.
    async fn adopt_dead(&self, live: &std::collections::HashSet<u32>) {
        let owners = ractor::call!(self.ctx.registry, |reply| RegistryMsg::UnfinishedOwners {
            reply
        });
        let owners = match owners {
            Ok(Ok(o)) => o,
            other => {
                tracing::warn!("cannot list the owners of unfinished threads: {other:?}");
                return;
            }
        };
        let me = crate::core::owner::node();
        let orphaned = owners
            .iter()
            .any(|o| crate::core::owner::is_node(*o) && Some(*o) != me && !live.contains(o));
        if !orphaned {
            return;
        }
        let recovered = super::recovery::recover(&self.ctx, false).await;
        for r in &recovered {
            tracing::warn!(thread = %r.id, owner = r.owner_pid, "adopted and finalized as interrupted: its node's lease ran out");
        }
        if self.ctx.config.auto_resume {
            self.resume_roots(&recovered).await;
        }
    }

    /// Resumes every adopted thread that is the root of its tree (its children were adopted
    /// with it; the root's continuation does again what it still needs).
    async fn resume_roots(&self, adopted: &[crate::thread::Recovered]) {
        for r in adopted {
            let Ok(id) = ThreadId::parse(&r.id) else {
                continue;
            };
            let root = matches!(self.get(&id), Ok(Some(v)) if v.row.parent_id.is_none());
            if !root {
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

/// One look at the nodes: fences the tables still unfenced, then reads which leases run
/// (None when they cannot be read: adopt nothing). Blocking work, off the async threads.
async fn look(
    project: crate::project::Project,
    db: Option<Db>,
    fenced: &mut bool,
) -> (Option<Db>, Option<std::collections::HashSet<u32>>) {
    let was_fenced = *fenced;
    let done = tokio::task::spawn_blocking(move || {
        let mut db = match db {
            Some(db) => db,
            None => match node::open(&project, false) {
                Ok(Some(db)) => db,
                Ok(None) => return (None, false, None),
                Err(e) => {
                    tracing::warn!("cannot open the nodes table: {e}");
                    return (None, false, None);
                }
            },
        };
        let mut fenced = was_fenced;
        if !fenced {
            match fence::install(&mut db) {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!("fenced {n} tables against nodes whose lease ran out");
                    }
                    fenced = true;
                }
                Err(e) => tracing::warn!("cannot fence the tables yet: {e}"),
            }
        }
        let live = node::live_owners_in(&db)
            .map_err(|e| tracing::warn!("cannot read the nodes' leases: {e}"))
            .ok();
        // Without the fence a node that comes back could write over an adoption: wait for it.
        (Some(db), fenced, live.filter(|_| fenced))
    })
    .await;
    match done {
        Ok((db, f, live)) => {
            *fenced = f;
            (db, live)
        }
        Err(_) => (None, None),
    }
}
