//! A batch's row updates on Postgres, held until the batch next reads or registers or
//! commits, then queued in statements of many rows: a statement costs the server about as
//! much as a row, and a row update was the most frequent statement of a tree. And the
//! server's statistics of `threads`, which those statements' plans are made from, kept up to
//! date as a tree grows the table.

use super::ThreadRow;
use crate::sql::{Db, Engine, Value};
use std::cell::RefCell;
use std::collections::HashSet;

/// Row updates held for the open batch transaction, in order.
#[derive(Default)]
pub(super) struct Held(RefCell<Vec<ThreadRow>>);

impl Held {
    pub(super) fn hold(&self, row: &ThreadRow) {
        self.0.borrow_mut().push(row.clone());
    }

    /// Queues the held updates on `db`'s open transaction, in order: a run of updates of
    /// distinct threads is one statement (each row as its own update would leave it: never out
    /// of a terminal state); a thread updated again starts the next run. A failure to queue is
    /// remembered by `db` and fails the batch's commit.
    pub(super) fn write(&self, db: &Db) {
        // Held only inside the batch, which ends only through a commit that writes them first.
        debug_assert!(
            self.0.borrow().is_empty() || db.in_tx(),
            "held outside a batch"
        );
        let held = std::mem::take(&mut *self.0.borrow_mut());
        let mut rest = held.as_slice();
        while !rest.is_empty() {
            let mut seen = HashSet::new();
            let run = rest
                .iter()
                .position(|r| !seen.insert(&r.id))
                .unwrap_or(rest.len());
            let values: Vec<Value> = rest[..run].iter().flat_map(row_values).collect();
            let _ = db.rows_later(13, &values, update_sql);
            rest = &rest[run..];
        }
    }
}

/// The 13 values of `row`'s update, in [`update_sql`]'s order (and `UPDATE_ROW`'s).
pub(super) fn row_values(row: &ThreadRow) -> [Value; 13] {
    [
        Value::from(row.id.as_str()),
        Value::from(row.status.as_str()),
        Value::from(row.updated_at.as_str()),
        Value::from(row.turns),
        Value::from(row.input_tokens),
        Value::from(row.output_tokens),
        Value::from(row.own_spend_nanos),
        Value::from(row.spend_nanos),
        Value::from(row.result.as_deref()),
        Value::from(row.outputs.as_ref().map(|o| o.to_string())),
        Value::from(row.error.as_deref()),
        Value::from(row.waiting.as_deref()),
        Value::from(row.status_text.as_deref()),
    ]
}

/// The update of `n` distinct threads' rows (Postgres). The first row's casts type every
/// row's values; the id compares in the column's collation.
fn update_sql(n: usize) -> String {
    use std::fmt::Write;
    const TYPES: [&str; 13] = [
        "TEXT", "TEXT", "TEXT", "BIGINT", "BIGINT", "BIGINT", "BIGINT", "BIGINT", "TEXT", "TEXT",
        "TEXT", "TEXT", "TEXT",
    ];
    let mut sql = String::from(
        "UPDATE threads AS t SET status=v.status, updated_at=v.updated_at, turns=v.turns,
           tokens_in=v.tokens_in, tokens_out=v.tokens_out, own_spend=v.own_spend, spend=v.spend,
           result=v.result, outputs=v.outputs, error=v.error, waiting=v.waiting,
           status_text=v.status_text
         FROM (VALUES ",
    );
    for r in 0..n {
        sql.push_str(if r == 0 { "(" } else { ",(" });
        for (c, ty) in TYPES.iter().enumerate() {
            let sep = if c == 0 { "" } else { "," };
            let p = r * 13 + c + 1;
            let _ = match r {
                0 => write!(sql, "{sep}CAST(?{p} AS {ty})"),
                _ => write!(sql, "{sep}?{p}"),
            };
        }
        sql.push(')');
    }
    sql.push_str(
        ") AS v(id, status, updated_at, turns, tokens_in, tokens_out, own_spend, spend, result,
              outputs, error, waiting, status_text)
         WHERE t.id = v.id COLLATE \"C\" AND t.status<>'completed' AND t.status<>'error'
           AND t.status<>'cancelled' AND t.status<>'continued'",
    );
    sql
}

/// The registrations after which `threads` is analyzed first (then at each doubling).
const FIRST_ANALYZE: u64 = 256;

/// When this store has the server analyze `threads` (Postgres). The server keeps a prepared
/// statement's plan for its connection, made from the statistics of the moment, and nothing
/// else analyzes a table that a tree grows in seconds (autovacuum looks a minute later): a plan
/// made while the table was a few rows — never analyzed, or vacuumed or analyzed small
/// (`weft gc`'s `VACUUM`, autovacuum) — a whole-table scan, fine then, stayed as the table
/// grew, and the batch updates above each read all of `threads` (~1 ms a statement at 11,111
/// rows against ~0.2 ms by the key). Analyzing after 256 registrations of this store, then at
/// each doubling, has every connection's plans on the table made again from its size now.
pub(super) struct Statistics {
    registered: u64,
    next: u64,
}

impl Default for Statistics {
    fn default() -> Self {
        Statistics {
            registered: 0,
            next: FIRST_ANALYZE,
        }
    }
}

impl Statistics {
    /// One more row registered.
    pub(super) fn registered(&mut self) {
        self.registered += 1;
    }

    /// Analyzes `threads` when this store's registrations have doubled since it last did; only
    /// outside a transaction (its own, a few milliseconds, holding no lock of weft's). A role
    /// that does not own the table gets a warning from the server and the plans stay as they
    /// are.
    pub(super) fn refresh(&mut self, db: &Db) {
        if db.engine() != Engine::Postgres || db.in_tx() || self.registered < self.next {
            return;
        }
        self.next = self.registered.saturating_mul(2);
        if let Err(e) = db.batch("ANALYZE threads") {
            tracing::debug!("registry: ANALYZE threads: {e}");
        }
    }
}
