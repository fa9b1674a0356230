//! The SQLite side of `Db` (`sql/mod.rs`): opening a file in WAL mode, the write lock taken without
//! stalling the async workers, and values in and out.

use super::value::{Row, SqlError, Value};
use super::workers::off_workers;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;
use std::path::Path;

/// How long a writer waits for another process to release a database's write lock.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Opens (creating unless `read_only`) the database file `path` in WAL mode.
pub(super) fn open(path: &Path, read_only: bool) -> Result<Connection, SqlError> {
    let named = |e: rusqlite::Error| {
        let hint = if read_only {
            " (run `weft init` and `weft run` first)"
        } else {
            ""
        };
        SqlError(format!("{}: {e}{hint}", path.display()))
    };
    if read_only {
        let db = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(named)?;
        db.busy_timeout(BUSY_TIMEOUT).map_err(named)?;
        return Ok(db);
    }
    let db = Connection::open(path).map_err(named)?;
    setup_with_retry(&db, |db| {
        db.execute_batch(
            "PRAGMA busy_timeout=5000; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        )
    })
    .map_err(named)?;
    Ok(db)
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            Value::Int(v) => ToSqlOutput::Borrowed(ValueRef::Integer(*v)),
            Value::Real(v) => ToSqlOutput::Borrowed(ValueRef::Real(*v)),
            Value::Text(t) => ToSqlOutput::Borrowed(ValueRef::Text(t.as_bytes())),
            Value::Blob(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
        })
    }
}

fn value_of(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

pub(super) fn execute(db: &Connection, sql: &str, params: &[Value]) -> Result<u64, SqlError> {
    let n = db
        .prepare_cached(sql)
        .and_then(|mut st| st.execute(rusqlite::params_from_iter(params)))
        .map_err(SqlError::new)?;
    Ok(n as u64)
}

pub(super) fn query(db: &Connection, sql: &str, params: &[Value]) -> Result<Vec<Row>, SqlError> {
    let mut st = db.prepare_cached(sql).map_err(SqlError::new)?;
    let n = st.column_count();
    let rows = st
        .query_map(rusqlite::params_from_iter(params), |r| {
            (0..n)
                .map(|i| r.get_ref(i).map(value_of))
                .collect::<rusqlite::Result<Vec<Value>>>()
                .map(Row)
        })
        .map_err(SqlError::new)?;
    rows.collect::<rusqlite::Result<Vec<Row>>>()
        .map_err(SqlError::new)
}

/// `BEGIN IMMEDIATE` (the write lock, taken now). The usual case — no other process writing —
/// takes it at once on the actor's worker; only when the lock is held elsewhere is the wait (up
/// to [`BUSY_TIMEOUT`]) moved off the async workers. The fast path stays free of the hand-off's
/// cost (tens of µs per commit, measured in the per-turn benchmark).
pub(super) fn begin_immediate(db: &Connection) -> rusqlite::Result<()> {
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
pub(super) fn commit(db: &Connection, fsyncs: bool) -> rusqlite::Result<()> {
    if fsyncs {
        off_workers(|| db.execute_batch("COMMIT"))
    } else {
        db.execute_batch("COMMIT")
    }
}

/// Runs `setup` (a new connection's pragmas and schema), again while another process holds the
/// database (up to 10 s): switching a fresh database to WAL can answer "locked" at once, without
/// waiting out the busy timeout, when another process is creating it at the same moment.
fn setup_with_retry(
    db: &Connection,
    setup: impl Fn(&Connection) -> rusqlite::Result<()>,
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
