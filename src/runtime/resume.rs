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
        if self.ctx.stopped(&of.root_id) && crate::thread::stays_in_tree(&self.ctx, &of)? {
            self.reopen_tree(id, &of.root_id).await?;
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
    /// hooks' spawns, its schedules) once nothing of the cancelled run is left here — a thread
    /// still stopping or starting, or work it caused still under way — for that work would
    /// start too. Waits for that up to the cancel's grace and 5 s more. The threads of the
    /// cancelled run are remembered: what they scheduled stays refused (`Caused::refuses`).
    async fn reopen_tree(&self, id: &ThreadId, root: &ThreadId) -> Result<(), SpawnError> {
        let cancels = self.ctx.caused.cancels(root);
        let patience = self.ctx.config.cancel_grace + std::time::Duration::from_secs(5);
        let until = std::time::Instant::now() + patience;
        let mut pause = std::time::Duration::from_millis(20);
        let run = loop {
            // Another resume may have opened it meanwhile.
            if !self.ctx.stopped(root) {
                return Ok(());
            }
            let rows = self.tree_rows(root).await?;
            let Some(left) = self.left_of_cancelled_run(root, &rows) else {
                break rows.into_iter().map(|r| r.id).collect();
            };
            if std::time::Instant::now() >= until {
                return Err(SpawnError::Stopping(format!(
                    "cannot resume {id} yet: its tree {root} is still stopping after its \
                     cancel ({left}, {} s after this resume asked); resume {id} again once \
                     the tree has ended (`weft threads` shows it)",
                    patience.as_secs()
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(250));
        };
        if !self.ctx.caused.reopen(root, cancels, run) {
            return Err(SpawnError::Stopping(format!(
                "cannot resume {id}: its tree {root} was cancelled again while the resume \
                 waited for it to end"
            )));
        }
        Ok(())
    }

    /// Every registry row of the tree of `root`.
    async fn tree_rows(
        &self,
        root: &ThreadId,
    ) -> Result<Vec<crate::registry::ThreadRow>, SpawnError> {
        ractor::call!(self.ctx.registry, |reply| RegistryMsg::Tree {
            root: root.clone(),
            reply
        })
        .map_err(|e| SpawnError::Storage(e.to_string()))?
        .map_err(|e| SpawnError::Storage(e.to_string()))
    }

    /// What of the cancelled run of `root`'s tree (its rows `rows`) is still here, if
    /// anything: work it caused (a hook's command, a deferred child starting), or a thread not
    /// ended whose actor runs or is starting in this process.
    fn left_of_cancelled_run(
        &self,
        root: &ThreadId,
        rows: &[crate::registry::ThreadRow],
    ) -> Option<String> {
        if self.ctx.caused.live(root) {
            return Some("work it caused is still stopping".into());
        }
        let starting = |id: &ThreadId| self.ctx.in_spawn.lock().map_or(true, |s| s.contains(id));
        rows.iter()
            .find(|r| {
                !r.status.is_terminal()
                    && (ractor::registry::where_is(r.id.to_string()).is_some() || starting(&r.id))
            })
            .map(|r| format!("thread {} is {}", r.id, r.status.as_str()))
    }
}
