//! Who owns a thread, decided by something the owner holds: every process that runs threads of
//! a project holds an exclusive lock on `.weft/state/owners/<pid>.lock` for as long as it lives
//! (the OS releases it when the process dies, however it dies). A thread whose owner's lock can
//! be taken has no live owner. What the program is called plays no part, so any program
//! embedding the library is as alive as `weft`.

use std::collections::HashMap;
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::project::Project;

/// This process's hold on its owner lock in one project, shared by every runtime of the process
/// on that project (two opens of one file would lock each other out).
pub(crate) struct OwnerLock {
    _file: Arc<File>,
    /// This runtime took the lock first in this process: any unfinished row carrying this pid
    /// was left by an earlier process that had the same pid (pids are reused; in a container
    /// every run may be pid 1), and is recovered.
    pub(crate) first: bool,
}

fn held() -> &'static Mutex<HashMap<PathBuf, Weak<File>>> {
    static HELD: OnceLock<Mutex<HashMap<PathBuf, Weak<File>>>> = OnceLock::new();
    HELD.get_or_init(Default::default)
}

fn lock_path(state_dir: &Path, pid: u32) -> PathBuf {
    state_dir.join("owners").join(format!("{pid}.lock"))
}

/// Takes (or shares) this process's owner lock in `state_dir`.
pub(crate) fn acquire(state_dir: &Path) -> Result<OwnerLock, String> {
    let path = lock_path(state_dir, std::process::id());
    let mut map = held()
        .lock()
        .map_err(|_| "owner lock table poisoned".to_string())?;
    if let Some(file) = map.get(&path).and_then(Weak::upgrade) {
        return Ok(OwnerLock {
            _file: file,
            first: false,
        });
    }
    let dir = state_dir.join("owners");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.lock()
        .map_err(|e| format!("{}: cannot lock: {e}", path.display()))?;
    let file = Arc::new(file);
    map.retain(|_, w| w.strong_count() > 0);
    map.insert(path, Arc::downgrade(&file));
    Ok(OwnerLock {
        _file: file,
        first: true,
    })
}

/// Is the process `pid` that ran threads of this project alive? This process is; another is
/// alive exactly while it holds its lock. No lock file: no live owner (a process that never
/// took one is from before owner locks, or died before its first thread).
pub(crate) fn alive(state_dir: &Path, pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let path = lock_path(state_dir, pid);
    let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else {
        return false;
    };
    match file.try_lock() {
        Ok(()) => {
            // Ours now: its owner is gone. Released when `file` drops; the file is removed
            // so the directory does not grow with every process that ever ran.
            let _ = std::fs::remove_file(&path);
            false
        }
        Err(TryLockError::WouldBlock) => true,
        // Cannot tell: never steal.
        Err(TryLockError::Error(e)) => {
            tracing::warn!("{}: cannot test the owner lock: {e}", path.display());
            true
        }
    }
}

/// Is `owner` (a pid or a node's number, see `core/owner.rs`) alive? A node's is read from the
/// nodes' leases; when they cannot be read it counts as alive (never steal when unsure).
pub(crate) fn owner_alive(project: &Project, owner: u32) -> bool {
    if Some(owner) == crate::core::owner::node() {
        return true;
    }
    if !crate::core::owner::is_node(owner) {
        return alive(&project.state_dir(), owner);
    }
    match super::node::live_owners(project) {
        Ok(live) => live.contains(&owner),
        Err(e) => {
            tracing::warn!("cannot read the nodes' leases: {e}");
            true
        }
    }
}

/// Judges which owners of a project's rows are gone: pids by their owner locks, nodes by
/// their leases (read once, when a node's number is first judged).
pub(crate) struct Judge<'a> {
    project: &'a Project,
    /// This process is the first owner since the project's last process died: rows carrying
    /// its own pid are from a dead process that had it.
    first_owner: bool,
    live_nodes: OnceLock<Option<std::collections::HashSet<u32>>>,
    /// Node owners judged dead, and whether they were buried (`node::bury`).
    buried: Mutex<HashMap<u32, bool>>,
}

impl<'a> Judge<'a> {
    /// A judge for `project` (see [`Judge::first_owner`]).
    pub(crate) fn new(project: &'a Project, first_owner: bool) -> Judge<'a> {
        Judge {
            project,
            first_owner,
            live_nodes: Default::default(),
            buried: Default::default(),
        }
    }

    /// Whether `owner` is gone.
    pub(crate) fn dead(&self, owner: u32) -> bool {
        if owner == std::process::id() {
            return self.first_owner;
        }
        if Some(owner) == crate::core::owner::node() {
            return false;
        }
        if !crate::core::owner::is_node(owner) {
            return !alive(&self.project.state_dir(), owner);
        }
        let live = self.live_nodes.get_or_init(|| {
            super::node::live_owners(self.project)
                .map_err(|e| tracing::warn!("cannot read the nodes' leases: {e}"))
                .ok()
        });
        live.as_ref().is_some_and(|l| !l.contains(&owner)) && self.bury(owner)
    }

    /// Buries node owner `owner` once (see `node::bury`): its writes still in flight are
    /// waited for and its lease can never run again. Not buried (a renewal held, or the
    /// database cannot say): not dead.
    fn bury(&self, owner: u32) -> bool {
        let Ok(mut buried) = self.buried.lock() else {
            return false;
        };
        *buried.entry(owner).or_insert_with(|| {
            let db = super::node::open(self.project, false);
            match db.map(|db| db.map(|mut db| super::node::bury(&mut db, owner))) {
                Ok(Some(Ok(b))) => b,
                other => {
                    tracing::warn!("cannot bury node owner {owner}: {other:?}");
                    false
                }
            }
        })
    }
}
