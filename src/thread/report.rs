//! What a thread tells the world when it ends ([`ThreadReport`]) and when asked how it stands
//! ([`StatusSnapshot`]). Plain data: every other file of the thread may use it.

use crate::core::ids::ThreadId;
use crate::core::money::Nanos;
use crate::core::status::Status;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a finished thread reports to its parent (and to `weft run`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadReport {
    /// Thread id.
    pub thread_id: ThreadId,
    /// Directive name.
    pub directive: String,
    /// Terminal status.
    pub status: Status,
    /// Final text.
    pub result: Option<String>,
    /// Structured outputs.
    pub outputs: Option<Value>,
    /// Error message.
    pub error: Option<String>,
    /// LLM calls made.
    pub turns: u64,
    /// Prompt tokens of the thread's own calls.
    pub input_tokens: u64,
    /// Output tokens of the thread's own calls.
    pub output_tokens: u64,
    /// Prompt tokens of the thread's own calls read from the provider's cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// The thread's own spend.
    pub own_spend_nanos: Nanos,
    /// The whole subtree's spend.
    pub spend_nanos: Nanos,
    /// What providers billed beyond the thread's reservations (zero unless a provider broke
    /// its prompt bound; the thread then ended and its subtree made no further call).
    #[serde(default)]
    pub overrun_nanos: Nanos,
    /// Files the thread returned, copied into its parent's file area (paths there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// The hash of its transcript's final line, as its final thread.json signs it (its parent
    /// records it as the child's anchor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_head: Option<String>,
}

impl ThreadReport {
    /// The report of thread `row` as its registry row says it ended (for a thread whose actor's
    /// report never came: it was finalized without it, or on another node); a row not yet
    /// terminal reports `error`.
    pub(crate) fn of_row(row: &crate::registry::ThreadRow) -> ThreadReport {
        let status = match row.status {
            Status::Completed | Status::Cancelled | Status::Continued => row.status,
            _ => Status::Error,
        };
        let ended = ThreadReport::ended(
            row.id.clone(),
            row.directive.clone(),
            status,
            row.error.clone(),
        );
        ThreadReport {
            result: row.result.clone(),
            outputs: row.outputs.clone(),
            turns: row.turns,
            input_tokens: row.input_tokens,
            output_tokens: row.output_tokens,
            own_spend_nanos: Nanos(row.own_spend_nanos),
            spend_nanos: Nanos(row.spend_nanos),
            ..ended
        }
    }

    /// The report of thread `id` (of `directive`) that ended `status` with `error`, nothing
    /// spent or made (fill what it did with struct update syntax).
    pub(crate) fn ended(
        id: ThreadId,
        directive: String,
        status: Status,
        error: Option<String>,
    ) -> ThreadReport {
        ThreadReport {
            thread_id: id,
            directive,
            status,
            result: None,
            outputs: None,
            error,
            turns: 0,
            input_tokens: 0,
            output_tokens: 0,
            cache_read_tokens: 0,
            own_spend_nanos: Nanos::ZERO,
            spend_nanos: Nanos::ZERO,
            overrun_nanos: Nanos::ZERO,
            files: Vec::new(),
            final_head: None,
        }
    }
}

/// A snapshot for `Status` queries.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StatusSnapshot {
    /// Current status.
    pub status: Status,
    /// Turns so far.
    pub turns: u64,
    /// Live children.
    pub live_children: Vec<ThreadId>,
}
