//! Work a tree caused that runs outside its actors — a hook's command, a scheduled tool, a
//! deferred child started by a hook or a schedule — counted per root, with one cancel token per
//! root that such work carries: a root's cancel (`runtime/cancel.rs`) fires it, so a hook's
//! command or a scheduled tool is killed with the tree that caused it, and a cancel of a root
//! whose actor has ended still finds the work it left running. A cancelled root is remembered:
//! work of its tree that enters afterwards (a deferred child that was starting, a schedule
//! that was due) carries a token already fired, so nothing its tree caused outlives the cancel.
//! A person's resume of a thread of the tree, once nothing of the cancelled run is left,
//! opens it again (`reopen`): what the resumed thread causes runs, while what a thread of the
//! cancelled run scheduled still does not (`refuses`), whenever it was written.

use crate::core::ids::ThreadId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// Live caused work by root: its cancel token, how many pieces hold it, and the deferred
/// threads among them (not their parent actor's children, so no cascade reaches them).
#[derive(Default)]
pub(crate) struct Caused {
    by_root: Mutex<HashMap<ThreadId, Entry>>,
    /// Roots told to stop (`Runtime::cancel`); locked before `by_root` where both are.
    cancelled: Mutex<HashMap<ThreadId, Mark>>,
}

/// A tree's last cancel.
#[derive(Default)]
struct Mark {
    /// Opened again since by a resume (`Caused::reopen`).
    open: bool,
    /// How many times it was cancelled.
    cancels: u64,
    /// Once opened: the threads of the run that was cancelled.
    run: std::collections::HashSet<ThreadId>,
}

/// Whether `root`'s tree is stopped now (a poisoned lock says it is).
fn is_stopped(
    cancelled: &std::sync::LockResult<std::sync::MutexGuard<'_, HashMap<ThreadId, Mark>>>,
    root: &ThreadId,
) -> bool {
    cancelled
        .as_ref()
        .map_or(true, |c| c.get(root).is_some_and(|m| !m.open))
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
    /// A root already cancelled gives a token already fired.
    pub(crate) fn enter(self: &Arc<Self>, root: &ThreadId) -> CausedGuard {
        let cancelled = self.cancelled.lock();
        let stopped = is_stopped(&cancelled, root);
        let token = match self.by_root.lock() {
            Ok(mut m) => {
                let e = m.entry(root.clone()).or_default();
                e.count += 1;
                if stopped {
                    e.token.cancel();
                } else if e.token.is_cancelled() {
                    // Opened again (`reopen`): work of the cancelled run keeps the fired token
                    // it holds; new work gets a token of its own.
                    e.token = CancellationToken::new();
                }
                e.token.clone()
            }
            Err(_) => CancellationToken::new(),
        };
        drop(cancelled);
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

    /// Stops the tree of `root`: fires its token (its caused work stops) and remembers it, so
    /// work entering later starts stopped. For another thread's id it records a key no work
    /// is counted under (work is keyed by its tree's root).
    pub(crate) fn cancel(&self, root: &ThreadId) {
        let mut cancelled = self.cancelled.lock();
        if let Ok(c) = cancelled.as_mut() {
            let m = c.entry(root.clone()).or_default();
            m.open = false;
            m.cancels += 1;
        }
        if let Ok(m) = self.by_root.lock() {
            if let Some(e) = m.get(root) {
                e.token.cancel();
            }
        }
    }

    /// How many times the tree of `root` was cancelled (read before [`Self::reopen`]).
    pub(crate) fn cancels(&self, root: &ThreadId) -> u64 {
        self.cancelled
            .lock()
            .map_or(0, |c| c.get(root).map_or(0, |m| m.cancels))
    }

    /// The tree of `root` runs again: a person resumed one of its threads after its cancel,
    /// once nothing of the cancelled run — the threads `run` — is left (`Runtime::resume`).
    /// What the resumed thread causes starts; work of the cancelled run still under way keeps
    /// its fired token. False (and still stopped) when the tree was cancelled again since
    /// `cancels` was read.
    pub(crate) fn reopen(
        &self,
        root: &ThreadId,
        cancels: u64,
        run: std::collections::HashSet<ThreadId>,
    ) -> bool {
        let Ok(mut c) = self.cancelled.lock() else {
            return false;
        };
        match c.get_mut(root) {
            // Another resume opened it first: its run is not the cancelled one.
            Some(m) if m.open => true,
            Some(m) if m.cancels == cancels => {
                m.open = true;
                m.run = run;
                true
            }
            Some(_) => false,
            None => true,
        }
    }

    /// Whether the tree of `root` was told to stop (a poisoned lock says it was).
    pub(crate) fn stopped(&self, root: &ThreadId) -> bool {
        is_stopped(&self.cancelled.lock(), root)
    }

    /// Whether work that thread `by` of the tree of `root` arranged (a schedule) is refused:
    /// the tree is stopped, or `by` was of a run of it that was cancelled (a resume has opened
    /// the tree again since, for its own work only).
    pub(crate) fn refuses(&self, root: &ThreadId, by: &ThreadId) -> bool {
        self.cancelled.lock().map_or(true, |c| {
            c.get(root).is_some_and(|m| !m.open || m.run.contains(by))
        })
    }
}

/// Why a deferred thread whose tree was cancelled as it started is cancelled.
pub(crate) const CANCELLED_AS_IT_STARTED: &str = "its tree was cancelled as it started";

impl CausedGuard {
    /// This piece of work is deferred thread `id` (until the guard drops). True when its tree
    /// was cancelled meanwhile — a root's cancel between the thread's start and this call did
    /// not find it among the tree's threads: the caller cancels it ([`CANCELLED_AS_IT_STARTED`];
    /// a cancel after this call finds it; `runtime/cancel.rs` fires the token before it reads
    /// them).
    pub(crate) fn is_thread(&mut self, id: ThreadId) -> bool {
        if let Ok(mut m) = self.caused.by_root.lock() {
            if let Some(e) = m.get_mut(&self.root) {
                e.threads.push(id.clone());
            }
        }
        self.thread = Some(id);
        self.token.is_cancelled()
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

#[cfg(test)]
mod tests {
    use super::Caused;
    use crate::core::ids::ThreadId;
    use std::sync::Arc;

    /// Work a cancelled tree causes afterwards starts stopped; other trees' work does not.
    #[test]
    fn work_entering_after_its_roots_cancel_starts_stopped() {
        let caused = Arc::new(Caused::default());
        let (root, other) = (
            ThreadId::parse("r-1").unwrap(),
            ThreadId::parse("o-1").unwrap(),
        );
        let before = caused.enter(&root);
        caused.cancel(&root);
        assert!(before.token.is_cancelled());
        drop(before);
        assert!(!caused.live(&root), "nothing under way");
        let after = caused.enter(&root);
        assert!(after.token.is_cancelled(), "entered after the cancel");
        assert!(caused.stopped(&root));
        let theirs = caused.enter(&other);
        assert!(!theirs.token.is_cancelled());
        assert!(!caused.stopped(&other));
        let cancels = caused.cancels(&root);
        assert!(caused.refuses(&root, &root) && caused.refuses(&root, &other));
        assert!(caused.reopen(&root, cancels, [root.clone()].into()));
        assert!(!caused.stopped(&root));
        assert!(caused.refuses(&root, &root), "the cancelled run's schedule");
        assert!(!caused.refuses(&root, &other), "the resumed run's");
        let resumed = caused.enter(&root);
        assert!(!resumed.token.is_cancelled(), "entered after a reopen");
        assert!(
            after.token.is_cancelled(),
            "the cancelled run's work stays stopped"
        );
        caused.cancel(&root);
        assert!(
            resumed.token.is_cancelled(),
            "the tree's next cancel reaches it"
        );
        assert!(
            !caused.reopen(&root, cancels, Default::default()),
            "cancelled again since"
        );
        assert!(caused.stopped(&root) && caused.refuses(&root, &other));
    }
}
