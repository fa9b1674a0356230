//! Blocking database work kept off the async workers.

/// Runs blocking storage work (an SQLite commit that may wait on another process's lock, an
/// fsync, a Postgres lock held by another process) without stalling the async workers: on a
/// multi-threaded runtime the worker hands its other tasks to a fresh thread for the duration
/// (`block_in_place`), so unrelated actors keep running while a disk is slow or a database is
/// locked. A current-thread runtime has no other worker to keep free, and there it simply runs.
pub(crate) fn off_workers<R>(work: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}
