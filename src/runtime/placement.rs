//! The runtime's side of children placed on other nodes (#26; `thread/placed.rs`): who places
//! (set by the node that serves), starting a placed child taken from the queue, and handing a
//! placed child's end, relayed from the node that ran it, to its stand-in here.

// Used by `weft serve --node` (the `cli` feature) only.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use super::Runtime;
use crate::core::ids::ThreadId;
use crate::thread::placer::{Placed, Placer};
use crate::thread::{Deferred, Origin, SpawnError, SpawnRequest};
use std::sync::Arc;

impl Runtime {
    /// From now on children this runtime's threads start go through `placer` when it is full.
    pub(crate) fn set_placer(&self, placer: Arc<dyn Placer>) {
        let _ = self.ctx.placement.placer.set(placer);
    }

    /// Starts `child` of `parent` (on another node), placed here: it takes over the account
    /// its parent's node set aside, and reports its end there.
    pub(crate) async fn start_placed(
        &self,
        child: ThreadId,
        parent: ThreadId,
        placed: Placed,
    ) -> Result<ThreadId, SpawnError> {
        let origin = Origin::Deferred(Deferred {
            parent,
            id: Some(child),
        });
        let limits = placed.limits();
        let mut req = SpawnRequest::new(placed.directive, placed.inputs, origin);
        req.overrides = limits;
        req.placed = true;
        let (id, _) = crate::thread::spawn(&self.ctx, req, None).await?;
        Ok(id)
    }

    /// A child of a thread here, placed on another node, ended there: its stand-in settles it
    /// and tells the parent. False when no stand-in waits for it.
    pub(crate) fn placed_ended(&self, report: crate::thread::ThreadReport) -> bool {
        let stand_in = self
            .ctx
            .placement
            .stand_ins
            .lock()
            .ok()
            .and_then(|m| m.get(&report.thread_id).cloned());
        stand_in.is_some_and(|a| {
            a.cast(crate::thread::ThreadMsg::ChildFinished(Box::new(report)))
                .is_ok()
        })
    }
}
