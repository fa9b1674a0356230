//! Spawn admission and continuation checks, inside the registry's write transaction: read
//! first, then write (SQLite, and Postgres for continuations), or one conditional insert the
//! commit decides (a child on Postgres).

use super::columns::{row_values, COLS};
use super::{st, Admission, RegistryError, ThreadRow};
use crate::core::ids::ThreadId;
use crate::sql::{params, Db, Value};

/// A child's row and its admission: the row's 24 values, then the parent, its `spawns` and
/// its `concurrency`.
pub(super) fn admitted_values(row: &ThreadRow, a: &Admission) -> Vec<Value> {
    let mut v = row_values(row);
    v.extend(
        params![a.parent.as_str(), a.spawns, a.concurrency]
            .iter()
            .cloned(),
    );
    v
}

/// Postgres: a child's row inserted only when its parent's `spawns` and `concurrency` admit
/// it, and the parent's count raised with it, in one statement (1 row changed: admitted).
pub(super) fn admit_sql() -> String {
    const INTEGER: [usize; 7] = [9, 10, 11, 12, 13, 14, 18];
    let values: Vec<String> = (1..=24)
        .map(|i| match INTEGER.contains(&i) {
            true => format!("CAST(?{i} AS BIGINT)"),
            false => format!("CAST(?{i} AS TEXT)"),
        })
        .collect();
    // The parent's count is raised first and the row inserted from what it returned: the
    // statement's count is the insert's (a parent gone meanwhile inserts nothing).
    format!(
        "WITH up AS (
           UPDATE threads p SET spawn_count = p.spawn_count + 1
           WHERE p.id = ?25 AND p.spawn_count < ?26
             AND (SELECT COUNT(*) FROM threads c
                  WHERE c.parent = p.id AND c.status IN ('created','running')) < ?27
           RETURNING p.id)
         INSERT INTO threads({COLS}) SELECT {} FROM up",
        values.join(",")
    )
}

/// `Store::register` inside an open transaction.
pub(super) fn register_in(
    db: &Db,
    row: &ThreadRow,
    admit: Option<&Admission>,
) -> Result<(), RegistryError> {
    if let Some(a) = admit {
        admit_child(db, a)?;
    }
    if let Some(old) = &row.continuation_of {
        may_continue(db, row, old)?;
    }
    db.execute_later(
        &format!("INSERT INTO threads({COLS}) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23,?24)"),
        &row_values(row),
    )
    .map_err(st)?;
    if let Some(a) = admit {
        db.execute_later(
            "UPDATE threads SET spawn_count=spawn_count+1 WHERE id=?1",
            params![a.parent.as_str()],
        )
        .map_err(st)?;
    }
    Ok(())
}

/// A parent's spawns so far and its live children. Two index lookups, not an `IN` list:
/// SQLite builds a temporary b-tree for one on every run.
pub(super) const ADMIT_COUNT: &str = "SELECT t.spawn_count,
       (SELECT COUNT(*) FROM threads c WHERE c.parent=t.id AND c.status='created')
       + (SELECT COUNT(*) FROM threads c WHERE c.parent=t.id AND c.status='running')
     FROM threads t WHERE t.id=?1";

/// Spawn admission: the parent's `spawns` and `concurrency` limits, checked (one query).
pub(super) fn admit_child(db: &Db, a: &Admission) -> Result<(), RegistryError> {
    let found = db
        .row(ADMIT_COUNT, params![a.parent.as_str()])
        .map_err(st)?
        .ok_or_else(|| RegistryError::Unknown(a.parent.clone()))?;
    let (used, live) = (found.uint(0).map_err(st)?, found.uint(1).map_err(st)?);
    if used >= a.spawns {
        return Err(RegistryError::Spawns {
            parent: a.parent.clone(),
            used,
            max: a.spawns,
        });
    }
    if live >= a.concurrency {
        return Err(RegistryError::Concurrency {
            parent: a.parent.clone(),
            live,
            max: a.concurrency,
        });
    }
    Ok(())
}

/// A continuation of `old`: checked and inserted under the registry's write lock (across
/// processes), so of two concurrent resumes of one thread, or of two threads of one tree, one
/// wins.
fn may_continue(db: &Db, row: &ThreadRow, old: &ThreadId) -> Result<(), RegistryError> {
    let refuse = |why: String| RegistryError::Continued {
        old: old.clone(),
        why,
    };
    // A continuation whose spawn was undone (withdrawn as it started: its predecessor was
    // cancelled; or its start failed) never ran: the thread may be continued again.
    let undone = format!("{}%", super::UNDONE);
    let by = db
        .row(
            "SELECT id FROM threads WHERE continuation_of=?1 AND NOT COALESCE(error,'') LIKE ?2 LIMIT 1",
            params![old.as_str(), undone],
        )
        .map_err(st)?;
    if let Some(by) = by {
        return Err(refuse(format!(
            "it was already continued by {}; resume that one",
            by.text(0).map_err(st)?
        )));
    }
    // A resumed thread must not run beside its live tree; a handoff (it has a live parent) is
    // the tree itself going on.
    if row.parent_id.is_none() {
        let live = db
            .row(
                "SELECT id FROM threads WHERE root=?1 AND id<>?2 AND status IN ('created','running') LIMIT 1",
                params![row.root_id.as_str(), row.id.as_str()],
            )
            .map_err(st)?;
        if let Some(live) = live {
            return Err(refuse(format!(
                "thread {} of its tree {} is still running; its tree draws on one budget, so wait for it or cancel it first",
                live.text(0).map_err(st)?,
                row.root_id
            )));
        }
    }
    Ok(())
}
