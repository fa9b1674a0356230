//! Upkeep of a project's files (deepagents' thread management): `gc`, the TTL clean-up of
//! finished trees, then VACUUM; and the sizes `weft doctor` reports.

use super::{storage, FileStore, StoreError, ThreadStore};
use crate::core::ids::ThreadId;
use crate::registry::{ThreadFilter, ThreadRow};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// What `gc` removed (or, with `dry_run`, would remove).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Collected {
    /// Roots of the trees collected.
    pub roots: Vec<ThreadId>,
    /// Threads in those trees.
    pub threads: usize,
    /// Bytes of their folders.
    pub bytes: u64,
    /// Nothing was removed: this is what would have been.
    pub dry_run: bool,
    /// Database bytes before and after VACUUM (registry.db + store.db), when it ran.
    pub databases: Option<(u64, u64)>,
}

/// Bytes of a file, or of every file under a folder.
pub(crate) fn size_of(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .map(|entries| entries.flatten().map(|e| size_of(&e.path())).sum())
        .unwrap_or(0)
}

/// A database's bytes, its write-ahead log included.
pub(crate) fn db_size(path: &Path) -> u64 {
    let wal = path.with_extension("db-wal");
    size_of(path) + size_of(&wal)
}

impl FileStore {
    /// Every row of the project (no limit).
    pub(crate) fn all_rows(&self) -> Result<Vec<ThreadRow>, StoreError> {
        self.list(&ThreadFilter {
            limit: Some(usize::MAX >> 1),
            ..Default::default()
        })
    }

    /// Removes every tree whose threads have all finished and none changed for `older_than`
    /// (and whose root's status is one of `statuses`, when given), subtrees together, then
    /// VACUUMs the databases. With `dry_run`, only says what it would remove.
    pub fn gc(
        &self,
        older_than: Duration,
        statuses: &[String],
        dry_run: bool,
    ) -> Result<Collected, StoreError> {
        let cutoff = SystemTime::now()
            .checked_sub(older_than)
            .map(|t| humantime::format_rfc3339_millis(t).to_string())
            .unwrap_or_default();
        let rows = self.all_rows()?;
        let mut trees: BTreeMap<&ThreadId, Vec<&ThreadRow>> = BTreeMap::new();
        for r in &rows {
            trees.entry(&r.root_id).or_default().push(r);
        }
        let mut done = Collected {
            dry_run,
            ..Default::default()
        };
        for (root, members) in trees {
            let Some(top) = members.iter().find(|r| r.id == *root) else {
                continue;
            };
            let ripe = members
                .iter()
                .all(|r| r.status.is_terminal() && r.updated_at < cutoff)
                && (statuses.is_empty() || statuses.iter().any(|s| top.status == s.as_str()));
            let id = root.clone();
            if !ripe {
                continue;
            }
            let bytes: u64 = members
                .iter()
                .map(|r| size_of(&self.thread_dir(&r.id)))
                .sum();
            if !dry_run {
                self.delete(&id, true)?;
            }
            done.threads += members.len();
            done.bytes += bytes;
            done.roots.push(id);
        }
        if !dry_run {
            done.databases = Some(self.vacuum()?);
        }
        Ok(done)
    }

    /// VACUUMs the registry's and the store's tables; returns the bytes of registry.db and
    /// store.db before and after (0 on Postgres, whose files are the server's).
    pub fn vacuum(&self) -> Result<(u64, u64), StoreError> {
        let state = self.project().state_dir();
        let size = || db_size(&state.join("registry.db")) + db_size(&state.join("store.db"));
        let before = size();
        self.reg(|s| s.vacuum())?;
        self.idx(|c| {
            c.vacuum(&["msgs", "indexed", "deleted", "kv", "effects", "env"])
                .map_err(storage)
        })?;
        if !self.records().on_files() {
            self.records()
                .with_server(|db| db.vacuum(&crate::record::tables::TABLES))
                .map_err(storage)?;
        }
        Ok((before, size()))
    }
}
