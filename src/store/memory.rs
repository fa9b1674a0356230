//! [`MemoryStore`]: the store contract kept in memory — for tests, for embedding weft's history
//! reading in a program that keeps no files, and as the proof that callers depend on the
//! contract and not on the files. The same contract tests run against it and [`FileStore`].
//!
//! [`FileStore`]: super::FileStore

use super::check::{around, check_event, check_kv, check_target, messages, terms};
use super::{
    merge_meta, page, Backfill, Deleted, NewThread, SearchHit, SearchMessage, SearchQuery,
    StoreError, ThreadStore, ThreadView, TranscriptPage,
};
use crate::core::ids::{now_ts, ThreadId};
use crate::registry::{ThreadFilter, ThreadRow};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

/// The store contract in memory (see the module doc).
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Mem>,
}

#[derive(Default)]
struct Mem {
    threads: BTreeMap<String, Kept>,
    deleted: HashSet<String>,
    /// Indexed threads: directive and messages.
    index: HashMap<String, (String, Vec<SearchMessage>)>,
}

struct Kept {
    row: ThreadRow,
    lines: Vec<Value>,
    kv: Map<String, Value>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Puts a thread in as it is (any status; lines numbered in order) — a running thread for
    /// tests, or history loaded from elsewhere.
    pub fn insert(&self, row: ThreadRow, events: Vec<Value>) {
        let lines = number(events, 0);
        if let Ok(mut m) = self.inner.lock() {
            m.threads.insert(
                row.id.to_string(),
                Kept {
                    row,
                    lines,
                    kv: Map::new(),
                },
            );
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Mem) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut m = self
            .inner
            .lock()
            .map_err(|_| StoreError::Storage("the memory store was poisoned".into()))?;
        f(&mut m)
    }
}

fn number(events: Vec<Value>, from: usize) -> Vec<Value> {
    events
        .into_iter()
        .enumerate()
        .map(|(i, mut e)| {
            e["seq"] = Value::from((from + i) as i64);
            e
        })
        .collect()
}

impl Mem {
    fn kept(&self, id: &ThreadId) -> Result<&Kept, StoreError> {
        match self.threads.get(id.as_str()) {
            Some(k) => Ok(k),
            None if self.deleted.contains(id.as_str()) => Err(StoreError::Deleted(id.clone())),
            None => Err(StoreError::NotFound(id.clone())),
        }
    }

    fn subtree(&self, id: &str) -> Vec<ThreadRow> {
        let mut out: Vec<ThreadRow> = self
            .threads
            .get(id)
            .map(|k| k.row.clone())
            .into_iter()
            .collect();
        let mut i = 0;
        while i < out.len() {
            let parent = out[i].id.clone();
            out.extend(
                self.threads
                    .values()
                    .filter(|k| k.row.parent_id.as_deref() == Some(parent.as_str()))
                    .map(|k| k.row.clone()),
            );
            i += 1;
        }
        out
    }

    fn index(&mut self, id: &ThreadId) -> Result<usize, StoreError> {
        let k = self.kept(id)?;
        if !k.row.status.is_terminal() {
            return Err(StoreError::Running(id.clone()));
        }
        let msgs = messages(&k.lines);
        let n = msgs.len();
        let directive = k.row.directive.clone();
        self.index.insert(id.to_string(), (directive, msgs));
        Ok(n)
    }
}

impl ThreadStore for MemoryStore {
    fn create(&self, t: NewThread) -> Result<ThreadId, StoreError> {
        let status = super::check::ended_status(&t.status)?;
        let mut lines = Vec::new();
        for e in &t.events {
            check_event(e)?;
            check_target(&lines, e)?;
            lines.extend(number(vec![e.clone()], lines.len()));
        }
        let id = ThreadId::generate(&t.directive);
        let now = now_ts();
        let pick = |s: &str| {
            if s.is_empty() {
                now.clone()
            } else {
                s.to_string()
            }
        };
        let row = ThreadRow {
            directive: t.directive,
            created_at: pick(&t.created_at),
            updated_at: pick(&t.updated_at),
            model: t.model,
            result: t.result,
            forked_from: t.forked_from,
            meta: (!t.meta.is_empty()).then_some(Value::Object(t.meta)),
            ..ThreadRow::new(id.clone(), id.clone(), status)
        };
        self.with(|m| {
            m.threads.insert(
                id.to_string(),
                Kept {
                    row,
                    lines,
                    kv: Map::new(),
                },
            );
            m.index(&id)?;
            Ok(id.clone())
        })
    }

    fn get(&self, id: &ThreadId) -> Result<Option<ThreadView>, StoreError> {
        self.with(|m| {
            Ok(m.threads.get(id.as_str()).map(|k| ThreadView {
                row: k.row.clone(),
                thread: Some(
                    json!({ "id": k.row.id, "directive": k.row.directive, "status": k.row.status }),
                ),
                verified: true,
                problem: None,
            }))
        })
    }

    fn list(&self, f: &ThreadFilter) -> Result<Vec<ThreadRow>, StoreError> {
        self.with(|m| {
            let mut rows: Vec<ThreadRow> = m
                .threads
                .values()
                .map(|k| &k.row)
                .filter(|r| f.status.is_empty() || f.status.iter().any(|s| r.status == s.as_str()))
                .filter(|r| f.directive.as_ref().is_none_or(|d| *d == r.directive))
                .filter(|r| f.root.as_ref().is_none_or(|d| *d == r.root_id))
                .filter(|r| f.updated_since.as_ref().is_none_or(|t| r.updated_at >= *t))
                .cloned()
                .collect();
            rows.sort_by(|a, b| (&b.created_at, &b.id).cmp(&(&a.created_at, &a.id)));
            rows.truncate(f.limit.unwrap_or(1000));
            Ok(rows)
        })
    }

    fn tree(&self, id: &ThreadId) -> Result<Vec<ThreadRow>, StoreError> {
        self.with(|m| Ok(m.subtree(id.as_str())))
    }

    fn delete(&self, id: &ThreadId, subtree: bool) -> Result<Deleted, StoreError> {
        self.with(|m| {
            match m.kept(id) {
                Err(StoreError::Deleted(_)) => {
                    return Ok(Deleted {
                        threads: vec![],
                        already: true,
                    })
                }
                Err(e) => return Err(e),
                Ok(_) => {}
            }
            let rows = m.subtree(id.as_str());
            if !subtree && rows.len() > 1 {
                return Err(StoreError::HasChildren {
                    id: id.clone(),
                    children: rows.len() - 1,
                });
            }
            if let Some(live) = rows.iter().find(|r| !r.status.is_terminal()) {
                return Err(StoreError::Running(live.id.clone()));
            }
            let mut gone = Vec::new();
            for r in rows {
                m.threads.remove(r.id.as_str());
                m.index.remove(r.id.as_str());
                m.deleted.insert(r.id.to_string());
                gone.push(r.id);
            }
            Ok(Deleted {
                threads: gone,
                already: false,
            })
        })
    }

    fn append(&self, id: &ThreadId, events: Vec<Value>) -> Result<i64, StoreError> {
        self.with(|m| {
            let k = m.kept(id)?;
            if !k.row.status.is_terminal() {
                return Err(StoreError::Running(id.clone()));
            }
            let mut lines = k.lines.clone();
            for e in &events {
                check_event(e)?;
                check_target(&lines, e)?;
                lines.extend(number(vec![e.clone()], lines.len()));
            }
            let last = lines.len() as i64 - 1;
            if let Some(k) = m.threads.get_mut(id.as_str()) {
                k.lines = lines;
                k.row.updated_at = now_ts();
            }
            m.index(id)?;
            Ok(last)
        })
    }

    fn load(
        &self,
        id: &ThreadId,
        after: Option<i64>,
        limit: usize,
    ) -> Result<TranscriptPage, StoreError> {
        self.with(|m| Ok(page(id, m.kept(id)?.lines.clone(), after, limit, false)))
    }

    fn update_metadata(
        &self,
        id: &ThreadId,
        patch: &Map<String, Value>,
    ) -> Result<Map<String, Value>, StoreError> {
        self.with(|m| {
            m.kept(id)?;
            let Some(k) = m.threads.get_mut(id.as_str()) else {
                return Err(StoreError::NotFound(id.clone()));
            };
            let mut meta = match k.row.meta.take() {
                Some(Value::Object(o)) => o,
                _ => Map::new(),
            };
            let merged = merge_meta(&mut meta, patch);
            k.row.meta = (!meta.is_empty()).then(|| Value::Object(meta.clone()));
            merged.map(|_| meta)
        })
    }

    fn index(&self, id: &ThreadId) -> Result<usize, StoreError> {
        self.with(|m| m.index(id))
    }

    fn kv_get(&self, id: &ThreadId, key: &str) -> Result<Option<Value>, StoreError> {
        check_kv(key, None)?;
        self.with(|m| Ok(m.kept(id)?.kv.get(key).cloned()))
    }

    fn kv_set(&self, id: &ThreadId, key: &str, value: Option<Value>) -> Result<(), StoreError> {
        check_kv(key, value.as_ref())?;
        self.with(|m| {
            m.kept(id)?;
            if let Some(k) = m.threads.get_mut(id.as_str()) {
                match value {
                    Some(v) => k.kv.insert(key.to_string(), v),
                    None => k.kv.remove(key),
                };
            }
            Ok(())
        })
    }

    fn kv_list(&self, id: &ThreadId) -> Result<Map<String, Value>, StoreError> {
        self.with(|m| Ok(m.kept(id)?.kv.clone()))
    }

    fn search(&self, q: &SearchQuery) -> Result<Vec<SearchHit>, StoreError> {
        let words = terms(&q.text);
        self.with(|m| {
            let docs: Vec<(&String, &String, usize, Vec<String>)> = m
                .index
                .iter()
                .filter(|(_, (d, _))| q.directive.as_ref().is_none_or(|w| w == d))
                .flat_map(|(t, (d, msgs))| {
                    msgs.iter()
                        .enumerate()
                        .map(move |(i, s)| (t, d, i, terms_all(&s.text)))
                })
                .collect();
            let n = docs.len() as f64;
            let avg = docs.iter().map(|d| d.3.len()).sum::<usize>() as f64 / n.max(1.0);
            let idf: HashMap<&str, f64> = words
                .iter()
                .map(|w| {
                    let df = docs.iter().filter(|d| d.3.contains(w)).count() as f64;
                    (w.as_str(), ((n - df + 0.5) / (df + 0.5) + 1.0).ln())
                })
                .collect();
            let mut best: HashMap<&String, (f64, &String, usize)> = HashMap::new();
            for (t, d, i, toks) in &docs {
                let len = toks.len() as f64;
                let score: f64 = words
                    .iter()
                    .map(|w| {
                        let tf = toks.iter().filter(|x| *x == w).count() as f64;
                        idf[w.as_str()] * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len / avg.max(1.0)))
                    })
                    .sum();
                if score > 0.0 && best.get(t).is_none_or(|b| score > b.0) {
                    best.insert(t, (score, d, *i));
                }
            }
            let mut ranked: Vec<_> = best.into_iter().collect();
            ranked.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0).then(a.0.cmp(b.0)));
            ranked.truncate(q.limit.max(1));
            Ok(ranked
                .into_iter()
                .filter_map(|(t, (score, d, i))| {
                    let msgs = &m.index.get(t)?.1;
                    Some(SearchHit {
                        thread_id: ThreadId::parse(t).ok()?,
                        directive: d.clone(),
                        hit: msgs[i].clone(),
                        score,
                        context: around(msgs, i, q.context),
                    })
                })
                .collect())
        })
    }

    fn backfill(&self) -> Result<Backfill, StoreError> {
        self.with(|m| {
            let mut done = Backfill::default();
            let stale: Vec<String> = m
                .index
                .keys()
                .filter(|t| !m.threads.contains_key(*t))
                .cloned()
                .collect();
            for t in stale {
                m.index.remove(&t);
                done.removed += 1;
            }
            let missing: Vec<ThreadId> = m
                .threads
                .values()
                .filter(|k| k.row.status.is_terminal() && !m.index.contains_key(k.row.id.as_str()))
                .map(|k| k.row.id.clone())
                .collect();
            for id in missing {
                m.index(&id)?;
                done.indexed += 1;
            }
            Ok(done)
        })
    }
}

/// Every word of a text, lower-cased, repeats kept (term frequencies).
fn terms_all(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}
