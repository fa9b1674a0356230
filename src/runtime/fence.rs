//! Fencing (SPEC §13): a node whose lease ran out must write nothing more, since another node
//! may already have claimed its threads and be finishing their records. The database enforces
//! it, so no road can forget: every connection a node opens names its owner number
//! (`SET weft.owner`, `sql/pg.rs`), and a statement trigger on every table of the project's
//! database refuses an insert, update or delete from a session whose owner's lease is not
//! running by the database's clock. Sessions of other processes name no owner and pass. The
//! nodes table itself is not fenced (a lease is renewed, given up and taken there).
//!
//! The check holds the node's row in KEY SHARE until the writing transaction ends, and a node
//! adopts a dead owner's threads only after burying it (`node::bury`: the row locked FOR UPDATE,
//! which waits for every transaction of that owner still in flight, and its lease set to 0,
//! which no renewal can extend). So a write that passed the check before the lease ran out is
//! committed before the adoption starts, and none passes after; a takeover of the name locks the
//! row the same way. The check costs one row lock per statement of a node's session.

// Used by `weft serve --node` (the `cli` feature) only.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use super::node::NodeError;
use crate::sql::{Db, Engine, Lock};

/// The trigger function: refuses the statement of a session whose node's lease is not running.
const FENCE: &str = r#"CREATE OR REPLACE FUNCTION weft_fence() RETURNS trigger LANGUAGE plpgsql AS $f$
-- weft fence v2
DECLARE o text := current_setting('weft.owner', true);
BEGIN
  IF o IS NULL OR o = '' THEN RETURN NULL; END IF;
  -- KEY SHARE until this transaction ends: a node burying this owner (`node::bury`) waits for it.
  PERFORM 1 FROM nodes WHERE owner = o::bigint
    AND expires_at_ms > CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)
    FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'weft node owner % lost its lease: another node adopts its threads; this node writes nothing more', o
      USING ERRCODE = 'WF001';
  END IF;
  RETURN NULL;
END $f$"#;

/// Tables of the project's schema with no fence yet (`nodes` and `weft_schema` are never
/// fenced).
const UNFENCED: &str = "SELECT c.relname FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
    AND c.relname NOT IN ('nodes', 'weft_schema')
    AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                    WHERE t.tgrelid = c.oid AND t.tgname = 'weft_fence')
  ORDER BY c.relname";

/// Whether the trigger function is this version's (an older one is replaced).
fn current(db: &Db) -> Result<bool, NodeError> {
    let src = db.row(
        "SELECT prosrc FROM pg_catalog.pg_proc WHERE proname = 'weft_fence' LIMIT 1",
        &[],
    )?;
    Ok(src
        .and_then(|r| r.text(0).ok())
        .is_some_and(|s| s.contains("weft fence v2")))
}

/// Puts the fence on every table of `db`'s schema that lacks it (nothing on SQLite, whose
/// nodes share one machine and judge each other by owner locks). Returns how many it fenced;
/// no DDL at all when every table has it.
pub(crate) fn install(db: &mut Db) -> Result<usize, NodeError> {
    if db.engine() == Engine::Sqlite {
        return Ok(0);
    }
    if db.query(UNFENCED, &[])?.is_empty() && current(db)? {
        return Ok(0);
    }
    db.begin_write(Lock::Schema)?;
    let done = (|| {
        let tables = db.query(UNFENCED, &[])?;
        db.batch(FENCE)?;
        for t in &tables {
            let name = t.text(0)?;
            let table = name.replace('"', "\"\"");
            // (DROP and CREATE rather than CREATE OR REPLACE TRIGGER: Postgres 12 and 13 too.)
            db.batch(&format!(
                "DROP TRIGGER IF EXISTS weft_fence ON \"{table}\";
                 CREATE TRIGGER weft_fence BEFORE INSERT OR UPDATE OR DELETE ON \"{table}\"
                 FOR EACH STATEMENT EXECUTE FUNCTION weft_fence()"
            ))?;
        }
        Ok::<usize, crate::sql::SqlError>(tables.len())
    })();
    match done {
        Ok(n) => {
            db.commit()?;
            Ok(n)
        }
        Err(e) => {
            db.rollback();
            Err(e.into())
        }
    }
}

/// Fences every table of `project`'s database (nothing on SQLite).
pub(crate) fn fence_now(project: &crate::project::Project) -> Result<(), NodeError> {
    match super::node::open(project, true)? {
        Some(mut db) => install(&mut db).map(|_| ()),
        None => Ok(()),
    }
}
