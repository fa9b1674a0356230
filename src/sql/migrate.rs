//! Schema versions: each concern (registry, ledger, store) has a list of forward steps; the
//! table `weft_schema` records how many of them a database has had. Opening a database runs the
//! missing steps in one write transaction (so two processes opening at once apply each step
//! once) and refuses a database whose version is newer than this binary knows, naming both.

use super::{Db, Engine, Lock, SqlError};

/// One forward step: DDL in the shared dialect. On Postgres `INTEGER` columns become `BIGINT`
/// and `BLOB` columns `BYTEA` (SQLite's INTEGER is 64 bits), and `TEXT` columns collate
/// byte-wise (`COLLATE "C"`, as SQLite compares text: orders and ties come out the same
/// whatever the database's locale); `postgres`, when given, replaces the text there (for what
/// only one engine has, such as full-text search).
pub(crate) struct Step {
    /// The DDL.
    pub(crate) sql: &'static str,
    /// Postgres's own DDL for this step, when it differs beyond the column types.
    pub(crate) postgres: Option<&'static str>,
}

/// The DDL of `step` for `engine`.
fn ddl(step: &Step, engine: Engine) -> String {
    match (engine, step.postgres) {
        (Engine::Sqlite, _) => step.sql.to_string(),
        (Engine::Postgres, Some(pg)) => pg.replace(" TEXT", " TEXT COLLATE \"C\""),
        (Engine::Postgres, None) => step
            .sql
            .replace(" INTEGER", " BIGINT")
            .replace(" BLOB", " BYTEA")
            .replace(" TEXT", " TEXT COLLATE \"C\""),
    }
}

/// Brings `concern`'s schema up to date with `steps`; refused (and nothing changed) when the
/// database is newer. Returns the version found before.
pub(crate) fn migrate(db: &mut Db, concern: &str, steps: &[Step]) -> Result<u64, SqlError> {
    // Up to date: nothing to write, no DDL (a role allowed only to read and write rows opens
    // a database another role set up).
    if let Some(found) = check(db, concern, steps)? {
        if found == steps.len() as u64 {
            return Ok(found);
        }
    }
    db.begin_write(Lock::Schema)?;
    let done = apply(db, concern, steps);
    match done {
        Ok(found) => {
            db.commit()?;
            Ok(found)
        }
        Err(e) => {
            db.rollback();
            Err(e)
        }
    }
}

/// The version of `concern`'s schema found (None: no version table yet), refused when it is
/// newer than `steps`. Writes nothing.
pub(crate) fn check(db: &Db, concern: &str, steps: &[Step]) -> Result<Option<u64>, SqlError> {
    let exists = match db.engine() {
        Engine::Sqlite => "SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name='weft_schema'",
        Engine::Postgres => "SELECT CAST(COUNT(*) AS BIGINT) FROM pg_catalog.pg_tables WHERE tablename='weft_schema' AND schemaname = ANY(current_schemas(false))",
    };
    if db.row(exists, &[])?.map_or(Ok(0), |r| r.int(0))? == 0 {
        return Ok(None);
    }
    let found = version_of(db, concern)?;
    refuse_newer(concern, found, steps.len() as u64)?;
    Ok(Some(found))
}

/// `concern`'s version in `weft_schema` (0 without a row).
fn version_of(db: &Db, concern: &str) -> Result<u64, SqlError> {
    match db.row(
        "SELECT version FROM weft_schema WHERE concern=?1",
        super::params![concern],
    )? {
        Some(r) => r.uint(0),
        None => Ok(0),
    }
}

fn refuse_newer(concern: &str, found: u64, known: u64) -> Result<(), SqlError> {
    if found > known {
        return Err(SqlError(format!(
            "the {concern} schema in this database is version {found}, newer than this weft knows ({known}): a newer weft wrote it; upgrade weft (older binaries never change a newer schema)"
        )));
    }
    Ok(())
}

fn apply(db: &mut Db, concern: &str, steps: &[Step]) -> Result<u64, SqlError> {
    db.batch(
        "CREATE TABLE IF NOT EXISTS weft_schema(concern TEXT PRIMARY KEY, version BIGINT NOT NULL)",
    )?;
    let found = version_of(db, concern)?;
    let known = steps.len() as u64;
    refuse_newer(concern, found, known)?;
    for (n, step) in steps.iter().enumerate().skip(found as usize) {
        db.batch(&ddl(step, db.engine()))
            .map_err(|e| SqlError(format!("{concern} schema step {}: {e}", n + 1)))?;
    }
    if found < known {
        db.execute(
            "INSERT INTO weft_schema(concern, version) VALUES(?1, ?2)
             ON CONFLICT(concern) DO UPDATE SET version=excluded.version",
            super::params![concern, known],
        )?;
    }
    Ok(found)
}
