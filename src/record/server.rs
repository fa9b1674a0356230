//! Thread records on a database server (a project whose config names a Postgres database): the
//! same bytes the files hold, in three tables — `transcript_lines` (one row per line, keyed by
//! thread and seq: a second line at a seq is refused, as a transcript file is never rewritten),
//! `thread_docs` (each thread's signed thread.json) and `anchor_lines` (the anchor log's
//! lines in order). No line is ever torn.
//!
//! Lines and documents go through the write-behind queue (`behind.rs`): committed in batches,
//! each before any step that relies on it. Reads first wait for what this process queued.
//!
//! Durability as with files: under `durability: normal` a batch's commit does not wait for the
//! WAL to reach the disk (`synchronous_commit = off`: a killed weft process loses nothing the
//! server has, a crashed server machine may lose the last moments, as a page cache would); a
//! checkpoint, a thread.json written with fsync and an anchor line wait for the disk (what an
//! fsync is for the files). `strict`: every commit waits.
//!
//! Connections: the queue's writer has its own; reads and anchor lines take one of at most
//! [`MAX_OPEN`] per process, for one statement each.

use super::behind::{Behind, Op};
use super::log_file::MakeLines;
use super::tables::open_schema;
use crate::core::ids::{sha256_hex, GENESIS};
use crate::sql::{params, DatabaseUrl, Db, Lock, SqlError};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// The most connections a process opens for reading records and anchoring.
const MAX_OPEN: usize = 8;

/// This process's connections for records.
#[derive(Default)]
struct Pool {
    idle: Vec<Db>,
    /// Connections open (idle or in use).
    open: usize,
}

/// The records' tables on one database, and this process's connections to it.
pub(crate) struct Server {
    url: DatabaseUrl,
    /// `durability: strict`: each commit waits for the server's disk.
    strict: bool,
    pool: Mutex<Pool>,
    /// A connection was given back.
    freed: Condvar,
    /// The write-behind queue (started on first write).
    behind: std::sync::OnceLock<Result<Arc<Behind>, String>>,
    /// Each thread.json this process wrote: a number that changes with every write (see
    /// [`Server::doc_stamp`]).
    stamps: Mutex<HashMap<Arc<str>, u64>>,
    next_stamp: AtomicU64,
}

/// A connection lent by the pool: given back when dropped (also when its user panicked), a
/// transaction it left open rolled back.
struct Lent<'a> {
    server: &'a Server,
    db: Option<Db>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Ok(mut pool) = self.server.pool.lock() {
            match self.db.take() {
                Some(mut db) => {
                    if db.in_tx() {
                        db.rollback();
                    }
                    pool.idle.push(db);
                }
                None => pool.open = pool.open.saturating_sub(1),
            }
        }
        self.server.freed.notify_one();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(Ok(b)) = self.behind.get() {
            b.stop();
        }
    }
}

fn failed(e: SqlError) -> io::Error {
    io::Error::other(e.0)
}

impl Server {
    /// The records on the database `url` (connections are made when first needed).
    pub(crate) fn new(url: DatabaseUrl, strict: bool) -> Server {
        Server {
            url,
            strict,
            pool: Mutex::new(Pool::default()),
            freed: Condvar::new(),
            behind: std::sync::OnceLock::new(),
            stamps: Mutex::new(HashMap::new()),
            next_stamp: AtomicU64::new(1),
        }
    }

    /// The database, as shown (password masked).
    pub(crate) fn shown(&self) -> String {
        self.url.to_string()
    }

    /// Runs `f` on a connection of the pool: an idle one, a new one (its schema brought up
    /// to date) while fewer than [`MAX_OPEN`] are open, else the next one given back.
    pub(super) fn with<T>(&self, f: impl FnOnce(&mut Db) -> Result<T, SqlError>) -> io::Result<T> {
        // What this process queued is there before anything is read.
        self.queue()?.wait(None, None, false)?;
        let mut lent = Lent {
            server: self,
            db: Some(self.take()?),
        };
        match lent.db.as_mut() {
            Some(db) => f(db).map_err(failed),
            None => Err(io::Error::other("no connection")),
        }
    }

    fn take(&self) -> io::Result<Db> {
        let poisoned = || io::Error::other("the records' connection pool failed earlier");
        let mut pool = self.pool.lock().map_err(|_| poisoned())?;
        loop {
            if let Some(db) = pool.idle.pop() {
                return Ok(db);
            }
            if pool.open < MAX_OPEN {
                pool.open += 1;
                drop(pool);
                let made = self.connect();
                if made.is_err() {
                    if let Ok(mut pool) = self.pool.lock() {
                        pool.open -= 1;
                    }
                    self.freed.notify_one();
                }
                return made.map_err(failed);
            }
            pool = crate::sql::off_workers(|| self.freed.wait(pool)).map_err(|_| poisoned())?;
        }
    }

    fn connect(&self) -> Result<Db, SqlError> {
        let mut db = Db::postgres(&self.url)?;
        open_schema(&mut db)?;
        if self.strict {
            db.set_strict()?;
        }
        Ok(db)
    }

    /// A connection of its own holding `thread`'s advisory lock (waiting up to the session's
    /// `lock_timeout` for another process to let it go); dropping it releases the lock.
    pub(crate) fn lock_thread(&self, thread: &str) -> io::Result<Db> {
        let hash = sha256_hex(thread.as_bytes());
        let key = u64::from_str_radix(&hash[..16], 16).unwrap_or(0) as i64;
        let db = Db::postgres(&self.url).map_err(failed)?;
        crate::sql::off_workers(|| db.execute("SELECT pg_advisory_lock(?1)", params![key]))
            .map_err(|e| {
                io::Error::other(format!(
                    "thread {thread} is being written by another process: {e}"
                ))
            })?;
        Ok(db)
    }

    /// The write-behind queue, its writer started on first use.
    fn queue(&self) -> io::Result<&Arc<Behind>> {
        self.behind
            .get_or_init(|| Behind::start(&self.url, self.strict).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| io::Error::other(format!("cannot start the records' writer: {e}")))
    }

    /// Queues line `seq` of `thread` (without its newline); `wait`: returns once it is
    /// stored (on the disk under `strict`).
    pub(crate) fn append_line(
        &self,
        thread: &Arc<str>,
        seq: i64,
        line: &[u8],
        wait: bool,
    ) -> io::Result<()> {
        let q = self.queue()?;
        let ticket = q.push(Op::Line {
            thread: thread.clone(),
            seq,
            line: line.to_vec(),
        })?;
        match wait {
            true => q.wait(Some(thread), Some(ticket), false),
            false => Ok(()),
        }
    }

    /// Waits until everything this process queued is stored and, when `disk`, on the
    /// server's disk; fails if `thread`'s records could not be stored.
    pub(crate) fn sync(&self, thread: Option<&str>, disk: bool) -> io::Result<()> {
        self.queue()?.wait(thread, None, disk)
    }

    /// What tells whether `thread`'s thread.json changed since this process last wrote it
    /// (None: this process never wrote it; read it).
    pub(crate) fn doc_stamp(&self, thread: &str) -> Option<u64> {
        self.stamps.lock().ok()?.get(thread).copied()
    }

    /// `thread`'s transcript as the file would hold it (each line ending in a newline); None
    /// when it has no line.
    pub(crate) fn transcript(&self, thread: &str) -> io::Result<Option<Vec<u8>>> {
        self.lines_after(thread, -1).map(|lines| {
            (!lines.is_empty()).then(|| {
                let mut out = Vec::new();
                for l in lines {
                    out.extend_from_slice(&l);
                    out.push(b'\n');
                }
                out
            })
        })
    }

    /// `thread`'s lines after seq `after`, in order (without newlines).
    pub(crate) fn lines_after(&self, thread: &str, after: i64) -> io::Result<Vec<Vec<u8>>> {
        self.with(|db| {
            db.query(
                "SELECT line FROM transcript_lines WHERE thread=?1 AND seq>?2 ORDER BY seq",
                params![thread, after],
            )?
            .iter()
            .map(|r| r.blob(0))
            .collect()
        })
    }

    /// Whether `thread` has a line or a thread.json.
    pub(crate) fn has(&self, thread: &str) -> io::Result<bool> {
        self.with(|db| {
            db.row(
                "SELECT 1 FROM thread_docs WHERE thread=?1
                 UNION ALL SELECT 1 FROM transcript_lines WHERE thread=?1 LIMIT 1",
                params![thread],
            )
            .map(|r| r.is_some())
        })
    }

    /// Every thread with a line or a thread.json.
    pub(crate) fn threads(&self) -> io::Result<Vec<String>> {
        self.with(|db| {
            db.query(
                "SELECT thread FROM thread_docs UNION SELECT DISTINCT thread FROM transcript_lines",
                &[],
            )?
            .iter()
            .map(|r| r.text(0))
            .collect()
        })
    }

    /// Queues `thread`'s signed thread.json (replacing the one before); `fsync`: returns once
    /// it is on the server's disk.
    pub(crate) fn put_doc(&self, thread: &str, doc: &[u8], fsync: bool) -> io::Result<()> {
        let thread: Arc<str> = Arc::from(thread);
        let q = self.queue()?;
        q.push(Op::Doc {
            thread: thread.clone(),
            doc: doc.to_vec(),
        })?;
        if let Ok(mut s) = self.stamps.lock() {
            // Bounded: a stamp forgotten only costs a read.
            if s.len() >= 65_536 {
                s.clear();
            }
            s.insert(
                thread.clone(),
                self.next_stamp.fetch_add(1, Ordering::Relaxed),
            );
        }
        match fsync {
            true => q.wait(Some(&thread), None, true),
            false => Ok(()),
        }
    }

    /// `thread`'s thread.json, if it has one.
    pub(crate) fn doc(&self, thread: &str) -> io::Result<Option<Vec<u8>>> {
        self.with(|db| {
            db.row(
                "SELECT doc FROM thread_docs WHERE thread=?1",
                params![thread],
            )?
            .map(|r| r.blob(0))
            .transpose()
        })
    }

    /// Appends the lines `make` builds, each from the hash of the one before it, to the anchor
    /// log in one transaction, under the records' write lock: appends from every process on
    /// the database take turns, so the chain never forks.
    pub(crate) fn append_anchor(&self, make: MakeLines) -> io::Result<()> {
        // The lock waits at most the session's `lock_timeout`; a burst of roots ending in
        // several processes may wait longer: tried again, up to about a minute (a file's lock
        // waits as long as it takes).
        let mut tries = 0;
        loop {
            match self.anchor_once(make) {
                Err(e) if tries < 12 && e.to_string().contains("lock") => tries += 1,
                other => return other,
            }
        }
    }

    fn anchor_once(&self, make: MakeLines) -> io::Result<()> {
        self.with(|db| {
            db.begin_write(Lock::Records)?;
            let last = db.row(
                "SELECT n, line FROM anchor_lines ORDER BY n DESC LIMIT 1",
                &[],
            )?;
            let (mut n, mut prev) = match &last {
                Some(r) => (r.int(0)? + 1, sha256_hex(&r.blob(1)?)),
                None => (1, GENESIS.to_string()),
            };
            let mut i = 0;
            while let Some(line) = make(i, &prev) {
                prev = sha256_hex(&line);
                db.execute(
                    "INSERT INTO anchor_lines(n, line) VALUES(?1, ?2)",
                    params![n, line],
                )?;
                (n, i) = (n + 1, i + 1);
            }
            db.batch("SET LOCAL synchronous_commit = on")?;
            db.commit()
        })
    }

    /// The anchor log as the file would hold it.
    pub(crate) fn anchors(&self) -> io::Result<Vec<u8>> {
        self.with(|db| {
            let mut out = Vec::new();
            for r in db.query("SELECT line FROM anchor_lines ORDER BY n", &[])? {
                out.extend_from_slice(&r.blob(0)?);
                out.push(b'\n');
            }
            Ok(out)
        })
    }

    /// Removes `thread`'s transcript and thread.json (`weft delete`, `weft gc`), in one
    /// transaction.
    pub(crate) fn remove(&self, thread: &str) -> io::Result<()> {
        if let Ok(mut s) = self.stamps.lock() {
            s.remove(thread);
        }
        self.queue()?.forget(thread);
        self.with(|db| {
            db.atomic(Lock::Records, |db| {
                db.execute(
                    "DELETE FROM transcript_lines WHERE thread=?1",
                    params![thread],
                )?;
                db.execute("DELETE FROM thread_docs WHERE thread=?1", params![thread])
            })
        })
        .map(|_| ())
    }
}
