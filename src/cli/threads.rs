//! `weft threads` (list, tree, active) and `weft threads chain`.

use super::{failed, find_project, open_store, usage, Exit};
use crate::core::ids::ThreadId;
use crate::core::money::Nanos;
use crate::record::render::{human_duration, plural};
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
            out!("{}{}", if i == 0 { "● " } else { "→ " }, row_text(r));
        }
    }
    Ok(0)
}

/// How long a row's thread ran (or has run, while it runs): created → updated.
fn took(r: &ThreadRow) -> Option<String> {
    let at = |t: &str| humantime::parse_rfc3339(t).ok();
    let (from, to) = (at(&r.created_at)?, at(&r.updated_at)?);
    let to = if r.status.is_terminal() {
        to
    } else {
        std::time::SystemTime::now()
    };
    let ms = to.duration_since(from).ok()?.as_millis() as u64;
    Some(human_duration(ms))
}

/// One row as a tree line's text (after its branch): status, id, turns, spend, time, note.
pub(super) fn row_text(r: &ThreadRow) -> String {
    let status = if r.waiting.is_some() {
        "waiting"
    } else {
        r.status.as_str()
    };
    format!(
        "{:<9} {} — {}, {}{}{}",
        status,
        r.id,
        plural(r.turns, "turn"),
        Nanos(r.spend_nanos),
        took(r).map(|t| format!(", {t}")).unwrap_or_default(),
        r.waiting
            .as_deref()
            .filter(|w| !w.is_empty())
            .map(|w| format!(" — waiting for {w}"))
            .or_else(|| r.status_text.as_deref().map(|t| format!(" — {t}")))
            .unwrap_or_default()
    )
}

/// Rows drawn as trees: `●` a root, `├─`/`└─` a child, `│` the branches still open above.
pub(super) fn tree_lines(rows: &[ThreadRow]) -> Vec<String> {
    let ids: std::collections::HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let mut out = Vec::new();
    fn walk(
        rows: &[ThreadRow],
        r: &ThreadRow,
        prefix: &str,
        last: Option<bool>,
        out: &mut Vec<String>,
    ) {
        let branch = match last {
            None => "● ".to_string(),
            Some(true) => format!("{prefix}└─ "),
            Some(false) => format!("{prefix}├─ "),
        };
        out.push(format!("{branch}{}", row_text(r)));
        let kids: Vec<&ThreadRow> = rows
            .iter()
            .filter(|c| c.parent_id.as_deref() == Some(r.id.as_str()))
            .collect();
        let inner = match last {
            None => String::new(),
            Some(true) => format!("{prefix}   "),
            Some(false) => format!("{prefix}│  "),
        };
        for (i, c) in kids.iter().enumerate() {
            walk(rows, c, &inner, Some(i + 1 == kids.len()), out);
        }
    }
    for r in rows
        .iter()
        .filter(|r| r.parent_id.as_deref().is_none_or(|p| !ids.contains(p)))
    {
        walk(rows, r, "", None, &mut out);
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
    if !super::common::has_registry(&project) {
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
                "{:<9} {:<50} {:<24} {} {}{}",
                if r.waiting.is_some() {
                    "waiting"
                } else {
                    r.status.as_str()
                },
                r.id,
                r.directive,
                plural(r.turns, "turn"),
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
