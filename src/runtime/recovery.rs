//! Crash recovery (SPEC §7): threads left `created`/`running` by a process that is gone are
//! finalized as `error` with kind `interrupted`.
//!
//! For each such thread, deepest first: its ledger account is closed (open reservations released
//! unspent — what a dead process spent in flight is unknown; what it settled stays), a torn last
//! transcript line is set aside in `transcript.torn`, the transcript gets an `interrupted` and a
//! `thread_finished` event and a signed checkpoint, thread.json is re-signed as `error`, and the
//! registry row is closed. Runs at the start of every command that opens a project for writing.
//! Must never touch a thread whose owner process is alive.

use crate::core::ids::{now_ts, ThreadId};
use crate::core::status::Status;
use crate::ledger::LedgerMsg;
use crate::project::config::Durability;
use crate::record::thread_doc::ThreadDoc;
use crate::record::transcript::TranscriptWriter;
use crate::registry::{RegistryMsg, ThreadRow};
use crate::thread::Ctx;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// One recovered thread.
#[derive(Debug, Clone, Serialize)]
pub struct Recovered {
    /// The thread.
    pub id: String,
    /// The dead owner's pid.
    pub owner_pid: u32,
    /// A torn last transcript line was moved to `transcript.torn`.
    pub torn_line_kept: bool,
    /// Anything recovery could not do (e.g. an unverifiable thread.json), naming the file.
    pub problems: Vec<String>,
}

/// Is `pid` a live weft process (this one, or one whose program is `weft` or this binary)?
/// Without `/proc` every pid counts as alive: recovery then never steals a running thread.
pub(crate) fn owner_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let proc = std::path::Path::new("/proc");
    if !proc.exists() {
        return true;
    }
    let Ok(cmdline) = std::fs::read(proc.join(pid.to_string()).join("cmdline")) else {
        return false;
    };
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    let name = std::path::Path::new(std::str::from_utf8(argv0).unwrap_or_default())
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let me = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().to_string()));
    name == "weft" || Some(name) == me
}

/// Finalizes every thread of the project whose owner process is gone.
pub(crate) async fn recover(ctx: &Arc<Ctx>) -> Vec<Recovered> {
    let rows = match ractor::call!(ctx.registry, |reply| RegistryMsg::Unfinished { reply }) {
        Ok(Ok(rows)) => rows,
        other => {
            tracing::error!("recovery: cannot list unfinished threads: {other:?}");
            return vec![];
        }
    };
    let orphans: Vec<ThreadRow> = rows
        .into_iter()
        .filter(|r| !owner_alive(r.owner_pid))
        .collect();
    // Deepest first, so every child is closed before its parent.
    let parents: HashMap<String, Option<String>> = orphans
        .iter()
        .map(|r| (r.id.clone(), r.parent_id.clone()))
        .collect();
    let depth = |id: &str| -> usize {
        let mut d = 0;
        let mut cur = id.to_string();
        while let Some(Some(p)) = parents.get(&cur) {
            d += 1;
            cur = p.clone();
            if d > 10_000 {
                break;
            }
        }
        d
    };
    let mut order: Vec<(usize, ThreadRow)> =
        orphans.iter().map(|r| (depth(&r.id), r.clone())).collect();
    order.sort_by_key(|o| std::cmp::Reverse(o.0));
    let mut out = Vec::new();
    for (_, row) in order {
        out.push(recover_one(ctx, &row).await);
    }
    close_orphan_accounts(ctx).await;
    out
}

/// Closes ledger accounts left open by dead processes that never registered their thread (the
/// process died between opening the account and registering): nothing was spent on them.
async fn close_orphan_accounts(ctx: &Arc<Ctx>) {
    let open =
        ractor::call!(ctx.ledger, |reply| LedgerMsg::OpenAccounts { reply }).unwrap_or_default();
    for (id, owner) in open {
        if owner_alive(owner) {
            continue;
        }
        tracing::warn!(thread = %id, "closing the ledger account of a thread whose process (pid {owner}) died before registering it");
        let _ = ractor::call!(ctx.ledger, |reply| LedgerMsg::Close { id, reply });
    }
}

async fn recover_one(ctx: &Arc<Ctx>, row: &ThreadRow) -> Recovered {
    let mut rec = Recovered {
        id: row.id.clone(),
        owner_pid: row.owner_pid,
        torn_line_kept: false,
        problems: vec![],
    };
    let Ok(id) = ThreadId::parse(&row.id) else {
        rec.problems.push(format!(
            "registry row with invalid id `{}` left as is",
            row.id
        ));
        return rec;
    };
    let error = format!(
        "interrupted: the process that ran this thread (pid {}) ended while it was {}; `weft resume {id}` continues it",
        row.owner_pid, row.status
    );
    // Calls the transcript recorded but whose settlement the ledger may never have stored: settle
    // them with the recorded cost (a no-op for those already settled), then close the account,
    // which releases whatever is still reserved as unspent.
    let tr = ctx.project.thread_dir(&id).join("transcript.jsonl");
    if let Ok(read) = crate::record::transcript::read(&tr, id.as_str(), None) {
        for e in read
            .events
            .iter()
            .filter(|e| e["type"] == "llm_call" || e["type"] == "llm_retry")
        {
            if let (Some(reservation), Some(cost)) =
                (e["reservation"].as_u64(), e["cost_nanos"].as_i64())
            {
                let actual = crate::core::money::Nanos(cost);
                let _ = ractor::call!(ctx.ledger, |reply| LedgerMsg::Settle {
                    reservation,
                    actual,
                    reply: Some(reply)
                });
            }
        }
    }
    let acct = ractor::call!(ctx.ledger, |reply| LedgerMsg::Close {
        id: id.clone(),
        reply
    })
    .ok()
    .and_then(Result::ok);
    let spend = acct.as_ref().map_or(row.spend_nanos, |a| a.spent.0);
    let own = acct.as_ref().map_or(row.own_spend_nanos, |a| a.own_spent.0);
    let dir = ctx.project.thread_dir(&id);
    let tr_path = dir.join("transcript.jsonl");
    // The process may have died between registering the thread and creating its files.
    if let Err(e) = std::fs::create_dir_all(dir.join("files")) {
        rec.problems.push(format!("{}: {e}", dir.display()));
    }
    let repaired = if tr_path.exists() {
        crate::record::transcript::repair(&tr_path).map(|(head, torn)| {
            rec.torn_line_kept = torn;
            (head, false)
        })
    } else {
        std::fs::File::create(&tr_path).map(|_| {
            (
                crate::record::transcript::Head {
                    seq: -1,
                    hash: crate::record::transcript::GENESIS.into(),
                },
                true,
            )
        })
    };
    let head = match repaired {
        Ok((head, fresh)) => {
            let w = TranscriptWriter::open_append(
                &tr_path,
                id.as_str(),
                head,
                ctx.signer.clone(),
                Durability::Strict,
                u64::MAX,
            );
            match w {
                Ok(mut w) => {
                    let note = if fresh {
                        "the process died before the thread's files were written"
                    } else {
                        ""
                    };
                    let _ = w.append("interrupted", json!({ "owner_pid": row.owner_pid, "torn_line_kept": rec.torn_line_kept, "note": note }));
                    let _ = w.append(
                        "thread_finished",
                        json!({ "status": "error", "error": error, "error_kind": "interrupted", "spend_nanos": spend, "own_spend_nanos": own }),
                    );
                    if let Err(e) = w.checkpoint() {
                        rec.problems.push(format!("{}: {e}", tr_path.display()));
                    }
                    Some(w.head().clone())
                }
                Err(e) => {
                    rec.problems.push(format!("{}: {e}", tr_path.display()));
                    None
                }
            }
        }
        Err(e) => {
            rec.problems.push(format!("{}: {e}", tr_path.display()));
            None
        }
    };
    let doc_path = dir.join("thread.json");
    // A thread.json torn by the crash (not JSON at all) is set aside and rebuilt; one that parses
    // but fails verification is left for `weft verify` to report: recovery never signs over it.
    let torn_doc = doc_path.exists()
        && std::fs::read(&doc_path)
            .map(|b| serde_json::from_slice::<Value>(&b).is_err())
            .unwrap_or(false);
    if torn_doc {
        let _ = std::fs::rename(&doc_path, dir.join("thread.json.torn"));
    }
    let doc = if doc_path.exists() {
        ThreadDoc::read_verified(&doc_path, &ctx.trust)
            .map_err(|e| format!("{e} (left as is; `weft verify` reports it)"))
    } else {
        Ok(doc_from_row(ctx, row, &id, acct.as_ref().map(|a| a.max)))
    };
    match doc {
        Ok(mut doc) => {
            doc.error = Some(error.clone());
            doc.error_kind = Some("interrupted".into());
            doc.cost.spend_nanos = spend;
            doc.cost.own_spend_nanos = own;
            if let Some(h) = head {
                doc.transcript_head = h;
            }
            doc.transition(Status::Error);
            if let Err(e) = doc.write_signed(&doc_path, &ctx.signer, true) {
                rec.problems.push(format!("{}: {e}", doc_path.display()));
            }
        }
        Err(e) => rec.problems.push(e),
    }
    let mut fin = row.clone();
    fin.status = "error".into();
    fin.error = Some(error);
    fin.spend_nanos = spend;
    fin.own_spend_nanos = own;
    fin.updated_at = now_ts();
    if let Err(e) = ractor::call!(ctx.registry, |reply| RegistryMsg::FinishInterrupted {
        row: Box::new(fin),
        reply
    }) {
        rec.problems.push(format!("registry: {e}"));
    }
    rec
}

/// A thread.json for a thread whose process died before writing one: what the registry and
/// the ledger know; limits the directive and config would have given it, spend as opened.
fn doc_from_row(
    ctx: &Ctx,
    row: &ThreadRow,
    id: &ThreadId,
    max: Option<crate::core::money::Nanos>,
) -> ThreadDoc {
    let directive = ctx.library.load(&row.directive).ok();
    let mut limits = crate::core::limits::resolve(
        &ctx.config.default_limits,
        &directive
            .as_ref()
            .map(|d| d.limits.clone())
            .unwrap_or_default(),
        &crate::core::limits::LimitSet::default(),
        None,
    );
    if let Some(m) = max {
        limits.spend = m;
    }
    let parse = |s: &Option<String>| s.as_deref().and_then(|p| ThreadId::parse(p).ok());
    ThreadDoc {
        version: 1,
        id: id.clone(),
        directive: row.directive.clone(),
        directive_hash: directive
            .as_ref()
            .map(|d| d.content_hash.clone())
            .unwrap_or_default(),
        parent_id: parse(&row.parent_id),
        root_id: ThreadId::parse(&row.root_id).unwrap_or_else(|_| id.clone()),
        status: Status::Created,
        history: vec![crate::record::thread_doc::Transition {
            status: Status::Created,
            at: row.created_at.clone(),
        }],
        created_at: row.created_at.clone(),
        updated_at: row.updated_at.clone(),
        model: row.model.clone(),
        provider: String::new(),
        limits,
        capabilities: vec![],
        cost: crate::record::thread_doc::Cost::default(),
        outputs: None,
        result: None,
        error: None,
        error_kind: None,
        continuation_of: parse(&row.continuation_of),
        continued_by: None,
        chain_root: parse(&row.chain_root),
        transcript_head: crate::record::transcript::Head {
            seq: -1,
            hash: crate::record::transcript::GENESIS.into(),
        },
    }
}
