//! registry.db: schema, queries, and spawn admission inside the batch transaction.

use super::admission::{admit_child, admit_sql, admitted_values, register_in};
use super::columns::{read_row, COLS};
use super::updates::{row_values, Held, Statistics};
use super::{st, Admission, RegistryError, ThreadFilter, ThreadRow};
use crate::core::ids::ThreadId;
use crate::core::status::Status;
use crate::sql::{params, DatabaseUrl, Db, Engine, Lock, Step, Value};
use std::path::Path;

/// SQL access to the registry: registry.db, or the `threads` table of the project's Postgres
/// database (the same SQL; see `sql/`).
pub struct Store {
    db: Db,
    /// Registrations of this batch whose admission its commit decides (Postgres): the
    /// ticket of the conditional insert, the child and its admission.
    deciding: Vec<(u64, ThreadId, Admission)>,
    /// Children the last commit refused, with why.
    refused: Vec<(ThreadId, RegistryError)>,
    /// Row updates of the open batch on Postgres, written before anything reads or registers
    /// and before the commit ([`Store::db`]).
    held: Held,
    /// When the server analyzes `threads` (Postgres).
    stats: Statistics,
}

/// The registry's schema, step by step (see `sql/migrate.rs`).
const SCHEMA: &[Step] = &[Step {
    sql: "CREATE TABLE IF NOT EXISTS threads(
           id TEXT PRIMARY KEY, directive TEXT NOT NULL, parent TEXT, root TEXT NOT NULL,
           status TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
           model TEXT NOT NULL, turns INTEGER NOT NULL DEFAULT 0, tokens_in INTEGER NOT NULL DEFAULT 0,
           tokens_out INTEGER NOT NULL DEFAULT 0, own_spend INTEGER NOT NULL DEFAULT 0,
           spend INTEGER NOT NULL DEFAULT 0, spawn_count INTEGER NOT NULL DEFAULT 0,
           result TEXT, outputs TEXT, error TEXT, owner_pid INTEGER NOT NULL,
           continuation_of TEXT, chain_root TEXT, waiting TEXT, status_text TEXT,
           forked_from TEXT, meta TEXT);
         CREATE INDEX IF NOT EXISTS threads_parent ON threads(parent, status);
         CREATE INDEX IF NOT EXISTS threads_status ON threads(status);",
    postgres: None,
}];

/// A running thread's row brought up to date (never out of a terminal state). No `NOT IN`
/// list: SQLite builds a temporary b-tree for one on every run (~90 KB of pages).
const UPDATE_ROW: &str =
    "UPDATE threads SET status=?2, updated_at=?3, turns=?4, tokens_in=?5, tokens_out=?6,
       own_spend=?7, spend=?8, result=?9, outputs=?10, error=?11, waiting=?12, status_text=?13
     WHERE id=?1 AND status<>'completed' AND status<>'error' AND status<>'cancelled'
       AND status<>'continued'";

impl Store {
    /// Opens (creating) the registry file `path`.
    pub fn open(path: &Path) -> Result<Store, RegistryError> {
        Store::open_at(None, path)
    }

    /// Opens (creating) the registry on the Postgres database `url`, or in the file `path`
    /// when `url` is None; brings its schema up to date.
    pub fn open_at(url: Option<&DatabaseUrl>, path: &Path) -> Result<Store, RegistryError> {
        let mut db = Db::open(url, path, false).map_err(st)?;
        let found = crate::sql::migrate(&mut db, "registry", SCHEMA).map_err(st)?;
        if found == 0 && db.engine() == Engine::Sqlite {
            legacy_columns(&db)?;
        }
        Ok(Store {
            db,
            deciding: Vec::new(),
            refused: Vec::new(),
            held: Held::default(),
            stats: Statistics::default(),
        })
    }

    /// `durability: strict`: every commit reaches the disk before it returns
    /// (`synchronous=FULL`; the default NORMAL may lose the last commits on power loss).
    pub(crate) fn set_strict(&mut self) -> Result<(), RegistryError> {
        self.db.set_strict().map_err(st)
    }

    /// Opens (creating) `project`'s registry wherever its config keeps it.
    pub fn of_project(project: &crate::project::Project) -> Result<Store, RegistryError> {
        let config = project
            .config()
            .map_err(|e| RegistryError::Storage(e.to_string()))?;
        Store::open_at(
            config.database.as_ref(),
            &project.state_dir().join("registry.db"),
        )
    }

    /// Opens `project`'s registry read-only wherever its config keeps it.
    pub fn read_project(project: &crate::project::Project) -> Result<Store, RegistryError> {
        let config = project
            .config()
            .map_err(|e| RegistryError::Storage(e.to_string()))?;
        Store::open_read_only_at(
            config.database.as_ref(),
            &project.state_dir().join("registry.db"),
        )
    }

    /// Opens read-only (for `threads`, `show`, `verify` in another process).
    pub fn open_read_only(path: &Path) -> Result<Store, RegistryError> {
        Store::open_read_only_at(None, path)
    }

    /// Opens read-only on `url`, or the file `path` when `url` is None.
    pub fn open_read_only_at(
        url: Option<&DatabaseUrl>,
        path: &Path,
    ) -> Result<Store, RegistryError> {
        let db = Db::open(url, path, true).map_err(st)?;
        // An older weft never reads a newer schema as if it knew it.
        crate::sql::check(&db, "registry", SCHEMA).map_err(st)?;
        Ok(Store {
            db,
            deciding: Vec::new(),
            refused: Vec::new(),
            held: Held::default(),
            stats: Statistics::default(),
        })
    }

    /// The database, the held row updates queued first: every statement after them sees them.
    fn db(&self) -> &Db {
        self.held.write(&self.db);
        &self.db
    }

    /// [`Store::db`], for a transaction or a commit.
    fn db_mut(&mut self) -> &mut Db {
        self.held.write(&self.db);
        &mut self.db
    }

    /// Opens the batch transaction if none is open (the registry's write lock is taken now).
    pub fn begin_batch(&mut self) -> Result<(), RegistryError> {
        self.db.begin_write(Lock::Registry).map_err(st)
    }

    /// Commits the batch transaction, if one is open; then the admissions it decided are
    /// known ([`Store::take_refused`]).
    pub fn commit_batch(&mut self) -> Result<(), RegistryError> {
        let done = self.db_mut().commit().map_err(st);
        if done.is_ok() {
            self.stats.refresh(&self.db);
        }
        let counts = self.db.take_counts();
        for (ticket, child, admit) in std::mem::take(&mut self.deciding) {
            if done.is_ok() && counts.get(&ticket) != Some(&1) {
                let why = self.refusal(&admit);
                self.refused.push((child, why));
            }
        }
        done
    }

    /// The children the last commits refused (their rows were not inserted), with why.
    pub fn take_refused(&mut self) -> Vec<(ThreadId, RegistryError)> {
        std::mem::take(&mut self.refused)
    }

    /// Why the parent of `a` refused a child, read after the commit that refused it (the
    /// decision is the commit's; the numbers are those of now).
    fn refusal(&self, a: &Admission) -> RegistryError {
        match admit_child(self.db(), a) {
            Err(e) => e,
            // Nothing refuses it now (a sibling ended since): it was the concurrency limit.
            Ok(()) => RegistryError::Concurrency {
                parent: a.parent.clone(),
                live: a.concurrency,
                max: a.concurrency,
            },
        }
    }

    /// Inserts a new row; with `admit`, first checks and counts the parent's spawn slots.
    /// Atomic on its own, and inside the actor's batch transaction, which holds the registry's
    /// write lock: two concurrent spawns, even from two processes, take turns. Every check
    /// reads before anything is written, so a refusal writes nothing; the two writes ride with
    /// the batch's commit.
    pub fn register(
        &mut self,
        row: &ThreadRow,
        admit: Option<&Admission>,
    ) -> Result<(), RegistryError> {
        self.stats.registered();
        // Inside the batch on Postgres without a savepoint: the writes are queued for the
        // commit, and a failed one fails the batch. On SQLite a savepoint, so a failed write
        // leaves nothing of this registration.
        if self.db.in_tx() && self.db.engine() == Engine::Postgres {
            // A child's admission rides with the commit as one conditional insert (no round
            // trip per spawn); the commit says which were refused.
            if let (Some(a), None) = (admit, &row.continuation_of) {
                let ticket = self
                    .db()
                    .execute_counted(&admit_sql(), &admitted_values(row, a))
                    .map_err(st)?;
                self.deciding.push((ticket, row.id.clone(), a.clone()));
                return Ok(());
            }
            return register_in(self.db(), row, admit);
        }
        let done = self
            .db_mut()
            .atomic(Lock::Registry, |db| register_in(db, row, admit));
        if done.is_ok() {
            self.stats.refresh(&self.db);
        }
        done
    }

    /// Writes status, cost and result fields of an existing row (never leaves a terminal state).
    /// Inside the actor's batch it rides with the commit (nothing reads its count); on
    /// Postgres it is held and written with the batch's other updates ([`Held`]).
    pub fn update(&mut self, row: &ThreadRow) -> Result<(), RegistryError> {
        if self.db.in_tx() && self.db.engine() == Engine::Postgres {
            self.held.hold(row);
            return Ok(());
        }
        self.db
            .execute_later(UPDATE_ROW, &row_values(row))
            .map_err(st)?;
        Ok(())
    }

    /// One row.
    pub fn get(&self, id: &str) -> Result<Option<ThreadRow>, RegistryError> {
        self.db()
            .row(
                &format!("SELECT {COLS} FROM threads WHERE id=?1"),
                params![id],
            )
            .map_err(st)?
            .map(|r| read_row(&r))
            .transpose()
    }

    /// Rows, newest first; `active` keeps created/running only.
    pub fn list(&self, active: bool, limit: usize) -> Result<Vec<ThreadRow>, RegistryError> {
        let filter = if active {
            "WHERE status IN ('created','running')"
        } else {
            ""
        };
        self.rows(
            &format!(
                "SELECT {COLS} FROM threads {filter} ORDER BY created_at DESC, id DESC LIMIT ?1"
            ),
            params![limit as u64],
        )
    }

    /// Every row of a tree (by root id), oldest first.
    pub fn tree(&self, root: &str) -> Result<Vec<ThreadRow>, RegistryError> {
        self.rows(
            &format!("SELECT {COLS} FROM threads WHERE root=?1 ORDER BY created_at, id"),
            params![root],
        )
    }

    /// How many rows have `status` (by the status index, without reading them).
    pub fn count(&self, status: Status) -> Result<u64, RegistryError> {
        self.db()
            .row(
                "SELECT COUNT(*) FROM threads WHERE status=?1",
                params![status.as_str()],
            )
            .map_err(st)?
            .map_or(Ok(0), |r| r.uint(0).map_err(st))
    }

    /// Rows matching `f`, newest first.
    pub fn query(&self, f: &ThreadFilter) -> Result<Vec<ThreadRow>, RegistryError> {
        let mut clauses = Vec::new();
        let mut args: Vec<Value> = Vec::new();
        let mark = |v: &str, args: &mut Vec<Value>| {
            args.push(Value::from(v));
            format!("?{}", args.len())
        };
        if !f.status.is_empty() {
            let marks: Vec<String> = f.status.iter().map(|s| mark(s, &mut args)).collect();
            clauses.push(format!("status IN ({})", marks.join(",")));
        }
        for (col, v) in [("directive", &f.directive), ("root", &f.root)] {
            if let Some(v) = v {
                clauses.push(format!("{col}={}", mark(v, &mut args)));
            }
        }
        if let Some(t) = &f.updated_since {
            clauses.push(format!("updated_at>={}", mark(t, &mut args)));
        }
        let filter = if clauses.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", clauses.join(" AND "))
        };
        args.push(Value::from(f.limit.unwrap_or(1000) as u64));
        self.rows(
            &format!(
                "SELECT {COLS} FROM threads {filter} ORDER BY created_at DESC, id DESC LIMIT ?{}",
                args.len()
            ),
            &args,
        )
    }

    /// `id`'s subtree, itself included, parents before children.
    pub fn subtree(&self, id: &str) -> Result<Vec<ThreadRow>, RegistryError> {
        self.subtree_where(id, "", "sub.depth, t.created_at, t.id")
    }

    /// The `created`/`running` rows of `id`'s subtree, itself included, deepest first.
    pub fn unfinished_subtree(&self, id: &str) -> Result<Vec<ThreadRow>, RegistryError> {
        self.subtree_where(
            id,
            "WHERE t.status IN ('created','running')",
            "sub.depth DESC, t.id",
        )
    }

    fn subtree_where(
        &self,
        id: &str,
        filter: &str,
        order: &str,
    ) -> Result<Vec<ThreadRow>, RegistryError> {
        let cols: String = COLS
            .split(',')
            .map(|c| format!("t.{c}"))
            .collect::<Vec<_>>()
            .join(",");
        self.rows(
            &format!(
                "WITH RECURSIVE sub(id, depth) AS (SELECT {}, 0
                   UNION ALL SELECT c.id, sub.depth + 1 FROM threads c JOIN sub ON c.parent = sub.id)
                 SELECT {cols} FROM threads t JOIN sub ON t.id = sub.id {filter} ORDER BY {order}",
                self.db.text_param(1)
            ),
            params![id],
        )
    }

    /// The rows weft never wrote (a bad id or status), which every many-row query leaves out:
    /// each as its raw id and what is wrong with it (`weft doctor` reports them).
    pub fn damaged(&self) -> Result<Vec<(String, RegistryError)>, RegistryError> {
        let rows = self
            .db()
            .query(&format!("SELECT {COLS} FROM threads"), &[])
            .map_err(st)?;
        let mut out = Vec::new();
        for r in rows {
            if let Err(e @ RegistryError::Corrupt { .. }) = read_row(&r) {
                let RegistryError::Corrupt { row, .. } = &e else {
                    continue;
                };
                out.push((row.clone(), e));
            }
        }
        Ok(out)
    }

    /// Rows still `created` or `running` (any owner).
    pub fn unfinished(&self) -> Result<Vec<ThreadRow>, RegistryError> {
        self.rows(
            &format!("SELECT {COLS} FROM threads WHERE status IN ('created','running')"),
            &[],
        )
    }

    /// The owners of rows still `created` or `running`.
    pub(crate) fn unfinished_owners(&self) -> Result<Vec<u32>, RegistryError> {
        let rows = self
            .db()
            .query(
                "SELECT DISTINCT owner_pid FROM threads WHERE status IN ('created','running')",
                &[],
            )
            .map_err(st)?;
        // A value weft never writes there (negative, too large) is no owner to adopt from.
        rows.iter()
            .map(|r| r.int(0).map(|o| u32::try_from(o).unwrap_or(0)).map_err(st))
            .collect()
    }

    /// Claims an unfinished row for repair: moves it from the dead owner `from` to `to` in its
    /// own committed transaction (never inside a batch). True for exactly one of several
    /// processes that race for it; false if another claimed it or it has finished meanwhile.
    pub fn claim(&mut self, id: &str, from: u32, to: u32) -> Result<bool, RegistryError> {
        debug_assert!(!self.db.in_tx());
        let n = self
            .db()
            .execute(
                "UPDATE threads SET owner_pid=?3 WHERE id=?1 AND owner_pid=?2 AND status IN ('created','running')",
                params![id, from, to],
            )
            .map_err(st)?;
        Ok(n == 1)
    }

    /// Marks a terminal row as interrupted (recovery only: its owner process is gone).
    pub fn finish_interrupted(&mut self, row: &ThreadRow) -> Result<(), RegistryError> {
        self.db()
            .execute(
                "UPDATE threads SET status=?2, updated_at=?3, spend=?4, own_spend=?5, error=?6, waiting=NULL
                 WHERE id=?1 AND status IN ('created','running')",
                params![
                    row.id.as_str(),
                    row.status.as_str(),
                    row.updated_at.as_str(),
                    row.spend_nanos,
                    row.own_spend_nanos,
                    row.error.as_deref()
                ],
            )
            .map_err(st)?;
        Ok(())
    }

    /// Links a continuation: the new row's `continuation_of`/`chain_root`, and the old row's
    /// `chain_root` when it starts the chain.
    pub fn link_continuation(
        &mut self,
        old: &str,
        new: &str,
        chain_root: &str,
    ) -> Result<(), RegistryError> {
        self.db_mut().atomic(Lock::Registry, |db| {
            db.execute(
                "UPDATE threads SET chain_root=?2 WHERE id=?1 AND chain_root IS NULL",
                params![old, chain_root],
            )
            .map_err(st)?;
            db.execute(
                "UPDATE threads SET continuation_of=?2, chain_root=?3 WHERE id=?1",
                params![new, old, chain_root],
            )
            .map_err(st)?;
            Ok(())
        })
    }

    /// Every thread of the continuation chain `id` belongs to, oldest first.
    pub fn chain(&self, id: &str) -> Result<Vec<ThreadRow>, RegistryError> {
        let Some(row) = self.get(id)? else {
            return Ok(vec![]);
        };
        let root = row.chain_root.unwrap_or(row.id);
        let rows = self.rows(
            &format!(
                "SELECT {COLS} FROM threads WHERE id=?1 OR chain_root=?1 ORDER BY created_at, id"
            ),
            params![root.as_str()],
        )?;
        // A continuation whose spawn was undone never ran: no link of the chain.
        Ok(rows.into_iter().filter(|r| !r.undone()).collect())
    }

    /// Removes the rows of `ids` (finished threads only; see `ThreadStore::delete`). Returns
    /// how many went.
    pub fn delete_finished(&mut self, ids: &[&str]) -> Result<usize, RegistryError> {
        self.db_mut().atomic(Lock::Registry, |db| {
            let mut gone = 0;
            for id in ids {
                gone += db
                    .execute(
                        "DELETE FROM threads WHERE id=?1 AND status IN ('completed','error','cancelled','continued')",
                        params![*id],
                    )
                    .map_err(st)?;
            }
            Ok(gone as usize)
        })
    }

    /// Rewrites the database compactly (after deletes); on SQLite it also empties its
    /// write-ahead log.
    pub fn vacuum(&mut self) -> Result<(), RegistryError> {
        self.db.vacuum(&["threads"]).map_err(st)
    }

    /// Replaces a row's metadata (a JSON object).
    pub fn set_meta(&mut self, id: &str, meta: &serde_json::Value) -> Result<bool, RegistryError> {
        let n = self
            .db()
            .execute(
                "UPDATE threads SET meta=?2 WHERE id=?1",
                params![id, meta.to_string()],
            )
            .map_err(st)?;
        Ok(n == 1)
    }

    /// Is `id` a strict descendant of `ancestor`?
    pub fn is_descendant(&self, ancestor: &str, id: &str) -> Result<bool, RegistryError> {
        let mut cur = self.get(id)?.and_then(|r| r.parent_id);
        let mut hops = 0;
        while let Some(p) = cur {
            if p == ancestor {
                return Ok(true);
            }
            hops += 1;
            if hops > 1000 {
                break;
            }
            cur = self.get(&p)?.and_then(|r| r.parent_id);
        }
        Ok(false)
    }

    /// The rows of a many-row query. A row weft never wrote (a bad id or status) is left out
    /// with a warning naming it, as recovery always left such a row as is: one damaged row
    /// never hides every other thread. A query for that one row (`get`) still names the damage.
    fn rows(&self, sql: &str, params: &[Value]) -> Result<Vec<ThreadRow>, RegistryError> {
        let mut out = Vec::new();
        for r in self.db().query(sql, params).map_err(st)? {
            match read_row(&r) {
                Ok(row) => out.push(row),
                Err(e @ RegistryError::Corrupt { .. }) => {
                    tracing::warn!("{e}: left out of this list")
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

/// Registries made before the `waiting`, `status_text`, `forked_from` and `meta` columns (and
/// before schema versions) gain them.
fn legacy_columns(db: &Db) -> Result<(), RegistryError> {
    for column in ["waiting", "status_text", "forked_from", "meta"] {
        let has = db
            .row(
                "SELECT COUNT(*) FROM pragma_table_info('threads') WHERE name=?1",
                params![column],
            )
            .map_err(st)?
            .map_or(Ok(0), |r| r.int(0))
            .map_err(st)?
            > 0;
        if !has {
            db.batch(&format!("ALTER TABLE threads ADD COLUMN {column} TEXT"))
                .map_err(st)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn strict_durability_commits_to_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = super::Store::open(&dir.path().join("r.db")).unwrap();
        let sync = |s: &super::Store| -> i64 {
            s.db.as_sqlite()
                .unwrap()
                .query_row("PRAGMA synchronous", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(sync(&s), 1, "NORMAL by default");
        s.set_strict().unwrap();
        assert_eq!(sync(&s), 2, "FULL under durability: strict");
    }

    /// The statements every thread runs build no temporary b-tree (SQLite does for an `IN`
    /// list of constants: pages allocated, filled and freed on every run).
    #[test]
    fn a_threads_statements_build_no_temporary_table() {
        let dir = tempfile::tempdir().unwrap();
        let s = super::Store::open(&dir.path().join("r.db")).unwrap();
        let db = s.db.as_sqlite().unwrap();
        for sql in [super::UPDATE_ROW, super::super::admission::ADMIT_COUNT] {
            let mut stmt = db.prepare(&format!("EXPLAIN {sql}")).unwrap();
            let ops: Vec<String> = stmt
                .query_map(
                    rusqlite::params_from_iter(std::iter::repeat_n("x", stmt.parameter_count())),
                    |r| r.get(1),
                )
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert!(ops.iter().any(|o| o == "Column"), "{ops:?}");
            assert!(!ops.iter().any(|o| o == "OpenEphemeral"), "{sql}: {ops:?}");
        }
    }

    #[test]
    fn a_row_weft_never_wrote_is_a_registry_error() {
        use crate::core::ids::ThreadId;
        use crate::core::status::Status;
        use crate::registry::{RegistryError, ThreadRow};
        let dir = tempfile::tempdir().unwrap();
        let mut s = super::Store::open(&dir.path().join("r.db")).unwrap();
        let id = ThreadId::parse("t-1").unwrap();
        let row = ThreadRow::new(id.clone(), id.clone(), Status::Running);
        s.register(&row, None).unwrap();
        assert_eq!(s.get("t-1").unwrap(), Some(row));
        for (set, column, value) in [
            ("status='paused'", "status", "paused"),
            ("status='running', parent='../x'", "parent", "../x"),
        ] {
            s.db.batch(&format!("UPDATE threads SET {set}")).unwrap();
            let want = RegistryError::Corrupt {
                row: "t-1".into(),
                column,
                value: value.into(),
            };
            assert_eq!(s.get("t-1"), Err(want));
            assert_eq!(
                s.list(false, 10),
                Ok(vec![]),
                "a damaged row hides no other"
            );
        }
    }
}
