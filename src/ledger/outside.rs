//! The ledger's journals as seen from outside a runtime: which live runtimes hold records not
//! yet folded into ledger.db (`weft doctor` leaves their trees alone), and folding the dead
//! ones before ledger.db is read whole (`weft copy`).

/// The live runtimes (by owner) whose journals hold records not yet folded into ledger.db: for
/// the trees they hold, their books, not ledger.db, are the ledger. `alive` judges owners.
pub(crate) fn unfolded_owners(
    state: &std::path::Path,
    alive: &(dyn Fn(u32) -> bool + Send + Sync),
) -> std::collections::HashSet<u32> {
    let files = std::fs::read_dir(state.join("ledger.journal"));
    let files = files.into_iter().flatten().flatten();
    let unfolded = files.filter(|e| e.metadata().is_ok_and(|m| m.len() > 0));
    let owners = unfolded.filter_map(|e| e.file_name().to_str()?.split('-').next()?.parse().ok());
    owners.filter(|o| alive(*o)).collect()
}

/// Before ledger.db is read whole by something that is not a runtime (`weft copy`): what
/// runtimes that are gone journaled is folded into it. A live runtime's records not yet folded
/// are not (see [`unfolded_owners`]): its owner is returned instead.
pub(crate) fn fold_journals(
    state: &std::path::Path,
    alive: &(dyn Fn(u32) -> bool + Send + Sync),
) -> Result<Option<u32>, super::LedgerError> {
    let me = crate::core::owner::me();
    if let Some(live) = unfolded_owners(state, alive).into_iter().find(|o| *o != me) {
        return Ok(Some(live));
    }
    let mut db = super::db::open_db(None, &state.join("ledger.db"))?;
    super::journal::fold_dead_now(&mut db, &state.join("ledger.journal"), alive)?;
    Ok(None)
}
