//! [`FileStore`]: the store over weft's own files — registry.db (rows), `.weft/threads/<id>/`
//! (transcript.jsonl, the signed thread.json, the file area) and store.db (search index,
//! tombstones). The one place that knows where a thread's files are.

use super::check::{check_event, check_kv, check_target, messages};
use super::{
    index, merge_meta, page, storage, Backfill, Deleted, NewThread, SearchHit, SearchQuery,
    StoreError, ThreadStore, ThreadView, TranscriptPage,
};
use crate::core::ids::{now_ts, ThreadId};
use crate::core::limits::LimitSet;
use crate::core::status::Status;
use crate::project::config::Durability;
use crate::project::Project;
use crate::record::place::Records;
use crate::record::signing::{Signer, Trust};
use crate::record::thread_doc::{Cost, ThreadDoc, Transition};
use crate::record::transcript::{self, TranscriptWriter};
use crate::registry::{Store, ThreadFilter, ThreadRow};
use crate::sql::Db;
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The store over a project's files (see the module doc).
pub struct FileStore {
    /// The project whose `.weft/` this is.
    project: Project,
    /// Signs checkpoints and thread.json after an append.
    signer: Arc<Signer>,
    /// Verifies what is read.
    trust: Trust,
    /// fsync policy for the lines appended.
    durability: Durability,
    /// Lines between signed checkpoints.
    checkpoint_every: u64,
    /// Where transcripts, thread.json and the anchor log are kept.
    records: Records,
    /// A registry connection of the store's own (std Mutex: no await while held).
    registry: Mutex<Option<Store>>,
    /// The store's own tables (store.db, or the project's Postgres database), opened on first
    /// use.
    index: Mutex<Option<Db>>,
    /// `files_root:` (absolute), where file areas live instead of each thread's folder.
    files_root: Option<PathBuf>,
    /// Environment changes made through this store (see `env.rs`).
    pub(super) env_changes: std::sync::atomic::AtomicU64,
    /// Threads waiting to be indexed (see `later.rs`).
    pub(super) later: super::queue::Later,
    /// Reads of "is any effect pending" shared by concurrent askers (see `effects.rs`).
    pub(super) pending_check: super::shared_read::SharedRead,
}

impl FileStore {
    /// The store of `project` with its records in `records` (see `Records::of`), signing
    /// with `signer` and trusting `trust`.
    pub fn new(
        project: Project,
        records: Records,
        signer: Arc<Signer>,
        trust: Trust,
        durability: Durability,
        checkpoint_every: u64,
    ) -> FileStore {
        FileStore {
            project,
            records,
            signer,
            trust,
            durability,
            checkpoint_every: checkpoint_every.max(1),
            registry: Mutex::new(None),
            index: Mutex::new(None),
            files_root: None,
            later: Default::default(),
            pending_check: Default::default(),
            env_changes: Default::default(),
        }
    }

    /// The store of `project` with the user's signing key and the project's trust store and
    /// config (what a command that starts no thread needs).
    pub fn open(project: &Project) -> Result<FileStore, StoreError> {
        let config = project.config().map_err(storage)?;
        let signer = Signer::load_or_create(&crate::project::user_dir()).map_err(storage)?;
        signer.trust_in(&project.trust_dir()).map_err(storage)?;
        let (trust, _) = Trust::load(&project.trust_dir());
        std::fs::create_dir_all(project.state_dir()).map_err(storage)?;
        let records = Records::of(project, &config);
        crate::record::adopt::adopt_files(&records, project).map_err(|e| {
            storage(format!(
                "moving record files to {}: {e}",
                records.thread_name_all()
            ))
        })?;
        Ok(FileStore::new(
            project.clone(),
            records,
            Arc::new(signer),
            trust,
            config.durability,
            config.checkpoint_every,
        )
        .with_files_root(project.files_root(&config).map_err(storage)?))
    }

    /// The folder of a thread's files.
    pub fn thread_dir(&self, id: &ThreadId) -> PathBuf {
        self.project.thread_dir(id)
    }

    /// Where the project's transcripts, thread.json and anchor log are kept.
    pub fn records(&self) -> &Records {
        &self.records
    }

    /// File areas under `root` (`files_root:`, as `Project::files_root` resolves it), not in
    /// each thread's folder.
    pub fn with_files_root(mut self, root: Option<PathBuf>) -> FileStore {
        self.files_root = root;
        self
    }

    /// A thread's private file area.
    pub fn files_dir(&self, id: &ThreadId) -> PathBuf {
        match &self.files_root {
            Some(root) => root.join(id.as_str()).join("files"),
            None => self.thread_dir(id).join("files"),
        }
    }

    /// Removes everything of a thread's: its records, its folder, and its file area when that
    /// lives under `files_root:`.
    pub(crate) fn remove_thread_files(&self, id: &ThreadId) -> std::io::Result<()> {
        if let Some(root) = &self.files_root {
            match std::fs::remove_dir_all(root.join(id.as_str())) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        self.records.remove(id)?;
        match std::fs::remove_dir_all(self.thread_dir(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// The project.
    pub fn project(&self) -> &Project {
        &self.project
    }

    pub(super) fn reg<T>(
        &self,
        f: impl FnOnce(&mut Store) -> Result<T, crate::registry::RegistryError>,
    ) -> Result<T, StoreError> {
        let mut guard = self
            .registry
            .lock()
            .map_err(|_| storage("the registry connection failed earlier"))?;
        if guard.is_none() {
            *guard = Some(Store::of_project(&self.project)?);
        }
        match guard.as_mut() {
            Some(s) => Ok(f(s)?),
            None => Err(storage("the registry cannot be opened")),
        }
    }

    pub(super) fn idx<T>(
        &self,
        f: impl FnOnce(&mut Db) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // A panic while the connection was held (the indexer survives its own) leaves it in
        // an unknown state: a new one is opened rather than refusing every later call.
        let mut guard = self.index.lock().unwrap_or_else(|poisoned| {
            self.index.clear_poison();
            let mut g = poisoned.into_inner();
            *g = None;
            g
        });
        if guard.is_none() {
            let config = self.project.config().map_err(storage)?;
            let file = self.project.state_dir().join("store.db");
            *guard = Some(index::open(config.database.as_ref(), &file)?);
        }
        match guard.as_mut() {
            Some(c) => f(c),
            None => Err(storage("the store's database cannot be opened")),
        }
    }

    /// Whether `id` was deleted (its tombstone is in store.db).
    #[cfg_attr(not(feature = "cli"), allow(dead_code))]
    pub(crate) fn is_deleted(&self, id: &ThreadId) -> bool {
        self.idx(|c| index::is_deleted(c, id.as_str()))
            .unwrap_or(false)
    }

    pub(super) fn row(&self, id: &ThreadId) -> Result<ThreadRow, StoreError> {
        if let Some(row) = self.reg(|s| s.get(id.as_str()))? {
            return Ok(row);
        }
        if self.idx(|c| index::is_deleted(c, id.as_str()))? {
            return Err(StoreError::Deleted(id.clone()));
        }
        Err(StoreError::NotFound(id.clone()))
    }

    /// A thread's lines, its chain and checkpoints verified (a torn last line left out, a
    /// broken one an error naming file and line) — what resume and fork build on.
    pub(crate) fn verified_lines(&self, id: &ThreadId) -> Result<Vec<Value>, StoreError> {
        self.lines(id).map(|(lines, _)| lines)
    }

    /// The lines up to the head `id`'s verified thread.json signs: what a resume or a fork
    /// rebuilds from (a line appended past it was never signed).
    pub(crate) fn signed_lines(&self, id: &ThreadId) -> Result<Vec<Value>, StoreError> {
        let doc = ThreadDoc::read_verified(&self.records, id, &self.trust)
            .map_err(|e| storage(e.to_string()))?;
        let mut lines = self.verified_lines(id)?;
        lines.truncate(usize::try_from(doc.transcript_head.seq + 1).unwrap_or(0));
        Ok(lines)
    }

    /// [`Self::verified_lines`], and whether a torn last line was left out.
    fn lines(&self, id: &ThreadId) -> Result<(Vec<Value>, bool), StoreError> {
        let path = self.records.transcript_name(id);
        let rep = transcript::read(&self.records, id, Some(&self.trust))
            .map_err(|e| storage(format!("{path}: {e}")))?;
        if let Some((line, m)) = rep.broken {
            return Err(storage(format!("{path}:{line}: {m}")));
        }
        Ok((rep.events, rep.torn_last_line))
    }

    /// Writes `events` through a chained writer, every secret in them redacted (a line added
    /// from outside is held to the rule a thread's own are), and signs the end of them.
    fn write_events(&self, w: &mut TranscriptWriter, events: Vec<Value>) -> Result<(), StoreError> {
        let redactor = self.redactor();
        for mut e in events {
            redactor.redact_value(&mut e);
            let kind = e["type"].as_str().unwrap_or_default().to_string();
            if let Some(o) = e.as_object_mut() {
                o.remove("type");
            }
            w.append(&kind, e).map_err(storage)?;
        }
        w.checkpoint().map_err(storage)
    }
}

impl ThreadStore for FileStore {
    fn create(&self, t: NewThread) -> Result<ThreadId, StoreError> {
        let status = super::check::ended_status(&t.status)?;
        for (i, e) in t.events.iter().enumerate() {
            check_event(e)?;
            check_target(&numbered(&t.events[..i]), e)?;
        }
        let id = ThreadId::generate(&t.directive);
        let now = now_ts();
        let created = if t.created_at.is_empty() {
            now.clone()
        } else {
            t.created_at.clone()
        };
        let updated = if t.updated_at.is_empty() {
            now.clone()
        } else {
            t.updated_at.clone()
        };
        let mut w = TranscriptWriter::create(
            &self.records,
            &id,
            self.signer.clone(),
            self.durability,
            self.checkpoint_every,
        )
        .map_err(storage)?;
        self.write_events(&mut w, t.events)?;
        let doc = ThreadDoc {
            version: 1,
            id: id.clone(),
            directive: t.directive.clone(),
            directive_hash: String::new(),
            parent_id: None,
            root_id: id.clone(),
            status,
            history: vec![
                Transition {
                    status: Status::Created,
                    at: created.clone(),
                },
                Transition {
                    status,
                    at: updated.clone(),
                },
            ],
            created_at: created.clone(),
            updated_at: updated.clone(),
            model: t.model.clone(),
            provider: String::new(),
            limits: crate::core::limits::resolve(
                &LimitSet::default(),
                &LimitSet::default(),
                &LimitSet::default(),
                None,
            ),
            capabilities: vec![],
            approval: vec![],
            cost: Cost::default(),
            outputs: None,
            result: t.result.clone(),
            error: None,
            error_kind: None,
            continuation_of: None,
            continued_by: None,
            chain_root: None,
            transcript_head: w.head().clone(),
            forked_from: t
                .forked_from
                .clone()
                .map(|thread| crate::record::thread_doc::ForkedFrom { thread, seq: -1 }),
            imported: t.imported.clone(),
            caused_by: Vec::new(),
            directive_signature: None,
        };
        doc.write_signed(&self.records, &self.signer, true)
            .map_err(storage)?;
        let row = ThreadRow {
            directive: t.directive,
            created_at: created,
            updated_at: updated,
            model: t.model,
            result: t.result,
            forked_from: t.forked_from,
            meta: (!t.meta.is_empty()).then_some(Value::Object(t.meta)),
            ..ThreadRow::new(id.clone(), id.clone(), status)
        };
        self.reg(|s| s.register(&row, None))?;
        self.index(&id)?;
        Ok(id)
    }

    fn get(&self, id: &ThreadId) -> Result<Option<ThreadView>, StoreError> {
        let Some(row) = self.reg(|s| s.get(id.as_str()))? else {
            return Ok(None);
        };
        let doc = ThreadDoc::read_verified(&self.records, id, &self.trust);
        Ok(Some(match doc {
            Ok(d) => ThreadView {
                row,
                thread: serde_json::to_value(d).ok(),
                verified: true,
                problem: None,
            },
            Err(e) => ThreadView {
                row,
                thread: None,
                verified: false,
                problem: Some(e.to_string()),
            },
        }))
    }

    fn list(&self, filter: &ThreadFilter) -> Result<Vec<ThreadRow>, StoreError> {
        self.reg(|s| s.query(filter))
    }

    fn tree(&self, id: &ThreadId) -> Result<Vec<ThreadRow>, StoreError> {
        self.reg(|s| s.subtree(id.as_str()))
    }

    fn delete(&self, id: &ThreadId, subtree: bool) -> Result<Deleted, StoreError> {
        let rows = match self.row(id) {
            Ok(_) => self.reg(|s| s.subtree(id.as_str()))?,
            Err(StoreError::Deleted(_)) => {
                // Finish what a crash may have left (files of a tombstoned id).
                let _ = self.remove_thread_files(id);
                return Ok(Deleted {
                    threads: vec![],
                    already: true,
                });
            }
            Err(e) => return Err(e),
        };
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
        for r in &rows {
            let tid = &r.id;
            // Tombstone first: from here on nothing recreates it, and a crash is finished by
            // the next delete.
            self.idx(|c| index::tombstone(c, tid.as_str()))?;
            self.idx(|c| index::remove(c, tid.as_str()))?;
            self.idx(|c| index::kv_clear(c, tid.as_str()))?;
            match self.remove_thread_files(tid) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(storage(e)),
                _ => {}
            }
            gone.push(tid.clone());
        }
        let ids: Vec<&str> = gone.iter().map(ThreadId::as_str).collect();
        self.reg(|s| s.delete_finished(&ids))?;
        Ok(Deleted {
            threads: gone,
            already: false,
        })
    }

    fn append(&self, id: &ThreadId, events: Vec<Value>) -> Result<i64, StoreError> {
        if self.idx(|c| index::is_deleted(c, id.as_str()))? {
            return Err(StoreError::Deleted(id.clone()));
        }
        let row = self.row(id)?;
        if !row.status.is_terminal() {
            return Err(StoreError::Running(id.clone()));
        }
        // One writer at a time across processes: the transcript file's own lock, held to the
        // end (on a server, a second writer's first line is refused: its seq is taken).
        let lock = self
            .records
            .lock_transcript(id)
            .map_err(|e| storage(format!("{}: {e}", self.records.transcript_name(id))))?;
        let mut doc = ThreadDoc::read_verified(&self.records, id, &self.trust).map_err(storage)?;
        if doc.imported.is_some() {
            return Err(StoreError::Invalid {
                rule: "thread.read_only",
                detail: format!(
                    "thread {id} was imported: it is read-only history (fork it to go on)"
                ),
            });
        }
        let head = transcript::repair(&self.records, id)
            .map_err(storage)?
            .map_or_else(transcript::Head::empty, |(head, _)| head);
        let (mut lines, _) = self.lines(id)?;
        for e in &events {
            check_event(e)?;
            check_target(&lines, e)?;
            let mut numbered = e.clone();
            numbered["seq"] = Value::from(lines.len() as i64);
            lines.push(numbered);
        }
        let mut w = TranscriptWriter::open_append(
            &self.records,
            id,
            head,
            self.signer.clone(),
            self.durability,
            self.checkpoint_every,
        )
        .map_err(storage)?;
        self.write_events(&mut w, events)?;
        doc.transcript_head = w.head().clone();
        doc.updated_at = now_ts();
        doc.write_signed(&self.records, &self.signer, true)
            .map_err(storage)?;
        // Its new final head is anchored (an older signed thread.json is now a rollback).
        crate::record::anchors::anchor_root(
            &self.records,
            &self.signer,
            id,
            doc.status,
            &doc.transcript_head,
        )
        .map_err(storage)?;
        drop(lock);
        self.index(id)?;
        Ok(w.head().seq)
    }

    fn load(
        &self,
        id: &ThreadId,
        after: Option<i64>,
        limit: usize,
    ) -> Result<TranscriptPage, StoreError> {
        let path = self.records.transcript_name(id);
        let rep = match transcript::read(&self.records, id, None) {
            Ok(rep) => rep,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.row(id)?;
                return Err(storage(format!("thread {id} has no transcript yet")));
            }
            Err(e) => return Err(storage(format!("{path}: {e}"))),
        };
        Ok(page(id, rep.events, after, limit, rep.torn_last_line))
    }

    fn update_metadata(
        &self,
        id: &ThreadId,
        patch: &Map<String, Value>,
    ) -> Result<Map<String, Value>, StoreError> {
        let row = self.row(id)?;
        let mut meta = match row.meta {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        merge_meta(&mut meta, patch)?;
        self.reg(|s| s.set_meta(id.as_str(), &Value::Object(meta.clone())))?;
        Ok(meta)
    }

    fn index(&self, id: &ThreadId) -> Result<usize, StoreError> {
        let row = self.row(id)?;
        if !row.status.is_terminal() {
            return Err(StoreError::Running(id.clone()));
        }
        // Unverified: indexing reads what is there; `weft verify` judges it.
        let lines = transcript::read(&self.records, id, None)
            .map_err(|e| storage(format!("{}: {e}", self.records.transcript_name(id))))?
            .events;
        let head = lines.last().and_then(|l| l["seq"].as_i64()).unwrap_or(-1);
        let msgs = messages(&lines);
        self.idx(|c| index::put(c, id.as_str(), &row.directive, head, &msgs))?;
        Ok(msgs.len())
    }

    fn kv_get(&self, id: &ThreadId, key: &str) -> Result<Option<Value>, StoreError> {
        check_kv(key, None)?;
        self.row(id)?;
        self.idx(|c| index::kv_get(c, id.as_str(), key))
    }

    fn kv_set(&self, id: &ThreadId, key: &str, value: Option<Value>) -> Result<(), StoreError> {
        check_kv(key, value.as_ref())?;
        self.row(id)?;
        self.idx(|c| index::kv_set(c, id.as_str(), key, value.as_ref()))
    }

    fn kv_list(&self, id: &ThreadId) -> Result<Map<String, Value>, StoreError> {
        self.row(id)?;
        self.idx(|c| index::kv_list(c, id.as_str()))
    }

    fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, StoreError> {
        // Every thread that ended before this search is found (see `later.rs`); the wait is
        // off the async workers (the MCP server's search tool runs on them).
        if !crate::sql::off_workers(|| self.flush_index()) {
            tracing::warn!(
                "searching an index still being written: threads that just ended may be missing"
            );
        }
        self.idx(|c| index::search(c, query))
    }

    fn backfill(&self) -> Result<Backfill, StoreError> {
        let filter = ThreadFilter {
            status: ["completed", "error", "cancelled", "continued"]
                .map(String::from)
                .to_vec(),
            limit: Some(usize::MAX >> 1),
            ..Default::default()
        };
        let rows = self.list(&filter)?;
        let heads = self.idx(|c| index::heads(c))?;
        let mut done = Backfill::default();
        for r in &rows {
            let id = &r.id;
            let Ok(rep) = transcript::read(&self.records, id, None) else {
                continue;
            };
            let head = rep
                .events
                .last()
                .and_then(|l| l["seq"].as_i64())
                .unwrap_or(-1);
            if heads.get(r.id.as_str()) != Some(&head) {
                self.index(id)?;
                done.indexed += 1;
            }
        }
        let live: std::collections::HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        for thread in heads.keys().filter(|t| !live.contains(t.as_str())) {
            // Gone from the registry (deleted, or the registry was replaced): not searchable.
            if self.reg(|s| s.get(thread))?.is_none() {
                self.idx(|c| index::remove(c, thread))?;
                done.removed += 1;
            }
        }
        Ok(done)
    }
}

/// `events` with the seqs they will have, for checking edit targets inside one batch.
fn numbered(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut e = e.clone();
            e["seq"] = Value::from(i as i64);
            e
        })
        .collect()
}
