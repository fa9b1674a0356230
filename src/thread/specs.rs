//! The tool lists offered to threads, shared: threads offered the same tools (same built-ins,
//! command tools and declared outputs) hold one list, not a copy each (at 10⁵ threads the
//! copies were a third of a tree's heap).

use crate::provider::ToolSpec;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What decides an offered list: the thread's capabilities, whether it has a parent, and the
/// declared outputs `directive_return` describes (JSON).
pub(crate) type SpecKey = (Vec<String>, bool, String);

/// An offered list and its text bytes (`provider::tools_bytes`), both computed once.
pub(crate) type Offered = (Arc<Vec<ToolSpec>>, u64);

/// Lists past this many distinct keys are built per thread instead of kept.
const KEEP: usize = 1024;

/// The shared lists of one runtime.
#[derive(Default)]
pub(crate) struct SpecCache(Mutex<HashMap<SpecKey, Offered>>);

impl SpecCache {
    /// The list for `key`, built by `make` the first time.
    pub(crate) fn get(&self, key: SpecKey, make: impl FnOnce() -> Vec<ToolSpec>) -> Offered {
        let Ok(mut map) = self.0.lock() else {
            return counted(make());
        };
        if let Some(found) = map.get(&key) {
            return found.clone();
        }
        let offered = counted(make());
        if map.len() < KEEP {
            map.insert(key, offered.clone());
        }
        offered
    }
}

fn counted(list: Vec<ToolSpec>) -> Offered {
    let bytes = crate::provider::tools_bytes(&list);
    (Arc::new(list), bytes)
}
