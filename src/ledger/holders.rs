//! Which runtime of this process holds each tree. Ownership of a tree in ledger.db is per
//! process (its pid, see `trees.rs`), but each runtime keeps its own book: the process keeps
//! which of its runtimes opened or took each tree, so another runtime of it is refused a tree
//! held open, and reads afresh one that changed runtimes.

use crate::core::ids::ThreadId;
use std::collections::{HashMap, HashSet};

/// A tree of one ledger (its database: two copies of a project share thread ids).
type Tree = (String, ThreadId);

/// Which runtime of this process holds each tree (by its top) it opened or took, and which of
/// its runtimes are live (see the module's doc).
#[derive(Default)]
struct Holders {
    trees: HashMap<Tree, u64>,
    live: HashSet<u64>,
}

fn holders() -> std::sync::MutexGuard<'static, Holders> {
    static HOLDERS: std::sync::OnceLock<std::sync::Mutex<Holders>> = std::sync::OnceLock::new();
    let m = HOLDERS.get_or_init(Default::default);
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A runtime's ledger among this process's: live until it is dropped (its actor stopped,
/// panicked or was dropped with its tokio runtime), then it holds nothing.
pub(crate) struct Seat {
    me: u64,
    /// The ledger's database.
    scope: String,
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut h = holders();
        h.live.remove(&self.me);
        let me = self.me;
        h.trees.retain(|_, r| *r != me);
    }
}

impl Seat {
    /// A new runtime's ledger on the database `scope`.
    pub(super) fn join(scope: String) -> Seat {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let me = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        holders().live.insert(me);
        Seat { me, scope }
    }

    fn tree(&self, top: &ThreadId) -> Tree {
        (self.scope.clone(), top.clone())
    }

    /// This runtime holds tree `top` (it opened its first account).
    pub(super) fn hold(&self, top: &ThreadId) {
        holders().trees.insert(self.tree(top), self.me);
    }

    /// Tree `top` is no longer this runtime's (finished and stored, or never stored).
    pub(super) fn release(&self, top: &ThreadId) {
        let mut h = holders();
        let tree = self.tree(top);
        if h.trees.get(&tree) == Some(&self.me) {
            h.trees.remove(&tree);
        }
    }

    /// Under one lock: refused (None) when another live runtime of this process holds `top`
    /// and `open` says the tree is open; otherwise this runtime holds it from now on, and
    /// whether it held it already.
    pub(super) fn claim<E>(
        &self,
        top: &ThreadId,
        open: impl FnOnce() -> Result<bool, E>,
    ) -> Result<Option<bool>, E> {
        let mut h = holders();
        let tree = self.tree(top);
        let held = h.trees.get(&tree).copied();
        let other = held.is_some_and(|r| r != self.me && h.live.contains(&r));
        if other && open()? {
            return Ok(None);
        }
        h.trees.insert(tree, self.me);
        Ok(Some(held == Some(self.me)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_another_live_runtime_holds_open_is_refused_until_it_is_released_or_dropped() {
        let top = ThreadId::generate("top");
        let (a, b) = (Seat::join("db-1".into()), Seat::join("db-1".into()));
        a.hold(&top);
        let open = || Ok::<_, ()>(true);
        assert_eq!(b.claim(&top, open), Ok(None), "held open by a");
        assert_eq!(
            b.claim(&top, || Ok::<_, ()>(false)),
            Ok(Some(false)),
            "finished"
        );
        assert_eq!(a.claim(&top, open), Ok(None), "b holds it now");
        assert_eq!(b.claim(&top, open), Ok(Some(true)), "b's own");
        // Another project's copy: the same id in another database is another tree.
        let c = Seat::join("db-2".into());
        assert_eq!(c.claim(&top, open), Ok(Some(false)));
        b.release(&top);
        assert_eq!(a.claim(&top, open), Ok(Some(false)), "released");
        drop(a);
        assert_eq!(
            b.claim(&top, open),
            Ok(Some(false)),
            "a dropped holds nothing"
        );
    }
}
