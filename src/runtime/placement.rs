//! The runtime's side of children placed on other nodes (#26; `thread/placed.rs`): who places
//! (set by the node that serves), starting a placed child taken from the queue, and handing a
//! placed child's end, relayed from the node that ran it, to its stand-in here.

// Used by `weft serve --node` (the `cli` feature) only.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use super::Runtime;
use crate::core::ids::ThreadId;
use crate::ledger::LedgerMsg;
use crate::thread::placer::{Placed, Placer};
use crate::thread::slot::Slot;
use crate::thread::{Deferred, Origin, SpawnError, SpawnRequest};
use std::collections::HashSet;
use std::sync::Arc;

impl Runtime {
    /// From now on children this runtime's threads start go through `placer` when it is full.
    pub(crate) fn set_placer(&self, placer: Arc<dyn Placer>) {
        let _ = self.ctx.placement.placer.set(placer);
    }

    /// A place for one more thread here, with at most `max` (None: no bound) running.
    pub(crate) fn room(&self, max: Option<usize>) -> Option<Slot> {
        match max {
            Some(max) => self.ctx.placement.try_slot(max),
            None => Some(self.ctx.placement.slot()),
        }
    }

    /// Starts `child` of `parent` (on another node), placed here in `place`: it takes over the
    /// account its parent's node set aside, and reports its end there.
    pub(crate) async fn start_placed(
        &self,
        place: Slot,
        child: ThreadId,
        parent: ThreadId,
        placed: Placed,
    ) -> Result<ThreadId, SpawnError> {
        parent_runs(self, &parent)?;
        let origin = Origin::Deferred(Deferred {
            parent,
            id: Some(child),
        });
        let limits = placed.limits();
        let mut req = SpawnRequest::new(placed.directive, placed.inputs, origin);
        req.overrides = limits;
        req.placed = true;
        req.slot = Some(place);
        let (id, _) = crate::thread::spawn(&self.ctx, req, None).await?;
        Ok(id)
    }

    /// A child of a thread here, placed on another node, ended there: its stand-in settles it
    /// and tells the parent. With no stand-in (its parent was adopted here after its node
    /// died), the ledger settles it against the tree this node holds. False when neither can.
    pub(crate) async fn placed_ended(&self, report: crate::thread::ThreadReport) -> bool {
        let stand_in = self
            .ctx
            .placement
            .stand_ins
            .lock()
            .ok()
            .and_then(|m| m.get(&report.thread_id).cloned());
        match stand_in {
            Some(a) => a
                .cast(crate::thread::ThreadMsg::ChildFinished(Box::new(report)))
                .is_ok(),
            None => self.settle_placed(&report.thread_id).await,
        }
    }

    /// Settles placed child `child` in the ledger, its parent gone.
    async fn settle_placed(&self, child: &ThreadId) -> bool {
        let settled = ractor::call!(self.ctx.ledger, |reply| LedgerMsg::SettlePlaced {
            id: child.clone(),
            reply
        });
        match settled {
            Ok(Ok(_)) => true,
            other => {
                tracing::warn!(thread = %child, "a placed child's end not settled here: {other:?}");
                false
            }
        }
    }

    /// After threads were adopted here (`adopted`, finalized `interrupted`): their children
    /// placed elsewhere end too — one still queued is withdrawn and its guarantee given back,
    /// one running is cancelled where it runs (its end, relayed here, is settled by
    /// [`Runtime::placed_ended`]).
    pub(crate) async fn end_orphaned_placed(&self, adopted: &HashSet<ThreadId>) {
        let Some(placer) = self.ctx.placement.placer.get().cloned() else {
            return;
        };
        let open = ractor::call!(self.ctx.ledger, |reply| LedgerMsg::OpenPlaced { reply })
            .unwrap_or_default();
        for (child, parent) in open.into_iter().filter(|(_, p)| adopted.contains(p)) {
            let reason = format!("its parent {parent} was interrupted: its node's lease ran out");
            match placer.cancel(child.clone(), reason).await {
                true => drop(self.settle_placed(&child).await),
                // Its end is relayed here; should that be lost, its row says when it ended.
                false => self.settle_when_ended(child),
            }
        }
    }

    /// Settles placed child `child`, whose parent was adopted here, once its registry row is
    /// terminal (looked at every second, for at most 10 minutes); a relayed end settles it
    /// sooner, and settling is done once whichever comes first.
    fn settle_when_ended(&self, child: ThreadId) {
        let weak = self.downgrade();
        tokio::spawn(async move {
            for _ in 0..600 {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                let Some(rt) = Runtime::upgrade(&weak) else {
                    return;
                };
                if matches!(rt.get(&child), Ok(Some(v)) if v.row.status.is_terminal()) {
                    rt.settle_placed(&child).await;
                    return;
                }
            }
        });
    }
}

/// Whether thread `parent`, of a child taken from the queue, still runs (a child of a parent
/// that ended, or was adopted after its node died, does not start).
fn parent_runs(rt: &Runtime, parent: &ThreadId) -> Result<(), SpawnError> {
    match rt.get(parent) {
        Ok(Some(v)) if !v.row.status.is_terminal() => Ok(()),
        Ok(Some(v)) => Err(SpawnError::Denied(format!(
            "its parent {parent} ended ({}) before it started",
            v.row.status
        ))),
        Ok(None) => Err(SpawnError::Denied(format!(
            "its parent {parent} is not in the registry"
        ))),
        Err(e) => Err(SpawnError::Storage(e.to_string())),
    }
}
