//! The registry's row as SQL sees it: its columns, the values an insert takes, and a row read
//! back (a value weft never writes there is a `Corrupt` error naming it).

use super::{st, RegistryError, ThreadRow};
use crate::core::ids::ThreadId;
use crate::core::status::Status;
use crate::sql::{params, Row, Value};

/// The `threads` table's columns, in the order every query reads them.
pub(super) const COLS: &str = "id,directive,parent,root,status,created_at,updated_at,model,turns,tokens_in,tokens_out,own_spend,spend,spawn_count,result,outputs,error,owner_pid,continuation_of,chain_root,waiting,status_text,forked_from,meta";

/// The values of a row as its insert takes them (`COLS` order).
pub(super) fn row_values(row: &ThreadRow) -> Vec<Value> {
    params![
        row.id.as_str(),
        row.directive.as_str(),
        row.parent_id.as_deref(),
        row.root_id.as_str(),
        row.status.as_str(),
        row.created_at.as_str(),
        row.updated_at.as_str(),
        row.model.as_str(),
        row.turns,
        row.input_tokens,
        row.output_tokens,
        row.own_spend_nanos,
        row.spend_nanos,
        row.spawn_count,
        row.result.as_deref(),
        row.outputs.as_ref().map(|o| o.to_string()),
        row.error.as_deref(),
        row.owner_pid,
        row.continuation_of.as_deref(),
        row.chain_root.as_deref(),
        row.waiting.as_deref(),
        row.status_text.as_deref(),
        row.forked_from.as_deref(),
        row.meta.as_ref().map(|m| m.to_string())
    ]
    .to_vec()
}

pub(super) fn read_row(r: &Row) -> Result<ThreadRow, RegistryError> {
    let row_id = r.text(0).map_err(st)?;
    let corrupt = |column: &'static str, value: String| RegistryError::Corrupt {
        row: row_id.clone(),
        column,
        value,
    };
    let id = |column, value: String| ThreadId::parse(&value).map_err(|_| corrupt(column, value));
    let some_id = |column, at: usize| -> Result<Option<ThreadId>, RegistryError> {
        let value = r.opt_text(at).map_err(st)?;
        value.map(|v| id(column, v)).transpose()
    };
    let text = |at: usize| r.text(at).map_err(st);
    let opt = |at: usize| r.opt_text(at).map_err(st);
    let count = |at: usize| r.uint(at).map_err(st);
    let nanos = |at: usize| r.int(at).map_err(st);
    let status = text(4)?;
    let owner = count(17)?;
    Ok(ThreadRow {
        id: id("id", row_id.clone())?,
        directive: text(1)?,
        parent_id: some_id("parent", 2)?,
        root_id: id("root", text(3)?)?,
        status: Status::parse(&status).ok_or_else(|| corrupt("status", status.clone()))?,
        created_at: text(5)?,
        updated_at: text(6)?,
        model: text(7)?,
        turns: count(8)?,
        input_tokens: count(9)?,
        output_tokens: count(10)?,
        own_spend_nanos: nanos(11)?,
        spend_nanos: nanos(12)?,
        spawn_count: count(13)?,
        result: opt(14)?,
        outputs: opt(15)?.and_then(|o| serde_json::from_str(&o).ok()),
        error: opt(16)?,
        owner_pid: u32::try_from(owner).map_err(|_| corrupt("owner_pid", owner.to_string()))?,
        continuation_of: some_id("continuation_of", 18)?,
        chain_root: some_id("chain_root", 19)?,
        waiting: opt(20)?,
        status_text: opt(21)?,
        forked_from: some_id("forked_from", 22)?,
        meta: opt(23)?.and_then(|m| serde_json::from_str(&m).ok()),
    })
}
