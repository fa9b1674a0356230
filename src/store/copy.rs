//! `weft copy --to postgres://…`: a project's whole history from its embedded SQLite files
//! (registry.db, ledger.db, store.db) and its records (every transcript, thread.json and the
//! anchor log) into a Postgres database, in one transaction, rows and records byte for byte:
//! `weft verify --all` on the copy checks the same signed bytes. The files stay as they were,
//! but for the ledger journals of runtimes that are gone, folded into ledger.db first. Refused
//! while a thread of the project runs or a live runtime has ledger records not yet in
//! ledger.db (a copy of a moving state is no copy), and into a database that already holds
//! threads (nothing is merged or overwritten).

use super::{storage, StoreError};
use crate::project::Project;
use crate::record::place::Records;
use crate::sql::{DatabaseUrl, Db, Lock, Value};

/// What was copied: rows per table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Copied {
    /// The target, password hidden.
    pub to: String,
    /// (table, rows) in the order they were copied.
    pub tables: Vec<(String, u64)>,
}

/// The tables of each concern and the columns copied (a generated column is made again).
const TABLES: &[(&str, &str, &str)] = &[
    ("registry.db", "threads", "id,directive,parent,root,status,created_at,updated_at,model,turns,tokens_in,tokens_out,own_spend,spend,spawn_count,result,outputs,error,owner_pid,continuation_of,chain_root,waiting,status_text,forked_from,meta"),
    ("ledger.db", "accounts", "id,parent,max,spent,own_spent,inflight,guaranteed,pool_left,closed,owner,placed"),
    ("ledger.db", "reservations", "id,thread,body"),
    ("store.db", "msgs", "thread,directive,n,seq,role,text"),
    ("store.db", "indexed", "thread,head"),
    ("store.db", "deleted", "thread,at"),
    ("store.db", "kv", "thread,key,value,updated_at"),
    ("store.db", "effects", "id,thread,kind,target,inputs,due_at,created_at,status,result,claimed_by,limits"),
    ("store.db", "env", "scope,name,value,secret,updated_at"),
];

/// Copies `project`'s SQLite state into the Postgres database `to`; `alive` says whether a
/// process (by pid) still runs.
pub fn copy_to(
    project: &Project,
    to: &DatabaseUrl,
    alive: &(dyn Fn(u32) -> bool + Send + Sync),
) -> Result<Copied, StoreError> {
    let state = project.state_dir();
    let registry = crate::registry::Store::open_read_only(&state.join("registry.db"))?;
    if let Some(live) = registry.unfinished()?.first() {
        return Err(StoreError::Invalid {
            rule: "copy.running",
            detail: format!("thread {} is {}; wait for the project's trees to end (or cancel them) before copying", live.id, live.status),
        });
    }
    // A live runtime's ledger is in its book and journal (a tree a scheduled directive keeps
    // open, its threads all ended); a dead one's journal is folded first.
    if let Some(pid) = crate::ledger::fold_journals(&state, alive).map_err(storage)? {
        return Err(StoreError::Invalid {
            rule: "copy.running",
            detail: format!("weft process {pid} has this project's ledger open (e.g. `weft serve`); stop it before copying"),
        });
    }
    // Each concern's schema made (or checked) on both sides by the concern itself.
    crate::registry::Store::open_at(Some(to), &state.join("registry.db"))?;
    crate::ledger::open_db(Some(to), &state.join("ledger.db")).map_err(storage)?;
    super::index::open(Some(to), &state.join("store.db"))?;
    crate::ledger::open_db(None, &state.join("ledger.db")).map_err(storage)?;
    super::index::open(None, &state.join("store.db"))?;
    let mut target = Db::postgres(to)?;
    for (_, table, _) in TABLES {
        let held = target.row(&format!("SELECT COUNT(*) FROM {table}"), &[])?;
        if held.map_or(Ok(0), |r| r.int(0))? > 0 {
            return Err(StoreError::Invalid {
                rule: "copy.target",
                detail: format!("{to} already holds rows of weft's `{table}`; copy into an empty database (nothing is merged or overwritten)"),
            });
        }
    }
    crate::record::tables::open_schema(&mut target)?;
    for table in crate::record::tables::TABLES {
        let held = target.row(&format!("SELECT COUNT(*) FROM {table}"), &[])?;
        if held.map_or(Ok(0), |r| r.int(0))? > 0 {
            return Err(StoreError::Invalid {
                rule: "copy.target",
                detail: format!("{to} already holds weft's thread records (`{table}`); copy into an empty database (nothing is merged or overwritten)"),
            });
        }
    }
    let mut tables = Vec::new();
    target.atomic(Lock::Schema, |target| {
        for (file, table, cols) in TABLES {
            let source = Db::open(None, &state.join(file), true)?;
            let n = copy_table(&source, target, table, cols)?;
            // Sent table by table: the server is never idle in the transaction for long, and
            // a failure names its table.
            target
                .flush()
                .map_err(|e| storage(format!("{table}: {e}")))?;
            tables.push((table.to_string(), n));
        }
        tables.extend(copy_records(project, target)?);
        Ok::<(), StoreError>(())
    })?;
    Ok(Copied {
        to: to.to_string(),
        tables,
    })
}

/// Every thread's transcript and thread.json, and the anchor log, from `project`'s files into
/// `target` (queued; sent with the commit); returns rows per table. A torn last line (a crash
/// mid-append that no recovery has set aside yet) is refused: it has no row to go to.
fn copy_records(project: &Project, target: &Db) -> Result<Vec<(String, u64)>, StoreError> {
    use crate::record::adopt::{queue_files, Torn};
    let files = Records::files(project);
    let ids = match files.thread_ids() {
        Ok(ids) => ids,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(storage(format!("{}: {e}", files.thread_name_all()))),
    };
    let n =
        queue_files(&files, target, &ids, true, Torn::Refuse).map_err(|e| StoreError::Invalid {
            rule: "copy.records",
            detail: e.to_string(),
        })?;
    target
        .flush()
        .map_err(|e| storage(format!("thread records: {e}")))?;
    Ok(vec![
        ("transcript_lines".into(), n.lines),
        ("thread_docs".into(), n.docs),
        ("anchor_lines".into(), n.anchors),
    ])
}

/// Every row of `table` from `source` into `target` (sent pipelined with the commit); returns
/// how many.
fn copy_table(source: &Db, target: &Db, table: &str, cols: &str) -> Result<u64, StoreError> {
    let rows = source.query(&format!("SELECT {cols} FROM {table}"), &[])?;
    // The search index's folded text is made again as the store makes it.
    let folded = table == "msgs";
    let all = match folded {
        true => format!("{cols},folded"),
        false => cols.to_string(),
    };
    let marks: Vec<String> = (1..=all.split(',').count())
        .map(|i| format!("?{i}"))
        .collect();
    let insert = format!("INSERT INTO {table}({all}) VALUES({})", marks.join(","));
    for row in &rows {
        let mut values: Vec<Value> = row.0.clone();
        if folded {
            let text = row.text(5)?;
            values.push(Value::Text(super::index::fold(
                &text,
                super::index::FOLDED_MAX,
            )));
        }
        target
            .execute_later(&insert, &values)
            .map_err(|e| storage(format!("{table}: {e}")))?;
    }
    Ok(rows.len() as u64)
}
