//! The errors of the runtime's opening and of its public questions and controls: [`OpenError`]
//! for opening a project, [`QueryError`] for what it reads of the project's threads,
//! [`ControlError`] for what it asks of a running thread. Each names
//! the thread; the HTTP layer picks its status code by variant.

use crate::core::ids::ThreadId;
use crate::store::StoreError;

/// A question about the project's threads (`Runtime::list`, `get`, `tree`,
/// `search`, `transcript`) that could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The thread store (registry.db, store.db, the thread's files) failed or refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The thread's transcript cannot be read.
    #[error("thread {id} has no readable transcript: {source}")]
    NoTranscript {
        /// The thread.
        id: ThreadId,
        /// Why.
        source: StoreError,
    },
}

/// A request to a running thread (`Runtime::inject`, `Runtime::decide`) that did not
/// take effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// This process does not run the thread (it ended, or another process runs it).
    #[error("thread {id} is not running in process {pid}")]
    NotRunning {
        /// The thread.
        id: ThreadId,
        /// This process.
        pid: u32,
    },
    /// The thread's actor stopped before it answered (it was ending).
    #[error("thread {id} did not answer: {reason}")]
    NoAnswer {
        /// The thread.
        id: ThreadId,
        /// What the actor system reported.
        reason: String,
    },
    /// The thread answered with a refusal (no call waits for approval, an unknown call, a
    /// message it cannot queue…), in its own words.
    #[error("{0}")]
    Refused(String),
}

/// Errors opening a runtime.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Bad config.
    #[error(transparent)]
    Config(#[from] crate::project::config::ConfigError),
    /// Bad key or trust store.
    #[error(transparent)]
    Signing(#[from] crate::record::signing::SigningError),
    /// Provider problem.
    #[error("{0}")]
    Provider(String),
    /// Storage problem.
    #[error("{0}")]
    Storage(String),
    /// A command tool file (`tools/*.yaml`) that cannot be used.
    #[error(transparent)]
    Tool(#[from] crate::tools::ToolFileError),
    /// A hooks file that cannot be used.
    #[error(transparent)]
    Hook(#[from] crate::hooks::HookError),
}
