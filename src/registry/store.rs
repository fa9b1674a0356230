//! registry.db: schema, queries, and spawn admission inside the batch transaction.

use super::{st, Admission, RegistryError, ThreadFilter, ThreadRow};
use crate::core::ids::ThreadId;
use crate::core::status::Status;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;

/// SQL access to registry.db.
pub struct Store {
    db: Connection,
    /// A batch transaction is open (see [`RegistryActor`]).
    in_batch: bool,
    /// Commits fsync (`durability: strict`).
    fsyncs: bool,
}

const COLS: &str = "id,directive,parent,root,status,created_at,updated_at,model,turns,tokens_in,tokens_out,own_spend,spend,spawn_count,result,outputs,error,owner_pid,continuation_of,chain_root,waiting,status_text,forked_from,meta";

impl Store {
    /// Opens (creating) the registry.
    pub fn open(path: &Path) -> Result<Store, RegistryError> {
        let db = Connection::open(path)
            .map_err(|e| RegistryError::Storage(format!("{}: {e}", path.display())))?;
        crate::record::batch::setup_with_retry(&db, |db| {
            db.execute_batch(
                "PRAGMA busy_timeout=5000; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
                 CREATE TABLE IF NOT EXISTS threads(
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
            )?;
            // Registries made before these columns existed gain them.
            for column in ["waiting", "status_text", "forked_from", "meta"] {
                let has: bool = db
                    .query_row(
                        "SELECT COUNT(*) FROM pragma_table_info('threads') WHERE name=?1",
                        [column],
                        |r| r.get::<_, i64>(0),
                    )?
                    > 0;
                if !has {
                    db.execute_batch(&format!("ALTER TABLE threads ADD COLUMN {column} TEXT"))?;
                }
            }
            Ok(())
        })
        .map_err(st)?;
        Ok(Store {
            db,
            in_batch: false,
            fsyncs: false,
        })
    }

    /// `durability: strict`: every commit reaches the disk before it returns
    /// (`synchronous=FULL`; the default NORMAL may lose the last commits on power loss).
    pub(crate) fn set_strict(&mut self) -> Result<(), RegistryError> {
        self.db
            .execute_batch("PRAGMA synchronous=FULL")
            .map_err(st)?;
        self.fsyncs = true;
        Ok(())
    }

    /// Opens read-only (for `threads`, `show`, `verify` in another process).
    pub fn open_read_only(path: &Path) -> Result<Store, RegistryError> {
        let db = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| {
                RegistryError::Storage(format!(
                    "{}: {e} (run `weft init` and `weft run` first)",
                    path.display()
                ))
            })?;
        db.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(st)?;
        Ok(Store {
            db,
            in_batch: false,
            fsyncs: false,
        })
    }

    /// Opens the batch transaction if none is open (IMMEDIATE: the write lock is taken now).
    pub fn begin_batch(&mut self) -> Result<(), RegistryError> {
        if !self.in_batch {
            crate::record::batch::begin_immediate(&self.db).map_err(st)?;
            self.in_batch = true;
        }
        Ok(())
    }

    /// Commits the batch transaction, if one is open.
    pub fn commit_batch(&mut self) -> Result<(), RegistryError> {
        if self.in_batch {
            self.in_batch = false;
            if let Err(e) = crate::record::batch::commit(&self.db, self.fsyncs) {
                let _ = self.db.execute_batch("ROLLBACK");
                return Err(st(e));
            }
        }
        Ok(())
    }

    /// Inserts a new row; with `admit`, first checks and counts the parent's spawn slots.
    pub fn register(
        &mut self,
        row: &ThreadRow,
        admit: Option<&Admission>,
    ) -> Result<(), RegistryError> {
        // A savepoint: atomic on its own, and inside the supervisor's batch transaction.
        let tx = self.db.savepoint().map_err(st)?;
        if let Some(a) = admit {
            let (used,): (u64,) = tx
                .prepare_cached("SELECT spawn_count FROM threads WHERE id=?1")
                .map_err(st)?
                .query_row([a.parent.as_str()], |r| Ok((r.get(0)?,)))
                .optional()
                .map_err(st)?
                .ok_or_else(|| RegistryError::Unknown(a.parent.clone()))?;
            if used >= a.spawns {
                return Err(RegistryError::Spawns {
                    parent: a.parent.clone(),
                    used,
                    max: a.spawns,
                });
            }
            let live: u64 = tx
                .prepare_cached("SELECT COUNT(*) FROM threads WHERE parent=?1 AND status IN ('created','running')")
                .map_err(st)?
                .query_row([a.parent.as_str()], |r| r.get(0))
                .map_err(st)?;
            if live >= a.concurrency {
                return Err(RegistryError::Concurrency {
                    parent: a.parent.clone(),
                    live,
                    max: a.concurrency,
                });
            }
            tx.prepare_cached("UPDATE threads SET spawn_count=spawn_count+1 WHERE id=?1")
                .map_err(st)?
                .execute([a.parent.as_str()])
                .map_err(st)?;
        }
        if let Some(old) = &row.continuation_of {
            // Checked and inserted in one transaction (IMMEDIATE across processes): of two
            // concurrent resumes of one thread, or of two threads of one tree, one wins.
            let refuse = |why: String| RegistryError::Continued {
                old: old.clone(),
                why,
            };
            let by: Option<String> = tx
                .prepare_cached("SELECT id FROM threads WHERE continuation_of=?1 LIMIT 1")
                .map_err(st)?
                .query_row([old.as_str()], |r| r.get(0))
                .optional()
                .map_err(st)?;
            if let Some(by) = by {
                return Err(refuse(format!(
                    "it was already continued by {by}; resume that one"
                )));
            }
            // A resumed thread must not run beside its live tree; a handoff (it has a live
            // parent) is the tree itself going on.
            if row.parent_id.is_none() {
                let live: Option<String> = tx
                    .prepare_cached("SELECT id FROM threads WHERE root=?1 AND id<>?2 AND status IN ('created','running') LIMIT 1")
                    .map_err(st)?
                    .query_row([row.root_id.as_str(), row.id.as_str()], |r| r.get(0))
                    .optional()
                    .map_err(st)?;
                if let Some(live) = live {
                    return Err(refuse(format!(
                        "thread {live} of its tree {} is still running; its tree draws on one budget, so wait for it or cancel it first",
                        row.root_id
                    )));
                }
            }
        }
        tx.prepare_cached(&format!("INSERT INTO threads({COLS}) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23,?24)"))
            .map_err(st)?
            .execute(
            params![
                row.id.as_str(), row.directive, row.parent_id.as_deref(), row.root_id.as_str(), row.status.as_str(),
                row.created_at, row.updated_at, row.model, row.turns, row.input_tokens, row.output_tokens,
                row.own_spend_nanos, row.spend_nanos, row.spawn_count, row.result,
                row.outputs.as_ref().map(|o| o.to_string()), row.error, row.owner_pid,
                row.continuation_of.as_deref(), row.chain_root.as_deref(), row.waiting, row.status_text,
                row.forked_from.as_deref(), row.meta.as_ref().map(|m| m.to_string())
            ],
        )
        .map_err(st)?;
        tx.commit().map_err(st)
    }

    /// Writes status, cost and result fields of an existing row (never leaves a terminal state).
    pub fn update(&mut self, row: &ThreadRow) -> Result<(), RegistryError> {
        self
            .db
            .prepare_cached(
                "UPDATE threads SET status=?2, updated_at=?3, turns=?4, tokens_in=?5, tokens_out=?6, own_spend=?7,
                 spend=?8, result=?9, outputs=?10, error=?11, waiting=?12, status_text=?13
                 WHERE id=?1 AND status NOT IN ('completed','error','cancelled','continued')",
            )
            .map_err(st)?
            .execute(params![
                row.id.as_str(), row.status.as_str(), row.updated_at, row.turns, row.input_tokens, row.output_tokens,
                row.own_spend_nanos, row.spend_nanos, row.result, row.outputs.as_ref().map(|o| o.to_string()), row.error,
                row.waiting, row.status_text
            ])
            .map_err(st)?;
        Ok(())
    }

    /// One row.
    pub fn get(&self, id: &str) -> Result<Option<ThreadRow>, RegistryError> {
        self.db
            .prepare_cached(&format!("SELECT {COLS} FROM threads WHERE id=?1"))
            .map_err(st)?
            .query_row([id], row_of)
            .optional()
            .map_err(st)?
            .transpose()
    }

    /// Rows, newest first; `active` keeps created/running only.
    pub fn list(&self, active: bool, limit: usize) -> Result<Vec<ThreadRow>, RegistryError> {
        let filter = if active {
            "WHERE status IN ('created','running')"
        } else {
            ""
        };
        let mut stmt = self
            .db
            .prepare(&format!(
                "SELECT {COLS} FROM threads {filter} ORDER BY created_at DESC, id DESC LIMIT ?1"
            ))
            .map_err(st)?;
        let rows = stmt.query_map([limit as i64], row_of).map_err(st)?;
        good_rows(rows)
    }

    /// Every row of a tree (by root id), oldest first.
    pub fn tree(&self, root: &str) -> Result<Vec<ThreadRow>, RegistryError> {
        let mut stmt = self
            .db
            .prepare(&format!(
                "SELECT {COLS} FROM threads WHERE root=?1 ORDER BY created_at, id"
            ))
            .map_err(st)?;
        let rows = stmt.query_map([root], row_of).map_err(st)?;
        good_rows(rows)
    }

    /// Rows matching `f`, newest first.
    pub fn query(&self, f: &ThreadFilter) -> Result<Vec<ThreadRow>, RegistryError> {
        let mut clauses = Vec::new();
        let mut args: Vec<String> = Vec::new();
        if !f.status.is_empty() {
            let marks: Vec<String> = f
                .status
                .iter()
                .map(|s| {
                    args.push(s.clone());
                    format!("?{}", args.len())
                })
                .collect();
            clauses.push(format!("status IN ({})", marks.join(",")));
        }
        for (col, v) in [("directive", &f.directive), ("root", &f.root)] {
            if let Some(v) = v {
                args.push(v.clone());
                clauses.push(format!("{col}=?{}", args.len()));
            }
        }
        if let Some(t) = &f.updated_since {
            args.push(t.clone());
            clauses.push(format!("updated_at>=?{}", args.len()));
        }
        let filter = if clauses.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", clauses.join(" AND "))
        };
        args.push(f.limit.unwrap_or(1000).to_string());
        let mut stmt = self
            .db
            .prepare(&format!(
                "SELECT {COLS} FROM threads {filter} ORDER BY created_at DESC, id DESC LIMIT CAST(?{} AS INTEGER)",
                args.len()
            ))
            .map_err(st)?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(args.iter()), row_of)
            .map_err(st)?;
        good_rows(rows)
    }

    /// `id`'s subtree, itself included, parents before children.
    pub fn subtree(&self, id: &str) -> Result<Vec<ThreadRow>, RegistryError> {
        self.subtree_where(id, "", "sub.depth, t.created_at, t.id")
    }

    /// The `created`/`running` rows of `id`'s subtree, itself included, deepest first.
    pub(crate) fn unfinished_subtree(&self, id: &str) -> Result<Vec<ThreadRow>, RegistryError> {
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
        let mut stmt = self
            .db
            .prepare_cached(&format!(
                "WITH RECURSIVE sub(id, depth) AS (SELECT ?1, 0
                   UNION ALL SELECT c.id, sub.depth + 1 FROM threads c JOIN sub ON c.parent = sub.id)
                 SELECT {cols} FROM threads t JOIN sub ON t.id = sub.id {filter} ORDER BY {order}"
            ))
            .map_err(st)?;
        let rows = stmt.query_map([id], row_of).map_err(st)?;
        good_rows(rows)
    }

    /// The rows weft never wrote (a bad id or status), which every many-row query leaves out:
    /// each as its raw id and what is wrong with it (`weft doctor` reports them).
    pub fn damaged(&self) -> Result<Vec<(String, RegistryError)>, RegistryError> {
        let mut stmt = self
            .db
            .prepare(&format!("SELECT {COLS} FROM threads"))
            .map_err(st)?;
        let rows = stmt.query_map([], row_of).map_err(st)?;
        let mut out = Vec::new();
        for r in rows {
            if let Err(e @ RegistryError::Corrupt { .. }) = r.map_err(st)? {
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
        let mut stmt = self
            .db
            .prepare(&format!(
                "SELECT {COLS} FROM threads WHERE status IN ('created','running')"
            ))
            .map_err(st)?;
        let rows = stmt.query_map([], row_of).map_err(st)?;
        good_rows(rows)
    }

    /// Claims an unfinished row for repair: moves it from the dead owner `from` to `to` in its
    /// own committed transaction (never inside a batch). True for exactly one of several
    /// processes that race for it; false if another claimed it or it has finished meanwhile.
    pub(crate) fn claim(&mut self, id: &str, from: u32, to: u32) -> Result<bool, RegistryError> {
        debug_assert!(!self.in_batch);
        let n = self
            .db
            .execute(
                "UPDATE threads SET owner_pid=?3 WHERE id=?1 AND owner_pid=?2 AND status IN ('created','running')",
                params![id, from, to],
            )
            .map_err(st)?;
        Ok(n == 1)
    }

    /// Marks a terminal row as interrupted (recovery only: its owner process is gone).
    pub fn finish_interrupted(&mut self, row: &ThreadRow) -> Result<(), RegistryError> {
        self.db
            .execute(
                "UPDATE threads SET status=?2, updated_at=?3, spend=?4, own_spend=?5, error=?6, waiting=NULL
                 WHERE id=?1 AND status IN ('created','running')",
                params![
                    row.id.as_str(),
                    row.status.as_str(),
                    row.updated_at,
                    row.spend_nanos,
                    row.own_spend_nanos,
                    row.error
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
        let tx = self.db.savepoint().map_err(st)?;
        tx.execute(
            "UPDATE threads SET chain_root=?2 WHERE id=?1 AND chain_root IS NULL",
            params![old, chain_root],
        )
        .map_err(st)?;
        tx.execute(
            "UPDATE threads SET continuation_of=?2, chain_root=?3 WHERE id=?1",
            params![new, old, chain_root],
        )
        .map_err(st)?;
        tx.commit().map_err(st)
    }

    /// Every thread of the continuation chain `id` belongs to, oldest first.
    pub fn chain(&self, id: &str) -> Result<Vec<ThreadRow>, RegistryError> {
        let Some(row) = self.get(id)? else {
            return Ok(vec![]);
        };
        let root = row.chain_root.unwrap_or(row.id);
        let root = root.as_str();
        let mut stmt = self
            .db
            .prepare(&format!(
                "SELECT {COLS} FROM threads WHERE id=?1 OR chain_root=?1 ORDER BY created_at, id"
            ))
            .map_err(st)?;
        let rows = stmt.query_map([root], row_of).map_err(st)?;
        good_rows(rows)
    }

    /// Removes the rows of `ids` (finished threads only; see `ThreadStore::delete`). Returns
    /// how many went.
    pub fn delete_finished(&mut self, ids: &[&str]) -> Result<usize, RegistryError> {
        let tx = self.db.savepoint().map_err(st)?;
        let mut gone = 0;
        for id in ids {
            gone += tx
                .prepare_cached("DELETE FROM threads WHERE id=?1 AND status IN ('completed','error','cancelled','continued')")
                .map_err(st)?
                .execute([id])
                .map_err(st)?;
        }
        tx.commit().map_err(st)?;
        Ok(gone)
    }

    /// Rewrites the database compactly (after deletes) and empties its write-ahead log.
    pub fn vacuum(&mut self) -> Result<(), RegistryError> {
        self.db
            .execute_batch("VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")
            .map_err(st)
    }

    /// Replaces a row's metadata (a JSON object).
    pub fn set_meta(&mut self, id: &str, meta: &serde_json::Value) -> Result<bool, RegistryError> {
        let n = self
            .db
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
}

/// One row for `query_map`: a storage failure or a value weft cannot read is a
/// [`RegistryError`] inside, so the caller's `collect` reports it (never a panic).
fn row_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Result<ThreadRow, RegistryError>> {
    Ok(read_row(r))
}

/// The rows of a many-row query. A row weft never wrote (a bad id or status) is left out with
/// a warning naming it, as recovery always left such a row as is: one damaged row never hides
/// every other thread. A query for that one row (`get`) still names the damage.
fn good_rows(
    rows: impl Iterator<Item = rusqlite::Result<Result<ThreadRow, RegistryError>>>,
) -> Result<Vec<ThreadRow>, RegistryError> {
    let mut out = Vec::new();
    for r in rows {
        match r.map_err(st)? {
            Ok(row) => out.push(row),
            Err(e @ RegistryError::Corrupt { .. }) => {
                tracing::warn!("{e}: left out of this list")
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn read_row(r: &rusqlite::Row<'_>) -> Result<ThreadRow, RegistryError> {
    let row_id: String = r.get(0).map_err(st)?;
    let corrupt = |column: &'static str, value: String| RegistryError::Corrupt {
        row: row_id.clone(),
        column,
        value,
    };
    let id = |column, value: String| ThreadId::parse(&value).map_err(|_| corrupt(column, value));
    let some_id = |column, at: usize| -> Result<Option<ThreadId>, RegistryError> {
        let value: Option<String> = r.get(at).map_err(st)?;
        value.map(|v| id(column, v)).transpose()
    };
    let status: String = r.get(4).map_err(st)?;
    let outputs: Option<String> = r.get(15).map_err(st)?;
    let meta: Option<String> = r.get(23).map_err(st)?;
    Ok(ThreadRow {
        id: id("id", row_id.clone())?,
        directive: r.get(1).map_err(st)?,
        parent_id: some_id("parent", 2)?,
        root_id: id("root", r.get(3).map_err(st)?)?,
        status: Status::parse(&status).ok_or_else(|| corrupt("status", status.clone()))?,
        created_at: r.get(5).map_err(st)?,
        updated_at: r.get(6).map_err(st)?,
        model: r.get(7).map_err(st)?,
        turns: r.get(8).map_err(st)?,
        input_tokens: r.get(9).map_err(st)?,
        output_tokens: r.get(10).map_err(st)?,
        own_spend_nanos: r.get(11).map_err(st)?,
        spend_nanos: r.get(12).map_err(st)?,
        spawn_count: r.get(13).map_err(st)?,
        result: r.get(14).map_err(st)?,
        outputs: outputs.and_then(|o| serde_json::from_str(&o).ok()),
        error: r.get(16).map_err(st)?,
        owner_pid: r.get(17).map_err(st)?,
        continuation_of: some_id("continuation_of", 18)?,
        chain_root: some_id("chain_root", 19)?,
        waiting: r.get(20).map_err(st)?,
        status_text: r.get(21).map_err(st)?,
        forked_from: some_id("forked_from", 22)?,
        meta: meta.and_then(|m| serde_json::from_str(&m).ok()),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn strict_durability_commits_to_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = super::Store::open(&dir.path().join("r.db")).unwrap();
        let sync = |s: &super::Store| -> i64 {
            s.db.query_row("PRAGMA synchronous", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(sync(&s), 1, "NORMAL by default");
        s.set_strict().unwrap();
        assert_eq!(sync(&s), 2, "FULL under durability: strict");
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
            s.db.execute_batch(&format!("UPDATE threads SET {set}"))
                .unwrap();
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
