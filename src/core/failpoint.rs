//! Crash injection for the fault tests: `WEFT_FAILPOINT=<step>[:<n>]` makes the process abort
//! (no destructors, no flush: as a `kill -9` or a power cut would leave it) the `n`th time
//! (default: first) any thread reaches `step`. Unset, a failpoint costs one relaxed load.
//!
//! The steps, in the order a thread meets them (SPEC §4 spawn, a turn, a tool, settlement,
//! finalization): `spawn.ledger`, `spawn.registered`, `spawn.transcript`, `turn.reserved`,
//! `turn.recorded`, `settle.cast`, `ledger.committed`, `tool.dispatch`, `tool.result`,
//! `finalize.closed`, `finalize.line`, `finalize.doc`, `finalize.row`. `ledger.committed` is
//! reached once a ledger batch is stored (committed, or written to the journal) and before any
//! of its callers is answered; `ledger.folded`, once a fold of the journal (a take-over, every
//! 256 records) is committed and before the journal is emptied — a tree rarely reaches it, so it
//! is not one of [`STEPS`]. Two steps fail instead of aborting: `transcript.append:<n>` makes
//! the n-th transcript append return an I/O error, and `ledger.journal:<n>` cuts the n-th
//! journal record halfway and fails it (the batch then commits instead).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Every step a failpoint may name.
pub const STEPS: &[&str] = &[
    "spawn.ledger",
    "spawn.registered",
    "spawn.transcript",
    "turn.reserved",
    "turn.recorded",
    "settle.cast",
    "ledger.committed",
    "tool.dispatch",
    "tool.result",
    "finalize.closed",
    "finalize.line",
    "finalize.signed",
    "finalize.doc",
    "finalize.row",
];

fn armed() -> Option<&'static (String, u64)> {
    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let v = std::env::var("WEFT_FAILPOINT").ok()?;
            let (step, n) = match v.split_once(':') {
                Some((s, n)) => (s.to_string(), n.parse().unwrap_or(1)),
                None => (v, 1),
            };
            Some((step, n))
        })
        .as_ref()
}

/// Whether the operation at `step` fails here — for steps where an armed failpoint makes the
/// operation fail with an I/O error instead of aborting (a full disk, a dying drive):
/// `transcript.append` (`WEFT_FAILPOINT` names `step` and this is its
/// `n`th hit): the caller returns an I/O error.
pub(crate) fn fails(step: &'static str) -> bool {
    static HITS: AtomicU64 = AtomicU64::new(0);
    let Some((armed, n)) = armed() else {
        return false;
    };
    armed == step && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *n
}

/// Aborts the process here if `WEFT_FAILPOINT` names `step` and this is its `n`th hit.
pub(crate) fn hit(step: &'static str) {
    static HITS: AtomicU64 = AtomicU64::new(0);
    let Some((armed, n)) = armed() else {
        return;
    };
    if armed == step && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *n {
        eprintln!("weft: failpoint {step}:{n} reached, aborting");
        std::process::abort();
    }
}
