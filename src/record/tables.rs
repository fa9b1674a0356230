//! The thread records' tables on a database server (`transcript_lines`, `thread_docs`,
//! `anchor_lines`, `record_syncs`): their schema, and how `weft copy` fills them from files.

use crate::sql::{migrate, params, Db, SqlError, Step};

/// The records' tables, step by step (see `sql/migrate.rs`).
const STEPS: &[Step] = &[Step {
    sql: "CREATE TABLE IF NOT EXISTS transcript_lines(thread TEXT NOT NULL, seq INTEGER NOT NULL,
           line BLOB NOT NULL, PRIMARY KEY(thread, seq));
         CREATE TABLE IF NOT EXISTS thread_docs(thread TEXT PRIMARY KEY, doc BLOB NOT NULL);
         CREATE TABLE IF NOT EXISTS anchor_lines(n INTEGER PRIMARY KEY, line BLOB NOT NULL);
         CREATE TABLE IF NOT EXISTS record_syncs(writer TEXT PRIMARY KEY, n INTEGER NOT NULL);",
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
