//! The ledger's journals as seen from outside a runtime: which live runtimes hold records not
//! yet folded into ledger.db (`weft doctor` leaves their trees alone), and folding the dead
//! ones before ledger.db is read whole (`weft copy`).

use super::names::{is_dead, listed};
use super::LedgerError;
use std::path::Path;

/// Judges whether a process (by pid) still runs.
type Alive<'a> = &'a (dyn Fn(u32) -> bool + Send + Sync);

/// The owners of the live journals in `state` that hold records.
fn live_holding(state: &Path, alive: Alive<'_>) -> std::io::Result<Vec<u32>> {
    let mut out = Vec::new();
    for (path, name, owner) in listed(&state.join("ledger.journal"))? {
        let holds = std::fs::metadata(&path).is_ok_and(|m| m.len() > 0);
        if holds && !is_dead(owner, &name, alive) {
            out.push(owner);
        }
    }
    Ok(out)
}

/// The live runtimes (by owner) whose journals hold records not yet folded into ledger.db: for
/// the trees they hold, their books, not ledger.db, are the ledger. An unreadable folder names
/// none.
pub(crate) fn unfolded_owners(state: &Path, alive: Alive<'_>) -> std::collections::HashSet<u32> {
    live_holding(state, alive)
        .unwrap_or_default()
        .into_iter()
        .collect()
}

/// Before ledger.db is read whole by something that is not a runtime (`weft copy`): what
/// runtimes that are gone journaled is folded into it. A live runtime's records not yet folded
/// are not (see [`unfolded_owners`]): its owner is returned instead.
pub(crate) fn fold_journals(state: &Path, alive: Alive<'_>) -> Result<Option<u32>, LedgerError> {
    let dir = state.join("ledger.journal");
    let live = live_holding(state, alive)
        .map_err(|e| LedgerError::Storage(format!("ledger journals {}: {e}", dir.display())))?;
    if let Some(owner) = live.first() {
        return Ok(Some(*owner));
    }
    let mut db = super::db::open_db(None, &state.join("ledger.db"))?;
    super::journal::fold_dead_now(&mut db, &dir, alive)?;
    Ok(None)
}
