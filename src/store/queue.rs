//! The queue of ended threads waiting for the search index (`later.rs` drains it): plain
//! state, below the store that holds it.

use super::SearchMessage;
use crate::core::ids::ThreadId;
use std::sync::{Condvar, Mutex};

/// A thread to index.
pub(crate) struct Ended {
    /// The thread.
    pub id: ThreadId,
    /// Its directive.
    pub directive: String,
    /// Its transcript's last seq.
    pub head: i64,
    /// Its user and assistant messages as the actor logged them; None: read the transcript.
    pub said: Option<Vec<SearchMessage>>,
}

/// The queue of threads to index and whether a worker is draining it.
#[derive(Default)]
pub(crate) struct Later {
    /// The threads queued, and whether a worker is draining them.
    pub(crate) state: Mutex<(Vec<Ended>, bool)>,
    /// Signalled when the queue has been drained.
    pub(crate) idle: Condvar,
}
