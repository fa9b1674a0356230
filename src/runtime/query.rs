//! What a runtime can tell about the project's threads, any process's: [`Runtime::list`],
//! [`Runtime::get`], [`Runtime::tree`], [`Runtime::transcript`], [`Runtime::search`] — all
//! through the runtime's [`ThreadStore`] (registry rows, verified thread.json, transcripts read
//! by the tolerant reader: a torn last line is reported, never an error).

use super::{QueryError, Runtime};
use crate::core::ids::ThreadId;
use crate::registry::{ThreadFilter, ThreadRow};
use crate::store::{SearchHit, SearchQuery, ThreadStore, ThreadView, TranscriptPage};

impl Runtime {
    /// The runtime's thread store: everything weft keeps of the project's threads.
    pub fn store(&self) -> &crate::store::FileStore {
        &self.ctx.store
    }

    /// How many threads this process runs (their actors alive, or starting).
    pub fn live_here(&self) -> usize {
        self.ctx.placement.live()
    }

    /// The project's threads matching `filter` (any process's), newest first.
    pub fn list(&self, filter: &ThreadFilter) -> Result<Vec<ThreadRow>, QueryError> {
        Ok(self.ctx.store.list(filter)?)
    }

    /// One thread: its registry row and verified thread.json. None when the project has no
    /// such thread.
    pub fn get(&self, id: &ThreadId) -> Result<Option<ThreadView>, QueryError> {
        Ok(self.ctx.store.get(id)?)
    }

    /// `id`'s subtree, itself first, parents before children. Empty when there is no such
    /// thread.
    pub fn tree(&self, id: &ThreadId) -> Result<Vec<ThreadRow>, QueryError> {
        Ok(self.ctx.store.tree(id)?)
    }

    /// Each finished thread's best message matching `query` (full text, BM25), with context.
    pub fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, QueryError> {
        Ok(self.ctx.store.search(query)?)
    }

    /// Up to `limit` lines of `id`'s transcript after seq `after` (None: from the start),
    /// checkpoints included, as stored. Err when the thread has no transcript.
    ///
    /// ```no_run
    /// # async fn page(rt: weft::Runtime, id: weft::ThreadId) -> Result<(), weft::QueryError> {
    /// let mut after = None;
    /// loop {
    ///     let page = rt.transcript(&id, after, 500)?;
    ///     for line in &page.lines {
    ///         println!("{} {}", line["seq"], line["type"]);
    ///     }
    ///     match page.next {
    ///         Some(n) => after = Some(n),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn transcript(
        &self,
        id: &ThreadId,
        after: Option<i64>,
        limit: usize,
    ) -> Result<TranscriptPage, QueryError> {
        self.ctx
            .store
            .load(id, after, limit)
            .map_err(|source| QueryError::NoTranscript {
                id: id.clone(),
                source,
            })
    }
}
