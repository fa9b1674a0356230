//! Threads from and to other systems: `weft import nova|deepagents` (read-only history,
//! searchable and forkable) and `weft export --format nova|markdown`. Readers are lenient the
//! way the originals are — a blank or torn line, a non-object entry, a bad timestamp is skipped
//! and reported — and strict where the original is: a file that cannot be read at all is an
//! error for that file, never a crash of the whole import.

use super::{NewThread, StoreError, ThreadStore};
use crate::core::ids::ThreadId;
use crate::core::limits::bounded_input;
use crate::record::line::Line;
use crate::registry::ThreadFilter;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A file that could not be imported at all (nothing of it was; other files go on).
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file cannot be read.
    #[error("{}: {source}", .file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A nova file without even a manifest line.
    #[error("{}: empty file, no manifest", .file.display())]
    Empty {
        /// The file.
        file: PathBuf,
    },
    /// A nova manifest that is not JSON.
    #[error("{}:1: the manifest is not JSON: {source}", .file.display())]
    ManifestJson {
        /// The file.
        file: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// A nova manifest without the timestamps nova itself requires.
    #[error("{}:1: invalid manifest: nova requires `createdAt` and `updatedAt` (ISO 8601); this thread cannot be read", .file.display())]
    Manifest {
        /// The file.
        file: PathBuf,
    },
    /// A deepagents threads.json that is not JSON.
    #[error("{}: corrupt threads.json ({source}); nothing imported from it", .file.display())]
    Corrupt {
        /// The file.
        file: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// A deepagents threads.json whose `threads` is not a list.
    #[error("{}: malformed thread metadata: `threads` is not a list", .file.display())]
    NotAList {
        /// The file.
        file: PathBuf,
    },
    /// The store refused or failed to create an imported thread.
    #[error("{}: {}{source}", .file.display(), .original.as_ref().map(|o| format!("{o}: ")).unwrap_or_default())]
    Store {
        /// The file.
        file: PathBuf,
        /// The thread's original id, when the file holds several.
        original: Option<String>,
        /// Why.
        source: StoreError,
    },
}

/// What importing one file did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Imported {
    /// The file.
    pub file: String,
    /// (original id, weft id) of each thread imported.
    pub threads: Vec<(String, ThreadId)>,
    /// Lines or entries left out, and threads already imported, with why.
    pub skipped: Vec<String>,
}

/// The weft id of a thread imported earlier from `format` with `original` id, if any.
fn already(store: &dyn ThreadStore, format: &str, original: &str) -> Option<String> {
    let filter = ThreadFilter {
        directive: Some(format!("import/{format}")),
        limit: Some(usize::MAX >> 1),
        ..Default::default()
    };
    store.list(&filter).ok()?.into_iter().find_map(|r| {
        let m = r.meta.as_ref()?;
        (m["original_id"] == original).then(|| r.id.to_string())
    })
}

fn file_name(path: &Path) -> String {
    path.display().to_string()
}

/// A nova timestamp (ISO 8601) as stored, or None when it does not parse.
fn ts(v: &Value) -> Option<String> {
    let text = v.as_str()?;
    let t = humantime::parse_rfc3339_weak(text.trim_end_matches('Z')).ok()?;
    Some(humantime::format_rfc3339_millis(t).to_string())
}

/// Imports one nova thread file: a manifest line, then messages (`{role, text}` as nova writes
/// them, or `{"type":"message", role, text}` as its contract names them) and engine events (`assistant_text`, `tool_use`, `result`).
pub fn import_nova(store: &dyn ThreadStore, path: &Path) -> Result<Imported, ImportError> {
    let file = || path.to_path_buf();
    let text = std::fs::read_to_string(path).map_err(|source| ImportError::Read {
        file: file(),
        source,
    })?;
    let mut out = Imported {
        file: file_name(path),
        ..Default::default()
    };
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, first)) = lines.next() else {
        return Err(ImportError::Empty { file: file() });
    };
    let manifest: Value =
        serde_json::from_str(first).map_err(|source| ImportError::ManifestJson {
            file: file(),
            source,
        })?;
    let (Some(created), Some(updated)) = (ts(&manifest["createdAt"]), ts(&manifest["updatedAt"]))
    else {
        return Err(ImportError::Manifest { file: file() });
    };
    let original = manifest["id"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default()
        });
    if let Some(id) = already(store, "nova", &original) {
        out.skipped
            .push(format!("{original}: already imported as {id}"));
        return Ok(out);
    }
    let events = nova_events(path, lines, &mut out.skipped);
    let thread = NewThread {
        directive: "import/nova".into(),
        status: "completed".into(),
        created_at: created,
        updated_at: updated,
        meta: nova_meta(&manifest, &original),
        imported: Some(json!({ "format": "nova", "file": out.file, "original_id": original })),
        events,
        ..Default::default()
    };
    let id = store.create(thread).map_err(|source| ImportError::Store {
        file: file(),
        original: None,
        source,
    })?;
    out.threads.push((original, id));
    Ok(out)
}

/// The events of a nova file's lines after the manifest ((index, line) pairs); a line that is
/// not JSON, or neither a message nor a known event, is skipped and reported in `skipped`.
fn nova_events<'a>(
    path: &Path,
    lines: impl Iterator<Item = (usize, &'a str)>,
    skipped: &mut Vec<String>,
) -> Vec<Value> {
    let mut events = Vec::new();
    let mut last_assistant = String::new();
    for (i, line) in lines {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            skipped.push(format!(
                "{}:{}: not JSON (a torn line?), skipped",
                path.display(),
                i + 1
            ));
            continue;
        };
        let at = v.get("timestamp").cloned().unwrap_or(Value::Null);
        let text = v["text"].as_str().unwrap_or_default().to_string();
        // nova's contract types a message `"type":"message"`; nova's code writes none: both
        // are messages.
        let kind = v["type"].as_str().filter(|t| *t != "message");
        let event = match (kind, v["role"].as_str()) {
            (Some("assistant_text"), _) => {
                last_assistant = text.clone();
                json!({ "type": "assistant_text", "text": text, "at": at })
            }
            (Some("tool_use"), _) => json!({
                "type": "tool_use", "id": format!("nova-{}", i + 1),
                "name": v["name"].as_str().unwrap_or("tool"), "input": bounded_input(v["input"].clone()), "at": at
            }),
            (Some("result"), _) => {
                json!({ "type": "note", "text": format!("nova result: {} turn(s), ${}", v["turns"], v["cost"]), "result": bounded_input(v.clone()), "at": at })
            }
            // The engine streams the final answer as an event before nova writes it as a
            // message: keep one.
            (None, Some("assistant")) if text == last_assistant => continue,
            (None, Some("assistant")) => {
                json!({ "type": "assistant_text", "text": text, "at": at })
            }
            (None, Some(role)) => {
                json!({ "type": "message", "role": if role == "user" { "user" } else { "system" }, "text": text, "at": at })
            }
            _ => {
                skipped.push(format!(
                    "{}:{}: neither a message nor a known event, skipped",
                    path.display(),
                    i + 1
                ));
                continue;
            }
        };
        events.push(event);
    }
    events
}

/// An imported nova thread's metadata: its source, original id and the manifest's names.
fn nova_meta(manifest: &Value, original: &str) -> Map<String, Value> {
    let mut meta = Map::new();
    meta.insert("source".into(), json!("nova"));
    meta.insert("original_id".into(), json!(original));
    for (from, to) in [
        ("title", "title"),
        ("agentId", "agent"),
        ("taskId", "task"),
        ("sessionId", "session"),
    ] {
        if let Some(v) = manifest.get(from).filter(|v| v.is_string()) {
            meta.insert(to.into(), v.clone());
        }
    }
    meta
}

/// Imports a deepagents-cli `threads.json`: each thread's metadata and lineage (deepagents
/// keeps messages in its checkpointer, not in this file). A parent becomes the child's
/// `forked_from`: lineage, not a budget tree.
pub fn import_deepagents(store: &dyn ThreadStore, path: &Path) -> Result<Imported, ImportError> {
    let file = || path.to_path_buf();
    let text = std::fs::read_to_string(path).map_err(|source| ImportError::Read {
        file: file(),
        source,
    })?;
    let doc: Value = serde_json::from_str(&text).map_err(|source| ImportError::Corrupt {
        file: file(),
        source,
    })?;
    let mut out = Imported {
        file: file_name(path),
        ..Default::default()
    };
    let threads = deepagents_entries(path, &doc, &mut out.skipped)?;
    let mut ids: HashMap<String, ThreadId> = HashMap::new();
    for t in threads {
        let original = t["id"].as_str().unwrap_or_default().to_string();
        if let Some(id) = already(store, "deepagents", &original) {
            out.skipped
                .push(format!("{original}: already imported as {id}"));
            ids.extend(ThreadId::parse(&id).ok().map(|w| (original.clone(), w)));
            continue;
        }
        let thread = deepagents_thread(t, &original, &ids, &mut out);
        let id = store.create(thread).map_err(|source| ImportError::Store {
            file: file(),
            original: Some(original.clone()),
            source,
        })?;
        ids.insert(original.clone(), id.clone());
        out.threads.push((original, id));
    }
    Ok(out)
}

/// The thread entries of a deepagents `threads.json`, parents first (so a child can name its
/// parent's weft id); an entry that is not a thread is skipped and reported in `skipped`.
fn deepagents_entries<'a>(
    path: &Path,
    doc: &'a Value,
    skipped: &mut Vec<String>,
) -> Result<Vec<&'a Value>, ImportError> {
    let Some(entries) = doc["threads"].as_array() else {
        return Err(ImportError::NotAList {
            file: path.to_path_buf(),
        });
    };
    // Values, not maps: indexing a missing key of a Value is Null, never a panic.
    let mut threads: Vec<&Value> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        match e.is_object() && e["id"].is_string() {
            true => threads.push(e),
            false => skipped.push(format!(
                "{}: threads[{i}] is not a thread entry, skipped",
                path.display()
            )),
        }
    }
    if let Some(cur) = doc["current_thread_id"].as_str() {
        if !threads.iter().any(|t| t["id"] == cur) {
            skipped.push(format!(
                "{}: current_thread_id {cur} names no thread (ignored)",
                path.display()
            ));
        }
    }
    threads.sort_by_key(|t| {
        (
            t["parent_id"].is_string(),
            t["created"].as_str().unwrap_or("").to_string(),
        )
    });
    Ok(threads)
}

/// One deepagents entry as a finished weft thread holding one note; its parent (already
/// imported, in `ids`) becomes its `forked_from`. An unparsable `created` is reported in `out`.
fn deepagents_thread(
    t: &Value,
    original: &str,
    ids: &HashMap<String, ThreadId>,
    out: &mut Imported,
) -> NewThread {
    let created = ts(&t["created"]);
    let used = ts(&t["last_used"]).or_else(|| created.clone());
    if created.is_none() {
        out.skipped.push(format!(
            "{original}: unparsable `created` {}; imported with the import time",
            t["created"]
        ));
    }
    let mut meta = Map::new();
    meta.insert("source".into(), json!("deepagents"));
    meta.insert("original_id".into(), json!(original));
    for k in ["name", "assistant_id", "token_count", "parent_id"] {
        if let Some(v) = Some(&t[k]).filter(|v| !v.is_null()) {
            meta.insert(
                if k == "parent_id" {
                    "original_parent".into()
                } else {
                    k.to_string()
                },
                v.clone(),
            );
        }
    }
    if let Some(m) = Some(&t["metadata"]).filter(|m| m.is_object()) {
        meta.insert("deepagents".into(), m.clone());
    }
    let parent = t["parent_id"].as_str().and_then(|p| ids.get(p)).cloned();
    let name = t["name"].as_str().unwrap_or("unnamed thread");
    let note = json!({ "type": "note", "text": format!("imported from deepagents: {name} (its messages live in the deepagents checkpointer, not in threads.json)") });
    NewThread {
        directive: "import/deepagents".into(),
        status: "completed".into(),
        created_at: created.unwrap_or_default(),
        updated_at: used.unwrap_or_default(),
        meta,
        forked_from: parent,
        imported: Some(
            json!({ "format": "deepagents", "file": out.file, "original_id": original }),
        ),
        events: vec![note],
        ..Default::default()
    }
}

/// A thread in another format: `nova` (a manifest line, then messages and events as nova
/// writes them) or `markdown` (the conversation as people read it). Edits are applied.
pub fn export(store: &dyn ThreadStore, id: &ThreadId, format: &str) -> Result<String, StoreError> {
    let view = store
        .get(id)?
        .ok_or_else(|| StoreError::NotFound(id.clone()))?;
    let lines = super::apply_edits(&store.load(id, None, usize::MAX >> 1)?.lines);
    let row = &view.row;
    let title = row
        .meta
        .as_ref()
        .and_then(|m| m["title"].as_str())
        .map(str::to_string);
    match format {
        "nova" => {
            let mut out = vec![json!({
                "id": id, "agentId": row.directive, "createdAt": row.created_at,
                "updatedAt": row.updated_at, "title": title.unwrap_or_else(|| row.directive.clone()),
            })];
            for l in &lines {
                let at = l
                    .get("at")
                    .filter(|a| !a.is_null())
                    .or(l.get("ts"))
                    .cloned()
                    .unwrap_or(Value::Null);
                out.extend(match Line::parse(l) {
                    Line::Message { role, text, .. } => Some(json!({ "role": role, "text": text, "timestamp": at })),
                    Line::AssistantText { text } => Some(json!({ "role": "assistant", "text": text, "timestamp": at })),
                    Line::ToolUse { name, input, .. } => Some(json!({ "type": "tool_use", "name": name, "input": input, "timestamp": at })),
                    _ => None,
                });
            }
            Ok(out.iter().map(|v| format!("{v}\n")).collect())
        }
        "markdown" => {
            let mut md = format!(
                "# {}\n\n",
                title.unwrap_or_else(|| format!("{} — {id}", row.directive))
            );
            md.push_str(&format!("- thread `{id}`, directive `{}`, {}\n- model {}, {} turn(s), spend {}\n- {} → {}\n\n",
                row.directive, row.status, if row.model.is_empty() { "-" } else { &row.model }, row.turns,
                crate::core::money::Nanos(row.spend_nanos), row.created_at, row.updated_at));
            for l in &lines {
                if let Some((label, text)) = crate::record::render::describe(l) {
                    md.push_str(&format!("**{label}**: {}\n\n", text.trim_end()));
                }
            }
            Ok(md)
        }
        other => Err(StoreError::Invalid {
            rule: "export.format",
            detail: format!("`{other}` is not an export format; use nova or markdown"),
        }),
    }
}
