//! How the ledger actor stores a batch before it answers it: committed to ledger.db, or — a
//! batch of only reservations, settlements and the opens and closes of accounts below a tree's
//! top, on SQLite — written to the runtime's journal (`journal.rs`). A commit also folds in everything journaled since the last fold, so
//! ledger.db never holds an account row older than a journaled one it depends on.

use super::actor::{LedgerMsg, LedgerState};
use super::batch::{Undo, Unfolded};
use super::db::{drop_reservations, put_accounts, put_reservations, st};
use super::{Account, LedgerError};
use crate::core::money::Nanos;
use crate::sql::Lock;
use ractor::ActorRef;

/// How long after a failed commit the pending changes are tried again.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl LedgerState {
    /// Stores the batch (the `Flush` marker), then releases its replies.
    pub(super) fn flush(&mut self, me: Option<&ActorRef<LedgerMsg>>) {
        if self.held.is_empty() && !self.pending() {
            // A marker left behind by a fold that stored its batch: nothing to store.
            return;
        }
        let mut journaled = self.journalable();
        let res = match journaled {
            true => self.journal_batch().or_else(|e| {
                // The journal is a shortcut: ledger.db can store the batch as well.
                tracing::warn!("{e}; this batch commits to ledger.db instead");
                journaled = false;
                self.persist()
            }),
            false => self.persist(),
        };
        if res.is_ok() {
            // Stored, nothing answered yet (and a fold's journal not yet emptied).
            crate::core::failpoint::hit("ledger.committed");
        }
        self.stored(me, &res, journaled);
        self.held.release(&res);
        if journaled && res.is_ok() && self.journal.as_ref().is_some_and(|j| j.due()) {
            if let Err(e) = self.fold() {
                tracing::warn!("ledger: folding the journal failed ({e}); it stays in the journal and is folded at the next commit");
                if let Some(j) = &mut self.journal {
                    j.put_off();
                }
            }
        }
    }

    /// Commits the batch with everything journaled since the last fold, when anything is
    /// pending or was journaled: before ledger.db is read for a decision (its rows must be this
    /// book's, a batch whose `Flush` is still queued included), and every so many records
    /// (`journal.rs`).
    pub(super) fn fold(&mut self) -> Result<(), LedgerError> {
        let journaled = self.journal.as_ref().is_some_and(|j| j.unfolded() > 0);
        if !journaled && !self.pending() {
            return Ok(());
        }
        let res = self.persist();
        if res.is_ok() {
            crate::core::failpoint::hit("ledger.folded");
        }
        self.stored(None, &res, false);
        self.held.release(&res);
        res
    }

    /// At a stop: everything stored, the journal removed.
    pub(super) fn stop(&mut self) {
        if !self.held.is_empty() || self.pending() {
            self.must_commit = true;
            self.flush(None);
        } else if let Err(e) = self.fold() {
            tracing::error!("ledger: the journal was not folded at the stop ({e}); the next runtime to open the ledger folds it");
        }
        if let Some(j) = &mut self.journal {
            j.remove(&self.db);
        }
    }

    /// Whether the batch may be journaled: nothing in it must commit (see
    /// [`LedgerState::hold`]) and it finishes no tree, on a journal that takes records. A tree
    /// is finished when the book drops its top (the last account of it closed): other
    /// processes read that in ledger.db (a finished tree is free to take), so it commits.
    fn journalable(&self) -> bool {
        let finishes = self.dropped.iter().any(Account::is_top);
        !self.must_commit && !finishes && self.journal.as_ref().is_some_and(|j| j.usable())
    }

    /// Writes the batch to the journal: the rows it leaves.
    fn journal_batch(&mut self) -> Result<(), LedgerError> {
        let Some(journal) = self.journal.as_mut() else {
            return Err(LedgerError::Storage("no ledger journal".into()));
        };
        let rows: Vec<&Account> = self
            .dirty
            .iter()
            .filter_map(|id| self.book.get(id))
            .chain(&self.dropped)
            .collect();
        journal.append(rows, self.added.iter().collect(), &self.removed)
    }

    /// Persists the batch and everything journaled since the last fold in one transaction
    /// holding the ledger's write lock.
    fn persist(&mut self) -> Result<(), LedgerError> {
        // A call's cost is in its transcript before its settlement is stored: when the batch
        // settles or releases a reservation, the thread records this process queued for a
        // database server are committed first (files need nothing).
        if let (false, Some(url)) = (self.removed.is_empty(), self.db.url()) {
            crate::record::behind::barrier(url);
        }
        self.db.begin_write(Lock::Ledger).map_err(st)?;
        let written = self.write_batch();
        match written {
            Ok(()) => self.db.commit().map_err(st),
            Err(e) => {
                self.db.rollback();
                Err(e)
            }
        }
    }

    /// The statements of the batch and of what is unfolded, inside the transaction
    /// [`Self::persist`] opened.
    fn write_batch(&self) -> Result<(), LedgerError> {
        let u = &self.unfolded;
        let ids = self
            .dirty
            .iter()
            .chain(u.dirty.iter().filter(|id| !self.dirty.contains(*id)));
        // Journaled final rows first: an account the book holds again is newer in the book.
        let rows = u.dropped.values();
        let rows = rows.chain(ids.filter_map(|id| self.book.get(id)).chain(&self.dropped));
        put_accounts(&self.db, &rows.collect::<Vec<_>>())?;
        put_reservations(
            &self.db,
            &u.added.values().chain(&self.added).collect::<Vec<_>>(),
        )?;
        drop_reservations(
            &self.db,
            u.removed
                .iter()
                .chain(&self.removed)
                .map(|(t, id)| (t, *id)),
        )?;
        match &self.journal {
            Some(j) => j.mark(&self.db),
            None => Ok(()),
        }
    }

    /// After the batch was stored (`journaled` or committed) or not.
    fn stored(
        &mut self,
        me: Option<&ActorRef<LedgerMsg>>,
        res: &Result<(), LedgerError>,
        journaled: bool,
    ) {
        match res {
            Ok(()) if journaled => self.absorb(),
            Ok(()) => {
                // Trees this batch finished are released once stored (never journaled).
                for top in self.dropped.iter().filter(|a| a.is_top()) {
                    self.seat.release(&top.id);
                }
                self.unfolded = Unfolded::default();
                if let Some(j) = &mut self.journal {
                    j.folded();
                }
                self.must_commit = false;
                self.dirty.clear();
                self.added.clear();
                self.removed.clear();
                self.dropped.clear();
                self.undo.clear();
            }
            Err(e) => {
                tracing::error!(
                    "ledger commit failed: {e}; {} decision(s) undone and refused, settlements and closes kept and retried",
                    self.undo.len()
                );
                self.undo_decisions();
                if let (Some(me), true) = (me, self.pending()) {
                    me.send_after(RETRY_AFTER, || LedgerMsg::Flush);
                }
            }
        }
    }

    /// A journaled batch joins what is unfolded; the next batch starts empty.
    fn absorb(&mut self) {
        let u = &mut self.unfolded;
        for id in &self.dirty {
            u.dropped.remove(id);
        }
        u.dirty.extend(self.dirty.drain());
        for a in self.dropped.drain(..) {
            // Held again meanwhile (reopened): the book's row is the newer.
            if self.book.get(&a.id).is_none() {
                u.dirty.remove(&a.id);
                u.dropped.insert(a.id.clone(), a);
            }
        }
        for r in self.added.drain(..) {
            u.added.insert(r.id, r);
        }
        for (t, id) in self.removed.drain(..) {
            if u.added.remove(&id).is_none() {
                u.removed.push((t, id));
            }
        }
        self.undo.clear();
    }

    /// Undoes the decisions of a batch that was not stored, by their exact inverses.
    fn undo_decisions(&mut self) {
        for undo in std::mem::take(&mut self.undo) {
            match undo {
                Undo::Reserve(r) => {
                    if let Some(chain) = self.book.reservations.get(&r).map(|x| x.chain.clone()) {
                        self.book.settle(r, Nanos::ZERO);
                        self.touch(&chain);
                    }
                    self.added.retain(|x| x.id != r);
                }
                Undo::Open(id) => {
                    let chain = self.book.chain(&id).unwrap_or_default();
                    let _ = self.book.close(&id);
                    // A tree whose first account was never stored is nobody's.
                    if chain.len() == 1 {
                        self.seat.release(&id);
                    }
                    // Empty when the account was already closed and dropped in this batch.
                    if let Some(up) = chain.get(1..) {
                        self.touch(up);
                    }
                    self.dirty.remove(&id);
                    self.prune(&id);
                    // Never stored, so nothing to store: ledger.db keeps no trace of it.
                    self.dropped.retain(|a| a.id != id);
                }
            }
        }
    }
}
