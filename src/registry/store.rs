//! registry.db: schema, queries, and spawn admission inside the batch transaction.

use super::{st, Admission, RegistryError, ThreadFilter, ThreadRow};
use crate::core::ids::ThreadId;
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
                old: ThreadId::parse(old).unwrap_or_else(|_| ThreadId::generate("unknown")),
                why,
            };
            let by: Option<String> = tx
                .prepare_cached("SELECT id FROM threads WHERE continuation_of=?1 LIMIT 1")
                .map_err(st)?
                .query_row([old], |r| r.get(0))
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
                    .query_row([&row.root_id, &row.id], |r| r.get(0))
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
                row.id, row.directive, row.parent_id, row.root_id, row.status, row.created_at, row.updated_at,
                row.model, row.turns, row.input_tokens, row.output_tokens, row.own_spend_nanos, row.spend_nanos,
                row.spawn_count, row.result, row.outputs.as_ref().map(|o| o.to_string()), row.error, row.owner_pid,
                row.continuation_of, row.chain_root, row.waiting, row.status_text, row.forked_from,
                row.meta.as_ref().map(|m| m.to_string())
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
                row.id, row.status, row.updated_at, row.turns, row.input_tokens, row.output_tokens,
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
            .map_err(st)
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
        rows.collect::<Result<Vec<_>, _>>().map_err(st)
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
        rows.collect::<Result<Vec<_>, _>>().map_err(st)
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
        rows.collect::<Result<Vec<_>, _>>().map_err(st)
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
        rows.collect::<Result<Vec<_>, _>>().map_err(st)
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
        rows.collect::<Result<Vec<_>, _>>().map_err(st)
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
                    row.id,
                    row.status,
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
        let mut stmt = self
            .db
            .prepare(&format!(
                "SELECT {COLS} FROM threads WHERE id=?1 OR chain_root=?1 ORDER BY created_at, id"
            ))
            .map_err(st)?;
        let rows = stmt.query_map([root], row_of).map_err(st)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(st)
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

fn row_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<ThreadRow> {
    let outputs: Option<String> = r.get(15)?;
    let meta: Option<String> = r.get(23)?;
    Ok(ThreadRow {
        id: r.get(0)?,
        directive: r.get(1)?,
        parent_id: r.get(2)?,
        root_id: r.get(3)?,
        status: r.get(4)?,
        created_at: r.get(5)?,
        updated_at: r.get(6)?,
        model: r.get(7)?,
        turns: r.get(8)?,
        input_tokens: r.get(9)?,
        output_tokens: r.get(10)?,
        own_spend_nanos: r.get(11)?,
        spend_nanos: r.get(12)?,
        spawn_count: r.get(13)?,
        result: r.get(14)?,
        outputs: outputs.and_then(|o| serde_json::from_str(&o).ok()),
        error: r.get(16)?,
        owner_pid: r.get(17)?,
        continuation_of: r.get(18)?,
        chain_root: r.get(19)?,
        waiting: r.get(20)?,
        status_text: r.get(21)?,
        forked_from: r.get(22)?,
        meta: meta.and_then(|m| serde_json::from_str(&m).ok()),
    })
}

#[cfg(test)]
mod strict_tests {
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
}
