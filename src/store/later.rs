//! Indexing off the thread actors: a thread that ends queues what it said; one worker OS thread
//! (started when the queue fills, gone when it empties) writes everything queued meanwhile in
//! one store.db transaction, so an ending thread never waits for store.db and a burst of
//! endings shares one commit.

use super::queue::Ended;
use super::{index, FileStore, ThreadStore};
use std::sync::Arc;

impl FileStore {
    /// Indexes an ended thread soon, on the indexing worker (see the module doc).
    pub(crate) fn index_later(self: &Arc<Self>, ended: Ended) {
        let Ok(mut st) = self.later.state.lock() else {
            return;
        };
        st.push(ended);
        if st.draining {
            return;
        }
        st.draining = true;
        let me = self.clone();
        let started = std::thread::Builder::new()
            .name("weft-indexer".into())
            .spawn(move || me.drain_later());
        if started.is_err() {
            // No thread to spare: `weft search --backfill` indexes what is left.
            st.take();
            st.draining = false;
        }
    }

    fn drain_later(&self) {
        loop {
            let batch = match self.later.state.lock() {
                Ok(mut st) if st.ended.is_empty() => {
                    st.draining = false;
                    self.later.idle.notify_all();
                    return;
                }
                Ok(mut st) => st.take(),
                Err(_) => return,
            };
            let mut ready = Vec::with_capacity(batch.len());
            for e in batch {
                match e.said {
                    Some(said) => ready.push((e.id, e.directive, e.head, said)),
                    None => {
                        if let Err(err) = self.index(&e.id) {
                            tracing::warn!(thread = %e.id, "not indexed for search: {err} (`weft search --backfill` retries)");
                        }
                    }
                }
            }
            if self.idx(|c| index::put_many(c, &ready)).is_err() {
                // One thread the index refuses never keeps the others out: each on its own.
                for one in ready.chunks(1) {
                    if let Err(err) = self.idx(|c| index::put_many(c, one)) {
                        tracing::warn!(thread = %one[0].0, "not indexed for search: {err} (`weft search --backfill` retries)");
                    }
                }
            }
        }
    }

    /// Waits until every queued thread is indexed (before a process exits).
    pub fn flush_index(&self) {
        let Ok(mut st) = self.later.state.lock() else {
            return;
        };
        while st.draining {
            st = match self.later.idle.wait(st) {
                Ok(st) => st,
                Err(_) => return,
            };
        }
    }
}
