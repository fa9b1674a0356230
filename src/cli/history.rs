//! Commands on stored threads: `weft search` (and `--backfill`), `weft delete`, `weft message
//! edit|delete`, `weft kv`, `weft env`, `weft schedule`, `weft import`, `weft export`. All through the project's [`FileStore`]; none needs a runtime.

use super::{find_project, open_threads, usage, EnvAction, Exit, MessageChange, ScheduleAction};
use crate::core::ids::ThreadId;
use crate::record::line::Line;
use crate::store::{SearchQuery, StoreError, ThreadStore};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

/// A store refusal is the user's to fix (exit 2); a storage failure is not (exit 1).
fn store_exit(e: StoreError) -> Exit {
    match e {
        StoreError::Storage(_) | StoreError::Registry(_) => super::failed(e),
        other => usage(other.to_string()),
    }
}

pub(super) fn search(
    explicit: Option<PathBuf>,
    query: Option<SearchQuery>,
    backfill: bool,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let store = open_threads(&project)?;
    if backfill {
        let done = store.backfill().map_err(store_exit)?;
        if as_json && query.is_none() {
            out!("{}", json!(done));
        } else if !as_json {
            out!(
                "backfill: {} thread(s) indexed, {} stale entr{} removed",
                done.indexed,
                done.removed,
                if done.removed == 1 { "y" } else { "ies" }
            );
        }
    }
    let Some(q) = query else {
        return Ok(0);
    };
    let hits = store.search(&q).map_err(store_exit)?;
    if as_json {
        out!("{}", json!(hits));
        return Ok(0);
    }
    if hits.is_empty() {
        out!("no finished thread mentions {:?} (new threads are indexed as they end; `weft search --backfill` indexes older ones)", q.text);
    }
    for h in &hits {
        out!("{}  ({})  score {:.2}", h.thread_id, h.directive, h.score);
        for m in &h.context {
            let mark = if m.seq == h.hit.seq { ">" } else { " " };
            out!(
                "  {mark} {:>4} {:<9} {}",
                m.seq,
                m.role,
                one_line(&m.text, 160)
            );
        }
    }
    Ok(0)
}

/// `text` on one line, cut to `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &flat[..i]),
        None => flat,
    }
}

pub(super) fn delete(
    explicit: Option<PathBuf>,
    id: String,
    subtree: bool,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let store = open_threads(&project)?;
    let done = store.delete(&id, subtree).map_err(store_exit)?;
    if as_json {
        out!("{}", json!(done));
    } else if done.already {
        out!("{id} was deleted already");
    } else {
        out!(
            "deleted {} thread(s): {}",
            done.threads.len(),
            done.threads
                .iter()
                .map(ThreadId::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(0)
}

pub(super) fn message(
    explicit: Option<PathBuf>,
    id: String,
    change: MessageChange,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let store = open_threads(&project)?;
    let (line, what) = match change {
        MessageChange::Edit { seq, text } => (
            Line::MessageEdited { target: seq, text },
            format!("edited message {seq}"),
        ),
        MessageChange::Delete { seq } => (
            Line::MessageDeleted { target: seq },
            format!("deleted message {seq}"),
        ),
    };
    // The store takes an event as an object with its `type`, as it takes one from outside.
    let event = serde_json::to_value(line).map_err(super::failed)?;
    let seq = store.append(&id, vec![event]).map_err(store_exit)?;
    if as_json {
        out!("{}", json!({ "thread_id": id, "seq": seq }));
    } else {
        out!("{what} of {id} (recorded at line {seq}; the original stays in the signed history)");
    }
    Ok(0)
}

pub(super) fn kv(
    explicit: Option<PathBuf>,
    id: String,
    key: Option<String>,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let store = open_threads(&project)?;
    let Some(key) = key else {
        let all = store.kv_list(&id).map_err(store_exit)?;
        if as_json {
            out!("{}", serde_json::Value::Object(all));
        } else if all.is_empty() {
            out!("{id} stored nothing (its `kv_set` calls store here)");
        } else {
            for (k, v) in &all {
                out!("{k}  {v}");
            }
        }
        return Ok(0);
    };
    match store.kv_get(&id, &key).map_err(store_exit)? {
        Some(v) if as_json => out!("{}", json!({ "key": key, "value": v })),
        Some(v) => out!("{v}"),
        None => {
            return Err(usage(format!(
                "{id} has no key {key:?} (`weft kv {id}` lists its keys)"
            )))
        }
    }
    Ok(0)
}

pub(super) fn import(
    explicit: Option<PathBuf>,
    format: &str,
    files: &[PathBuf],
    as_json: bool,
) -> Result<i32, Exit> {
    let reader = match format {
        "nova" => crate::store::import_nova,
        "deepagents" => crate::store::import_deepagents,
        other => {
            return Err(usage(format!(
                "`{other}` is not an import format; use nova or deepagents"
            )))
        }
    };
    let project = find_project(explicit)?;
    let store = open_threads(&project)?;
    let mut done = Vec::new();
    let mut failed = Vec::new();
    // One file that cannot be read never stops the others.
    for f in files {
        match reader(&store, f) {
            Ok(i) => done.push(i),
            Err(e) => failed.push(e.to_string()),
        }
    }
    if as_json {
        out!("{}", json!({ "imported": done, "failed": failed }));
    } else {
        for i in &done {
            for (orig, id) in &i.threads {
                out!("{orig} → {id}");
            }
            for s in &i.skipped {
                out!("  skipped: {s}");
            }
        }
        for e in &failed {
            out!("FAILED  {e}");
        }
        let n: usize = done.iter().map(|i| i.threads.len()).sum();
        out!(
            "imported {n} thread(s) from {} file(s); {} file(s) failed",
            done.len(),
            failed.len()
        );
    }
    Ok(i32::from(!failed.is_empty()))
}

pub(super) fn export(explicit: Option<PathBuf>, id: String, format: &str) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let store = open_threads(&project)?;
    let text = crate::store::export(&store, &id, format).map_err(store_exit)?;
    let _ = std::io::stdout().write_all(text.as_bytes());
    Ok(0)
}

fn scope(thread: Option<String>, user: bool) -> Result<crate::store::Scope, Exit> {
    use crate::store::Scope;
    Ok(match (thread, user) {
        (Some(t), _) => Scope::Thread(ThreadId::parse(&t).map_err(usage)?),
        (None, true) => Scope::User,
        (None, false) => Scope::Project,
    })
}

pub(super) fn env(explicit: Option<PathBuf>, action: EnvAction) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let store = open_threads(&project)?;
    match action {
        EnvAction::Set {
            name,
            value,
            secret,
            thread,
            user,
            ..
        } => {
            let value = match value.as_str() {
                "-" => {
                    let mut v = String::new();
                    std::io::Read::read_to_string(&mut std::io::stdin(), &mut v)
                        .map_err(super::failed)?;
                    v.trim_end_matches(['\n', '\r']).to_string()
                }
                _ => value,
            };
            let scope = scope(thread, user)?;
            store
                .env_set(&scope, &name, &value, secret)
                .map_err(store_exit)?;
            let what = if secret {
                "secret (encrypted; shown as [secret:NAME])"
            } else {
                "value"
            };
            out!("{name} set as a {what} for {scope}");
        }
        EnvAction::Unset { name, thread, user } => {
            let scope = scope(thread, user)?;
            if !store.env_unset(&scope, &name).map_err(store_exit)? {
                return Err(usage(format!("{name} is not set for {scope}")));
            }
            out!("{name} unset for {scope}");
        }
        EnvAction::List {
            thread,
            json: as_json,
        } => {
            let values: Vec<crate::store::EnvValue> = match thread {
                Some(t) => {
                    let id = ThreadId::parse(&t).map_err(usage)?;
                    store
                        .env_resolve(&id)
                        .map_err(store_exit)?
                        .into_values()
                        .map(|mut v| {
                            if v.secret {
                                v.value = None;
                            }
                            v
                        })
                        .collect()
                }
                None => {
                    let mut v = store
                        .env_list(&crate::store::Scope::Project)
                        .map_err(store_exit)?;
                    v.extend(
                        store
                            .env_list(&crate::store::Scope::User)
                            .map_err(store_exit)?,
                    );
                    v
                }
            };
            if as_json {
                out!("{}", json!(values));
                return Ok(0);
            }
            for v in &values {
                let shown = v
                    .value
                    .clone()
                    .unwrap_or_else(|| format!("[secret:{}]", v.name));
                out!("{:<24} {:<10} {shown}", v.name, v.scope);
            }
        }
    }
    Ok(0)
}

pub(super) fn schedule(
    explicit: Option<PathBuf>,
    action: Option<ScheduleAction>,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let store = open_threads(&project)?;
    match action.unwrap_or(ScheduleAction::List { thread: None }) {
        ScheduleAction::List { thread } => {
            let thread = thread
                .map(|t| ThreadId::parse(&t))
                .transpose()
                .map_err(usage)?;
            let all = store.scheduled(thread.as_ref()).map_err(store_exit)?;
            if as_json {
                out!("{}", json!(all));
                return Ok(0);
            }
            if all.is_empty() {
                out!(
                    "nothing scheduled (a thread with the `schedule` capability schedules effects)"
                );
            }
            for e in &all {
                let what = format!("{:?} {}", e.kind, e.target).to_lowercase();
                out!(
                    "{}  {:<9} {}  {what}  (by {}){}",
                    e.id,
                    e.status,
                    e.due_at,
                    e.thread,
                    e.result
                        .as_deref()
                        .map(|r| format!(" → {}", one_line(r, 100)))
                        .unwrap_or_default()
                );
            }
        }
        ScheduleAction::Cancel { id } => {
            let e = store.cancel_effect(&id, None).map_err(store_exit)?;
            if as_json {
                out!("{}", json!(e));
            } else {
                out!("{} cancelled", e.id);
            }
        }
    }
    Ok(0)
}
