//! The thread registry (`registry.db`) and the registry actor that owns it.
//!
//! [`Store`] is the SQL; [`RegistryActor`] is the only writer at run time. Spawn admission (the
//! parent's `spawns` and `concurrency` limits) happens here, in the same IMMEDIATE transaction
//! that inserts the child's row, so two concurrent spawns — even from two processes — can never
//! both take the last slot. The registry is an index: the signed thread.json stays the truth.

use crate::core::ids::ThreadId;
use crate::core::status::Status;
use serde::{Deserialize, Serialize};

mod actor;
mod admission;
mod columns;
mod store;
mod updates;

pub(crate) use actor::RegistryActor;
pub use actor::RegistryMsg;
pub use store::Store;

/// How the error of a row whose spawn was undone begins (`thread/spawn/stages.rs`): the mark
/// `weft verify` goes by — a thread that never ran has no records to verify, and a row of one
/// that ran never carries it.
pub(crate) const UNDONE: &str = "its spawn was undone: ";

/// Registry failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The parent's `spawns` limit is used up.
    #[error("limit exceeded: spawns {used}/{max} — thread {parent} may not spawn more children")]
    Spawns {
        /// The parent.
        parent: ThreadId,
        /// Children spawned so far.
        used: u64,
        /// The limit.
        max: u64,
    },
    /// The parent's `concurrency` limit is reached.
    #[error("limit exceeded: concurrency {live}/{max} — thread {parent} has that many live children; wait for one to finish")]
    Concurrency {
        /// The parent.
        parent: ThreadId,
        /// Live children.
        live: u64,
        /// The limit.
        max: u64,
    },
    /// A continuation of a thread that another continuation already continues, or of a thread
    /// whose tree still runs: a chain draws on one budget, so one continuation at a time.
    #[error("thread {old} cannot be continued: {why}")]
    Continued {
        /// The thread to continue.
        old: ThreadId,
        /// Which thread is in the way.
        why: String,
    },
    /// No such thread.
    #[error("no thread {0} in the registry")]
    Unknown(ThreadId),
    /// registry.db failed.
    #[error("registry storage: {0}")]
    Storage(String),
    /// A row of registry.db holds a value weft never writes there (an invalid thread id or an
    /// unknown status): the file was changed by something else.
    #[error(
        "registry.db: thread row `{row}` has an invalid {column} `{value}` (run `weft doctor`)"
    )]
    Corrupt {
        /// The row's id as stored.
        row: String,
        /// The column that cannot be read.
        column: &'static str,
        /// The value found there.
        value: String,
    },
}

fn st(e: crate::sql::SqlError) -> RegistryError {
    RegistryError::Storage(e.to_string())
}

impl From<crate::sql::SqlError> for RegistryError {
    fn from(e: crate::sql::SqlError) -> RegistryError {
        st(e)
    }
}

/// One registry row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadRow {
    /// Thread id.
    pub id: ThreadId,
    /// Directive name.
    pub directive: String,
    /// Parent thread id.
    pub parent_id: Option<ThreadId>,
    /// Root thread id.
    pub root_id: ThreadId,
    /// created, running, completed, error, cancelled, continued.
    pub status: Status,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// Model id.
    pub model: String,
    /// LLM calls made.
    pub turns: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Own spend, nano-USD.
    pub own_spend_nanos: i64,
    /// Subtree spend, nano-USD.
    pub spend_nanos: i64,
    /// Children spawned.
    pub spawn_count: u64,
    /// Final text.
    pub result: Option<String>,
    /// Structured outputs (JSON).
    pub outputs: Option<serde_json::Value>,
    /// Error message.
    pub error: Option<String>,
    /// Process that runs the thread.
    pub owner_pid: u32,
    /// Thread this one continues.
    pub continuation_of: Option<ThreadId>,
    /// First thread of the chain.
    pub chain_root: Option<ThreadId>,
    /// What a running thread waits for, if it waits on a person (e.g. the approval of a call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// The thread's own short status line (`set_status`), if it set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_text: Option<String>,
    /// The thread this one was forked from (`weft fork`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ThreadId>,
    /// Metadata a user or an importer set (a JSON object: title, source, tags…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<serde_json::Value>,
}

impl ThreadRow {
    /// Whether this is the row of a thread whose spawn was undone before it ran (its error
    /// carries [`UNDONE`]): no records, nothing spent, never a link of anything that ran.
    pub(crate) fn undone(&self) -> bool {
        self.error.as_deref().is_some_and(|e| e.starts_with(UNDONE))
    }

    /// A row of thread `id` in tree `root_id` at `status`, every other field empty or zero
    /// (fill them with struct update syntax).
    pub fn new(id: ThreadId, root_id: ThreadId, status: Status) -> ThreadRow {
        ThreadRow {
            id,
            directive: String::new(),
            parent_id: None,
            root_id,
            status,
            created_at: String::new(),
            updated_at: String::new(),
            model: String::new(),
            turns: 0,
            input_tokens: 0,
            output_tokens: 0,
            own_spend_nanos: 0,
            spend_nanos: 0,
            spawn_count: 0,
            result: None,
            outputs: None,
            error: None,
            owner_pid: 0,
            continuation_of: None,
            chain_root: None,
            waiting: None,
            status_text: None,
            forked_from: None,
            meta: None,
        }
    }
}

/// Which rows [`Store::query`] returns (every field optional; all given must hold).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadFilter {
    /// Any of these statuses.
    #[serde(default)]
    pub status: Vec<String>,
    /// This directive.
    pub directive: Option<String>,
    /// This tree (root id).
    pub root: Option<String>,
    /// Rows updated at or after this time (RFC 3339, as stored).
    pub updated_since: Option<String>,
    /// At most this many (default 1,000).
    pub limit: Option<usize>,
}

/// Spawn admission asked of the registry.
#[derive(Debug, Clone)]
pub struct Admission {
    /// Parent.
    pub parent: ThreadId,
    /// Parent's `spawns` limit.
    pub spawns: u64,
    /// Parent's `concurrency` limit.
    pub concurrency: u64,
}
