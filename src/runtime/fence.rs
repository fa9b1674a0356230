//! Fencing (SPEC §13): a node whose lease ran out must write nothing more, since another node
//! may already have claimed its threads and be finishing their records. The database enforces
//! it, so no road can forget: every connection a node opens names its owner number
//! (`SET weft.owner`, `sql/pg.rs`), and a statement trigger on every table of the project's
//! database refuses an insert, update or delete from a session whose owner's lease is not
//! running by the database's clock. Sessions of other processes name no owner and pass. The
//! nodes table itself is not fenced (a lease is renewed, given up and taken there).
//!
//! A write checked before the lease ran out that commits after it is ordered by the rows it
//! touches: a claimer's update of the same row waits for it, and a transcript line's key can be
//! taken once. A claimer judges a lease by the same clock, so anything it reads as expired can
//! take no further write.

use super::node::NodeError;
use crate::sql::{Db, Engine, Lock};

/// The trigger function: refuses the statement of a session whose node's lease is not running.
const FENCE: &str = r#"CREATE OR REPLACE FUNCTION weft_fence() RETURNS trigger LANGUAGE plpgsql AS $f$
DECLARE o text := current_setting('weft.owner', true);
BEGIN
  IF o IS NULL OR o = '' THEN RETURN NULL; END IF;
  IF NOT EXISTS (SELECT 1 FROM nodes WHERE owner = o::bigint
       AND expires_at_ms > CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)) THEN
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

/// Puts the fence on every table of `db`'s schema that lacks it (nothing on SQLite, whose
/// nodes share one machine and judge each other by owner locks). Returns how many it fenced;
/// no DDL at all when every table has it.
pub(crate) fn install(db: &mut Db) -> Result<usize, NodeError> {
    if db.engine() == Engine::Sqlite {
        return Ok(0);
    }
    if db.query(UNFENCED, &[])?.is_empty() {
        return Ok(0);
    }
    db.begin_write(Lock::Schema)?;
    let done = (|| {
        let tables = db.query(UNFENCED, &[])?;
        db.batch(FENCE)?;
        for t in &tables {
            let name = t.text(0)?;
            db.batch(&format!(
                "CREATE OR REPLACE TRIGGER weft_fence BEFORE INSERT OR UPDATE OR DELETE ON \"{}\"
                 FOR EACH STATEMENT EXECUTE FUNCTION weft_fence()",
                name.replace('"', "\"\"")
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
