//! What a runtime can tell about the project's threads, any process's: [`Runtime::list`],
//! [`Runtime::get`], [`Runtime::tree`], [`Runtime::transcript`]. Reads only: the registry through
//! a read-only connection of its own, thread.json verified against the trust store, transcripts
//! through the tolerant reader (a torn last line is reported, never an error).

use super::Runtime;
use crate::core::ids::ThreadId;
use crate::registry::{Store, ThreadFilter, ThreadRow};
use serde_json::Value;

/// One thread as [`Runtime::get`] sees it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ThreadView {
    /// Its registry row (status, counters, spend).
    pub row: ThreadRow,
    /// Its signed thread.json, when it verified.
    pub thread: Option<Value>,
    /// Whether thread.json's signature and content verified.
    pub verified: bool,
    /// Why it did not.
    pub problem: Option<String>,
}

/// A page of a transcript (see [`Runtime::transcript`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TranscriptPage {
    /// The thread.
    pub thread_id: ThreadId,
    /// Lines with `seq` > the `after` asked for, in order, at most the `limit` asked for.
    pub lines: Vec<Value>,
    /// The `after` for the next page; None when this page reached the end.
    pub next: Option<i64>,
    /// The last line was torn (a crash mid-append) and is left out.
    pub torn_last_line: bool,
}

impl Runtime {
    fn read<T>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, crate::registry::RegistryError>,
    ) -> Result<T, String> {
        let mut guard = self
            .reader
            .lock()
            .map_err(|_| "the registry reader failed earlier".to_string())?;
        if guard.is_none() {
            let path = self.ctx.project.state_dir().join("registry.db");
            *guard = Some(Store::open_read_only(&path).map_err(|e| e.to_string())?);
        }
        match guard.as_ref() {
            Some(store) => f(store).map_err(|e| e.to_string()),
            None => Err("the registry cannot be read".into()),
        }
    }

    /// The project's threads matching `filter` (any process's), newest first.
    pub fn list(&self, filter: &ThreadFilter) -> Result<Vec<ThreadRow>, String> {
        self.read(|s| s.query(filter))
    }

    /// One thread: its registry row and verified thread.json. None when the project has no
    /// such thread.
    pub fn get(&self, id: &ThreadId) -> Result<Option<ThreadView>, String> {
        let Some(row) = self.read(|s| s.get(id.as_str()))? else {
            return Ok(None);
        };
        let path = self.ctx.project.thread_dir(id).join("thread.json");
        let doc = crate::record::thread_doc::ThreadDoc::read_verified(&path, &self.ctx.trust);
        Ok(Some(match doc {
            Ok(d) => ThreadView {
                row,
                thread: serde_json::to_value(d).ok(),
                verified: true,
                problem: None,
            },
            Err(e) => ThreadView {
                row,
                thread: None,
                verified: false,
                problem: Some(e.to_string()),
            },
        }))
    }

    /// `id`'s subtree, itself first, parents before children. Empty when there is no such
    /// thread.
    pub fn tree(&self, id: &ThreadId) -> Result<Vec<ThreadRow>, String> {
        self.read(|s| s.subtree(id.as_str()))
    }

    /// Up to `limit` lines of `id`'s transcript after seq `after` (None: from the start),
    /// checkpoints included, as stored. Err when the thread has no transcript.
    ///
    /// ```no_run
    /// # async fn page(rt: weft::Runtime, id: weft::ThreadId) -> Result<(), String> {
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
    ) -> Result<TranscriptPage, String> {
        let path = self.ctx.project.thread_dir(id).join("transcript.jsonl");
        let rep = crate::record::transcript::read(&path, id.as_str(), None)
            .map_err(|e| format!("thread {id} has no readable transcript: {e}"))?;
        let limit = limit.max(1);
        let mut lines: Vec<Value> = rep
            .events
            .into_iter()
            .filter(|l| after.is_none_or(|a| l["seq"].as_i64().unwrap_or(-1) > a))
            .take(limit.saturating_add(1))
            .collect();
        let more = lines.len() > limit;
        lines.truncate(limit);
        let next = if more {
            lines.last().and_then(|l| l["seq"].as_i64())
        } else {
            None
        };
        Ok(TranscriptPage {
            thread_id: id.clone(),
            lines,
            next,
            torn_last_line: rep.torn_last_line,
        })
    }
}
