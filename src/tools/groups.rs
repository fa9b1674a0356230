//! No tool process outlives its owner: every process group a call starts (command tools, hook
//! commands, scheduled tools), and every command MCP server's, is
//! - started from one long-lived thread with a parent-death signal, so the kernel kills its
//!   leader when weft dies, however it dies (`kill -9`, OOM); the signal fires when the thread
//!   that forked exits, which is why it is never a tokio worker (a worker that once ran
//!   `block_in_place` may later exit as an idle blocking thread);
//! - recorded durably (`.weft/state/procs/<owner>-<pgid>.json`: pgid, the leader's start time,
//!   the owner pid) before its call waits on it, and the record removed once the group is killed;
//! - killed with the whole group when its call ends (`process.rs`), and with every live group
//!   of the process on its abrupt exit paths ([`kill_all_live`]: a second Ctrl-C, SIGTERM);
//! - killed by recovery ([`reap`]) when its owner is gone and it is provably the same group: its
//!   leader alive with the recorded start time, or the group alive with members that started no
//!   earlier than the recorded leader (a process group id is not handed out again while the group
//!   has a member).
//!
//! Must never kill a group it cannot prove is the one it recorded.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex, OnceLock};

/// Work run on the spawner thread.
type Job = Box<dyn FnOnce() + Send>;

/// Live groups of this process: pgid → its record file (if any).
fn live() -> &'static Mutex<HashMap<i32, Option<PathBuf>>> {
    static LIVE: OnceLock<Mutex<HashMap<i32, Option<PathBuf>>>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
}

/// Runs `job` on the process's one spawner thread (started on first use, never exits).
fn on_spawner(job: Job) -> Result<(), String> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let _ = std::thread::Builder::new()
            .name("weft-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            });
        Mutex::new(tx)
    });
    let tx = tx
        .lock()
        .map_err(|_| "the spawner lock is poisoned".to_string())?;
    tx.send(job)
        .map_err(|_| "the spawner thread is gone".to_string())
}

/// Starts `cmd` (already set to its own process group) on the spawner thread, its leader killed
/// by the kernel if this process dies.
pub(crate) async fn spawn(
    mut cmd: tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    arm_parent_death(&mut cmd);
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    on_spawner(Box::new(move || {
        let _in_runtime = handle.enter();
        let _ = tx.send(cmd.spawn());
    }))
    .map_err(std::io::Error::other)?;
    rx.await
        .unwrap_or_else(|_| Err(std::io::Error::other("the spawner dropped the start")))
}

/// The child's leader gets SIGKILL when the thread that forked it exits (the spawner thread
/// lives as long as the process), and refuses to start if its parent is already gone.
#[allow(unsafe_code)]
fn arm_parent_death(cmd: &mut tokio::process::Command) {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec and makes only two system calls
    // (prctl, getppid), both async-signal-safe; it allocates nothing on its success path.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The parent may have died before the signal was armed.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(3)); // ESRCH
            }
            Ok(())
        });
    }
}

/// A live group's record; [`Recorded::done`] (or drop) kills what is left of the group and
/// removes the record.
pub(crate) struct Recorded {
    pgid: i32,
}

/// Records group `pgid` of call `call` in `dir` (durably: the file and its folder are
/// synced) and in this process's live set. A record that cannot be written is logged; the
/// parent-death signal still covers the leader.
pub(crate) fn record(dir: Option<&Path>, pgid: u32, call: &str) -> Recorded {
    let Ok(pgid) = i32::try_from(pgid) else {
        return Recorded { pgid: 0 };
    };
    let path = dir.and_then(|d| match write_record(d, pgid, call) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(
                "cannot record tool process group {pgid} in {}: {e}",
                d.display()
            );
            None
        }
    });
    if let Ok(mut l) = live().lock() {
        l.insert(pgid, path);
    }
    Recorded { pgid }
}

fn write_record(dir: &Path, pgid: i32, call: &str) -> std::io::Result<PathBuf> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let owner = std::process::id();
    let path = dir.join(format!("{owner}-{pgid}.json"));
    let body = serde_json::json!({
        "pgid": pgid, "leader_start": start_time(pgid), "owner": owner, "call": call,
    });
    let mut f = std::fs::File::create(&path)?;
    f.write_all(body.to_string().as_bytes())?;
    f.sync_all()?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(path)
}

impl Recorded {
    /// Kills what is left of the group and forgets it.
    pub(crate) fn done(self) {}

    /// Asks every process of the group to end (SIGTERM); the record stays until it is dropped.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn terminate(&self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pgid) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::TERM);
        }
    }
}

impl Recorded {
    /// Whether any process of the group is still there.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn alive(&self) -> bool {
        rustix::process::Pid::from_raw(self.pgid)
            .is_some_and(|pid| rustix::process::test_kill_process_group(pid).is_ok())
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        if self.pgid <= 0 {
            return;
        }
        kill_group(self.pgid);
        let path = live().lock().ok().and_then(|mut l| l.remove(&self.pgid));
        if let Some(p) = path.flatten() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Kills every tool process group this process still runs: call it before exiting without
/// ending the runtime's threads (`std::process::exit` on a second Ctrl-C, say), so nothing of a
/// call outlives the process.
pub fn kill_all_live() {
    let groups: Vec<(i32, Option<PathBuf>)> = match live().lock() {
        Ok(mut l) => l.drain().collect(),
        Err(_) => return,
    };
    for (pgid, path) in groups {
        kill_group(pgid);
        if let Some(p) = path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// SIGKILL to every process of group `pgid`.
pub(crate) fn kill_group(pgid: i32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pgid) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// Recovery: kills the recorded groups of owners that are gone (`dead`), when provably the same
/// processes, and removes their records. Returns the groups killed.
pub(crate) fn reap(dir: &Path, dead: impl Fn(u32) -> bool) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut killed = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        let rec: Option<serde_json::Value> = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let Some(rec) = rec else {
            // Torn (the owner died while writing it): nothing provable to act on.
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let owner = rec["owner"].as_u64().and_then(|o| u32::try_from(o).ok());
        if !owner.is_some_and(&dead) {
            continue;
        }
        let pgid = rec["pgid"].as_i64().and_then(|p| i32::try_from(p).ok());
        if let (Some(pgid), Some(start)) = (pgid, rec["leader_start"].as_u64()) {
            if same_group(pgid, start) {
                kill_group(pgid);
                killed.push(pgid);
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    killed
}

/// Whether group `pgid` is still the one whose leader started at `start` (clock ticks after
/// boot): the leader alive with that start time, or, the leader gone, a member of the group
/// that started no earlier.
fn same_group(pgid: i32, start: u64) -> bool {
    match start_time(pgid) {
        Some(t) => t == start && group_of(pgid) == Some(pgid),
        None => members(pgid).iter().any(|&t| t >= start),
    }
}

/// A process's start time (field 22 of `/proc/<pid>/stat`), None when it is gone.
fn start_time(pid: i32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// A process's group (field 5 of `/proc/<pid>/stat`).
fn group_of(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(2)?.parse().ok()
}

/// The fields of `/proc/<pid>/stat` after the command name (field 3 onwards).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    Some(rest.split(' ').map(str::to_string).collect())
}

/// Start times of the live processes of group `pgid`.
fn members(pgid: i32) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| group_of(pid) == Some(pgid))
        .filter_map(start_time)
        .collect()
}
