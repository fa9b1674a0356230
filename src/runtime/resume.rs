//! `weft resume`: continuing an ended thread as a new continuation thread (SPEC §7).

use super::{Runtime, ThreadHandle};
use crate::core::ids::{now_ts, ThreadId};
use crate::core::limits::LimitSet;
use crate::registry::RegistryMsg;
use crate::thread::{Continuation, Origin, SpawnError, SpawnRequest};
use serde_json::Map;

impl Runtime {
    /// Continues an ended thread as a new continuation thread (SPEC §7 `weft resume`): same
    /// directive and capabilities, conversation rebuilt from the transcript plus `message`, the
    /// chain's remaining spend and spawns; turns, tokens and duration start afresh from the old
    /// thread's resolved limits (capped further by `overrides`).
    pub async fn resume(
        &self,
        id: &ThreadId,
        message: &str,
        overrides: LimitSet,
    ) -> Result<ThreadHandle, SpawnError> {
        let store = &self.ctx.store;
        // Verified, and the thread.json of `id` itself (not another's copied into its folder).
        let of = self.ctx.verified_doc(id).map_err(SpawnError::Untrusted)?;
        if !of.status.is_terminal() {
            return Err(SpawnError::Limit(format!(
                "thread {id} is still {}; cancel it first or wait for it to end",
                of.status.as_str()
            )));
        }
        if let Some(next) = &of.continued_by {
            return Err(SpawnError::Limit(format!(
                "thread {id} was already continued by {next}; resume that one"
            )));
        }
        if self.ctx.stopped(&of.root_id) {
            self.reopen_tree(&of.root_id).await?;
        }
        let lines = store
            .signed_lines(id)
            .map_err(|e| SpawnError::Untrusted(e.to_string()))?;
        let (mut messages, calls_made) = crate::thread::rebuild_conversation(&lines);
        messages.push(crate::provider::Message::user(message));
        let row = ractor::call!(self.ctx.registry, |reply| RegistryMsg::Get {
            id: id.clone(),
            reply
        })
        .map_err(|e| SpawnError::Storage(e.to_string()))??;
        let spawn_count = row.map_or(0, |r| r.spawn_count);
        let continuation = Continuation {
            of: of.clone(),
            messages,
            calls_made,
            spawn_count,
        };
        let origin = Origin::Continue(Box::new(continuation), None);
        let mut req = SpawnRequest::new(of.directive.clone(), Map::new(), origin);
        req.overrides = overrides;
        let handle = self.spawn_root(req).await?;
        let mut old = of;
        old.continued_by = Some(handle.id().clone());
        old.updated_at = now_ts();
        old.write_signed(store.records(), &self.ctx.signer, true)
            .map_err(|e| SpawnError::Storage(e.to_string()))?;
        Ok(handle)
    }

    /// A resume after its tree's cancel is a new order: the tree may cause work again (its
    /// hooks' spawns, its schedules), once no thread of the cancelled run still runs here —
    /// one still stopping would have its own hooks' spawns let through.
    async fn reopen_tree(&self, root: &ThreadId) -> Result<(), SpawnError> {
        let rows = ractor::call!(self.ctx.registry, |reply| RegistryMsg::Tree {
            root: root.clone(),
            reply
        })
        .map_err(|e| SpawnError::Storage(e.to_string()))?
        .map_err(|e| SpawnError::Storage(e.to_string()))?;
        let stopping = rows.iter().find(|r| {
            !r.status.is_terminal() && ractor::registry::where_is(r.id.to_string()).is_some()
        });
        if let Some(r) = stopping {
            return Err(SpawnError::Limit(format!(
                "the tree of {root} is still stopping after its cancel (thread {} is {}); \
                 resume again once it has ended",
                r.id,
                r.status.as_str()
            )));
        }
        self.ctx.caused.reopen(root);
        Ok(())
    }
}
