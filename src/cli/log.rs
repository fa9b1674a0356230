//! `weft log <id> [--follow] [--json] [--tree]`: a thread's transcript as people read it (or its
//! lines as stored, `--json`); `--tree` interleaves its subtree, each line tagged; `--follow`
//! tails it from any process until it — every thread of it, with `--tree` — has ended.

use super::{failed, find_project, open_threads, usage, Exit};
use crate::core::ids::ThreadId;
use crate::record::place::Records;
use crate::store::{FileStore, ThreadStore};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

/// How often `--follow` looks for new lines and threads.
const POLL: std::time::Duration = std::time::Duration::from_millis(150);

/// One transcript being read: how far it was read.
struct Tail {
    thread: ThreadId,
    cursor: u64,
    tag: String,
    id: String,
}

impl Tail {
    /// The complete lines added since the last call (a torn last line waits for its end).
    fn read_new(&mut self, records: &Records) -> Vec<Value> {
        records
            .new_lines(&self.thread, &mut self.cursor)
            .unwrap_or_default()
            .iter()
            .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
            .collect()
    }
}

pub(super) async fn log(
    explicit: Option<PathBuf>,
    id: String,
    follow: bool,
    as_json: bool,
    tree: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let store = open_threads(&project)?;
    if store.get(&id).map_err(failed)?.is_none() {
        return Err(usage(format!(
            "no thread {id} in this project (see `weft threads`)"
        )));
    }
    let mut tails: BTreeMap<String, Tail> = BTreeMap::new();
    loop {
        let rows = members(&store, &id, tree)?;
        for r in &rows {
            tails.entry(r.id.to_string()).or_insert_with(|| Tail {
                thread: r.id.clone(),
                cursor: 0,
                tag: tag(&r.directive, &r.id),
                id: r.id.to_string(),
            });
        }
        let mut batch: Vec<(String, String, Value)> = Vec::new();
        for t in tails.values_mut() {
            for l in t.read_new(store.records()) {
                let ts = l["ts"].as_str().unwrap_or_default().to_string();
                batch.push((ts, t.id.clone(), l));
            }
        }
        batch.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = std::io::stdout().lock();
        for (_, tid, line) in &batch {
            let tail = &tails[tid];
            if as_json {
                let mut l = line.clone();
                l["thread_id"] = Value::String(tid.clone());
                let _ = writeln!(out, "{l}");
            } else if let Some((label, text)) = crate::record::render::describe(line) {
                let time = line["ts"]
                    .as_str()
                    .and_then(|t| t.get(11..23))
                    .unwrap_or("");
                let who = if tree {
                    format!("{}  ", tail.tag)
                } else {
                    String::new()
                };
                let indent = " ".repeat(time.len() + who.chars().count() + 14);
                let text = text.replace('\n', &format!("\n{indent}"));
                let _ = writeln!(out, "{time} {who}{label:<12} {text}");
            }
        }
        let _ = out.flush();
        drop(out);
        let ended = rows.iter().all(|r| r.status.is_terminal());
        if !follow || (ended && batch.is_empty()) {
            return Ok(0);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The threads shown: `id` alone, or its subtree.
fn members(
    store: &FileStore,
    id: &ThreadId,
    tree: bool,
) -> Result<Vec<crate::registry::ThreadRow>, Exit> {
    if tree {
        store.tree(id).map_err(failed)
    } else {
        Ok(store
            .get(id)
            .map_err(failed)?
            .map(|v| v.row)
            .into_iter()
            .collect())
    }
}

/// A short tag for a thread's lines: its directive and the end of its id.
fn tag(directive: &str, id: &str) -> String {
    let tail = id.get(id.len().saturating_sub(4)..).unwrap_or(id);
    format!("[{directive}·{tail}]")
}
