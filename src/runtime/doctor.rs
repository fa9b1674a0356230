//! `weft doctor`: health figures of a project and the reconciliation of its registry, files
//! and ledger (deepagents' health metrics and reconcile). [`diagnose`] only reads — it needs
//! no runtime, so it also works when the registry is too broken to open one; a broken database
//! is reported as broken, never as every thread being stale. [`Runtime::repair`] fixes what is
//! safe to fix, through the actors that own each database.

use super::Runtime;
use crate::core::ids::ThreadId;
use crate::project::Project;
use crate::record::place::Records;
use crate::record::signing::Trust;
use crate::record::thread_doc::ThreadDoc;
use crate::registry::{RegistryMsg, Store, ThreadRow};
use crate::store::ThreadStore;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime};

/// How a project is doing.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Health {
    /// Threads in the registry.
    pub threads: usize,
    /// Threads `created` or `running`.
    pub active: usize,
    /// Finished threads unchanged for 7 days.
    pub inactive_7d: usize,
    /// Mean, over threads that called a model, of their largest prompt (tokens).
    pub context_avg_tokens: u64,
    /// The largest prompt any thread sent (tokens), and which thread.
    pub context_max_tokens: u64,
    /// The thread of `context_max_tokens`.
    pub context_max_thread: Option<String>,
    /// Transcript lines, all threads.
    pub transcript_lines: u64,
    /// Bytes of every thread folder.
    pub thread_bytes: u64,
    /// Bytes of each database (write-ahead log included).
    pub databases: BTreeMap<String, u64>,
}

/// One inconsistency.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// `row_without_folder`, `folder_without_row`, `status_mismatch`, `unverified`,
    /// `open_reservations`, `open_account`, `damaged_row`.
    pub kind: &'static str,
    /// The thread.
    pub thread: String,
    /// What is wrong.
    pub detail: String,
    /// `--fix` can repair it safely.
    pub fixable: bool,
    /// What `--fix` did.
    pub fixed: Option<String>,
}

/// What [`diagnose`] found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Checkup {
    /// Figures; None when the registry cannot be read.
    pub health: Option<Health>,
    /// Databases that cannot be read, with why.
    pub broken: Vec<String>,
    /// Inconsistencies between registry, files and ledger.
    pub problems: Vec<Problem>,
}

fn problem(kind: &'static str, thread: &str, detail: String, fixable: bool) -> Problem {
    Problem {
        kind,
        thread: thread.to_string(),
        detail,
        fixable,
        fixed: None,
    }
}

/// Opens a database read-only and runs SQLite's own integrity check on it.
fn checked(path: &std::path::Path) -> Result<rusqlite::Connection, String> {
    let db =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| e.to_string())?;
    db.busy_timeout(Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let verdict: String = db
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if verdict != "ok" {
        return Err(verdict);
    }
    Ok(db)
}

/// Reads the project and reports its health and inconsistencies (see the module doc).
pub fn diagnose(project: &Project) -> Checkup {
    let state = project.state_dir();
    let mut up = Checkup::default();
    let database = project.config().ok().and_then(|c| c.database);
    let ledger = match &database {
        // On a server: its own integrity is the server's; weft reads its ledger rows.
        Some(url) => match crate::sql::Db::postgres(url) {
            Ok(db) => Some(db),
            Err(e) => {
                up.broken.push(e.to_string());
                return up;
            }
        },
        None => check_databases(&state, &mut up.broken),
    };
    if up.broken.iter().any(|b| b.contains("registry.db")) {
        return up;
    }
    let Some(rows) = registry_rows(project, &mut up.broken) else {
        return up;
    };
    let (trust, _) = Trust::load(&project.trust_dir());
    let records = match project.config() {
        Ok(c) => Records::of(project, &c),
        Err(_) => Records::files(project),
    };
    if let Err(e) = crate::record::adopt::adopt_files(&records, project) {
        up.broken.push(format!(
            "moving record files to {}: {e}",
            records.thread_name_all()
        ));
    }
    let mut health = thread_health(&records, &trust, &rows, &mut up.problems);
    let by_id: HashMap<&str, &ThreadRow> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    let damaged = damaged_rows(project, &mut up.problems);
    folders_without_rows(
        project,
        &records,
        &trust,
        &by_id,
        &damaged,
        &mut up.problems,
    );
    if let Some(db) = ledger {
        ledger_leftovers(&db, &state, &by_id, &mut up.problems);
    }
    health.thread_bytes = crate::store::size_of(&project.weft().join("threads"));
    if database.is_none() {
        for name in ["registry.db", "ledger.db", "store.db"] {
            health
                .databases
                .insert(name.into(), crate::store::db_size(&state.join(name)));
        }
    }
    up.health = Some(health);
    up
}

/// Runs SQLite's integrity check on each database of `state` there is, adding the broken ones
/// to `broken`; returns ledger.db, opened read-only, when it is sound.
fn check_databases(state: &std::path::Path, broken: &mut Vec<String>) -> Option<crate::sql::Db> {
    let mut ledger = None;
    for name in ["registry.db", "ledger.db", "store.db"] {
        let path = state.join(name);
        if !path.exists() {
            continue;
        }
        match checked(&path) {
            Ok(db) if name == "ledger.db" => ledger = Some(crate::sql::Db::sqlite(db)),
            Ok(_) => {}
            Err(e) => broken.push(format!(
                "{}: {e} — restore it from a backup (thread.json files stay the truth)",
                path.display()
            )),
        }
    }
    ledger
}

/// Every row of the registry (none when there is no registry yet); None, with the reason
/// added to `broken`, when it cannot be read.
fn registry_rows(project: &Project, broken: &mut Vec<String>) -> Option<Vec<ThreadRow>> {
    let path = project.state_dir().join("registry.db");
    let on_server = project.config().is_ok_and(|c| c.database.is_some());
    match Store::read_project(project).and_then(|s| s.list(false, usize::MAX >> 1)) {
        Ok(rows) => Some(rows),
        Err(e) if !on_server && !path.exists() => {
            tracing::debug!("no registry yet: {e}");
            Some(Vec::new())
        }
        Err(e) => {
            broken.push(format!("{}: {e}", path.display()));
            None
        }
    }
}

/// The figures of the registry's threads (all but the sizes), and the problems of each row's
/// folder: missing, or its thread.json unverified or disagreeing with the row.
fn thread_health(
    records: &Records,
    trust: &Trust,
    rows: &[ThreadRow],
    problems: &mut Vec<Problem>,
) -> Health {
    let mut health = Health {
        threads: rows.len(),
        ..Default::default()
    };
    let week_ago = SystemTime::now()
        .checked_sub(Duration::from_secs(7 * 86_400))
        .map(|t| humantime::format_rfc3339_millis(t).to_string())
        .unwrap_or_default();
    let (mut ctx_sum, mut ctx_n) = (0u64, 0u64);
    for r in rows {
        if r.status.is_terminal() {
            health.inactive_7d += usize::from(r.updated_at < week_ago);
        } else {
            health.active += 1;
        }
        let Ok(id) = ThreadId::parse(&r.id) else {
            continue;
        };
        if !records.has(&id).unwrap_or(true) {
            // A spawn undone before it ran (withdrawn, or its start failed) leaves no records.
            if !r.undone() {
                problems.push(row_without_folder(r, &records.thread_name(&id)));
            }
            continue;
        }
        let (lines, largest) = transcript_figures(records, &id);
        health.transcript_lines += lines;
        if largest > 0 {
            ctx_sum += largest;
            ctx_n += 1;
            if largest > health.context_max_tokens {
                health.context_max_tokens = largest;
                health.context_max_thread = Some(r.id.to_string());
            }
        }
        problems.extend(doc_problem(r, records, &id, trust));
    }
    health.context_avg_tokens = ctx_sum.checked_div(ctx_n).unwrap_or(0);
    health
}

/// A registry row whose thread's records (`dir`, as named) are gone.
fn row_without_folder(r: &ThreadRow, dir: &str) -> Problem {
    let fixable = r.status.is_terminal();
    let how = if fixable {
        "the row is removed by --fix"
    } else {
        "the next `weft recover` finalizes it"
    };
    problem(
        "row_without_folder",
        &r.id,
        format!(
            "registry row ({}) but no records at {}; {how}",
            r.status, dir
        ),
        fixable,
    )
}

/// What is wrong with `id`'s thread.json, if anything: unverified, or a status that
/// disagrees with the row where either one is terminal.
fn doc_problem(r: &ThreadRow, records: &Records, id: &ThreadId, trust: &Trust) -> Option<Problem> {
    match ThreadDoc::read_verified(records, id, trust) {
        Err(e) => Some(problem(
            "unverified",
            &r.id,
            format!("{e} (`weft verify {}` names the broken part)", r.id),
            false,
        )),
        Ok(doc)
            if doc.status.as_str() != r.status
                && (doc.status.is_terminal() || r.status.is_terminal()) =>
        {
            let fixable = doc.status.is_terminal() && !r.status.is_terminal();
            Some(problem(
                "status_mismatch",
                &r.id,
                format!(
                    "thread.json says {} but the registry says {}",
                    doc.status.as_str(),
                    r.status
                ),
                fixable,
            ))
        }
        Ok(_) => None,
    }
}

/// Lines of a transcript and the largest prompt (input tokens) any of its calls sent.
fn transcript_figures(records: &Records, id: &ThreadId) -> (u64, u64) {
    let Ok(Some(bytes)) = records.transcript(id) else {
        return (0, 0);
    };
    let mut largest = 0;
    let mut lines = 0;
    for l in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        lines += 1;
        if l.windows(10).any(|w| w == b"\"llm_call\"") {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(l) {
                largest = largest.max(v["usage"]["input_tokens"].as_u64().unwrap_or(0));
            }
        }
    }
    (lines, largest)
}

/// Rows weft never wrote (a bad id or status): reported, never fixed by `--fix` (a person
/// decides what the row should say). Returns their ids.
fn damaged_rows(project: &Project, out: &mut Vec<Problem>) -> Vec<String> {
    let found = Store::read_project(project).and_then(|s| s.damaged());
    let mut ids = Vec::new();
    for (id, e) in found.unwrap_or_default() {
        let detail = format!("{e}; it is left out of every list and of recovery until it is corrected or deleted in registry.db");
        out.push(problem("damaged_row", &id, detail, false));
        ids.push(id);
    }
    ids
}

fn folders_without_rows(
    project: &Project,
    records: &Records,
    trust: &Trust,
    rows: &HashMap<&str, &ThreadRow>,
    damaged: &[String],
    out: &mut Vec<Problem>,
) {
    let names: Vec<String> = match records.on_files() {
        true => match std::fs::read_dir(project.weft().join("threads")) {
            Ok(entries) => entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect(),
            Err(_) => return,
        },
        false => records
            .thread_ids()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect(),
    };
    for name in names {
        if rows.contains_key(name.as_str()) || damaged.contains(&name) {
            continue;
        }
        let detail = match ThreadId::parse(&name) {
            Err(_) => format!("{} is not a thread folder; --fix moves it to .weft/lost+found", project.weft().join("threads").join(&name).display()),
            Ok(id) => match ThreadDoc::read_verified(records, &id, trust) {
                Ok(doc) => format!("a folder with a verified thread.json ({}) but no registry row; --fix registers it", doc.status.as_str()),
                Err(err) => format!("a folder without a registry row or a verified thread.json ({err}); --fix moves it to .weft/lost+found"),
            },
        };
        // Records on a server are never moved aside: only a verified one can be fixed.
        let fixable = records.on_files()
            || ThreadId::parse(&name)
                .is_ok_and(|id| ThreadDoc::read_verified(records, &id, trust).is_ok());
        out.push(problem("folder_without_row", &name, detail, fixable));
    }
}

/// Reservations and accounts still open in ledger.db for finished threads. A tree held by a
/// live runtime whose journal has records not yet folded is left out: that runtime's book is
/// its ledger, and its threads' ends reach ledger.db with the next fold.
fn ledger_leftovers(
    db: &crate::sql::Db,
    state: &std::path::Path,
    rows: &HashMap<&str, &ThreadRow>,
    out: &mut Vec<Problem>,
) {
    let query = |sql: &str| -> Vec<(String, i64)> {
        db.query(sql, &[])
            .unwrap_or_default()
            .iter()
            .filter_map(|r| Some((r.text(0).ok()?, r.int(1).ok()?)))
            .collect()
    };
    let alive = |pid| super::owner::alive(state, pid);
    let held = crate::ledger::unfolded_owners(state, &alive);
    let journaled = held_by(db, &held);
    let finished =
        |id: &str| rows.get(id).is_some_and(|r| r.status.is_terminal()) && !journaled.contains(id);
    let mut seen = HashSet::new();
    for (id, n) in query("SELECT thread, COUNT(*) FROM reservations GROUP BY thread") {
        if finished(&id) {
            seen.insert(id.clone());
            out.push(problem("open_reservations", &id, format!("{n} reservation(s) still open in the ledger for a finished thread; --fix releases them"), true));
        }
    }
    for (id, inflight) in query("SELECT id, inflight FROM accounts WHERE closed=0") {
        if finished(&id) && !seen.contains(&id) {
            out.push(problem("open_account", &id, format!("its ledger account is still open ({inflight} nano-USD in flight) though it finished; --fix closes it"), true));
        }
    }
}

/// The accounts in ledger.db of the trees whose top is held by one of `owners`.
fn held_by(db: &crate::sql::Db, owners: &HashSet<u32>) -> HashSet<String> {
    if owners.is_empty() {
        return HashSet::new();
    }
    let rows = db
        .query("SELECT id, parent, owner FROM accounts", &[])
        .unwrap_or_default();
    let up: HashMap<String, (Option<String>, i64)> = rows
        .iter()
        .filter_map(|r| Some((r.text(0).ok()?, (r.text(1).ok(), r.int(2).ok()?))))
        .collect();
    let top_owner = |id: &str| {
        let mut cur = id;
        for _ in 0..10_000 {
            match up.get(cur) {
                Some((Some(p), _)) if up.contains_key(p.as_str()) => cur = p,
                Some((_, owner)) => return u32::try_from(*owner).ok(),
                None => return None,
            }
        }
        None
    };
    up.keys()
        .filter(|id| top_owner(id).is_some_and(|o| owners.contains(&o)))
        .cloned()
        .collect()
}

/// A registry row rebuilt from a verified thread.json.
fn row_of_doc(d: &ThreadDoc) -> ThreadRow {
    ThreadRow {
        directive: d.directive.clone(),
        parent_id: d.parent_id.clone(),
        created_at: d.created_at.clone(),
        updated_at: d.updated_at.clone(),
        model: d.model.clone(),
        turns: d.cost.turns,
        input_tokens: d.cost.input_tokens,
        output_tokens: d.cost.output_tokens,
        own_spend_nanos: d.cost.own_spend_nanos,
        spend_nanos: d.cost.spend_nanos,
        result: d.result.clone(),
        outputs: d.outputs.clone(),
        error: d.error.clone(),
        continuation_of: d.continuation_of.clone(),
        chain_root: d.chain_root.clone(),
        forked_from: d.forked_from.as_ref().map(|f| f.thread.clone()),
        ..ThreadRow::new(d.id.clone(), d.root_id.clone(), d.status)
    }
}

impl Runtime {
    /// Repairs what [`diagnose`] marked fixable, through the actors that own each database,
    /// and records on each problem what was done.
    pub async fn repair(&self, up: &mut Checkup) {
        let ctx = self.ctx.clone();
        for p in up.problems.iter_mut().filter(|p| p.fixable) {
            let id = ThreadId::parse(&p.thread);
            p.fixed = Some(match (p.kind, id) {
                ("row_without_folder", Ok(id)) => match ctx.store.delete(&id, false) {
                    Ok(_) => "row removed".into(),
                    Err(e) => format!("not fixed: {e}"),
                },
                ("folder_without_row", Ok(id)) => {
                    match ThreadDoc::read_verified(ctx.store.records(), &id, &ctx.trust) {
                        Ok(doc) => {
                            let row = Box::new(row_of_doc(&doc));
                            match ractor::call!(ctx.registry, |reply| RegistryMsg::Register {
                                row,
                                admit: None,
                                reply
                            }) {
                                Ok(Ok(())) => format!("registered ({})", doc.status.as_str()),
                                other => format!("not fixed: {other:?}"),
                            }
                        }
                        Err(_) => lost_and_found(&ctx.project, ctx.store.records(), &p.thread),
                    }
                }
                ("folder_without_row", Err(_)) => {
                    lost_and_found(&ctx.project, ctx.store.records(), &p.thread)
                }
                ("status_mismatch", Ok(id)) => {
                    match ThreadDoc::read_verified(ctx.store.records(), &id, &ctx.trust) {
                        Ok(doc) => {
                            let row = Box::new(row_of_doc(&doc));
                            match ractor::call!(ctx.registry, |reply| {
                                RegistryMsg::FinishInterrupted { row, reply }
                            }) {
                                Ok(Ok(())) => {
                                    format!("registry row set to {}", doc.status.as_str())
                                }
                                other => format!("not fixed: {other:?}"),
                            }
                        }
                        Err(e) => format!("not fixed: {e}"),
                    }
                }
                ("open_reservations" | "open_account", Ok(id))
                    if !super::recovery::take_tree(&ctx, &id).await =>
                {
                    "not fixed: another live weft process holds its tree; run `weft doctor --fix` again once it has ended".into()
                }
                ("open_reservations" | "open_account", Ok(id)) => {
                    match ractor::call!(ctx.ledger, |reply| crate::ledger::LedgerMsg::Close {
                        id,
                        reply
                    }) {
                        Ok(Ok(a)) => format!("account closed, spent {} kept", a.spent),
                        // Opening the runtime's recovery closed it already (its owner is gone).
                        Ok(Err(crate::ledger::LedgerError::Unknown(_))) => {
                            "account closed (its owner process is gone)".into()
                        }
                        other => format!("not fixed: {other:?}"),
                    }
                }
                _ => "not fixed: nothing safe to do".into(),
            });
        }
    }
}

/// Moves a folder nobody can vouch for aside (never deletes it). Records on a database server
/// stay where they are (`weft delete` removes them).
fn lost_and_found(project: &Project, records: &Records, name: &str) -> String {
    if !records.on_files() {
        return "not fixed: records on the database server stay (remove them with `weft delete`)"
            .into();
    }
    let aside = project.weft().join("lost+found");
    let from = project.weft().join("threads").join(name);
    match std::fs::create_dir_all(&aside).and_then(|()| std::fs::rename(&from, aside.join(name))) {
        Ok(()) => format!("moved to {}", aside.join(name).display()),
        Err(e) => format!("not fixed: {e}"),
    }
}
