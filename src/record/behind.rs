//! The write-behind queue of thread records on a database server: a line or a thread.json is
//! queued and the thread goes on; one writer thread per process commits everything queued in
//! one transaction (multi-row inserts), so ten thousand threads writing at once cost a few
//! commits a millisecond, not one round trip each.
//!
//! What a later step relies on is committed before that step (the files' rule, "written to the
//! OS before the step that depends on it", with the server in the OS's place): a read, a
//! checkpoint, a thread.json written with fsync, the ledger's commit (a call's cost is in the
//! transcript before its settlement is stored: `barrier_all`), a tool's run and a thread's end
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
    fn thread(&self) -> Option<&Arc<str>> {
        match self {
            Op::Line { thread, .. } | Op::Doc { thread, .. } => Some(thread),
            Op::Sync => None,
        }
    }
}

/// More queued than this and a writer waits (memory stays bounded when the server is slow).
const MAX_QUEUED: usize = 50_000;
/// At most this many records per transaction.
const MAX_BATCH: usize = 8_192;

#[derive(Default)]
struct State {
    ops: Vec<Op>,
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

/// Every queue of the process (for [`barrier_all`]).
static ALL: Mutex<Vec<Weak<Behind>>> = Mutex::new(Vec::new());

/// Waits until every record queued in this process so far is committed: before the ledger
/// stores a settlement (a call's cost is in its transcript first).
pub(crate) fn barrier_all() {
    let all: Vec<Arc<Behind>> = match ALL.lock() {
        Ok(mut v) => {
            v.retain(|w| w.strong_count() > 0);
            v.iter().filter_map(Weak::upgrade).collect()
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
        let (me, url) = (behind.clone(), url.clone());
        std::thread::Builder::new()
            .name("weft-records".into())
            .spawn(move || me.serve(&url))?;
        if let Ok(mut all) = ALL.lock() {
            all.push(Arc::downgrade(&behind));
        }
        Ok(behind)
    }

    /// Queues `op`; returns its ticket. Refused when its thread's records failed.
    pub(crate) fn push(&self, op: Op) -> io::Result<u64> {
        let mut s = self.state.lock().map_err(|_| lost())?;
        if let Some(e) = op.thread().and_then(|t| s.failed.get(t)) {
            return Err(io::Error::other(e.clone()));
        }
        while s.ops.len() >= MAX_QUEUED {
            s = crate::sql::off_workers(|| self.settled.wait(s)).map_err(|_| lost())?;
        }
        s.queued += 1;
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
                let batch: Vec<Op> = s.ops.drain(..n).collect();
                let last = s.done + batch.len() as u64;
                (batch, last)
            };
            let written = self.write(&mut db, url, &batch, &marker);
            if let Ok(mut s) = self.state.lock() {
                if let Err(e) = written {
                    tracing::error!("thread records not stored: {e}");
                    for t in batch.iter().filter_map(Op::thread) {
                        s.failed
                            .entry(t.clone())
                            .or_insert_with(|| format!("records not stored: {e}"));
                    }
                }
                s.done = last;
            }
            self.settled.notify_all();
        }
    }

    /// Commits `batch`, on a new connection if the first try fails (a failed transaction
    /// stored nothing, so a second try cannot store twice; a commit whose answer was lost
    /// is found by the second try's conflict on the lines' keys, and fails).
    fn write(
        &self,
        db: &mut Option<Db>,
        url: &DatabaseUrl,
        batch: &[Op],
        marker: &str,
    ) -> Result<(), SqlError> {
        let mut tried = 0;
        loop {
            let conn = match db.take() {
                Some(c) => Ok(c),
                None => self.connect(url),
            };
            let result = conn.and_then(|mut c| {
                let r = self.commit(&mut c, batch, marker);
                if r.is_ok() || !c.in_tx() {
                    *db = Some(c);
                }
                r
            });
            tried += 1;
            match result {
                Ok(()) => return Ok(()),
                Err(e) if tried >= 3 => return Err(e),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(50 * tried)),
            }
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
    fn commit(&self, db: &mut Db, batch: &[Op], marker: &str) -> Result<(), SqlError> {
        let sync = !self.strict && batch.iter().any(|o| matches!(o, Op::Sync));
        db.begin_unlocked(match sync {
            true => "SET LOCAL synchronous_commit = on",
            false => "",
        })?;
        let mut lines = Vec::new();
        let mut docs: Vec<(&Arc<str>, &Vec<u8>)> = Vec::new();
        for op in batch {
            match op {
                Op::Line { thread, seq, line } => lines.push(vec![
                    Value::Text(thread.to_string()),
                    Value::Int(*seq),
                    Value::Blob(line.clone()),
                ]),
                Op::Doc { thread, doc } => match docs.iter_mut().find(|(t, _)| *t == thread) {
                    Some(d) => d.1 = doc,
                    None => docs.push((thread, doc)),
                },
                Op::Sync => {}
            }
        }
        let docs: Vec<Vec<Value>> = docs
            .into_iter()
            .map(|(t, d)| vec![Value::Text(t.to_string()), Value::Blob(d.clone())])
            .collect();
        let done = insert_rows(
            db,
            "INSERT INTO transcript_lines(thread, seq, line)",
            "",
            3,
            &lines,
        )
        .and_then(|()| {
            insert_rows(
                db,
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

/// `rows` inserted by `head VALUES (…),(…)… tail`, in statements of 256, 32, 4 or 1 rows (a
/// few prepared statements, whatever the batch's size), queued to go with the commit.
fn insert_rows(
    db: &Db,
    head: &str,
    tail: &str,
    cols: usize,
    rows: &[Vec<Value>],
) -> Result<(), SqlError> {
    let mut rest = rows;
    while !rest.is_empty() {
        let n = [256, 32, 4, 1]
            .into_iter()
            .find(|n| *n <= rest.len())
            .unwrap_or(1);
        let (now, later) = rest.split_at(n);
        let marks: Vec<String> = (0..n)
            .map(|r| {
                let cells: Vec<String> = (1..=cols).map(|c| format!("?{}", r * cols + c)).collect();
                format!("({})", cells.join(","))
            })
            .collect();
        let values: Vec<Value> = now.iter().flatten().cloned().collect();
        db.execute_later(&format!("{head} VALUES {}{tail}", marks.join(",")), &values)?;
        rest = later;
    }
    Ok(())
}
