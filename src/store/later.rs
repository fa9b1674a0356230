//! Indexing off the thread actors: a thread that ends queues its id; one worker OS thread
//! (started when the queue fills, gone when it empties) indexes the queue in turn, so an
//! ending thread never waits for store.db and a burst of endings shares one worker.

use super::{FileStore, ThreadStore};
use crate::core::ids::ThreadId;
use std::sync::{Arc, Condvar, Mutex};

/// The queue of threads to index and whether a worker is draining it.
#[derive(Default)]
pub(crate) struct Later {
    state: Mutex<(Vec<ThreadId>, bool)>,
    idle: Condvar,
}

impl FileStore {
    /// Indexes `id` soon, on the indexing worker (see the module doc).
    pub(crate) fn index_later(self: &Arc<Self>, id: ThreadId) {
        let Ok(mut st) = self.later.state.lock() else {
            return;
        };
        st.0.push(id);
        if st.1 {
            return;
        }
        st.1 = true;
        let me = self.clone();
        let started = std::thread::Builder::new()
            .name("weft-indexer".into())
            .spawn(move || me.drain_later());
        if started.is_err() {
            // No thread to spare: `weft search --backfill` indexes what is left.
            st.0.clear();
            st.1 = false;
        }
    }

    fn drain_later(&self) {
        loop {
            let batch = match self.later.state.lock() {
                Ok(mut st) if st.0.is_empty() => {
                    st.1 = false;
                    self.later.idle.notify_all();
                    return;
                }
                Ok(mut st) => std::mem::take(&mut st.0),
                Err(_) => return,
            };
            for id in batch {
                if let Err(e) = self.index(&id) {
                    tracing::warn!(thread = %id, "not indexed for search: {e} (`weft search --backfill` retries)");
                }
            }
        }
    }

    /// Waits until every queued thread is indexed (before a process exits).
    pub fn flush_index(&self) {
        let Ok(mut st) = self.later.state.lock() else {
            return;
        };
        while st.1 {
            st = match self.later.idle.wait(st) {
                Ok(st) => st,
                Err(_) => return,
            };
        }
    }
}
