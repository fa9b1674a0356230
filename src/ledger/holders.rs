//! Which runtime of this process holds each tree. Ownership of a tree in ledger.db is per
//! process (its pid, see `trees.rs`), but each runtime keeps its own book: the process keeps
//! which of its runtimes opened or took each tree, so another runtime of it is refused a tree
//! held open, and reads afresh one that changed runtimes.

use crate::core::ids::ThreadId;

/// Which runtime of this process holds each tree (by its top) it opened or took, and which of
/// its runtimes are live (see the module's doc).
#[derive(Default)]
pub(super) struct Holders {
    trees: std::collections::HashMap<ThreadId, u64>,
    live: std::collections::HashSet<u64>,
}

impl Holders {
    fn get() -> std::sync::MutexGuard<'static, Holders> {
        static HOLDERS: std::sync::OnceLock<std::sync::Mutex<Holders>> = std::sync::OnceLock::new();
        let m = HOLDERS.get_or_init(Default::default);
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new runtime's ledger: its number.
    pub(super) fn join() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let me = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Holders::get().live.insert(me);
        me
    }

    /// Runtime `me` has stopped: it holds nothing.
    pub(super) fn leave(me: u64) {
        let mut h = Holders::get();
        h.live.remove(&me);
        h.trees.retain(|_, r| *r != me);
    }

    /// Runtime `me` holds tree `top` (it opened its first account, or took it).
    pub(super) fn hold(top: &ThreadId, me: u64) {
        Holders::get().trees.insert(top.clone(), me);
    }

    /// Tree `top` has finished in runtime `me`'s book.
    pub(super) fn release(top: &ThreadId, me: u64) {
        let mut h = Holders::get();
        if h.trees.get(top) == Some(&me) {
            h.trees.remove(top);
        }
    }

    /// The live runtime of this process other than `me` that holds `top`, if any; whether `me`
    /// holds it.
    pub(super) fn of(top: &ThreadId, me: u64) -> (Option<u64>, bool) {
        let h = Holders::get();
        match h.trees.get(top) {
            Some(r) if *r == me => (None, true),
            Some(r) if h.live.contains(r) => (Some(*r), false),
            _ => (None, false),
        }
    }
}
