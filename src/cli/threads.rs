//! `weft threads` (list, tree, active) and `weft threads chain`.

use super::{failed, find_project, open_store, usage, Exit};
use crate::core::ids::ThreadId;
use crate::core::money::Nanos;
use crate::registry::ThreadRow;
use std::io::Write;
use std::path::PathBuf;

pub(super) fn chain(explicit: Option<PathBuf>, id: String, as_json: bool) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let rows = open_store(&project)?.chain(id.as_str()).map_err(failed)?;
    if rows.is_empty() {
        return Err(usage(format!("no thread {id} in this project")));
    }
    if as_json {
        out!("{}", serde_json::to_string(&rows).unwrap_or_default());
    } else {
        for (i, r) in rows.iter().enumerate() {
            out!(
                "{}{:<9} {} — {} turns, {}",
                if i == 0 { "● " } else { "→ " },
                r.status,
                r.id,
                r.turns,
                Nanos(r.spend_nanos)
            );
        }
    }
    Ok(0)
}

pub(super) fn tree_lines(rows: &[ThreadRow]) -> Vec<String> {
    let ids: std::collections::HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let mut out = Vec::new();
    fn walk(rows: &[ThreadRow], r: &ThreadRow, depth: usize, out: &mut Vec<String>) {
        let status = if r.waiting.is_some() {
            "waiting"
        } else {
            r.status.as_str()
        };
        out.push(format!(
            "{}{} {:<9} {} — {} turns, {}{}",
            "  ".repeat(depth),
            if depth == 0 { "●" } else { "└" },
            status,
            r.id,
            r.turns,
            Nanos(r.spend_nanos),
            r.waiting
                .as_deref()
                .map(|w| format!(" — waiting for {w}"))
                .or_else(|| r.status_text.as_deref().map(|t| format!(" — {t}")))
                .unwrap_or_default()
        ));
        for c in rows
            .iter()
            .filter(|c| c.parent_id.as_deref() == Some(r.id.as_str()))
        {
            walk(rows, c, depth + 1, out);
        }
    }
    for r in rows
        .iter()
        .filter(|r| r.parent_id.as_deref().is_none_or(|p| !ids.contains(p)))
    {
        walk(rows, r, 0, &mut out);
    }
    out
}

pub(super) fn print_tree(rows: &[ThreadRow]) {
    for l in tree_lines(rows) {
        out!("{l}");
    }
}

pub(super) fn threads(
    explicit: Option<PathBuf>,
    tree: bool,
    active: bool,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    if !project.state_dir().join("registry.db").exists() {
        if as_json {
            out!("[]");
        } else {
            out!("no threads yet (`weft run <directive>` starts one)");
        }
        return Ok(0);
    }
    let store = open_store(&project)?;
    let rows = store.list(active, 100_000).map_err(failed)?;
    if as_json {
        out!("{}", serde_json::to_string(&rows).unwrap_or_default());
    } else if tree {
        let mut rows = rows;
        rows.reverse();
        print_tree(&rows);
    } else {
        for r in &rows {
            out!(
                "{:<9} {:<50} {:<24} {} turns {}{}",
                if r.waiting.is_some() {
                    "waiting"
                } else {
                    r.status.as_str()
                },
                r.id,
                r.directive,
                r.turns,
                Nanos(r.spend_nanos),
                r.waiting
                    .as_deref()
                    .map(|w| format!(" — waiting for {w}"))
                    .or_else(|| r.status_text.as_deref().map(|t| format!(" — {t}")))
                    .unwrap_or_default()
            );
        }
    }
    Ok(0)
}
