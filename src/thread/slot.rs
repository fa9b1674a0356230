//! One thread's place among the threads of its runtime ([`Slot`]): what a node counts against
//! its `max_live_threads` (`placer.rs` hands slots out).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One thread's place among the threads of its runtime, held by its actor while it lives
/// (taken before its spawn starts, so children spawned at once never overfill a node).
pub(crate) struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

impl Slot {
    /// The slot counted (already) in `live`.
    pub(super) fn of(live: Arc<AtomicUsize>) -> Slot {
        Slot(live)
    }
}
