//! `weft recover`: finalize threads left running by dead processes, and say what was done.

use super::{find_project, open_error, Exit};
use crate::runtime::Runtime;
use std::io::Write;
use std::path::PathBuf;

pub(super) async fn recover(explicit: Option<PathBuf>, as_json: bool) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let rt = Runtime::builder(project)
        .without_provider()
        .open()
        .await
        .map_err(open_error)?;
    let rec = rt.recovered().to_vec();
    if as_json {
        out!("{}", serde_json::to_string(&rec).unwrap_or_default());
    } else if rec.is_empty() {
        out!("nothing to recover: no thread was left running by a dead process");
    } else {
        for r in &rec {
            let torn = if r.torn_line_kept {
                " (torn last transcript line kept in transcript.torn)"
            } else {
                ""
            };
            out!(
                "recovered {} (owner pid {} gone): error/interrupted{torn}",
                r.id,
                r.owner_pid
            );
            for p in &r.problems {
                out!("  problem: {p}");
            }
        }
    }
    rt.close().await;
    Ok(0)
}
