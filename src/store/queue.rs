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

/// Bytes of messages the queue holds at most; a thread queued past them keeps only its id,
/// and the worker reads its messages back from its transcript. Endings faster than the worker
/// indexes them grow the queue: this bounds the messages it holds (the batch being indexed
/// holds as much again), not how many threads it queues.
pub(crate) const HELD_MAX: usize = 16 << 20;

/// The queue of threads to index and whether a worker is draining it.
#[derive(Default)]
pub(crate) struct Later {
    /// The threads queued, and whether a worker is draining them.
    pub(crate) state: Mutex<Queued>,
    /// Signalled when the queue has been drained.
    pub(crate) idle: Condvar,
}

/// The threads queued, the bytes of messages they hold, and whether a worker drains them.
#[derive(Default)]
pub(crate) struct Queued {
    /// The threads, oldest first.
    pub(crate) ended: Vec<Ended>,
    /// Bytes of the messages they hold (at most [`HELD_MAX`]).
    pub(crate) held: usize,
    /// A worker is draining the queue.
    pub(crate) draining: bool,
}

impl Queued {
    /// Queues `e`, dropping its messages (read back from its transcript) when the queue
    /// already holds [`HELD_MAX`] bytes.
    pub(crate) fn push(&mut self, mut e: Ended) {
        let bytes = e.said.as_ref().map_or(0, |s| said_bytes(s));
        if self.held + bytes > HELD_MAX {
            e.said = None;
        } else {
            self.held += bytes;
        }
        self.ended.push(e);
    }

    /// Takes every thread queued.
    pub(crate) fn take(&mut self) -> Vec<Ended> {
        self.held = 0;
        std::mem::take(&mut self.ended)
    }
}

fn said_bytes(said: &[SearchMessage]) -> usize {
    said.iter()
        .map(|m| m.text.len() + m.role.len() + std::mem::size_of::<SearchMessage>())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(n: usize, bytes: usize) -> Ended {
        Ended {
            id: ThreadId::parse(&format!("t-{n}")).unwrap(),
            directive: "d".into(),
            head: 1,
            said: Some(vec![SearchMessage {
                seq: 1,
                role: "user".into(),
                text: "x".repeat(bytes),
            }]),
        }
    }

    /// Past HELD_MAX bytes a queued thread keeps only its id (its messages are read back from
    /// its transcript); every thread is still queued, and a take empties the count.
    #[test]
    fn the_queue_holds_at_most_held_max_bytes_of_messages() {
        let mut q = Queued::default();
        q.push(ended(0, HELD_MAX / 2));
        q.push(ended(1, HELD_MAX / 2));
        assert!(
            q.ended[1].said.is_none(),
            "the second half does not fit beside the first"
        );
        q.push(ended(2, 10));
        assert!(q.ended[2].said.is_some(), "a small one still fits");
        assert!(q.held <= HELD_MAX, "{} held", q.held);
        assert_eq!(q.take().len(), 3, "every thread queued");
        assert_eq!(q.held, 0);
        q.push(ended(3, HELD_MAX / 2));
        assert!(q.ended[0].said.is_some(), "room again after a take");
    }
}
