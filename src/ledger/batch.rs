//! What the ledger actor's batch holds besides its rows: the undo of each decision, and what
//! was journaled since the last fold (see `commit.rs`).

use super::{Account, Reservation, ReservationId};
use crate::core::ids::ThreadId;
use std::collections::{HashMap, HashSet};

/// A decision of the current batch, with what undoes it if the batch is not stored.
pub(super) enum Undo {
    /// An account opened: close it and forget it.
    Open(ThreadId),
    /// A reservation granted: release it unspent.
    Reserve(ReservationId),
}

/// What was journaled since the last fold, as ledger.db still has to receive it: accounts to
/// write as they are now, final rows of closed accounts the book has dropped since, reservations
/// to add (those settled since cancel out), reservations to delete.
#[derive(Default)]
pub(crate) struct Unfolded {
    pub(super) dirty: HashSet<ThreadId>,
    pub(super) dropped: HashMap<ThreadId, Account>,
    pub(super) added: HashMap<ReservationId, Reservation>,
    pub(super) removed: Vec<(ThreadId, ReservationId)>,
}
