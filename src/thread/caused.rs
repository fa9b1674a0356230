//! Work a tree caused that runs outside its actors — a hook's command, a scheduled tool, a
//! deferred child started by a hook or a schedule — counted per root, with one cancel token per
//! root that such work carries: a root's cancel (`runtime/cancel.rs`) fires it, so a hook's
//! command or a scheduled tool is killed with the tree that caused it, and a cancel of a root
//! whose actor has ended still finds the work it left running.

use crate::core::ids::ThreadId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// Live caused work by root: its cancel token and how many pieces hold it.
#[derive(Default)]
pub(crate) struct Caused {
    by_root: Mutex<HashMap<ThreadId, (CancellationToken, usize)>>,
}

/// One piece of caused work under way; dropping it ends it.
pub(crate) struct CausedGuard {
    caused: Arc<Caused>,
    root: ThreadId,
    /// Fired when the tree of `root` is cancelled.
    pub(crate) token: CancellationToken,
}

impl Caused {
    /// Counts a piece of work the tree of `root` caused; its token fires with the tree's cancel.
    pub(crate) fn enter(self: &Arc<Self>, root: &ThreadId) -> CausedGuard {
        let token = match self.by_root.lock() {
            Ok(mut m) => {
                let e = m
                    .entry(root.clone())
                    .or_insert_with(|| (CancellationToken::new(), 0));
                e.1 += 1;
                e.0.clone()
            }
            Err(_) => CancellationToken::new(),
        };
        CausedGuard {
            caused: self.clone(),
            root: root.clone(),
            token,
        }
    }

    /// Whether the tree of `root` has caused work under way.
    pub(crate) fn live(&self, root: &ThreadId) -> bool {
        self.by_root.lock().is_ok_and(|m| m.contains_key(root))
    }

    /// Fires the token of the tree of `root` (its caused work stops).
    pub(crate) fn cancel(&self, root: &ThreadId) {
        if let Ok(m) = self.by_root.lock() {
            if let Some((t, _)) = m.get(root) {
                t.cancel();
            }
        }
    }
}

impl Drop for CausedGuard {
    fn drop(&mut self) {
        if let Ok(mut m) = self.caused.by_root.lock() {
            if let Some(e) = m.get_mut(&self.root) {
                e.1 = e.1.saturating_sub(1);
                if e.1 == 0 {
                    m.remove(&self.root);
                }
            }
        }
    }
}
