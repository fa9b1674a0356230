//! Tool work under way: calls running as tasks, calls parked for a person's approval, the
//! `execute_tool` spans of calls not yet answered, and the files a thread returns.

use crate::provider::ToolCall;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// A thread's tool work.
#[derive(Default)]
pub(crate) struct ToolWork {
    /// Tool calls running as tasks (commands, file operations, store calls): a thread ends
    /// only after each has reported (a cancel kills a command's process group at once).
    pub(crate) tasks: HashSet<String>,
    /// Calls parked until a person approves or denies them, in the order they were made.
    pub(crate) approvals: Vec<ToolCall>,
    /// The `execute_tool` spans of calls not yet answered, by call id.
    pub(crate) spans: HashMap<String, tracing::Span>,
    /// Files named by `directive_return` (in this thread's area until the end, then copied to
    /// the parent's area, and these become the paths there).
    pub(crate) returned_files: Vec<String>,
    /// File tools of one thread run one at a time (a size check and the write it allows are
    /// not interleaved with another call's).
    pub(crate) files_lock: Arc<Mutex<()>>,
}

impl ToolWork {
    /// The waiting marker of the registry row: the parked calls (None when nothing is).
    pub(crate) fn waiting_marker(&self) -> Option<String> {
        let calls: Vec<String> = self
            .approvals
            .iter()
            .map(|c| format!("{} (call {})", c.name, c.id))
            .collect();
        (!calls.is_empty()).then(|| format!("approval of {}", calls.join(", ")))
    }

    /// Takes the parked call `call` (None: the only one parked), or says why none is taken.
    pub(crate) fn take_parked(
        &mut self,
        call: Option<&str>,
        thread: &str,
    ) -> Result<ToolCall, String> {
        let ids: Vec<String> = self.approvals.iter().map(|c| c.id.clone()).collect();
        let pick = match (call, ids.len()) {
            (_, 0) => return Err(format!("thread {thread} has no call waiting for approval")),
            (Some(c), _) => ids.iter().position(|i| i == c).ok_or_else(|| {
                format!(
                    "no call {c} waits for approval (waiting: {})",
                    ids.join(", ")
                )
            })?,
            (None, 1) => 0,
            (None, _) => {
                return Err(format!(
                    "{} calls wait for approval ({}); name one with --call",
                    ids.len(),
                    ids.join(", ")
                ))
            }
        };
        Ok(self.approvals.remove(pick))
    }
}
