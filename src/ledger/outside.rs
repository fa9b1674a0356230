//! The ledger's journals as seen from outside a runtime: which live runtimes hold records not
//! yet folded into ledger.db (`weft doctor` leaves their trees alone), and folding the dead
//! ones before ledger.db is read whole (`weft copy`).

use super::LedgerError;
use std::path::Path;

/// Judges whether a process (by pid) still runs.
type Alive<'a> = &'a (dyn Fn(u32) -> bool + Send + Sync);

/// The journals in `state` that hold records, with their owners and names (none when the
/// folder does not exist).
fn holding(state: &Path) -> std::io::Result<Vec<(u32, String)>> {
    let entries = match std::fs::read_dir(state.join("ledger.journal")) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e?;
        if e.metadata()?.len() == 0 {
            continue;
        }
        let name = e.file_name().to_string_lossy().to_string();
        let name = name.strip_suffix(".jsonl").unwrap_or(&name).to_string();
        if let Some(owner) = name.split('-').next().and_then(|o| o.parse().ok()) {
            out.push((owner, name));
        }
    }
    Ok(out)
}

/// Whether the journal `name` of `owner` belongs to a live runtime: one of this process that
/// keeps it, or another process that runs (judged by `alive`).
fn live(owner: u32, name: &str, alive: Alive<'_>) -> bool {
    match owner == crate::core::owner::me() {
        true => super::journal::is_kept(name),
        false => alive(owner),
    }
}

/// The live runtimes (by owner) whose journals hold records not yet folded into ledger.db: for
/// the trees they hold, their books, not ledger.db, are the ledger. An unreadable folder names
/// none.
pub(crate) fn unfolded_owners(state: &Path, alive: Alive<'_>) -> std::collections::HashSet<u32> {
    let files = holding(state).unwrap_or_default();
    let held = files.into_iter().filter(|(o, n)| live(*o, n, alive));
    held.map(|(o, _)| o).collect()
}

/// Before ledger.db is read whole by something that is not a runtime (`weft copy`): what
/// runtimes that are gone journaled is folded into it. A live runtime's records not yet folded
/// are not (see [`unfolded_owners`]): its owner is returned instead.
pub(crate) fn fold_journals(state: &Path, alive: Alive<'_>) -> Result<Option<u32>, LedgerError> {
    let dir = state.join("ledger.journal");
    let files = holding(state)
        .map_err(|e| LedgerError::Storage(format!("ledger journals {}: {e}", dir.display())))?;
    if let Some((owner, _)) = files.iter().find(|(o, n)| live(*o, n, alive)) {
        return Ok(Some(*owner));
    }
    let mut db = super::db::open_db(None, &state.join("ledger.db"))?;
    super::journal::fold_dead_now(&mut db, &dir, alive)?;
    Ok(None)
}
