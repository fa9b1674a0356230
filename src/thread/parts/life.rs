//! A thread's lifetime: when it started, the token that cancels its work, its timers, its
//! span, who waits for its report, and what a handoff passes on.

use crate::provider::Message;
use crate::thread::report::ThreadReport;
use std::time::Instant;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A thread's lifetime.
pub(crate) struct Life {
    /// When its actor started.
    pub(crate) started: Instant,
    /// Cancels everything it has under way (its LLM call, tools, MCP calls, code).
    pub(crate) cancel: CancellationToken,
    /// Its timers (retry backoff, wait timeouts, cancel grace), aborted at end.
    pub(crate) timers: Vec<JoinHandle<()>>,
    /// Its duration limit's deadline (on the runtime's timer task), taken back at end.
    pub(crate) deadline: Option<crate::thread::deadlines::Deadline>,
    /// Its `invoke_agent` span (ended when it finishes).
    pub(crate) span: tracing::Span,
    /// Where a root reports.
    pub(crate) on_finish: Option<oneshot::Sender<ThreadReport>>,
    /// Signalled once this thread has finished ending, when its continuation holds its waiter.
    pub(crate) ended: Option<oneshot::Sender<()>>,
    /// Set when the thread ends `continued`: the conversation its continuation starts from.
    pub(crate) handoff: Option<Vec<Message>>,
}

impl Life {
    /// Aborts every timer.
    pub(crate) fn stop_timers(&mut self) {
        for t in self.timers.drain(..) {
            t.abort();
        }
    }
}
