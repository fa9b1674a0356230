//! The queue of ended threads waiting for the search index (`later.rs` drains it): plain
//! state, below the store that holds it.

use super::SearchMessage;
use crate::core::ids::ThreadId;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

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

/// How long no thread must have ended before the worker indexes what is queued: a burst of
/// endings (a tree finishing, a cancel) is finished first and indexed after, in few commits,
/// instead of competing with it for the cores.
pub(crate) const QUIET: Duration = Duration::from_millis(100);

/// The longest a thread waits in the queue while threads keep ending. Nothing reads the
/// index without first waiting for what was queued before it ([`Queued::wanted`]), so this
/// bounds only what a killed process leaves unindexed (`weft search --backfill` finds it).
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(1);

/// The longest anyone waits for the queue (`FileStore::flush_index`): past it a search
/// reads the index as it is, and a closing runtime leaves the rest to `weft search --backfill`.
pub(crate) const FLUSH_WAIT: Duration = Duration::from_secs(10);

/// Threads indexed in one transaction at most: a batch holds the store's write lock (kv,
/// env and schedule calls wait for it) only as long as a thousand threads take.
pub(crate) const BATCH_MAX: usize = 1024;

/// The queue of threads to index and whether a worker is draining it.
#[derive(Default)]
pub(crate) struct Later {
    /// The threads queued, and whether a worker is draining them.
    pub(crate) state: Mutex<Queued>,
    /// Signalled when a batch has been indexed.
    pub(crate) idle: Condvar,
    /// Signalled when someone waits for the queue (the worker stops waiting for quiet).
    pub(crate) wake: Condvar,
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
    /// Threads ever queued, and ever taken and indexed (or given up): a reader waits until
    /// `done` reaches the `queued` it saw.
    pub(crate) queued: u64,
    pub(crate) done: u64,
    /// The highest `queued` someone waits for: while `done` is below it, nothing waits for quiet.
    pub(crate) wanted: u64,
    /// A thread was queued past [`HELD_MAX`] (it is read back from its transcript): the
    /// worker does not wait for quiet until the queue has been empty.
    pub(crate) spilled: bool,
    /// When the oldest queued thread and the newest were queued.
    pub(crate) first_at: Option<Instant>,
    pub(crate) last_at: Option<Instant>,
}

impl Queued {
    /// Queues `e`, dropping its messages (read back from its transcript) when the queue
    /// already holds [`HELD_MAX`] bytes.
    pub(crate) fn push(&mut self, mut e: Ended) {
        let bytes = e.said.as_ref().map_or(0, |s| said_bytes(s));
        if self.held + bytes > HELD_MAX {
            e.said = None;
            self.spilled = true;
        } else {
            self.held += bytes;
        }
        let now = Instant::now();
        self.first_at.get_or_insert(now);
        self.last_at = Some(now);
        self.queued += 1;
        self.ended.push(e);
    }

    /// How long the worker still waits before indexing (None: index now): until the queue has
    /// been quiet for [`QUIET`], its oldest thread has waited [`MAX_WAIT`], someone waits, or
    /// it spilled past [`HELD_MAX`].
    pub(crate) fn wait_left(&self, now: Instant) -> Option<Duration> {
        if self.wanted > self.done || self.spilled {
            return None;
        }
        let (first, last) = (self.first_at?, self.last_at?);
        let due = (last + QUIET).min(first + MAX_WAIT);
        due.checked_duration_since(now).filter(|d| !d.is_zero())
    }

    /// Takes the oldest threads queued (at most [`BATCH_MAX`]).
    pub(crate) fn take(&mut self) -> Vec<Ended> {
        let n = self.ended.len().min(BATCH_MAX);
        let batch: Vec<Ended> = self.ended.drain(..n).collect();
        let freed: usize = batch
            .iter()
            .map(|e| e.said.as_ref().map_or(0, |s| said_bytes(s)))
            .sum();
        self.held = self.held.saturating_sub(freed);
        if self.ended.is_empty() {
            (self.first_at, self.last_at, self.spilled) = (None, None, false);
        }
        batch
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

    /// The worker waits while threads keep ending, at most MAX_WAIT after the oldest, and not
    /// at all once someone waits for the queue or it holds HELD_MAX bytes.
    #[test]
    fn the_worker_waits_for_quiet_at_most_max_wait_and_never_for_a_reader() {
        let mut q = Queued::default();
        assert_eq!(q.wait_left(Instant::now()), None, "nothing queued");
        q.push(ended(0, 10));
        let t0 = q.first_at.unwrap();
        assert!(q.wait_left(t0).is_some_and(|d| d <= QUIET), "just queued");
        assert_eq!(q.wait_left(t0 + QUIET), None, "quiet long enough");
        // Threads ending every half QUIET: the wait ends MAX_WAIT after the oldest.
        let mut at = t0;
        while at < t0 + MAX_WAIT {
            q.last_at = Some(at);
            assert!(q.wait_left(at).is_some(), "still ending at {:?}", at - t0);
            at += QUIET / 2;
        }
        q.last_at = Some(at);
        assert_eq!(q.wait_left(at), None, "the oldest has waited MAX_WAIT");
        q.wanted = q.queued;
        assert_eq!(q.wait_left(t0), None, "a reader waits");
        q.wanted = 0;
        q.push(ended(1, HELD_MAX));
        assert!(q.spilled);
        assert_eq!(q.wait_left(t0), None, "past HELD_MAX bytes");
        q.take();
        assert!(!q.spilled, "until the queue has been empty");
    }

    /// A take is at most BATCH_MAX threads, oldest first; what stays keeps its bytes counted.
    #[test]
    fn a_take_is_at_most_batch_max_threads() {
        let mut q = Queued::default();
        for n in 0..BATCH_MAX + 3 {
            q.push(ended(n, 1));
        }
        let first = q.take();
        assert_eq!(first.len(), BATCH_MAX);
        assert_eq!(first[0].id.as_str(), "t-0");
        assert_eq!(q.ended.len(), 3);
        assert!(q.held > 0 && q.first_at.is_some(), "the rest still queued");
        assert_eq!(q.take().len(), 3);
        assert_eq!((q.held, q.first_at), (0, None));
    }
}
