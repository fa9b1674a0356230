//! Ending threads whose actor is gone — its process died (recovery), it was killed after its
//! parent's `cancel_grace`, or it panicked — deepest first, so no thread of a tree is left
//! non-terminal. The one place besides a thread's own actor that writes its transcript and
//! thread.json, and only when no actor of it runs.

use super::ctx::Ctx;
use super::report::ThreadReport;
use crate::core::ids::{now_ts, ReservationId, ThreadId};
use crate::core::money::Nanos;
use crate::core::status::Status;
use crate::ledger::LedgerMsg;
use crate::project::config::Durability;
use crate::record::line::{Gone, Line};
use crate::record::thread_doc::ThreadDoc;
use crate::record::transcript::TranscriptWriter;
use crate::registry::{RegistryMsg, ThreadRow};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// How a thread without a live actor ends.
pub(crate) struct DeadEnd {
    /// `error` (interrupted, failed) or `cancelled` (killed).
    pub(crate) status: Status,
    /// Why: the transcript line before `thread_finished` and thread.json's `error_kind`.
    pub(crate) kind: DeadKind,
    /// The thread's error message.
    pub(crate) error: String,
}

/// Why a thread ended without its actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeadKind {
    /// Its process died (recovery).
    Interrupted,
    /// Its subtree did not end within its parent's cancel grace.
    Killed,
    /// Its actor panicked or stopped without finalizing.
    Failed,
}

impl DeadKind {
    /// Its name: the transcript line's kind and thread.json's `error_kind`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DeadKind::Interrupted => "interrupted",
            DeadKind::Killed => "killed",
            DeadKind::Failed => "failed",
        }
    }

    /// Its transcript line.
    fn line(self, gone: Gone) -> Line {
        match self {
            DeadKind::Interrupted => Line::Interrupted(gone),
            DeadKind::Killed => Line::Killed(gone),
            DeadKind::Failed => Line::Failed(gone),
        }
    }
}

/// What finalizing a dead thread did.
pub(crate) struct Finalized {
    pub(crate) recovered: Recovered,
    pub(crate) report: ThreadReport,
}

impl Finalized {
    fn of(recovered: Recovered, row: &ThreadRow, end: &DeadEnd) -> Finalized {
        // What its row says it did, ended as `end` says.
        let report = ThreadReport {
            status: end.status,
            error: Some(end.error.clone()),
            result: None,
            ..ThreadReport::of_row(row)
        };
        Finalized { recovered, report }
    }

    fn with_status(mut self, status: Status, error: Option<String>) -> Finalized {
        self.report.status = status;
        self.report.error = error;
        self
    }
}

/// Ends `id`'s whole subtree, whose actors are dead or must die now: every actor of it still
/// running is killed, then each unfinished thread is finalized with `end`, deepest first.
/// Returns `id`'s report.
pub(crate) async fn end_subtree(ctx: &Arc<Ctx>, id: &ThreadId, end: &DeadEnd) -> ThreadReport {
    let rows = ractor::call!(ctx.registry, |reply| RegistryMsg::UnfinishedSubtree {
        id: id.clone(),
        reply
    })
    .ok()
    .and_then(Result::ok)
    .unwrap_or_default();
    // Threads of the subtree that another owner runs (children placed on other nodes) are
    // theirs to end: they were sent the cancel, and their ends come back through their
    // stand-ins; finalizing them here would write over their records and give back budget
    // they still spend.
    let me = crate::core::owner::me();
    let rows: Vec<ThreadRow> = rows.into_iter().filter(|r| r.owner_pid == me).collect();
    // A thread still being spawned gets its actor first (bounded): then it is killed like the
    // others, and its spawn never writes its files after they were finalized.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline
        && ctx
            .in_spawn
            .lock()
            .is_ok_and(|s| rows.iter().any(|r| s.iter().any(|i| i.as_str() == r.id)))
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for r in &rows {
        if let Some(cell) = ractor::registry::where_is(r.id.as_str()) {
            let _ = cell.kill_and_wait(Some(Duration::from_secs(2))).await;
        }
        // A killed actor never stops on its own road (`post_stop`): its note is handed on here
        // (to a continuation it had started, if any) or forgotten, and its chain's links go.
        ctx.hand_on_cancel(&r.id);
        if r.continuation_of.is_some() {
            ctx.end_chain(&r.id);
        }
    }
    // A killed actor's last writes (its final thread.json, queued on the writer threads) never
    // land after the dead finalization: those not started are skipped, a running one is waited
    // for.
    for r in &rows {
        ctx.writers.take_over(&r.id);
    }
    for r in &rows {
        ctx.writers.idle(&r.id, Duration::from_secs(10)).await;
    }
    let mut own = None;
    for r in &rows {
        let f = finalize_dead(ctx, r, end).await;
        for p in &f.recovered.problems {
            tracing::error!(thread = %r.id, "finalizing after its actor ended: {p}");
        }
        if r.id == id.as_str() {
            own = Some(f.report);
        }
    }
    match own {
        Some(r) => r,
        // It finalized itself meanwhile: report what the registry now says.
        None => {
            let row = ractor::call!(ctx.registry, |reply| RegistryMsg::Get {
                id: id.clone(),
                reply
            })
            .ok()
            .and_then(Result::ok)
            .flatten()
            .unwrap_or_else(|| ThreadRow::new(id.clone(), id.clone(), Status::Error));
            ThreadReport::of_row(&row)
        }
    }
}

/// A thread finalized without its actor (by recovery, or after a kill or a panic).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Recovered {
    /// The thread.
    pub id: String,
    /// The dead owner's pid.
    pub owner_pid: u32,
    /// A torn last transcript line was moved to `transcript.torn`.
    pub torn_line_kept: bool,
    /// Anything recovery could not do (e.g. an unverifiable thread.json), naming the file.
    pub problems: Vec<String>,
    /// Its signed thread.json was already terminal: recovery only brought its registry row in
    /// line (it ended as its records say, and is not resumed as interrupted).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub had_ended: bool,
}

/// Ends thread `row`, whose actor is gone (its process died, or it was killed or panicked),
/// with `end`: recorded calls settled, ledger account closed, a torn last transcript line set
/// aside, the transcript and thread.json completed, the registry row closed. A thread whose
/// signed thread.json is already terminal keeps its status: only its registry row is brought in
/// line (nothing leaves a terminal state).
pub(crate) async fn finalize_dead(ctx: &Arc<Ctx>, row: &ThreadRow, end: &DeadEnd) -> Finalized {
    let mut rec = Recovered {
        id: row.id.to_string(),
        owner_pid: row.owner_pid,
        torn_line_kept: false,
        problems: vec![],
        had_ended: false,
    };
    let id = row.id.clone();
    ctx.forget(&id);
    settle_recorded(ctx, &id).await;
    let charged = charge_at_bound(ctx, &id).await;
    let acct = ractor::call!(ctx.ledger, |reply| LedgerMsg::Close {
        id: id.clone(),
        reply
    })
    .ok()
    .and_then(Result::ok);
    let spend = Spend {
        tree: acct.as_ref().map_or(row.spend_nanos, |a| a.spent.0),
        own: acct.as_ref().map_or(row.own_spend_nanos, |a| a.own_spent.0),
        max: acct.as_ref().map(|a| a.max),
    };
    if let Ok(done) = ThreadDoc::read_verified(ctx.store.records(), &id, &ctx.trust) {
        if done.status.is_terminal() {
            return already_finished(ctx, row, end, rec, done).await;
        }
    }
    let head = end_transcript(ctx, row, end, &spend, &charged, &mut rec);
    let final_head = end_doc(ctx, row, end, &spend, head, &mut rec);
    let mut fin = row.clone();
    fin.status = end.status;
    fin.error = Some(end.error.clone());
    fin.spend_nanos = spend.tree;
    fin.own_spend_nanos = spend.own;
    fin.updated_at = now_ts();
    finish_row(ctx, &fin, &mut rec).await;
    ctx.store.index_later(crate::store::Ended {
        id: id.clone(),
        directive: fin.directive.clone(),
        head: -1,
        said: None,
    });
    let mut done = Finalized::of(rec, &fin, end);
    done.report.final_head = final_head;
    done
}

/// What a dead thread's account says it spent (its subtree's, its own) and could spend.
struct Spend {
    tree: i64,
    own: i64,
    max: Option<crate::core::money::Nanos>,
}

/// Calls under way when the actor died, which the transcript never recorded: the provider may
/// have billed them, so each is settled at what its reservation holds — its upper bound — and
/// never at nothing. Returns them, to be recorded.
async fn charge_at_bound(ctx: &Ctx, id: &ThreadId) -> Vec<(ReservationId, Nanos)> {
    let open = ractor::call!(ctx.ledger, |reply| LedgerMsg::OpenOf {
        id: id.clone(),
        reply
    })
    .unwrap_or_default();
    for (reservation, actual) in &open {
        let _ = ractor::call!(ctx.ledger, |reply| LedgerMsg::Settle {
            reservation: *reservation,
            actual: *actual,
            reply: Some(reply)
        });
    }
    open
}

/// The `llm_call` line of a call charged at its bound by recovery.
fn charged_line(model: &str, reservation: ReservationId, amount: Nanos) -> Line {
    Line::LlmCall {
        model: model.to_string(),
        provider: None,
        usage: Default::default(),
        cost_nanos: Some(amount),
        reservation: Some(reservation),
        usage_incomplete: true,
        error: Some(crate::record::line::CallError {
            kind: "unknown".into(),
            message: "unknown, charged at bound: the thread's process died during the call".into(),
        }),
        stop_reason: None,
        stream_deltas: None,
    }
}

/// It finalized itself but its registry row was never written: the row takes its status.
async fn already_finished(
    ctx: &Ctx,
    row: &ThreadRow,
    end: &DeadEnd,
    mut rec: Recovered,
    done: ThreadDoc,
) -> Finalized {
    rec.had_ended = true;
    // Its process may have died between its final thread.json and its anchor line (a root's):
    // anchored here, as every dead thread is (a line again for one that was anchored is
    // harmless: the latest names the same head).
    anchor(ctx, &done, &mut rec);
    let mut fin = row.clone();
    fin.status = done.status;
    fin.error = done.error.clone();
    fin.result = done.result.clone();
    fin.spend_nanos = done.cost.spend_nanos;
    fin.own_spend_nanos = done.cost.own_spend_nanos;
    fin.updated_at = now_ts();
    finish_row(ctx, &fin, &mut rec).await;
    let mut out = Finalized::of(rec, &fin, end).with_status(done.status, done.error);
    out.report.final_head = Some(done.transcript_head.hash);
    out
}

async fn finish_row(ctx: &Ctx, fin: &ThreadRow, rec: &mut Recovered) {
    if let Err(e) = ractor::call!(ctx.registry, |reply| RegistryMsg::FinishInterrupted {
        row: Box::new(fin.clone()),
        reply
    }) {
        rec.problems.push(format!("registry: {e}"));
    }
}

/// The transcript, a torn last line set aside (or made, if the process died before writing
/// it), ends with the `end.kind` line and `thread_finished`. Returns its new head.
fn end_transcript(
    ctx: &Ctx,
    row: &ThreadRow,
    end: &DeadEnd,
    spend: &Spend,
    charged: &[(ReservationId, Nanos)],
    rec: &mut Recovered,
) -> Option<crate::record::transcript::Head> {
    let id = &row.id;
    let records = ctx.store.records();
    let tr_path = records.transcript_name(id);
    // The process may have died between registering the thread and creating its files.
    if let Err(e) = std::fs::create_dir_all(ctx.store.files_dir(id)) {
        rec.problems
            .push(format!("{}: {e}", ctx.store.files_dir(id).display()));
    }
    let repaired = crate::record::transcript::repair(records, id).and_then(|found| match found {
        Some((head, torn)) => {
            rec.torn_line_kept = torn;
            Ok((head, false))
        }
        None => records
            .create_transcript(id, true)
            .map(|_| (crate::record::transcript::Head::empty(), true)),
    });
    let redactor = ctx.redactor();
    let written = repaired.and_then(|(head, fresh)| {
        let mut w = TranscriptWriter::open_append(
            records,
            id,
            head,
            ctx.signer.clone(),
            Durability::Strict,
            u64::MAX,
        )?;
        let note = match fresh {
            true => "the process died before the thread's files were written",
            false => "",
        };
        for (reservation, amount) in charged {
            let _ = w.append_line(charged_line(&row.model, *reservation, *amount), &redactor);
        }
        let gone = Gone {
            owner_pid: row.owner_pid,
            torn_line_kept: rec.torn_line_kept,
            note: note.into(),
        };
        let _ = w.append_line(end.kind.line(gone), &redactor);
        let _ = w.append_line(
            Line::ThreadFinished {
                status: end.status,
                error: Some(end.error.clone()),
                spend_nanos: Nanos(spend.tree),
                own_spend_nanos: Nanos(spend.own),
                run: None,
                error_kind: Some(end.kind.as_str().into()),
            },
            &redactor,
        );
        if let Err(e) = w.checkpoint() {
            rec.problems.push(format!("{tr_path}: {e}"));
        }
        Ok(w.head().clone())
    });
    written
        .map_err(|e| rec.problems.push(format!("{tr_path}: {e}")))
        .ok()
}

/// thread.json ends with `end`: a torn one (not JSON at all) is set aside and rebuilt from the
/// row; one that parses but fails verification is left for `weft verify` to report — recovery
/// never signs over it.
fn end_doc(
    ctx: &Ctx,
    row: &ThreadRow,
    end: &DeadEnd,
    spend: &Spend,
    head: Option<crate::record::transcript::Head>,
    rec: &mut Recovered,
) -> Option<String> {
    let records = ctx.store.records();
    let doc_path = records.doc_name(&row.id);
    let found = records.doc(&row.id).ok().flatten();
    let torn_doc = found
        .as_ref()
        .is_some_and(|b| serde_json::from_slice::<Value>(b).is_err());
    if torn_doc {
        let _ = records.set_aside_doc(&row.id);
    }
    let doc = if found.is_some() && !torn_doc {
        ThreadDoc::read_verified(records, &row.id, &ctx.trust)
            .map_err(|e| format!("{e} (left as is; `weft verify` reports it)"))
    } else {
        Ok(doc_from_row(ctx, row, &row.id, spend.max))
    };
    let mut doc = match doc {
        Ok(d) => d,
        Err(e) => {
            rec.problems.push(e);
            return None;
        }
    };
    doc.error = Some(end.error.clone());
    doc.error_kind = Some(end.kind.as_str().into());
    doc.cost.spend_nanos = spend.tree;
    doc.cost.own_spend_nanos = spend.own;
    if let Some(h) = head {
        doc.transcript_head = h;
    }
    doc.transition(end.status);
    if let Err(e) = doc.write_signed(records, &ctx.signer, true) {
        rec.problems.push(format!("{doc_path}: {e}"));
        return None;
    }
    // In the log whatever its parent: a parent that is gone too never records it.
    anchor(ctx, &doc, rec);
    Some(doc.transcript_head.hash)
}

/// Puts a dead thread's final head in the project's anchor log (its parent, dead too, never
/// records it); a failure is one of `rec`'s problems.
fn anchor(ctx: &Ctx, doc: &ThreadDoc, rec: &mut Recovered) {
    let records = ctx.store.records();
    let anchored = crate::record::anchors::anchor_root(
        records,
        &ctx.signer,
        &doc.id,
        doc.status,
        &doc.transcript_head,
    );
    if let Err(e) = anchored {
        rec.problems
            .push(format!("{}: {e}", records.anchors_name()));
    }
}

/// Settles the calls `id`'s transcript recorded but whose settlement the ledger may never have
/// stored, at their recorded cost (a no-op for those already settled). These lines are past the
/// last signed checkpoint (the process died), chained but unsigned: a negative cost is never
/// believed (that reservation is charged at its bound instead).
async fn settle_recorded(ctx: &Ctx, id: &ThreadId) {
    let Ok(read) = crate::record::transcript::read(ctx.store.records(), id, None) else {
        return;
    };
    for line in read.events.iter().map(Line::parse) {
        let (reservation, actual) = match line {
            Line::LlmCall {
                reservation: Some(r),
                cost_nanos: Some(c),
                ..
            }
            | Line::LlmRetry {
                reservation: Some(r),
                cost_nanos: Some(c),
                ..
            } => (r, c),
            _ => continue,
        };
        if actual.0 < 0 {
            // Not a cost a provider bills: left open, charged at its bound below.
            continue;
        }
        let _ = ractor::call!(ctx.ledger, |reply| LedgerMsg::Settle {
            reservation,
            actual,
            reply: Some(reply)
        });
    }
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
    ThreadDoc {
        version: 1,
        id: id.clone(),
        directive: row.directive.clone(),
        directive_hash: directive
            .as_ref()
            .map(|d| d.content_hash.clone())
            .unwrap_or_default(),
        parent_id: row.parent_id.clone(),
        root_id: row.root_id.clone(),
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
        approval: directive
            .as_ref()
            .map(|d| d.approval.clone())
            .unwrap_or_default(),
        cost: crate::record::thread_doc::Cost::default(),
        outputs: None,
        result: None,
        error: None,
        error_kind: None,
        continuation_of: row.continuation_of.clone(),
        continued_by: None,
        chain_root: row.chain_root.clone(),
        transcript_head: crate::record::transcript::Head::empty(),
        forked_from: None,
        imported: None,
        caused_by: Vec::new(),
        directive_signature: None,
    }
}
