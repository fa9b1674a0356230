//! A few long-lived threads for the blocking writes of ending threads: the terminal fsync of a
//! transcript, the signed thread.json with its fsync and its folder's, a root's anchor line.
//!
//! Why not tokio's blocking pool: when thousands of threads end at once (a tree's cancel),
//! that pool starts an OS thread for every task waiting, up to 512, each with its own allocator
//! heap to fault in (huge pages zeroed), and two cores spent more time starting, switching and
//! zeroing memory for those threads than writing (measured: a third of a 10⁴-thread cancel).
//! A fixed set of threads costs nothing to start and still keeps several writes in flight, so
//! a disk can group their fsyncs into one journal commit.
//!
//! A job runs to its end even if the thread that asked was killed meanwhile (its actor's task
//! aborted after the cancel grace): whoever then ends that thread without its actor first waits
//! until no job of it is queued or running ([`Writers::idle`]), so nothing it wrote is
//! overwritten by a stale write that ran later.
//!
//! Runs what it is given, in order of arrival; never decides what is written.

use crate::core::ids::ThreadId;
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

/// One piece of blocking work.
type Job = Box<dyn FnOnce() + Send>;

/// The writer threads of a runtime (started on first use; they end when it is dropped).
#[derive(Default)]
pub(crate) struct Writers {
    /// Where work is queued (None if the threads could not be started).
    queue: OnceLock<Option<Sender<Job>>>,
    /// How many threads (0: [`how_many`]).
    threads: usize,
    /// Jobs queued or running, per thread.
    busy: Arc<Busy>,
}

/// Jobs queued or running, per thread, and a wake-up for those waiting until a thread's are done.
#[derive(Default)]
struct Busy {
    jobs: Mutex<HashMap<ThreadId, usize>>,
    /// Threads ended without their actor ([`Writers::take_over`]): their jobs not yet started
    /// are skipped (kept until their last job is gone).
    taken: Mutex<std::collections::HashSet<ThreadId>>,
    done: tokio::sync::Notify,
}

impl Busy {
    fn add(&self, thread: &ThreadId) {
        if let Ok(mut j) = self.jobs.lock() {
            *j.entry(thread.clone()).or_default() += 1;
        }
    }

    fn remove(&self, thread: &ThreadId) {
        if let Ok(mut j) = self.jobs.lock() {
            if let Some(n) = j.get_mut(thread) {
                *n -= 1;
                if *n == 0 {
                    j.remove(thread);
                    if let Ok(mut t) = self.taken.lock() {
                        t.remove(thread);
                    }
                }
            }
        }
        self.done.notify_waiters();
    }

    fn has(&self, thread: &ThreadId) -> bool {
        self.jobs.lock().is_ok_and(|j| j.contains_key(thread))
    }

    fn is_taken(&self, thread: &ThreadId) -> bool {
        self.taken.lock().is_ok_and(|t| t.contains(thread))
    }
}

/// How many writer threads: twice the cores, at least 4 (fsyncs in flight) and at most 16.
fn how_many() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (2 * cores).clamp(4, 16)
}

/// A writer thread: runs jobs until the queue is closed. A job that panics is contained (its
/// caller sees no result); the thread goes on.
fn serve(jobs: Arc<Mutex<Receiver<Job>>>) {
    loop {
        // The lock is held only while waiting for the next job: one thread waits on the
        // queue, the others on the lock.
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else {
            return; // the runtime is gone
        };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

impl Writers {
    /// Writer threads for records on a database server: there a terminal write waits for the
    /// server's commit (a network wait, no CPU), and each thread waits for one, so more of
    /// them share each commit — 64 rather than the few that keep a disk's fsyncs in flight.
    pub(crate) fn for_server() -> Writers {
        Writers {
            threads: 64,
            ..Default::default()
        }
    }

    /// The queue, its threads started on first use.
    fn queue(&self) -> Option<&Sender<Job>> {
        self.queue
            .get_or_init(|| {
                let (tx, rx) = channel::<Job>();
                let rx = Arc::new(Mutex::new(rx));
                let n = match self.threads {
                    0 => how_many(),
                    n => n,
                };
                for i in 0..n {
                    let rx = rx.clone();
                    let started = std::thread::Builder::new()
                        .name(format!("weft-writer-{i}"))
                        .spawn(move || serve(rx));
                    if started.is_err() && i == 0 {
                        return None;
                    }
                }
                Some(tx)
            })
            .as_ref()
    }

    /// Runs `work` for `thread` on a writer thread and returns its result (None if it
    /// panicked). It runs to its end even if the caller is dropped. Falls back to tokio's
    /// blocking pool when no writer thread could be started.
    pub(crate) async fn run<R: Send + 'static>(
        &self,
        thread: &ThreadId,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Option<R> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (busy, id) = (self.busy.clone(), thread.clone());
        busy.add(&id);
        let job: Job = Box::new(move || {
            // Counted done even if `work` panics (the guard's drop runs while unwinding).
            struct Done(Arc<Busy>, ThreadId);
            impl Drop for Done {
                fn drop(&mut self) {
                    self.0.remove(&self.1);
                }
            }
            let done = Done(busy, id);
            // A thread ended without its actor meanwhile: its stale writes never run.
            if done.0.is_taken(&done.1) {
                return;
            }
            let _ = tx.send(work());
        });
        let left = match self.queue() {
            Some(q) => q.send(job).err().map(|back| back.0),
            None => Some(job),
        };
        if let Some(job) = left {
            tokio::task::spawn_blocking(job).await.ok()?;
        }
        rx.await.ok()
    }

    /// `thread` is being ended without its actor: its jobs not yet started are skipped (one
    /// already running finishes; [`Writers::idle`] waits for it).
    pub(crate) fn take_over(&self, thread: &ThreadId) {
        if self.busy.has(thread) {
            if let Ok(mut t) = self.busy.taken.lock() {
                t.insert(thread.clone());
            }
        }
    }

    /// Waits (up to `bound`) until no job of `thread` is queued or running.
    pub(crate) async fn idle(&self, thread: &ThreadId, bound: std::time::Duration) {
        let wait = async {
            loop {
                let done = self.busy.done.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                if !self.busy.has(thread) {
                    return;
                }
                done.await;
            }
        };
        let _ = tokio::time::timeout(bound, wait).await;
    }
}
