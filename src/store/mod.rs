//! The thread store: one boundary over everything weft keeps of its threads once they exist —
//! nova's `Threads` contract in Rust terms. [`ThreadStore`] creates, reads, lists and deletes
//! threads, appends and loads their events, updates their metadata, and searches their
//! messages; [`FileStore`] is today's storage (registry.db, transcripts, signed thread.json,
//! and `store.db` for the search index and tombstones), [`MemoryStore`] keeps the same contract
//! in memory, and the same contract tests run against both.
//!
//! The store never runs a thread: the thread actor alone appends to a live thread's transcript,
//! so [`ThreadStore::append`] refuses a thread that is still `created`/`running` (inject a
//! message instead). Everything that comes from outside is checked here before it is used:
//! ids are [`ThreadId`]s (validated on construction), events name a known type and carry the
//! fields it needs, and an error names the rule that failed.

use crate::core::ids::ThreadId;
use crate::registry::{ThreadFilter, ThreadRow};
use serde_json::{Map, Value};

mod check;
mod copy;
mod effects;
mod env;
mod files;
mod index;
mod interop;
mod later;
mod maintain;
mod memory;
mod queue;
mod schema;
mod shared_read;

pub use check::{apply_edits, check_event, messages, APPENDABLE};
pub use copy::{copy_to, Copied};
pub use effects::{Effect, EffectKind};
pub use env::{EnvValue, Scope};
pub use files::FileStore;
pub use interop::{export, import_deepagents, import_nova, ImportError, Imported};
pub use maintain::Collected;
pub(crate) use maintain::{db_size, size_of};
pub use memory::MemoryStore;
pub(crate) use queue::Ended;

/// What the store refuses or fails at. Each names the thread and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Input broke a rule of the contract (an event's type or fields, a metadata key…).
    #[error("{rule}: {detail}")]
    Invalid {
        /// The rule that failed, e.g. `event.type`.
        rule: &'static str,
        /// What was wrong and what to do.
        detail: String,
    },
    /// No such thread.
    #[error("no thread {0} in this project (`weft threads` lists them)")]
    NotFound(ThreadId),
    /// The thread was deleted; nothing may recreate it.
    #[error("thread {0} was deleted; nothing can be appended to it or recreate it")]
    Deleted(ThreadId),
    /// The thread still runs: its actor alone writes it.
    #[error("thread {0} is still running; cancel it or wait for it to end (to talk to it, use `weft inject`)")]
    Running(ThreadId),
    /// A delete of a thread with children, without `subtree`.
    #[error("thread {id} has {children} child thread(s); delete them with it (`--subtree`) or delete them first")]
    HasChildren {
        /// The thread.
        id: ThreadId,
        /// How many children.
        children: usize,
    },
    /// The storage failed (a file, a database).
    #[error("store: {0}")]
    Storage(String),
    /// registry.db failed, or holds a row weft cannot read.
    #[error("store: {0}")]
    Registry(#[from] crate::registry::RegistryError),
}

impl From<crate::sql::SqlError> for StoreError {
    fn from(e: crate::sql::SqlError) -> StoreError {
        storage(e)
    }
}

pub(crate) fn storage(e: impl std::fmt::Display) -> StoreError {
    StoreError::Storage(e.to_string())
}

/// One thread as the store sees it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ThreadView {
    /// Its registry row (status, counters, spend, metadata).
    pub row: ThreadRow,
    /// Its signed thread.json, when it verified.
    pub thread: Option<Value>,
    /// Whether thread.json's signature and content verified.
    pub verified: bool,
    /// Why it did not.
    pub problem: Option<String>,
}

/// A page of a transcript (see [`ThreadStore::load`]).
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

/// A finished thread written whole (an import; the contract tests).
#[derive(Debug, Clone, Default)]
pub struct NewThread {
    /// Directive name it is filed under (e.g. `import/nova`).
    pub directive: String,
    /// Model it ran on, if known.
    pub model: String,
    /// Terminal status: `completed`, `error` or `cancelled`.
    pub status: String,
    /// When it started and last changed (RFC 3339); now when empty.
    pub created_at: String,
    /// See `created_at`.
    pub updated_at: String,
    /// Final text.
    pub result: Option<String>,
    /// Metadata (title, source…), a JSON object.
    pub meta: Map<String, Value>,
    /// Where it came from (imports: format, file, original id).
    pub imported: Option<Value>,
    /// The thread it descends from (lineage only: no budget is shared).
    pub forked_from: Option<ThreadId>,
    /// Its events, each checked by [`check_event`].
    pub events: Vec<Value>,
}

/// What a search asks (see [`ThreadStore::search`]).
#[derive(Debug, Clone)]
pub struct SearchQuery {
    /// Words to look for (any of them; more and rarer matches rank higher).
    pub text: String,
    /// Only threads of this directive.
    pub directive: Option<String>,
    /// At most this many threads.
    pub limit: usize,
    /// Messages of context on each side of the hit.
    pub context: usize,
}

impl SearchQuery {
    /// A query for `text` with the defaults: 10 threads, 3 messages of context.
    pub fn new(text: &str) -> SearchQuery {
        SearchQuery {
            text: text.into(),
            directive: None,
            limit: 10,
            context: 3,
        }
    }
}

/// One indexed message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SearchMessage {
    /// Its transcript line.
    pub seq: i64,
    /// `user` or `assistant`.
    pub role: String,
    /// Its text (as edited, if it was).
    pub text: String,
}

/// A thread's best match.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SearchHit {
    /// The thread.
    pub thread_id: ThreadId,
    /// Its directive.
    pub directive: String,
    /// The matching message.
    pub hit: SearchMessage,
    /// Relevance, higher is better (BM25 in the file store).
    pub score: f64,
    /// The messages around it, the hit included, in order.
    pub context: Vec<SearchMessage>,
}

/// What [`ThreadStore::backfill`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Backfill {
    /// Threads (re)indexed.
    pub indexed: usize,
    /// Index entries of threads that no longer exist, removed.
    pub removed: usize,
}

/// What [`ThreadStore::delete`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Deleted {
    /// Threads whose rows, files and index entries went now.
    pub threads: Vec<ThreadId>,
    /// It had been deleted before (nothing more to do).
    pub already: bool,
}

/// The thread store contract (see the module doc). Every method takes validated ids and checks
/// what it is given; implementations are interchangeable behind it.
pub trait ThreadStore: Send + Sync {
    /// Writes a finished thread whole (row, events, signed state) and returns its new id.
    fn create(&self, thread: NewThread) -> Result<ThreadId, StoreError>;
    /// One thread; None when there is none (or it was deleted).
    fn get(&self, id: &ThreadId) -> Result<Option<ThreadView>, StoreError>;
    /// Threads matching `filter`, newest first.
    fn list(&self, filter: &ThreadFilter) -> Result<Vec<ThreadRow>, StoreError>;
    /// `id`'s subtree, itself first, parents before children; empty when there is none.
    fn tree(&self, id: &ThreadId) -> Result<Vec<ThreadRow>, StoreError>;
    /// Deletes a finished thread (with `subtree`, its finished descendants too): rows, files
    /// and index entries. Idempotent; refused while any of them runs. A deleted id stays
    /// deleted: no later append or create brings it back.
    fn delete(&self, id: &ThreadId, subtree: bool) -> Result<Deleted, StoreError>;
    /// Appends events to a finished thread (message edits, notes); returns the last seq.
    fn append(&self, id: &ThreadId, events: Vec<Value>) -> Result<i64, StoreError>;
    /// Up to `limit` events after seq `after` (None: from the start).
    fn load(
        &self,
        id: &ThreadId,
        after: Option<i64>,
        limit: usize,
    ) -> Result<TranscriptPage, StoreError>;
    /// Merges `patch` into the thread's metadata (a null value removes the key); returns it.
    fn update_metadata(
        &self,
        id: &ThreadId,
        patch: &Map<String, Value>,
    ) -> Result<Map<String, Value>, StoreError>;
    /// Indexes a finished thread's messages for search (again, if it changed); returns how
    /// many messages it holds.
    fn index(&self, id: &ThreadId) -> Result<usize, StoreError>;
    /// Each thread's best matching message, best threads first.
    fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, StoreError>;
    /// A value of the thread's key-value store (None: no such key).
    fn kv_get(&self, id: &ThreadId, key: &str) -> Result<Option<Value>, StoreError>;
    /// Sets a value of the thread's key-value store; None removes the key.
    fn kv_set(&self, id: &ThreadId, key: &str, value: Option<Value>) -> Result<(), StoreError>;
    /// Every key and value of the thread's key-value store.
    fn kv_list(&self, id: &ThreadId) -> Result<Map<String, Value>, StoreError>;
    /// Indexes every finished thread the index lacks (or holds an older version of) and
    /// removes the entries of threads that are gone. Running it twice does nothing the second
    /// time.
    fn backfill(&self) -> Result<Backfill, StoreError>;
}

/// The page of `events` after `after`, at most `limit` long (shared by both stores).
pub(crate) fn page(
    id: &ThreadId,
    events: Vec<Value>,
    after: Option<i64>,
    limit: usize,
    torn_last_line: bool,
) -> TranscriptPage {
    let limit = limit.max(1);
    let mut lines: Vec<Value> = events
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
    TranscriptPage {
        thread_id: id.clone(),
        lines,
        next,
        torn_last_line,
    }
}

/// Merges a metadata patch (null removes a key). Keys are short names, checked.
pub(crate) fn merge_meta(
    meta: &mut Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<(), StoreError> {
    for (k, v) in patch {
        let ok = !k.is_empty()
            && k.len() <= 64
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !ok {
            return Err(StoreError::Invalid {
                rule: "metadata.key",
                detail: format!(
                    "`{k}` is not a metadata key: use 1–64 letters, digits, `_`, `-`, `.`"
                ),
            });
        }
        if v.is_null() {
            meta.remove(k);
        } else {
            meta.insert(k.clone(), v.clone());
        }
    }
    Ok(())
}
