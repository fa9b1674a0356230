//! `weft gc` (TTL clean-up of finished trees, then VACUUM) and `weft doctor` (health figures,
//! reconciliation of registry, files and ledger, `--fix`).

use super::{failed, find_project, open_threads, usage, Exit};
use crate::runtime::{diagnose, Runtime};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

/// `weft copy --to URL`.
pub(super) fn copy(explicit: Option<PathBuf>, to: &str, as_json: bool) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let url = crate::sql::DatabaseUrl::parse(to).map_err(|e| usage(e.to_string()))?;
    if project.config().is_ok_and(|c| c.database.is_some()) {
        return Err(usage(
            "this project's state is already on a database server (`database:` or $WEFT_DATABASE_URL); `weft copy` moves the embedded SQLite state",
        ));
    }
    let state = project.state_dir();
    let alive = |pid| crate::runtime::owner::alive(&state, pid);
    let copied = crate::store::copy_to(&project, &url, &alive).map_err(failed)?;
    if as_json {
        out!("{}", json!(copied));
        return Ok(0);
    }
    for (table, n) in &copied.tables {
        out!("{table:>12}  {n} row(s)");
    }
    out!(
        "copied into {}; to run there, add `database: <the URL you gave --to>` to .weft/config.yaml (or set $WEFT_DATABASE_URL)",
        copied.to
    );
    Ok(0)
}

pub(super) fn gc(
    explicit: Option<PathBuf>,
    older_than: &str,
    status: Vec<String>,
    dry_run: bool,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let age = humantime::parse_duration(older_than).map_err(|e| {
        usage(format!(
            "--older-than {older_than:?}: {e} (e.g. 30d, 12h, 0s)"
        ))
    })?;
    if let Some(s) = status
        .iter()
        .find(|s| !crate::core::status::Status::parse(s).is_some_and(|s| s.is_terminal()))
    {
        return Err(usage(format!(
            "--status {s}: only finished trees are collected (completed, error, cancelled, continued)"
        )));
    }
    let store = open_threads(&project)?;
    let done = store.gc(age, &status, dry_run).map_err(failed)?;
    if as_json {
        out!("{}", json!(done));
        return Ok(0);
    }
    let verb = if dry_run { "would remove" } else { "removed" };
    out!(
        "{verb} {} tree(s), {} thread(s), {} of thread files",
        done.roots.len(),
        done.threads,
        bytes(done.bytes)
    );
    if let Some((before, after)) = done.databases {
        out!(
            "databases {} → {} after VACUUM",
            bytes(before),
            bytes(after)
        );
    }
    Ok(0)
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / f64::from(1 << 20)),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

pub(super) async fn doctor(
    explicit: Option<PathBuf>,
    fix: bool,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let mut up = diagnose(&project);
    if fix && up.broken.is_empty() && up.problems.iter().any(|p| p.fixable) {
        let rt = Runtime::builder(project.clone())
            .without_provider()
            .open()
            .await
            .map_err(super::open_error)?;
        rt.repair(&mut up).await;
        rt.close().await;
    }
    let code = i32::from(
        !up.broken.is_empty()
            || up.problems.iter().any(|p| {
                p.fixed
                    .as_deref()
                    .is_none_or(|f| f.starts_with("not fixed"))
            }),
    );
    if as_json {
        out!("{}", json!(up));
        return Ok(code);
    }
    for b in &up.broken {
        out!("BROKEN  {b}");
    }
    if let Some(h) = &up.health {
        out!(
            "threads      {} ({} active, {} inactive over 7 days)",
            h.threads,
            h.active,
            h.inactive_7d
        );
        out!(
            "context      {} tokens on average, largest {}{}",
            h.context_avg_tokens,
            h.context_max_tokens,
            h.context_max_thread
                .as_deref()
                .map(|t| format!(" ({t})"))
                .unwrap_or_default()
        );
        out!(
            "transcripts  {} lines, thread files {}",
            h.transcript_lines,
            bytes(h.thread_bytes)
        );
        let dbs: Vec<String> = h
            .databases
            .iter()
            .map(|(k, v)| format!("{k} {}", bytes(*v)))
            .collect();
        out!("databases    {}", dbs.join(", "));
    }
    if up.problems.is_empty() && up.broken.is_empty() {
        out!("registry, files and ledger agree");
    }
    for p in &up.problems {
        out!("{:<20} {}  {}", p.kind, p.thread, p.detail);
        if let Some(f) = &p.fixed {
            out!("{:<20} → {f}", "");
        }
    }
    if !fix && up.problems.iter().any(|p| p.fixable) {
        out!("`weft doctor --fix` repairs what is marked fixable");
    }
    Ok(code)
}
