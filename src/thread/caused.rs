//! Work a tree caused that runs outside its actors — a hook's command, a scheduled tool, a
//! deferred child started by a hook or a schedule — counted per root, with one cancel token per
//! root that such work carries: a root's cancel (`runtime/cancel.rs`) fires it, so a hook's
//! command or a scheduled tool is killed with the tree that caused it, and a cancel of a root
//! whose actor has ended still finds the work it left running.

use crate::core::ids::ThreadId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// Live caused work by root: its cancel token, how many pieces hold it, and the deferred
/// threads among them (not their parent actor's children, so no cascade reaches them).
#[derive(Default)]
pub(crate) struct Caused {
    by_root: Mutex<HashMap<ThreadId, Entry>>,
}

#[derive(Default)]
struct Entry {
    token: CancellationToken,
    count: usize,
    threads: Vec<ThreadId>,
}

/// One piece of caused work under way; dropping it ends it.
pub(crate) struct CausedGuard {
    caused: Arc<Caused>,
    root: ThreadId,
    thread: Option<ThreadId>,
    /// Fired when the tree of `root` is cancelled.
    pub(crate) token: CancellationToken,
}

impl Caused {
    /// Counts a piece of work the tree of `root` caused; its token fires with the tree's cancel.
    pub(crate) fn enter(self: &Arc<Self>, root: &ThreadId) -> CausedGuard {
        let token = match self.by_root.lock() {
            Ok(mut m) => {
                let e = m.entry(root.clone()).or_default();
                e.count += 1;
                e.token.clone()
            }
            Err(_) => CancellationToken::new(),
        };
        CausedGuard {
            caused: self.clone(),
            root: root.clone(),
            thread: None,
            token,
        }
    }

    /// The deferred threads of the tree of `root` running now.
    pub(crate) fn threads(&self, root: &ThreadId) -> Vec<ThreadId> {
        self.by_root
            .lock()
            .ok()
            .and_then(|m| m.get(root).map(|e| e.threads.clone()))
            .unwrap_or_default()
    }

    /// Whether the tree of `root` has caused work under way.
    pub(crate) fn live(&self, root: &ThreadId) -> bool {
        self.by_root.lock().is_ok_and(|m| m.contains_key(root))
    }

    /// Fires the token of the tree of `root` (its caused work stops).
    pub(crate) fn cancel(&self, root: &ThreadId) {
        if let Ok(m) = self.by_root.lock() {
            if let Some(e) = m.get(root) {
                e.token.cancel();
            }
        }
    }
}

impl CausedGuard {
    /// This piece of work is deferred thread `id`, run by `actor` (until the guard drops).
    /// When its tree was cancelled meanwhile — a root's cancel between the thread's start and
    /// this call did not find it among the tree's threads — it is cancelled here (a cancel
    /// after this call finds it; `runtime/cancel.rs` fires the token before it reads them).
    pub(crate) fn is_thread(
        &mut self,
        id: ThreadId,
        actor: &ractor::ActorRef<crate::thread::ThreadMsg>,
    ) {
        if let Ok(mut m) = self.caused.by_root.lock() {
            if let Some(e) = m.get_mut(&self.root) {
                e.threads.push(id.clone());
            }
        }
        self.thread = Some(id);
        if self.token.is_cancelled() {
            let reason = "its tree was cancelled as it started".to_string();
            let _ = actor.cast(crate::thread::ThreadMsg::Cancel { reason });
        }
    }
}

impl Drop for CausedGuard {
    fn drop(&mut self) {
        if let Ok(mut m) = self.caused.by_root.lock() {
            if let Some(e) = m.get_mut(&self.root) {
                e.count = e.count.saturating_sub(1);
                if let Some(t) = &self.thread {
                    e.threads.retain(|x| x != t);
                }
                if e.count == 0 {
                    m.remove(&self.root);
                }
            }
        }
    }
}
