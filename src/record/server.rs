//! Thread records on a database server (a project whose config names a Postgres database): the
//! same bytes the files hold, in three tables — `transcript_lines` (one row per line, keyed by
//! thread and seq: a second line at a seq is refused, as a transcript file is never rewritten),
//! `thread_docs` (each thread's signed thread.json) and `anchor_lines` (the anchor log's
//! lines in order). A line is committed before its append returns, so a killed process loses
//! none it reported written, and no line is ever torn.
//!
//! Connections: a few per process, taken for one statement and given back (records are
//! written by many thread actors at once; one connection would serialize them all).

use crate::core::ids::{sha256_hex, GENESIS};
use crate::sql::{migrate, params, DatabaseUrl, Db, Lock, SqlError, Step};
use std::io;
use std::sync::Mutex;

/// The records' tables, step by step (see `sql/migrate.rs`).
const STEPS: &[Step] = &[Step {
    sql: "CREATE TABLE IF NOT EXISTS transcript_lines(thread TEXT NOT NULL, seq INTEGER NOT NULL,
           line BLOB NOT NULL, PRIMARY KEY(thread, seq));
         CREATE TABLE IF NOT EXISTS thread_docs(thread TEXT PRIMARY KEY, doc BLOB NOT NULL);
         CREATE TABLE IF NOT EXISTS anchor_lines(n INTEGER PRIMARY KEY, line BLOB NOT NULL);",
    postgres: None,
}];

/// Brings the records' tables of `db` up to date (see `sql/migrate.rs`).
pub(crate) fn open_schema(db: &mut Db) -> Result<(), SqlError> {
    migrate(db, "records", STEPS).map(|_| ())
}

/// The records' tables.
pub(crate) const TABLES: [&str; 3] = ["transcript_lines", "thread_docs", "anchor_lines"];

/// Queues (see `Db::execute_later`) a file's records as the server keeps them: a transcript's
/// lines, a thread.json, the anchor log's lines. The bytes must be whole lines (ending in a
/// newline): a torn last line is refused by the caller. Returns how many rows.
pub(crate) fn queue_copy(db: &Db, what: Copy<'_>) -> Result<u64, SqlError> {
    let lines = |bytes: &'_ [u8]| -> Vec<Vec<u8>> {
        bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    };
    match what {
        Copy::Transcript(thread, bytes) => {
            let all = lines(bytes);
            for (seq, line) in all.iter().enumerate() {
                db.execute_later(
                    "INSERT INTO transcript_lines(thread, seq, line) VALUES(?1, ?2, ?3)",
                    params![thread, seq as i64, line.clone()],
                )?;
            }
            Ok(all.len() as u64)
        }
        Copy::Doc(thread, bytes) => db
            .execute_later(
                "INSERT INTO thread_docs(thread, doc) VALUES(?1, ?2)",
                params![thread, bytes.to_vec()],
            )
            .map(|_| 1),
        Copy::Anchors(bytes) => {
            let all = lines(bytes);
            for (n, line) in all.iter().enumerate() {
                db.execute_later(
                    "INSERT INTO anchor_lines(n, line) VALUES(?1, ?2)",
                    params![n as i64 + 1, line.clone()],
                )?;
            }
            Ok(all.len() as u64)
        }
    }
}

/// What [`queue_copy`] copies.
pub(crate) enum Copy<'a> {
    /// A thread's transcript file.
    Transcript(&'a str, &'a [u8]),
    /// A thread's thread.json file.
    Doc(&'a str, &'a [u8]),
    /// The anchor log file.
    Anchors(&'a [u8]),
}

/// Idle connections kept for the next statement.
const KEEP_IDLE: usize = 8;

/// The records' tables on one database, and this process's connections to it.
pub(crate) struct Server {
    url: DatabaseUrl,
    /// `durability: strict`: each commit waits for the server's disk.
    strict: bool,
    idle: Mutex<Vec<Db>>,
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
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The database, as shown (password masked).
    pub(crate) fn shown(&self) -> String {
        self.url.to_string()
    }

    /// Runs `f` on a connection of the pool (made, its schema brought up to date, if none is
    /// idle); a connection left inside a transaction is dropped, not kept.
    fn with<T>(&self, f: impl FnOnce(&mut Db) -> Result<T, SqlError>) -> io::Result<T> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        let mut db = match idle {
            Some(db) => db,
            None => self.connect().map_err(failed)?,
        };
        let out = f(&mut db);
        if db.in_tx() {
            db.rollback();
        }
        if let Ok(mut v) = self.idle.lock() {
            if v.len() < KEEP_IDLE {
                v.push(db);
            }
        }
        out.map_err(failed)
    }

    fn connect(&self) -> Result<Db, SqlError> {
        let mut db = Db::postgres(&self.url)?;
        migrate(&mut db, "records", STEPS)?;
        if self.strict {
            db.set_strict()?;
        }
        Ok(db)
    }

    /// Stores line `seq` of `thread`'s transcript (`line` without its newline); refused if
    /// that line exists.
    pub(crate) fn append_line(&self, thread: &str, seq: i64, line: &[u8]) -> io::Result<()> {
        self.with(|db| {
            db.execute(
                "INSERT INTO transcript_lines(thread, seq, line) VALUES(?1, ?2, ?3)",
                params![thread, seq, line.to_vec()],
            )
        })
        .map(|_| ())
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

    /// Stores `thread`'s signed thread.json, replacing the one before in one statement.
    pub(crate) fn put_doc(&self, thread: &str, doc: &[u8]) -> io::Result<()> {
        self.with(|db| {
            db.execute(
                "INSERT INTO thread_docs(thread, doc) VALUES(?1, ?2)
                 ON CONFLICT(thread) DO UPDATE SET doc=excluded.doc",
                params![thread, doc.to_vec()],
            )
        })
        .map(|_| ())
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

    /// Appends the line `make` builds from the hash of the last one to the anchor log, under
    /// the records' write lock: appends from every process on the database take turns, so the
    /// chain never forks.
    pub(crate) fn append_anchor(&self, make: &mut dyn FnMut(&str) -> Vec<u8>) -> io::Result<()> {
        self.with(|db| {
            db.begin_write(Lock::Records)?;
            let last = db.row(
                "SELECT n, line FROM anchor_lines ORDER BY n DESC LIMIT 1",
                &[],
            )?;
            let (n, prev) = match &last {
                Some(r) => (r.int(0)? + 1, sha256_hex(&r.blob(1)?)),
                None => (1, GENESIS.to_string()),
            };
            let line = make(&prev);
            db.execute(
                "INSERT INTO anchor_lines(n, line) VALUES(?1, ?2)",
                params![n, line],
            )?;
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
