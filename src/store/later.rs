//! Indexing off the thread actors: a thread that ends queues what it said; one worker OS thread
//! (started when the queue fills, gone when it empties) waits until threads stop ending for a
//! moment (at most a second: `queue::QUIET`, `queue::MAX_WAIT`), then writes what was queued in
//! few store.db transactions. An ending thread never waits for store.db, a burst of endings
//! shares its commits and does not share the cores with its own indexing, and a search first
//! waits until every thread queued before it is indexed ([`FileStore::flush_index`]).

use super::queue::{Ended, FLUSH_WAIT};
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
            while !st.ended.is_empty() {
                st.done += st.take().len() as u64;
            }
            st.draining = false;
        }
    }

    fn drain_later(&self) {
        while let Some(batch) = self.next_batch() {
            let n = batch.len() as u64;
            // A batch that panics is given up like one the index refuses: the worker goes on,
            // and nobody waiting for it waits forever.
            let indexing = std::panic::AssertUnwindSafe(|| self.index_batch(batch));
            if std::panic::catch_unwind(indexing).is_err() {
                tracing::warn!("{n} thread(s) not indexed for search: the indexer failed (`weft search --backfill` retries)");
            }
            if let Ok(mut st) = self.later.state.lock() {
                st.done += n;
            }
            self.later.idle.notify_all();
        }
    }

    /// The next batch to index, once it is due (None: the queue is empty and the worker ends).
    fn next_batch(&self) -> Option<Vec<Ended>> {
        let mut st = self.later.state.lock().ok()?;
        loop {
            if st.ended.is_empty() {
                st.draining = false;
                self.later.idle.notify_all();
                return None;
            }
            match st.wait_left(std::time::Instant::now()) {
                None => return Some(st.take()),
                Some(left) => st = self.later.wake.wait_timeout(st, left).ok()?.0,
            }
        }
    }

    fn index_batch(&self, batch: Vec<Ended>) {
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
            // One thread the index refuses never keeps the others out: each on its own — unless
            // the index refuses them all (its database gone): then the rest waits for backfill.
            let mut failed_in_a_row = 0;
            for (n, one) in ready.chunks(1).enumerate() {
                if let Err(err) = self.idx(|c| index::put_many(c, one)) {
                    tracing::warn!(thread = %one[0].0, "not indexed for search: {err} (`weft search --backfill` retries)");
                    failed_in_a_row += 1;
                    if failed_in_a_row == 3 {
                        tracing::warn!("{} more thread(s) not indexed for search: the index refuses every one (`weft search --backfill` retries)", ready.len() - n - 1);
                        break;
                    }
                } else {
                    failed_in_a_row = 0;
                }
            }
        }
    }

    /// Waits until every thread queued so far is indexed (before a search reads the index,
    /// before a process exits), at most [`FLUSH_WAIT`]; threads that end meanwhile are not
    /// waited for. False when it gave up waiting.
    pub fn flush_index(&self) -> bool {
        let deadline = std::time::Instant::now() + FLUSH_WAIT;
        let Ok(mut st) = self.later.state.lock() else {
            return false;
        };
        let target = st.queued;
        st.wanted = st.wanted.max(target);
        self.later.wake.notify_all();
        while st.done < target && st.draining {
            let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else {
                return false;
            };
            st = match self.later.idle.wait_timeout(st, left) {
                Ok((st, _)) => st,
                Err(_) => return false,
            };
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::project::Project;
    use crate::store::{FileStore, SearchQuery, ThreadStore};

    /// A panic while the index connection is held (the indexer survives its own) leaves the
    /// store usable: the next call opens a new connection instead of failing for good.
    #[test]
    fn a_panic_holding_the_index_connection_does_not_break_the_store() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".weft")).unwrap();
        let store = FileStore::open(&Project {
            root: dir.path().to_path_buf(),
        })
        .unwrap();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = store.idx(|_| -> Result<(), crate::store::StoreError> { panic!("indexing") });
        }));
        assert!(panicked.is_err());
        assert!(store.search(&SearchQuery::new("anything")).is_ok());
        assert!(store.flush_index(), "nothing queued: caught up at once");
    }
}
