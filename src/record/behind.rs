//! The write-behind queue of thread records on a database server: a line or a thread.json is
//! queued and the thread goes on; one writer thread per process commits everything queued in
//! one transaction (multi-row inserts), so ten thousand threads writing at once cost a few
//! commits a millisecond, not one round trip each.
//!
//! What a later step relies on is committed before that step (the files' rule, "written to the
//! OS before the step that depends on it", with the server in the OS's place): a read, a
//! checkpoint, a thread.json written with fsync, the ledger's commit (a call's cost is in the
//! transcript before its settlement is stored: `barrier`), a tool's run and a thread's end
//! each wait until what was queued before them is committed ([`Behind::wait`]). A killed
//! process loses only lines nothing had relied on yet: the transcript ends a few lines
//! earlier, its chain intact, as if the process had died a moment sooner.
//!
//! Order: one queue, committed in order, so a thread's lines never land out of order and a
//! thread.json never lands before the lines it signs. A batch that fails is retried on a new
//! connection; if it still fails, every thread with a record in it is failed: its next write or
//! wait returns the error (a lost line ends the thread, as with files).

use crate::sql::{params, DatabaseUrl, Db, SqlError, Value};
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Condvar, Mutex, Weak};

/// One record to store.
pub(crate) enum Op {
    /// Line `seq` of `thread`'s transcript (without its newline).
    Line {
        thread: Arc<str>,
        seq: i64,
        line: Vec<u8>,
    },
    /// `thread`'s signed thread.json, replacing the one before.
    Doc { thread: Arc<str>, doc: Vec<u8> },
    /// Nothing to store: the batch holding it waits for the disk.
    Sync,
}

impl Op {
    fn size(&self) -> usize {
        match self {
            Op::Line { line, .. } => line.len(),
            Op::Doc { doc, .. } => doc.len(),
            Op::Sync => 0,
        }
    }

    fn thread(&self) -> Option<&Arc<str>> {
        match self {
            Op::Line { thread, .. } | Op::Doc { thread, .. } => Some(thread),
            Op::Sync => None,
        }
    }
}

/// More records or bytes queued than these and a writer waits (memory stays bounded when the
/// server is slow).
const MAX_QUEUED: usize = 50_000;
const MAX_QUEUED_BYTES: usize = 256 << 20;
/// At most this many records per transaction.
const MAX_BATCH: usize = 8_192;

#[derive(Default)]
struct State {
    ops: Vec<Op>,
    /// Bytes of the records queued.
    bytes: usize,
    /// The ticket of the last record queued (tickets count from 1).
    queued: u64,
    /// Every ticket up to this one is committed (or failed).
    done: u64,
    /// Threads whose records could not be stored, and why.
    failed: HashMap<Arc<str>, String>,
    /// The queue's owner is gone: write what is left and stop.
    stopping: bool,
}

/// The queue and its writer thread.
pub(crate) struct Behind {
    state: Mutex<State>,
    /// Work was queued (or the owner stopped).
    work: Condvar,
    /// A batch was committed (or failed), or room was made.
    settled: Condvar,
    /// `durability: strict`: every commit waits for the disk.
    strict: bool,
}

/// Every queue of the process, by the database it writes to (for [`barrier`]).
static ALL: Mutex<Vec<(String, Weak<Behind>)>> = Mutex::new(Vec::new());

/// Waits until every record this process queued for the database `url` so far is
/// committed: before that database's ledger stores a settlement (a call's cost is in its
/// transcript first). Queues of other databases are not waited for.
pub(crate) fn barrier(url: &DatabaseUrl) {
    let shown = url.to_string();
    let all: Vec<Arc<Behind>> = match ALL.lock() {
        Ok(mut v) => {
            v.retain(|(_, w)| w.strong_count() > 0);
            v.iter()
                .filter(|(u, _)| *u == shown)
                .filter_map(|(_, w)| w.upgrade())
                .collect()
        }
        Err(_) => return,
    };
    for b in all {
        let _ = b.wait(None, None, false);
    }
}

fn lost() -> io::Error {
    io::Error::other("the records' queue failed earlier")
}

impl Behind {
    /// A queue writing to `url`, its writer thread started.
    pub(crate) fn start(url: &DatabaseUrl, strict: bool) -> io::Result<Arc<Behind>> {
        let behind = Arc::new(Behind {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            settled: Condvar::new(),
            strict,
        });
        let (me, url, shown) = (behind.clone(), url.clone(), url.to_string());
        std::thread::Builder::new()
            .name("weft-records".into())
            .spawn(move || me.serve(&url))?;
        if let Ok(mut all) = ALL.lock() {
            all.push((shown, Arc::downgrade(&behind)));
        }
        Ok(behind)
    }

    /// Queues `op`; returns its ticket. Refused when its thread's records failed.
    pub(crate) fn push(&self, op: Op) -> io::Result<u64> {
        let mut s = self.state.lock().map_err(|_| lost())?;
        if let Some(e) = op.thread().and_then(|t| s.failed.get(t)) {
            return Err(io::Error::other(e.clone()));
        }
        while s.ops.len() >= MAX_QUEUED || s.bytes >= MAX_QUEUED_BYTES {
            s = crate::sql::off_workers(|| self.settled.wait(s)).map_err(|_| lost())?;
        }
        s.queued += 1;
        s.bytes += op.size();
        s.ops.push(op);
        let ticket = s.queued;
        drop(s);
        self.work.notify_one();
        Ok(ticket)
    }

    /// Waits until `ticket` (None: everything queued so far) is committed — on the disk too
    /// when `disk` — and `thread`'s records, if named, have not failed.
    pub(crate) fn wait(
        &self,
        thread: Option<&str>,
        ticket: Option<u64>,
        disk: bool,
    ) -> io::Result<()> {
        let ticket = match (disk && !self.strict, ticket) {
            // A commit that writes waits for the disk, and so do all before it.
            (true, _) => self.push(Op::Sync)?,
            (false, Some(t)) => t,
            (false, None) => self.state.lock().map_err(|_| lost())?.queued,
        };
        let mut s = self.state.lock().map_err(|_| lost())?;
        while s.done < ticket {
            s = crate::sql::off_workers(|| self.settled.wait(s)).map_err(|_| lost())?;
        }
        match thread.and_then(|t| s.failed.get(t)) {
            Some(e) => Err(io::Error::other(e.clone())),
            None => Ok(()),
        }
    }

    /// Forgets a removed thread's failure.
    pub(crate) fn forget(&self, thread: &str) {
        if let Ok(mut s) = self.state.lock() {
            s.failed.remove(thread);
        }
    }

    /// The queue's owner is gone: the writer stores what is left, then stops.
    pub(crate) fn stop(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.stopping = true;
        }
        self.work.notify_one();
    }

    /// The writer thread: takes what is queued, commits it, tells the waiters; again.
    fn serve(&self, url: &DatabaseUrl) {
        let mut db: Option<Db> = None;
        let marker: String = format!("{}-{}", std::process::id(), crate::core::ids::now_ts());
        loop {
            let (batch, last) = {
                let Ok(mut s) = self.state.lock() else { return };
                while s.ops.is_empty() && !s.stopping {
                    s = match self.work.wait(s) {
                        Ok(s) => s,
                        Err(_) => return,
                    };
                }
                if s.ops.is_empty() {
                    return;
                }
                let n = s.ops.len().min(MAX_BATCH);
                let taken: Vec<Op> = s.ops.drain(..n).collect();
                s.bytes -= taken.iter().map(Op::size).sum::<usize>();
                let last = s.done + taken.len() as u64;
                // A thread whose records failed stores nothing more: a later line would
                // leave a gap in its chain, a later thread.json would sign lines not stored.
                let failed = &s.failed;
                let batch: Vec<Op> = taken
                    .into_iter()
                    .filter(|o| o.thread().is_none_or(|t| !failed.contains_key(t)))
                    .collect();
                (batch, last)
            };
            let failures = self.write_caught(&mut db, url, batch, &marker);
            if let Ok(mut s) = self.state.lock() {
                for (thread, e) in failures {
                    tracing::error!(thread = %thread, "thread records not stored: {e}");
                    s.failed
                        .entry(thread)
                        .or_insert_with(|| format!("records not stored: {e}"));
                }
                s.done = last;
            }
            self.settled.notify_all();
        }
    }

    /// [`Self::write`], a panic in it failing the batch's threads (never the writer).
    fn write_caught(
        &self,
        db: &mut Option<Db>,
        url: &DatabaseUrl,
        batch: Vec<Op>,
        marker: &str,
    ) -> Vec<(Arc<str>, String)> {
        let threads: Vec<Arc<str>> = batch.iter().filter_map(Op::thread).cloned().collect();
        let run = std::panic::AssertUnwindSafe(|| self.write(db, url, batch, marker));
        match std::panic::catch_unwind(run) {
            Ok(failures) => failures,
            Err(_) => {
                *db = None;
                threads
                    .into_iter()
                    .map(|t| (t, "the records' writer failed".to_string()))
                    .collect()
            }
        }
    }

    /// Commits `batch`; returns the threads whose records could not be stored. A line whose
    /// seq a thread already has (two writers of one thread) fails that thread alone and the
    /// rest is tried again. Any other failure is tried again on a new connection, twice, the
    /// lines then inserted only where missing (a commit whose answer was lost stored the same
    /// rows); after that every thread of the batch fails.
    fn write(
        &self,
        db: &mut Option<Db>,
        url: &DatabaseUrl,
        mut batch: Vec<Op>,
        marker: &str,
    ) -> Vec<(Arc<str>, String)> {
        let (mut failures, mut tried, mut again) = (Vec::new(), 0, false);
        loop {
            let conn = match db.take() {
                Some(c) => Ok(c),
                None => self.connect(url),
            };
            let result = conn.and_then(|mut c| {
                let r = self.commit(&mut c, &batch, marker, again);
                *db = Some(c);
                r
            });
            let e = match result {
                Ok(()) => return failures,
                Err(e) => e,
            };
            if let Some(thread) = conflicting(&e) {
                let before = batch.len();
                batch.retain(|o| o.thread().is_none_or(|t| **t != *thread));
                if batch.len() < before {
                    failures.push((Arc::from(thread.as_str()), e.0));
                    continue;
                }
            }
            tried += 1;
            if tried >= 3 {
                let all = batch.iter().filter_map(Op::thread).cloned();
                failures.extend(all.map(|t| (t, e.0.clone())));
                return failures;
            }
            *db = None;
            again = true;
            std::thread::sleep(std::time::Duration::from_millis(50 * tried));
        }
    }

    fn connect(&self, url: &DatabaseUrl) -> Result<Db, SqlError> {
        let mut db = Db::postgres(url)?;
        super::tables::open_schema(&mut db)?;
        match self.strict {
            true => db.set_strict()?,
            false => db.set_session("SET synchronous_commit = off")?,
        }
        Ok(db)
    }

    /// One transaction: the lines, then the latest thread.json of each thread; waiting for
    /// the disk (a write of its own, so its commit flushes) when the batch holds a `Sync`.
    fn commit(&self, db: &mut Db, batch: &[Op], marker: &str, again: bool) -> Result<(), SqlError> {
        let sync = !self.strict && batch.iter().any(|o| matches!(o, Op::Sync));
        db.begin_unlocked(match sync {
            true => "SET LOCAL synchronous_commit = on",
            false => "",
        })?;
        let mut lines = Vec::new();
        let mut docs: Vec<(&Arc<str>, &Vec<u8>)> = Vec::new();
        let mut doc_at: std::collections::HashMap<&Arc<str>, usize> = Default::default();
        for op in batch {
            match op {
                Op::Line { thread, seq, line } => lines.extend([
                    Value::Text(thread.to_string()),
                    Value::Int(*seq),
                    Value::Blob(line.clone()),
                ]),
                Op::Doc { thread, doc } => match doc_at.get(thread) {
                    Some(&i) => docs[i].1 = doc,
                    None => {
                        doc_at.insert(thread, docs.len());
                        docs.push((thread, doc));
                    }
                },
                Op::Sync => {}
            }
        }
        let docs: Vec<Value> = docs
            .into_iter()
            .flat_map(|(t, d)| [Value::Text(t.to_string()), Value::Blob(d.clone())])
            .collect();
        let missing = match again {
            true => " ON CONFLICT(thread, seq) DO NOTHING",
            false => "",
        };
        let done = db
            .insert_rows(
                "INSERT INTO transcript_lines(thread, seq, line)",
                missing,
                3,
                &lines,
            )
            .and_then(|()| {
                db.insert_rows(
                    "INSERT INTO thread_docs(thread, doc)",
                    " ON CONFLICT(thread) DO UPDATE SET doc=excluded.doc",
                    2,
                    &docs,
                )
            })
            .and_then(|()| match sync {
                true => db.execute_later(
                    "INSERT INTO record_syncs(writer, n) VALUES(?1, 1)
                     ON CONFLICT(writer) DO UPDATE SET n = record_syncs.n + 1",
                    params![marker],
                ),
                false => Ok(()),
            });
        match done {
            Ok(()) => db.commit(),
            Err(e) => {
                db.rollback();
                Err(e)
            }
        }
    }
}

/// The thread of a line whose key exists (Postgres names it: `Key (thread, seq)=(id, 3)`).
fn conflicting(e: &SqlError) -> Option<String> {
    let at = e.0.find("Key (thread, seq)=(")? + "Key (thread, seq)=(".len();
    let rest = &e.0[at..];
    let end = rest.rfind(", ")?;
    Some(rest[..end].to_string())
}
