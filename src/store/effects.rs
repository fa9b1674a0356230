//! Scheduled effects (Standard Agents' `ScheduledEffect`): a directive to start or a command
//! tool to run after a delay, kept in store.db so they survive restarts. A runtime claims a due
//! effect with one conditional UPDATE, so of several processes exactly one runs it; an effect
//! claimed by a process that died is settled by the next: a directive effect whose thread was
//! started is done (recovery finishes the thread), a tool effect is marked failed, never run
//! twice (its side effects may have happened).

use super::{storage, FileStore, StoreError};
use crate::core::ids::{now_ts, ThreadId};
use crate::sql::{params, Db, Lock, Row, SqlError};
use serde_json::Value;

/// What an effect does.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EffectKind {
    /// Start a directive's thread (a deferred child of the scheduling thread).
    Directive,
    /// Run a command tool.
    Tool,
}

/// One scheduled effect.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Effect {
    /// Its id (`fx-…`).
    pub id: String,
    /// The thread that scheduled it.
    pub thread: String,
    /// Directive or tool.
    pub kind: EffectKind,
    /// The directive or tool name.
    pub target: String,
    /// Its inputs.
    pub inputs: Value,
    /// When it is due (RFC 3339).
    pub due_at: String,
    /// pending, running, done, failed, cancelled.
    pub status: String,
    /// What it gave: the thread started, the tool's output, or why it failed.
    pub result: Option<String>,
    /// The process that claimed it.
    pub claimed_by: Option<u32>,
    /// The thread a directive effect runs as: a deferred child of the scheduling thread, whose
    /// ledger account holds the budget set aside for it (None for a tool, and for a directive
    /// scheduled before budgets were set aside: such an effect is not run).
    pub child: Option<String>,
}

const COLS: &str = "id, thread, kind, target, inputs, due_at, status, result, claimed_by, limits";

fn effect_of(r: &Row) -> Result<Effect, SqlError> {
    let kind = r.text(2)?;
    let json = |i: usize| -> Result<Value, SqlError> {
        Ok(serde_json::from_str(&r.text(i)?).unwrap_or(Value::Null))
    };
    Ok(Effect {
        id: r.text(0)?,
        thread: r.text(1)?,
        kind: if kind == "tool" {
            EffectKind::Tool
        } else {
            EffectKind::Directive
        },
        target: r.text(3)?,
        inputs: json(4)?,
        due_at: r.text(5)?,
        status: r.text(6)?,
        result: r.opt_text(7)?,
        claimed_by: r.opt_int(8)?.and_then(|p| u32::try_from(p).ok()),
        // The `limits` column holds `{"child": id}` (it once held the scheduler's limits).
        child: json(9)?["child"].as_str().map(str::to_string),
    })
}

fn effects_of(rows: Vec<Row>) -> Result<Vec<Effect>, StoreError> {
    rows.iter()
        .map(effect_of)
        .collect::<Result<_, _>>()
        .map_err(storage)
}

/// Most effects one thread may have pending.
pub(crate) const MAX_PENDING: usize = 16;

impl FileStore {
    fn effects<T>(&self, f: impl FnOnce(&Db) -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.idx(|c| f(c))
    }

    /// Schedules an effect of `thread`; returns it.
    pub fn schedule(
        &self,
        thread: &ThreadId,
        kind: EffectKind,
        target: &str,
        inputs: &Value,
        due_at: &str,
        child: Option<&ThreadId>,
    ) -> Result<Effect, StoreError> {
        let limits = serde_json::json!({ "child": child });
        let id = format!("fx-{}", &ThreadId::generate("e").as_str()[2..]);
        let kind_s = match kind {
            EffectKind::Directive => "directive",
            EffectKind::Tool => "tool",
        };
        // The count and the insert are one IMMEDIATE transaction: schedulers on other
        // connections (another process of the project) wait, so the limit holds for all.
        self.idx(|c| {
            c.atomic(Lock::Store, |tx| {
                let pending = tx
                    .row(
                        "SELECT COUNT(*) FROM effects WHERE thread=?1 AND status='pending'",
                        params![thread.as_str()],
                    )
                    .map_err(storage)?
                    .map_or(Ok(0), |r| r.int(0))
                    .map_err(storage)?;
                if pending >= MAX_PENDING as i64 {
                    return Err(StoreError::Invalid {
                        rule: "schedule.pending",
                        detail: format!("thread {thread} already has {pending} effects pending (at most {MAX_PENDING}); cancel one first"),
                    });
                }
                tx.execute(
                    "INSERT INTO effects(id, thread, kind, target, inputs, due_at, created_at, status, limits)
                     VALUES(?1,?2,?3,?4,?5,?6,?7,'pending',?8)",
                    params![id.as_str(), thread.as_str(), kind_s, target, inputs.to_string(), due_at, now_ts(), limits.to_string()],
                )
                .map_err(storage)?;
                Ok(())
            })
        })?;
        self.one_effect(&id)?
            .ok_or_else(|| storage("the effect just written is gone"))
    }

    fn one_effect(&self, id: &str) -> Result<Option<Effect>, StoreError> {
        self.effects(|c| {
            let rows = c
                .query(
                    &format!("SELECT {COLS} FROM effects WHERE id=?1"),
                    params![id],
                )
                .map_err(storage)?;
            Ok(effects_of(rows)?.pop())
        })
    }

    /// The effects of `thread` (all when None), soonest first.
    pub fn scheduled(&self, thread: Option<&ThreadId>) -> Result<Vec<Effect>, StoreError> {
        self.effects(|c| {
            effects_of(
                c.query(
                    &format!(
                        "SELECT {COLS} FROM effects WHERE CAST(?1 AS TEXT) IS NULL OR thread=?1 ORDER BY due_at, id"
                    ),
                    params![thread.map(ThreadId::as_str)],
                )
                .map_err(storage)?,
            )
        })
    }

    /// Cancels a pending effect (of `thread`, when given). Err when it is not pending.
    pub fn cancel_effect(&self, id: &str, thread: Option<&ThreadId>) -> Result<Effect, StoreError> {
        let found = self
            .one_effect(id)?
            .filter(|e| thread.is_none_or(|t| t.as_str() == e.thread));
        let Some(e) = found else {
            return Err(StoreError::Invalid {
                rule: "schedule.id",
                detail: format!(
                    "no effect {id}{}",
                    thread
                        .map(|t| format!(" of thread {t}"))
                        .unwrap_or_default()
                ),
            });
        };
        let n = self.effects(|c| {
            c.execute(
                "UPDATE effects SET status='cancelled' WHERE id=?1 AND status='pending'",
                params![id],
            )
            .map_err(storage)
        })?;
        if n == 0 {
            return Err(StoreError::Invalid {
                rule: "schedule.status",
                detail: format!("effect {id} is {}, not pending", e.status),
            });
        }
        Ok(Effect {
            status: "cancelled".into(),
            ..e
        })
    }

    /// Cancels every pending effect scheduled by one of `threads` (a tree told to stop);
    /// returns them.
    pub(crate) fn cancel_effects_of(
        &self,
        threads: &[ThreadId],
    ) -> Result<Vec<Effect>, StoreError> {
        let pending = self.pending_effects(None)?;
        let ids: std::collections::HashSet<&str> = threads.iter().map(ThreadId::as_str).collect();
        let mine: Vec<Effect> = pending
            .into_iter()
            .filter(|e| ids.contains(e.thread.as_str()))
            .collect();
        let mut out = Vec::new();
        for e in mine {
            if let Ok(e) = self.cancel_effect(&e.id, None) {
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Claims the effects due by now for process `pid` (each for exactly one process).
    /// Only those `wanted` says yes to are claimed.
    pub(crate) fn claim_due(
        &self,
        pid: u32,
        wanted: &dyn Fn(&Effect) -> bool,
    ) -> Result<Vec<Effect>, StoreError> {
        let due = self.pending_effects(Some(&now_ts()))?;
        let mut mine = Vec::new();
        for e in due.into_iter().filter(|e| wanted(e)).take(64) {
            let won = self.effects(|c| {
                c.execute(
                    "UPDATE effects SET status='running', claimed_by=?2 WHERE id=?1 AND status='pending'",
                    params![e.id.as_str(), pid],
                )
                .map_err(storage)
            })?;
            if won == 1 {
                mine.push(Effect {
                    status: "running".into(),
                    claimed_by: Some(pid),
                    ..e
                });
            }
        }
        Ok(mine)
    }

    /// The earliest due time of a pending effect `wanted` says yes to.
    pub(crate) fn next_due(
        &self,
        wanted: &dyn Fn(&Effect) -> bool,
    ) -> Result<Option<String>, StoreError> {
        let pending = self.pending_effects(None)?;
        Ok(pending.into_iter().find(|e| wanted(e)).map(|e| e.due_at))
    }

    /// Whether any effect may be pending now: one read shared by the askers waiting together
    /// (see `shared_read.rs`). A read that fails answers yes: the cancel that asked goes on to
    /// read its tree's effects (and handles that read's own failure), rather than leave them
    /// pending with their budgets set aside.
    pub(crate) async fn any_effect_pending(self: &std::sync::Arc<Self>) -> bool {
        let store = self.clone();
        self.pending_check
            .ask(move || {
                let any = store.effects(|c| {
                    c.row("SELECT 1 FROM effects WHERE status='pending' LIMIT 1", &[])
                        .map_err(storage)
                });
                !matches!(any, Ok(None))
            })
            .await
    }

    /// The pending effects (due by `due_by`, when given), soonest first. Only pending ones are
    /// read: a project's done and failed effects only grow.
    pub(crate) fn pending_effects(&self, due_by: Option<&str>) -> Result<Vec<Effect>, StoreError> {
        self.effects(|c| {
            effects_of(
                c.query(
                    &format!(
                        "SELECT {COLS} FROM effects WHERE status='pending' AND (CAST(?1 AS TEXT) IS NULL OR due_at<=?1) ORDER BY due_at"
                    ),
                    params![due_by],
                )
                .map_err(storage)?,
            )
        })
    }

    /// Gives a claimed effect back, pending again, due no earlier than `retry_at` (its tree is
    /// held by another live process, which runs it).
    pub(crate) fn release_effect(&self, id: &str, retry_at: &str) -> Result<(), StoreError> {
        self.effects(|c| {
            c.execute(
                "UPDATE effects SET status='pending', claimed_by=NULL,
                   due_at=CASE WHEN due_at > ?2 THEN due_at ELSE ?2 END
                 WHERE id=?1 AND status='running'",
                params![id, retry_at],
            )
            .map_err(storage)
        })
        .map(|_| ())
    }

    /// Records how a claimed effect ended.
    pub(crate) fn finish_effect(&self, id: &str, ok: bool, result: &str) -> Result<(), StoreError> {
        let status = if ok { "done" } else { "failed" };
        self.effects(|c| {
            c.execute(
                "UPDATE effects SET status=?2, result=?3 WHERE id=?1",
                params![id, status, result],
            )
            .map(|_| ())
            .map_err(storage)
        })
    }

    /// Effects left `running` by processes that are gone (`dead` says which).
    pub(crate) fn orphaned_effects(
        &self,
        dead: impl Fn(u32) -> bool,
    ) -> Result<Vec<Effect>, StoreError> {
        Ok(self
            .scheduled(None)?
            .into_iter()
            .filter(|e| e.status == "running" && e.claimed_by.is_some_and(&dead))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use crate::core::ids::ThreadId;
    use crate::project::Project;
    use crate::store::FileStore;
    use std::sync::Arc;

    /// An effect scheduled before a question is in its answer even when an earlier answer
    /// said none (how askers share reads: `shared_read.rs`'s tests).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_is_never_older_than_its_question() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".weft")).unwrap();
        let store = Arc::new(
            FileStore::open(&Project {
                root: dir.path().to_path_buf(),
            })
            .unwrap(),
        );
        assert!(!store.any_effect_pending().await);
        let t = ThreadId::parse("t-1").unwrap();
        let due = crate::core::ids::now_ts();
        store
            .schedule(
                &t,
                super::EffectKind::Tool,
                "x",
                &serde_json::json!({}),
                &due,
                None,
            )
            .unwrap();
        assert!(
            store.any_effect_pending().await,
            "the read started after the schedule"
        );
    }

    /// A store that cannot be read answers "maybe pending": a cancel then reads its tree's
    /// effects itself instead of leaving them pending with their budgets set aside.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_that_cannot_be_read_answers_yes() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join(".weft/state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("store.db"), vec![0x5a; 8192]).unwrap();
        let store = Arc::new(
            FileStore::open(&Project {
                root: dir.path().to_path_buf(),
            })
            .unwrap(),
        );
        assert!(store.any_effect_pending().await);
    }
}
