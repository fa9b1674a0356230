//! The tool lists offered to threads, shared: threads offered the same tools (same built-ins,
//! command tools and declared outputs) hold one list, not a copy each (at 10⁵ threads the
//! copies were a third of a tree's heap).

use crate::provider::ToolSpec;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What decides an offered list: the built-ins offered (a bit each), the command tools
/// allowed (their places in the project's list) and the declared outputs `directive_return`
/// describes (JSON; empty when it is not offered).
pub(crate) type SpecKey = (u32, Vec<u16>, String);

/// Lists past this many distinct keys are built per thread instead of kept.
const KEEP: usize = 1024;

/// The shared lists of one runtime.
#[derive(Default)]
pub(crate) struct SpecCache(Mutex<HashMap<SpecKey, Arc<Vec<ToolSpec>>>>);

impl SpecCache {
    /// The list for `key`, built by `make` the first time.
    pub(crate) fn get(
        &self,
        key: SpecKey,
        make: impl FnOnce() -> Vec<ToolSpec>,
    ) -> Arc<Vec<ToolSpec>> {
        let Ok(mut map) = self.0.lock() else {
            return Arc::new(make());
        };
        if let Some(list) = map.get(&key) {
            return list.clone();
        }
        let list = Arc::new(make());
        if map.len() < KEEP {
            map.insert(key, list.clone());
        }
        list
    }
}
