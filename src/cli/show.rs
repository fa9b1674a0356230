//! `weft show`: one thread's registry row, signed thread.json and ledger figures.

use super::{failed, find_project, open_store, open_threads, usage, Exit};
use crate::core::ids::ThreadId;
use crate::core::money::Nanos;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

pub(super) fn show(explicit: Option<PathBuf>, id: String, as_json: bool) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let store = open_store(&project)?;
    let row = store.get(id.as_str()).map_err(failed)?.ok_or_else(|| {
        usage(format!(
            "no thread {id} in this project (see `weft threads`)"
        ))
    })?;
    let (trust, _) = crate::record::signing::Trust::load(&project.trust_dir());
    let doc = crate::record::thread_doc::ThreadDoc::read_verified(
        open_threads(&project)?.records(),
        &id,
        &trust,
    );
    if as_json {
        let out = json!({ "row": row, "thread": doc.as_ref().ok(), "verified": doc.is_ok() });
        out!("{out}");
        return Ok(0);
    }
    out!("{} ({})", row.id, row.directive);
    out!("  status     {}", row.status);
    if let Some(t) = &row.status_text {
        out!("  says       {t}");
    }
    if let Some(w) = &row.waiting {
        out!("  waiting    {w} — answer with `weft approve {id} [--call ID]` or `weft deny {id} [--call ID] [--reason TEXT]`");
    }
    out!("  parent     {}", row.parent_id.as_deref().unwrap_or("-"));
    out!("  root       {}", row.root_id);
    out!("  model      {}", row.model);
    out!(
        "  turns      {}   tokens {} in / {} out",
        row.turns,
        row.input_tokens,
        row.output_tokens
    );
    out!(
        "  spend      own {}   subtree {}",
        Nanos(row.own_spend_nanos),
        Nanos(row.spend_nanos)
    );
    if let Some((n, total)) = charged_at_bound(&open_threads(&project)?, &id) {
        out!("  charged    {n} call(s) of unknown cost at their bound ({total}): the process died during them");
    }
    out!("  children   {}", row.spawn_count);
    if let Some(f) = &row.forked_from {
        out!("  forked     from {f}");
    }
    if let Some(m) = &row.meta {
        out!("  metadata   {m}");
    }
    match &doc {
        Ok(d) => out!("  limits     turns {} tokens {} spend {} duration {} depth {} spawns {} concurrency {}", d.limits.turns, d.limits.tokens, d.limits.spend, crate::record::render::human_duration(d.limits.duration_ms), d.limits.depth, d.limits.spawns, d.limits.concurrency),
        Err(e) => out!("  thread.json NOT VERIFIED: {e}"),
    }
    if let Some(o) = &row.outputs {
        out!("  outputs    {o}");
    }
    if let Some(r) = &row.result {
        out!("  result     {r}");
    }
    if let Some(e) = &row.error {
        out!("  error      {e}");
    }
    Ok(0)
}

/// Calls recovery charged at their bound (their thread's process died during them): how many,
/// and what they cost in all. None when there were none.
fn charged_at_bound(store: &crate::store::FileStore, id: &ThreadId) -> Option<(usize, Nanos)> {
    use crate::record::line::Line;
    let read = crate::record::transcript::read(store.records(), id, None).ok()?;
    let charged: Vec<Nanos> = read
        .events
        .iter()
        .filter_map(|e| match Line::parse(e) {
            Line::LlmCall {
                error: Some(err),
                cost_nanos,
                ..
            } if err.kind == "unknown" => Some(cost_nanos.unwrap_or_default()),
            _ => None,
        })
        .collect();
    let total = charged.iter().fold(Nanos::ZERO, |a, c| a.plus(*c));
    (!charged.is_empty()).then_some((charged.len(), total))
}
