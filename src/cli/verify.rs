//! `weft verify`: signatures, chains and heads of thread records.

use super::{find_project, usage, Exit};
use crate::core::ids::ThreadId;
use std::io::Write;
use std::path::PathBuf;

pub(super) fn verify(
    explicit: Option<PathBuf>,
    ids: Vec<String>,
    all: bool,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let mut targets: Vec<ThreadId> = ids
        .iter()
        .map(|i| ThreadId::parse(i))
        .collect::<Result<_, _>>()
        .map_err(usage)?;
    if all || targets.is_empty() {
        if !all {
            return Err(usage("name thread ids or pass --all"));
        }
        let dir = project.weft().join("threads");
        let entries = std::fs::read_dir(&dir).map_err(|e| Exit {
            code: 1,
            message: format!("{}: {e}", dir.display()),
        })?;
        for e in entries.flatten() {
            if let Some(id) = e.file_name().to_str().and_then(|n| ThreadId::parse(n).ok()) {
                targets.push(id);
            }
        }
        targets.sort();
    }
    let (trust, _) = crate::record::signing::Trust::load(&project.trust_dir());
    let verdicts: Vec<_> = targets
        .iter()
        .map(|id| crate::record::verify::verify_thread(&project, &trust, id))
        .collect();
    let bad = verdicts.iter().filter(|v| !v.ok).count();
    if as_json {
        out!("{}", serde_json::to_string(&verdicts).unwrap_or_default());
    } else {
        for v in &verdicts {
            if v.ok {
                out!(
                    "ok       {}{}",
                    v.id,
                    if v.torn_last_line {
                        " (torn last transcript line)"
                    } else {
                        ""
                    }
                );
            } else {
                for p in &v.problems {
                    out!("FAILED   {}: {p}", v.id);
                }
            }
        }
        out!("{} verified, {} failed", verdicts.len() - bad, bad);
    }
    Ok(if bad == 0 { 0 } else { 1 })
}
