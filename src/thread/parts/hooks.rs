//! What a thread's hooks have done so far: the hooks it runs, the retries `error` hooks
//! ordered, and the limits `limit` hooks lifted.

use crate::hooks::{Hook, HookEvent};
use std::sync::Arc;

/// A thread's hook state.
pub(crate) struct HookState {
    /// The hooks this thread runs (every layer, the directive's included), in order.
    pub(crate) list: Arc<Vec<Hook>>,
    /// Retries ordered by `error` hooks so far (at most `hooks::MAX_HOOK_RETRIES`).
    pub(crate) retries: u32,
    /// Limits a `limit` hook has lifted once already.
    pub(crate) lifted: Vec<String>,
}

impl HookState {
    /// A thread's hooks, none fired yet.
    pub(crate) fn new(list: Vec<Hook>) -> HookState {
        HookState {
            list: Arc::new(list),
            retries: 0,
            lifted: Vec::new(),
        }
    }

    /// Whether any hook listens to `event` (so its context is built only then).
    pub(crate) fn wants(&self, event: HookEvent) -> bool {
        self.list.iter().any(|h| h.event == event)
    }
}
