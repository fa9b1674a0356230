//! The thread registry (`registry.db`) and the supervisor actor that owns it.
//!
//! [`Store`] is the SQL; [`Supervisor`] is the only writer at run time. Spawn admission (the
//! parent's `spawns` and `concurrency` limits) happens here, in the same IMMEDIATE transaction
//! that inserts the child's row, so two concurrent spawns — even from two processes — can never
//! both take the last slot. The registry is an index: the signed thread.json stays the truth.

use crate::ids::ThreadId;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Registry failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The parent's `spawns` limit is used up.
    #[error("limit exceeded: spawns {used}/{max} — thread {parent} may not spawn more children")]
    Spawns {
        /// The parent.
        parent: ThreadId,
        /// Children spawned so far.
        used: u64,
        /// The limit.
        max: u64,
    },
    /// The parent's `concurrency` limit is reached.
    #[error("limit exceeded: concurrency {live}/{max} — thread {parent} has that many live children; wait for one to finish")]
    Concurrency {
        /// The parent.
        parent: ThreadId,
        /// Live children.
        live: u64,
        /// The limit.
        max: u64,
    },
    /// No such thread.
    #[error("no thread {0} in the registry")]
    Unknown(ThreadId),
    /// registry.db failed.
    #[error("registry storage: {0}")]
    Storage(String),
}

fn st(e: rusqlite::Error) -> RegistryError {
    RegistryError::Storage(e.to_string())
}

/// One registry row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadRow {
    /// Thread id.
    pub id: String,
    /// Directive name.
    pub directive: String,
    /// Parent thread id.
    pub parent_id: Option<String>,
    /// Root thread id.
    pub root_id: String,
    /// created, running, completed, error, cancelled, continued.
    pub status: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// Model id.
    pub model: String,
    /// LLM calls made.
    pub turns: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Own spend, nano-USD.
    pub own_spend_nanos: i64,
    /// Subtree spend, nano-USD.
    pub spend_nanos: i64,
    /// Children spawned.
    pub spawn_count: u64,
    /// Final text.
    pub result: Option<String>,
    /// Structured outputs (JSON).
    pub outputs: Option<serde_json::Value>,
    /// Error message.
    pub error: Option<String>,
    /// Process that runs the thread.
    pub owner_pid: u32,
    /// Thread this one continues.
    pub continuation_of: Option<String>,
    /// First thread of the chain.
    pub chain_root: Option<String>,
}

/// Is `status` terminal?
pub fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "error" | "cancelled" | "continued")
}

/// Spawn admission asked of the registry.
#[derive(Debug, Clone)]
pub struct Admission {
    /// Parent.
    pub parent: ThreadId,
    /// Parent's `spawns` limit.
    pub spawns: u64,
    /// Parent's `concurrency` limit.
    pub concurrency: u64,
}

/// SQL access to registry.db.
pub struct Store {
    db: Connection,
    /// A batch transaction is open (see [`Supervisor`]).
    in_batch: bool,
}

const COLS: &str = "id,directive,parent,root,status,created_at,updated_at,model,turns,tokens_in,tokens_out,own_spend,spend,spawn_count,result,outputs,error,owner_pid,continuation_of,chain_root";

impl Store {
    /// Opens (creating) the registry.
    pub fn open(path: &Path) -> Result<Store, RegistryError> {
        let db = Connection::open(path)
            .map_err(|e| RegistryError::Storage(format!("{}: {e}", path.display())))?;
        db.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;
             CREATE TABLE IF NOT EXISTS threads(
               id TEXT PRIMARY KEY, directive TEXT NOT NULL, parent TEXT, root TEXT NOT NULL,
               status TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
               model TEXT NOT NULL, turns INTEGER NOT NULL DEFAULT 0, tokens_in INTEGER NOT NULL DEFAULT 0,
               tokens_out INTEGER NOT NULL DEFAULT 0, own_spend INTEGER NOT NULL DEFAULT 0,
               spend INTEGER NOT NULL DEFAULT 0, spawn_count INTEGER NOT NULL DEFAULT 0,
               result TEXT, outputs TEXT, error TEXT, owner_pid INTEGER NOT NULL,
               continuation_of TEXT, chain_root TEXT);
             CREATE INDEX IF NOT EXISTS threads_parent ON threads(parent, status);
             CREATE INDEX IF NOT EXISTS threads_status ON threads(status);",
        )
        .map_err(st)?;
        Ok(Store {
            db,
            in_batch: false,
        })
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
        })
    }

    /// Opens the batch transaction if none is open (IMMEDIATE: the write lock is taken now).
    pub fn begin_batch(&mut self) -> Result<(), RegistryError> {
        if !self.in_batch {
            self.db.execute_batch("BEGIN IMMEDIATE").map_err(st)?;
            self.in_batch = true;
        }
        Ok(())
    }

    /// Commits the batch transaction, if one is open.
    pub fn commit_batch(&mut self) -> Result<(), RegistryError> {
        if self.in_batch {
            self.in_batch = false;
            if let Err(e) = self.db.execute_batch("COMMIT") {
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
        tx.prepare_cached(&format!("INSERT INTO threads({COLS}) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20)"))
            .map_err(st)?
            .execute(
            params![
                row.id, row.directive, row.parent_id, row.root_id, row.status, row.created_at, row.updated_at,
                row.model, row.turns, row.input_tokens, row.output_tokens, row.own_spend_nanos, row.spend_nanos,
                row.spawn_count, row.result, row.outputs.as_ref().map(|o| o.to_string()), row.error, row.owner_pid,
                row.continuation_of, row.chain_root
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
                 spend=?8, result=?9, outputs=?10, error=?11
                 WHERE id=?1 AND status NOT IN ('completed','error','cancelled','continued')",
            )
            .map_err(st)?
            .execute(params![
                row.id, row.status, row.updated_at, row.turns, row.input_tokens, row.output_tokens,
                row.own_spend_nanos, row.spend_nanos, row.result, row.outputs.as_ref().map(|o| o.to_string()), row.error
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

    /// Marks a terminal row as interrupted (recovery only: its owner process is gone).
    pub fn finish_interrupted(&mut self, row: &ThreadRow) -> Result<(), RegistryError> {
        self.db
            .execute(
                "UPDATE threads SET status=?2, updated_at=?3, spend=?4, own_spend=?5, error=?6
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
    })
}

/// Messages of the supervisor actor.
pub enum RegistryMsg {
    /// Register a new thread, with admission for children.
    Register {
        /// The row (status `created`).
        row: Box<ThreadRow>,
        /// Admission against the parent's limits.
        admit: Option<Admission>,
        /// Reply.
        reply: RpcReplyPort<Result<(), RegistryError>>,
    },
    /// Update a row (status, cost, result).
    Update {
        /// The row.
        row: Box<ThreadRow>,
        /// Reply, when the caller must know it is stored (terminal transitions).
        reply: Option<RpcReplyPort<Result<(), RegistryError>>>,
    },
    /// Read one row.
    Get {
        /// Thread id.
        id: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<Option<ThreadRow>, RegistryError>>,
    },
    /// Is `id` a descendant of `ancestor`?
    IsDescendant {
        /// The ancestor.
        ancestor: ThreadId,
        /// The candidate.
        id: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<bool, RegistryError>>,
    },
    /// Rows still created/running.
    Unfinished {
        /// Reply.
        reply: RpcReplyPort<Result<Vec<ThreadRow>, RegistryError>>,
    },
    /// Recovery: finalize a row whose owner is gone.
    FinishInterrupted {
        /// The row (status, error, spend set).
        row: Box<ThreadRow>,
        /// Reply.
        reply: RpcReplyPort<Result<(), RegistryError>>,
    },
    /// Link a continuation to the thread it continues.
    LinkContinuation {
        /// The continued thread.
        old: ThreadId,
        /// The continuation.
        new: ThreadId,
        /// First thread of the chain.
        chain_root: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<(), RegistryError>>,
    },
    /// Commit the batch and release held replies.
    Flush,
    /// Rows of one tree.
    Tree {
        /// Root id.
        root: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<Vec<ThreadRow>, RegistryError>>,
    },
}

/// The supervisor actor: sole writer of registry.db during a run.
///
/// Group commit, as the ledger: writes go into one open IMMEDIATE transaction and their replies
/// are held; a `Flush` marker queued behind them commits and releases the replies. Reads see the
/// batch's writes (same connection).
pub struct Supervisor;

type HeldReply = crate::batch::HeldReply<RegistryError>;

/// State of the supervisor.
pub struct SupervisorState {
    store: Store,
    held: crate::batch::GroupCommit<RegistryError>,
}

impl SupervisorState {
    /// Runs a write in the batch; its outcome is replied after the commit.
    fn write(
        &mut self,
        me: &ActorRef<RegistryMsg>,
        op: impl FnOnce(&mut Store) -> Result<(), RegistryError>,
        reply: Option<RpcReplyPort<Result<(), RegistryError>>>,
    ) {
        let res = self.store.begin_batch().and_then(|_| op(&mut self.store));
        if let Err(e) = &res {
            tracing::error!("registry write failed: {e}");
        }
        let held: HeldReply = Box::new(move |commit_err| {
            if let Some(r) = reply {
                let _ = r.send(match (res, commit_err) {
                    (Err(e), _) => Err(e),
                    (Ok(()), Some(e)) => Err(e),
                    (Ok(()), None) => Ok(()),
                });
            }
        });
        self.held.hold(held, || me.cast(RegistryMsg::Flush).is_ok());
    }

    fn flush(&mut self) {
        let res = self.store.commit_batch();
        if let Err(e) = &res {
            tracing::error!("registry.db commit failed: {e}");
        }
        self.held.release(&res);
    }
}

impl Actor for Supervisor {
    type Msg = RegistryMsg;
    type State = SupervisorState;
    type Arguments = Store;

    async fn pre_start(
        &self,
        _me: ActorRef<RegistryMsg>,
        store: Store,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        Ok(SupervisorState {
            store,
            held: Default::default(),
        })
    }

    async fn handle(
        &self,
        me: ActorRef<RegistryMsg>,
        msg: RegistryMsg,
        s: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RegistryMsg::Register { row, admit, reply } => {
                // Refusals are answered at once; only a stored row waits for the commit.
                let res = s
                    .store
                    .begin_batch()
                    .and_then(|_| s.store.register(&row, admit.as_ref()));
                match res {
                    Ok(()) => s.write(&me, |_| Ok(()), Some(reply)),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            RegistryMsg::Update { row, reply } => s.write(&me, |st| st.update(&row), reply),
            RegistryMsg::FinishInterrupted { row, reply } => {
                s.write(&me, |st| st.finish_interrupted(&row), Some(reply))
            }
            RegistryMsg::LinkContinuation {
                old,
                new,
                chain_root,
                reply,
            } => s.write(
                &me,
                |st| st.link_continuation(old.as_str(), new.as_str(), chain_root.as_str()),
                Some(reply),
            ),
            RegistryMsg::Flush => s.flush(),
            RegistryMsg::Get { id, reply } => {
                let _ = reply.send(s.store.get(id.as_str()));
            }
            RegistryMsg::IsDescendant {
                ancestor,
                id,
                reply,
            } => {
                let _ = reply.send(s.store.is_descendant(ancestor.as_str(), id.as_str()));
            }
            RegistryMsg::Unfinished { reply } => {
                let _ = reply.send(s.store.unfinished());
            }
            RegistryMsg::Tree { root, reply } => {
                let _ = reply.send(s.store.tree(root.as_str()));
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _me: ActorRef<RegistryMsg>,
        s: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        s.flush();
        Ok(())
    }
}
