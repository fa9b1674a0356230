//! `weft verify`: signatures, chains, heads and anchors of thread records; `--tree` also finds
//! a thread of the tree whose records are missing.

use super::args::VerifyArgs;
use super::{find_project, usage, Exit};
use crate::core::ids::ThreadId;
use crate::project::Project;
use crate::record::place::Records;
use crate::record::verify::Verdict;
use crate::registry::ThreadRow;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

pub(super) fn verify(explicit: Option<PathBuf>, args: VerifyArgs) -> Result<i32, Exit> {
    let VerifyArgs {
        ids,
        all,
        tree,
        json: as_json,
    } = args;
    let project = find_project(explicit)?;
    let mut targets: Vec<ThreadId> = ids
        .iter()
        .map(|i| ThreadId::parse(i))
        .collect::<Result<_, _>>()
        .map_err(usage)?;
    let tree = tree
        .map(|t| ThreadId::parse(&t))
        .transpose()
        .map_err(usage)?;
    let (trust, _) = crate::record::signing::Trust::load(&project.trust_dir());
    // Opening the store moves record files an older weft left beside a database server in.
    let store = crate::store::FileStore::open(&project).ok();
    let records = Records::open(&project).map_err(|e| Exit {
        code: 1,
        message: e.to_string(),
    })?;
    // The registry before the anchor log: a thread's row says it finished only after its anchor
    // is stored, so a thread that ends while verify reads (a live project) is not reported as
    // anchored nowhere.
    let rows = registry_rows(&project);
    let finished: HashMap<ThreadId, bool> = rows
        .iter()
        .map(|(id, r)| (id.clone(), r.status.is_terminal()))
        .collect();
    let (log, log_problems) = crate::record::anchors::read_log(&records, &trust);
    let deleted = |id: &ThreadId| store.as_ref().is_some_and(|s| s.is_deleted(id));
    // Rows of threads whose spawn was undone: nothing to verify (see `never_ran`).
    let mut undone: Vec<ThreadId> = Vec::new();
    if all {
        targets.extend(records.thread_ids().map_err(|e| Exit {
            code: 1,
            message: format!("{}: {e}", records.thread_name_all()),
        })?);
        // Every thread the registry lists, too: records gone are missing — unless its spawn
        // was undone (it never ran).
        for id in finished.keys().filter(|id| !deleted(id)) {
            match rows.get(id).is_some_and(|r| never_ran(&records, &log, r)) {
                true => undone.push(id.clone()),
                false => targets.push(id.clone()),
            }
        }
        // And every thread the registry or the anchor log knows: a folder gone is missing.
        let known = log.heads.keys().filter(|id| !deleted(id));
        targets.extend(known.cloned());
    } else if let Some(root) = &tree {
        for id in tree_rows(&project, root)? {
            match rows.get(&id).is_some_and(|r| never_ran(&records, &log, r)) {
                true => undone.push(id),
                false => targets.push(id),
            }
        }
    } else if targets.is_empty() {
        return Err(usage("name thread ids, or pass --all or --tree ROOT"));
    }
    targets.sort();
    targets.dedup();
    let ended = |id: &ThreadId| finished.get(id).copied().unwrap_or(false);
    let w = crate::record::verify::Witnesses {
        log: &log,
        finished: &ended,
        deleted: &deleted,
    };
    let mut verdicts: Vec<Verdict> = targets
        .iter()
        .map(|id| crate::record::verify::verify_anchored(&records, &trust, id, &w))
        .collect();
    if tree.is_some() {
        missing_children(&records, &targets, &deleted, &mut verdicts);
    }
    undone.retain(|id| !targets.contains(id));
    undone.sort();
    undone.dedup();
    verdicts.extend(undone.into_iter().map(|id| Verdict {
        id: id.to_string(),
        ok: true,
        problems: Vec::new(),
        torn_last_line: false,
    }));
    if !log_problems.is_empty() {
        verdicts.push(Verdict {
            id: "anchors.jsonl".into(),
            ok: false,
            problems: log_problems,
            torn_last_line: false,
        });
    }
    print(&verdicts, as_json);
    Ok(if verdicts.iter().all(|v| v.ok) { 0 } else { 1 })
}

/// Every row of the registry, by thread (empty when there is no registry).
fn registry_rows(project: &Project) -> HashMap<ThreadId, ThreadRow> {
    crate::registry::Store::read_project(project)
        .and_then(|s| s.list(false, usize::MAX))
        .map(|rows| rows.into_iter().map(|r| (r.id.clone(), r)).collect())
        .unwrap_or_default()
}

/// Whether `row` is of a thread whose spawn was undone before it ran (SPEC §4: a failed
/// spawn leaves its row ended and no records): its row carries the spawn's mark
/// (`registry::UNDONE`, written only when a spawn is undone), it spent and spawned nothing, took
/// no turn, has no records, and is named nowhere a thread that ran is anchored — not in the
/// anchor log, not by its parent's transcript (a child that started is named there, in the
/// hash chain, before it can run). Such a row gets an `ok` verdict of its own.
fn never_ran(records: &Records, log: &crate::record::anchors::Log, row: &ThreadRow) -> bool {
    let id = &row.id;
    let marked = row.undone();
    let idle =
        row.turns == 0 && row.spend_nanos == 0 && row.own_spend_nanos == 0 && row.spawn_count == 0;
    if !marked || !idle || !row.status.is_terminal() || records.has(id).unwrap_or(true) {
        return false;
    }
    if log.heads.contains_key(id) {
        return false;
    }
    let Some(parent) = &row.parent_id else {
        return true;
    };
    let lines = crate::record::transcript::read(records, parent, None)
        .map(|r| r.events)
        .unwrap_or_default();
    !lines.iter().any(|l| {
        (l["type"] == "child_spawned" || l["type"] == "child_finished")
            && l["id"].as_str() == Some(id.as_str())
    })
}

/// Every thread the registry lists in `root`'s tree.
fn tree_rows(project: &Project, root: &ThreadId) -> Result<Vec<ThreadId>, Exit> {
    let rows = crate::registry::Store::read_project(project)
        .and_then(|s| s.tree(root.as_str()))
        .map_err(|e| Exit {
            code: 1,
            message: format!("registry: {e}"),
        })?;
    if rows.is_empty() {
        return Err(usage(format!(
            "no thread of the tree of {root} in the registry"
        )));
    }
    Ok(rows.into_iter().map(|r| r.id).collect())
}

/// A thread of the tree without its records: a verdict of its own (a registry row's folder,
/// or a child a verified transcript names, is gone).
fn missing_children(
    records: &Records,
    targets: &[ThreadId],
    deleted: &dyn Fn(&ThreadId) -> bool,
    verdicts: &mut Vec<Verdict>,
) {
    let mut named: Vec<ThreadId> = targets.to_vec();
    for id in targets {
        let lines = crate::record::transcript::read(records, id, None)
            .map(|r| r.events)
            .unwrap_or_default();
        for l in lines {
            if l["type"] == "child_spawned" || l["type"] == "child_finished" {
                if let Some(c) = l["id"].as_str().and_then(|c| ThreadId::parse(c).ok()) {
                    named.push(c);
                }
            }
        }
    }
    named.sort();
    named.dedup();
    for id in named.into_iter().filter(|id| !deleted(id)) {
        let gone = records.doc(&id).is_ok_and(|d| d.is_none());
        if gone && !verdicts.iter().any(|v| v.id == id.as_str()) {
            verdicts.push(Verdict {
                id: id.to_string(),
                ok: false,
                problems: vec![format!(
                    "{}: missing: its tree names this thread, but its records are gone",
                    records.thread_name(&id)
                )],
                torn_last_line: false,
            });
        }
    }
}

fn print(verdicts: &[Verdict], as_json: bool) {
    let bad = verdicts.iter().filter(|v| !v.ok).count();
    if as_json {
        out!("{}", serde_json::to_string(verdicts).unwrap_or_default());
        return;
    }
    for v in verdicts {
        if v.ok {
            let torn = if v.torn_last_line {
                " (torn last transcript line)"
            } else {
                ""
            };
            out!("ok       {}{torn}", v.id);
        } else {
            for p in &v.problems {
                out!("FAILED   {}: {p}", v.id);
            }
        }
    }
    out!("{} verified, {} failed", verdicts.len() - bad, bad);
}
