//! Who this process is as the owner of threads, ledger trees and effects: its pid, or — for a
//! `weft serve --node` on a Postgres database shared by several machines — the owner number its
//! node's lease was given (from [`NODE_BASE`] up; pids are below 2²², so the two never meet). A
//! pid's owner is alive while its process holds its owner lock (one machine); a node's owner is
//! alive while its lease runs in the database (any machine). A node's number is new each time its
//! name is taken, so the rows of an earlier holder of the name are never taken for its own.

use std::sync::atomic::{AtomicU32, Ordering};

/// The first owner number of a node (below it: process ids).
pub(crate) const NODE_BASE: u32 = 1 << 30;

/// This process's node owner number; 0 while it is not a node.
static NODE: AtomicU32 = AtomicU32::new(0);

/// How long a node's transaction may sit idle before the server ends it, in milliseconds.
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
static NODE_IDLE_MS: AtomicU32 = AtomicU32::new(0);

/// This process as an owner: its node's number, else its pid.
pub(crate) fn me() -> u32 {
    match NODE.load(Ordering::Relaxed) {
        0 => pid(),
        n => n,
    }
}

/// This process's id, asked of the kernel once (a syscall each time otherwise; weft never
/// forks a copy of itself, its tools are new programs).
fn pid() -> u32 {
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// This process's node owner number, if it joined as a node on a shared database.
pub(crate) fn node() -> Option<u32> {
    match NODE.load(Ordering::Relaxed) {
        0 => None,
        n => Some(n),
    }
}

/// Whether `owner` is a node's number (its liveness is its lease), not a pid.
pub(crate) fn is_node(owner: u32) -> bool {
    owner >= NODE_BASE
}

/// From now on this process owns what it starts as node `owner`. Called once, before any
/// runtime opens (a row written before would carry the pid).
/// `lease` is its lease's length: a transaction of a node stopped halfway (SIGSTOP) is ended by
/// the server after twice that (5 to 60 s), so its locks do not hold the other nodes up for
/// longer than adopting its threads takes.
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) fn become_node(owner: u32, lease: std::time::Duration) {
    debug_assert!(is_node(owner));
    let idle = (lease * 2)
        .clamp(
            std::time::Duration::from_secs(5),
            std::time::Duration::from_secs(60),
        )
        .as_millis();
    NODE_IDLE_MS.store(u32::try_from(idle).unwrap_or(u32::MAX), Ordering::Relaxed);
    NODE.store(owner, Ordering::Relaxed);
}

/// How long a node's transaction may sit idle, in milliseconds (None: not a node).
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) fn node_idle_ms() -> Option<u32> {
    node().map(|_| NODE_IDLE_MS.load(Ordering::Relaxed))
}
