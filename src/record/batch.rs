//! Group commit for the actors that own a database (ledger, supervisor).
//!
//! A change is applied at once; its reply is held. The first held reply queues a flush marker
//! message behind everything already in the mailbox; when the actor reaches it, it persists the
//! whole batch in one transaction and releases every held reply with the outcome. So no caller
//! proceeds on a change that is not stored, and concurrent callers share one commit.

/// A reply waiting for the batch's commit; it receives the commit error, if any.
pub(crate) type HeldReply<E> = Box<dyn FnOnce(Option<E>) + Send>;

/// Replies held until the next commit.
pub(crate) struct GroupCommit<E> {
    held: Vec<HeldReply<E>>,
    queued: bool,
}

impl<E> Default for GroupCommit<E> {
    fn default() -> Self {
        GroupCommit {
            held: Vec::new(),
            queued: false,
        }
    }
}

impl<E: Clone> GroupCommit<E> {
    /// Holds `reply`; `queue_flush` is called (to cast the flush marker) if none is queued.
    /// It returns whether the marker was queued.
    pub(crate) fn hold(&mut self, reply: HeldReply<E>, queue_flush: impl FnOnce() -> bool) {
        self.held.push(reply);
        if !self.queued {
            self.queued = queue_flush();
        }
    }

    /// Whether no reply is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Releases every held reply with the commit's outcome; the next hold queues a new marker.
    pub(crate) fn release(&mut self, outcome: &Result<(), E>) {
        self.queued = false;
        for reply in self.held.drain(..) {
            reply(outcome.as_ref().err().cloned());
        }
    }
}

/// How long a writer waits for another process to release a database's write lock.
pub(crate) const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `BEGIN IMMEDIATE` (the write lock, taken now). The usual case — no other process writing —
/// takes it at once on the actor's worker; only when the lock is held elsewhere is the wait (up
/// to [`BUSY_TIMEOUT`]) moved off the async workers. The fast path stays free of the hand-off's
/// cost (tens of µs per commit, measured in the per-turn benchmark).
pub(crate) fn begin_immediate(db: &rusqlite::Connection) -> rusqlite::Result<()> {
    db.busy_timeout(std::time::Duration::ZERO)?;
    let res = match db.execute_batch("BEGIN IMMEDIATE") {
        Err(rusqlite::Error::SqliteFailure(e, _))
            if e.code == rusqlite::ErrorCode::DatabaseBusy =>
        {
            db.busy_timeout(BUSY_TIMEOUT)?;
            off_workers(|| db.execute_batch("BEGIN IMMEDIATE"))
        }
        other => other,
    };
    db.busy_timeout(BUSY_TIMEOUT)?;
    res
}

/// `COMMIT`: on the worker when it is a WAL append (`synchronous=NORMAL`), off the workers when
/// it fsyncs (`synchronous=FULL`, `durability: strict`).
pub(crate) fn commit(db: &rusqlite::Connection, fsyncs: bool) -> rusqlite::Result<()> {
    if fsyncs {
        off_workers(|| db.execute_batch("COMMIT"))
    } else {
        db.execute_batch("COMMIT")
    }
}

/// Whether commits on `db` fsync (`synchronous` FULL or EXTRA).
pub(crate) fn commits_fsync(db: &rusqlite::Connection) -> bool {
    db.query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0))
        .is_ok_and(|level| level >= 2)
}

/// Runs blocking storage work (an SQLite commit that may wait on another process's lock, an
/// fsync) without stalling the async workers: on a multi-threaded runtime the worker hands its
/// other tasks to a fresh thread for the duration (`block_in_place`), so unrelated actors keep
/// running while a disk is slow or a database is locked. A current-thread runtime has no other
/// worker to keep free, and there it simply runs.
pub(crate) fn off_workers<R>(work: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// Runs `setup` (a new connection's pragmas and schema), again while another process holds the
/// database (up to 10 s): switching a fresh database to WAL can answer "locked" at once, without
/// waiting out the busy timeout, when another process is creating it at the same moment.
pub(crate) fn setup_with_retry(
    db: &rusqlite::Connection,
    setup: impl Fn(&rusqlite::Connection) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match setup(db) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}
