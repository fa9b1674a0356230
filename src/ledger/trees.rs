//! One process at a time holds a tree's accounts. Each process keeps its own [`Book`] in memory
//! and writes it to the shared ledger.db, so two processes working on one tree's accounts at
//! once would each check the cap against their own copy (two resumes in two processes spent 1.8×
//! a root's cap). The holder is the `owner` of the tree's top account in ledger.db: a process
//! takes a tree over — to adopt a deferred child another process set aside, or to reopen a
//! finished chain for a continuation — in one IMMEDIATE transaction, and only when the holder is
//! itself, no one, a process that is gone (its owner lock is free) or one whose accounts of the
//! tree are all closed (a finished tree, as `weft serve` keeps it); it then reads the tree's
//! accounts afresh from ledger.db, dropping any copy its book loaded earlier. While the holder
//! lives, the others are refused with [`LedgerError::Busy`], naming it.
//!
//! Runtimes of one process share its pid, so the process also keeps which of its runtimes holds
//! each tree ([`Holders`]): a tree another live runtime of this process holds open is refused
//! as another process's is, and one that changes runtimes is read afresh like one that changes
//! processes (a second runtime's book otherwise spent from its own stale copy).

use super::actor::{LedgerMsg, LedgerState};
use super::db::st;
use super::holders::Seat;
use super::{Book, LedgerError};
use crate::core::ids::ThreadId;
use crate::core::money::Nanos;
use crate::sql::{params, Db, Lock};
use ractor::{ActorRef, RpcReplyPort};

impl LedgerState {
    /// A deferred child's thread takes over its account (its tree taken over first), loaded
    /// from ledger.db if this book does not hold it.
    pub(super) fn adopt(
        &mut self,
        me: &ActorRef<LedgerMsg>,
        id: ThreadId,
        parent: ThreadId,
        reply: RpcReplyPort<Result<Nanos, LedgerError>>,
    ) {
        let loaded = self.take_tree(&id).and_then(|()| match self.book.get(&id) {
            Some(_) => Ok(()),
            None => super::db::load_chain(&self.db, &mut self.book, &id),
        });
        let cap = loaded.and_then(|()| self.book.adopt(&id, &parent));
        let cap = match cap {
            Ok(c) => c,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        self.touch(std::slice::from_ref(&id));
        self.hold(
            me,
            Box::new(move |e| {
                let _ = reply.send(e.map_or(Ok(cap), Err));
            }),
        );
    }

    /// Opens `id`'s closed account and its closed ancestors again (its tree taken over first),
    /// from their ledger rows unless the book holds them. The tree is taken and `id`'s account
    /// marked open in the ledger in one transaction: from then on another process sees the
    /// tree open and held (it would otherwise see a finished tree, free to take, until this
    /// book's next commit — two resumes racing each took the tree and spent 1.8× its cap).
    pub(super) fn reopen(&mut self, id: ThreadId) -> Result<(), LedgerError> {
        self.take_tree_opening(&id, Some(&id))?;
        if self.book.get(&id).is_some() {
            // Held closed (work it caused is still open below it): open again all the same.
            self.book.reopen_held(&id);
            return Ok(());
        }
        let chain = super::db::closed_chain(&self.db, &id)?;
        if chain.is_empty() {
            return Err(LedgerError::Unknown(id));
        }
        self.book.reopen(chain);
        Ok(())
    }

    /// Takes over the tree of `id`, whose holder is gone (a dead thread being adopted): when
    /// the tree changes hands, this book's copies of it are dropped and its open accounts and
    /// reservations read afresh from the ledger, so the adopter settles what the dead holder
    /// left in flight.
    pub(super) fn take_over(&mut self, id: &ThreadId) -> Result<(), LedgerError> {
        self.fold()?;
        let whom = whom(&self.alive, self.journal.as_ref(), &self.seat);
        let Some((top, changed)) = take(&mut self.db, id, &whom, None)? else {
            return Ok(());
        };
        // Also when an earlier take-over committed but its read failed: the book lacks the tree.
        if changed || self.book.get(&top).is_none() {
            self.book.forget_tree(&top);
            super::db::load_open(&self.db, &mut self.book, Some(&top))?;
        }
        Ok(())
    }

    /// Makes this process the holder of `id`'s tree (see the module's doc); refused while
    /// another live process holds it. Nothing to do for an account the ledger has never seen.
    fn take_tree(&mut self, id: &ThreadId) -> Result<(), LedgerError> {
        self.take_tree_opening(id, None)
    }

    /// [`Self::take_tree`], marking `open`'s account open in the same transaction.
    fn take_tree_opening(
        &mut self,
        id: &ThreadId,
        open: Option<&ThreadId>,
    ) -> Result<(), LedgerError> {
        self.fold()?;
        let whom = whom(&self.alive, self.journal.as_ref(), &self.seat);
        if let Some((top, true)) = take(&mut self.db, id, &whom, open)? {
            self.book.forget_tree(&top);
        }
        Ok(())
    }
}

/// The top of `id`'s account chain in the ledger (its tree's first account, or the placed account
/// its chain stops at: a subtree another node holds).
fn top_of(db: &Db, id: &ThreadId) -> Result<Option<ThreadId>, LedgerError> {
    let top = db
        .row(
            "WITH RECURSIVE up(id, parent, placed, n) AS (
               SELECT id, parent, placed, 0 FROM accounts WHERE id=?1
               UNION ALL SELECT a.id, a.parent, a.placed, u.n + 1 FROM accounts a JOIN up u ON a.id=u.parent
               WHERE u.n < 10000 AND u.placed = 0)
             SELECT id FROM up ORDER BY n DESC LIMIT 1",
            params![id.as_str()],
        )
        .map_err(st)?;
    Ok(top
        .and_then(|r| r.text(0).ok())
        .and_then(|t| ThreadId::parse(&t).ok()))
}

/// Who takes a tree: this process and runtime, who is alive, and where the journals are.
struct Whom<'a> {
    me: u32,
    seat: &'a Seat,
    alive: &'a (dyn Fn(u32) -> bool + Send + Sync),
    journals: Option<&'a std::path::Path>,
}

/// The runtime in `seat` as a taker, judging with `alive`, folding the journals beside
/// `journal`'s.
fn whom<'a>(
    alive: &'a super::Alive,
    journal: Option<&'a super::journal::Journal>,
    seat: &'a Seat,
) -> Whom<'a> {
    Whom {
        me: crate::core::owner::me(),
        seat,
        alive: &**alive,
        journals: journal.map(|j| j.dir()),
    }
}

/// Sets `me` as the holder of `id`'s tree unless a live other process holds it (and marks
/// `open`'s account open, when given): the tree's top, and whether the tree changed hands (this
/// book's copies of it are stale); None for an account the ledger has never seen. Under the
/// ledger's write lock, so two processes taking one tree at once take turns. What runtimes that
/// are gone journaled is folded into ledger.db first, in the same transaction, before the tree
/// is looked up: a dead holder's children and last reservations are read with its tree.
fn take(
    db: &mut Db,
    id: &ThreadId,
    whom: &Whom<'_>,
    open: Option<&ThreadId>,
) -> Result<Option<(ThreadId, bool)>, LedgerError> {
    db.begin_write(Lock::Ledger).map_err(st)?;
    let folded = match whom.journals {
        Some(dir) => super::journal::fold_dead(db, dir, whom.alive),
        None => Ok(Vec::new()),
    };
    let folded = match folded {
        Ok(f) => f,
        Err(e) => {
            db.rollback();
            return Err(e);
        }
    };
    // Looked up after the fold: a dead runtime's child may be in its journal only.
    let decided = top_of(db, id).and_then(|top| match top {
        Some(top) => decide(db, &top, whom, open).map(|changed| Some((top, changed))),
        None => Ok(None),
    });
    let keep = match &decided {
        Ok(Some((_, changed))) => *changed || open.is_some() || !folded.is_empty(),
        Ok(None) | Err(LedgerError::Busy { .. }) => !folded.is_empty(),
        Err(_) => false,
    };
    if keep {
        if let Err(e) = db.commit() {
            if let Ok(Some((top, _))) = &decided {
                whom.seat.release(top);
            }
            return Err(st(e));
        }
        super::journal::remove_folded(folded);
    } else {
        db.rollback();
    }
    decided
}

/// Inside [`take`]'s transaction: `me` becomes the holder of tree `top` unless a live other
/// process, or another live runtime of this one, holds it open; true when the tree changed
/// hands (this book's copies of it are stale).
fn decide(
    db: &Db,
    top: &ThreadId,
    whom: &Whom<'_>,
    open: Option<&ThreadId>,
) -> Result<bool, LedgerError> {
    let (me, alive) = (whom.me, whom.alive);
    let owner = db
        .row(
            "SELECT owner FROM accounts WHERE id=?1",
            params![top.as_str()],
        )
        .map_err(st)?
        .ok_or_else(|| LedgerError::Unknown(top.clone()))?
        .int(0)
        .map_err(st)?;
    let owner = u32::try_from(owner).unwrap_or(0);
    let busy = || LedgerError::Busy {
        root: top.clone(),
        pid: owner,
    };
    if owner != me && owner != 0 && alive(owner) && tree_open(db, top)? {
        return Err(busy());
    }
    // Another runtime of this process may hold it: checked and taken under one lock.
    let Some(mine) = whom.seat.claim(top, || tree_open(db, top))? else {
        return Err(busy());
    };
    if owner != me {
        db.execute(
            "UPDATE accounts SET owner=?1 WHERE id=?2",
            params![me, top.as_str()],
        )
        .map_err(st)?;
    }
    if let Some(open) = open {
        db.execute(
            "UPDATE accounts SET closed=0 WHERE id=?1",
            params![open.as_str()],
        )
        .map_err(st)?;
    }
    // Held by another runtime of this process before: this book's copy is as stale.
    Ok(owner != me || !mine)
}

/// Whether an account of tree `top` is still open in the ledger (a finished tree, every account
/// closed and stored, is held by no one, whoever last held it). A scan per tree level (no index
/// on `parent`: every settlement rewrites account rows, and this runs only when a tree changes
/// hands).
fn tree_open(db: &Db, top: &ThreadId) -> Result<bool, LedgerError> {
    db.row(
        &format!(
            "WITH RECURSIVE down(id, n) AS (
           SELECT {}, 0
           UNION SELECT a.id, d.n + 1 FROM accounts a JOIN down d ON a.parent=d.id
           WHERE d.n < 10000)
         SELECT EXISTS(SELECT 1 FROM accounts WHERE closed=0 AND id IN (SELECT id FROM down))",
            db.text_param(1)
        ),
        params![top.as_str()],
    )
    .map_err(st)?
    .map_or(Ok(false), |r| r.flag(0))
    .map_err(st)
}

impl Book {
    /// Drops every account of tree `top` (and their reservations) from the book: copies read
    /// before another process last held the tree. The tree is what `db::load_open` reads
    /// again: `top` and the accounts below it, down to and with its placed accounts — except a
    /// placed account this process holds as a top of its own, which is live here.
    pub(super) fn forget_tree(&mut self, top: &ThreadId) {
        let gone: Vec<ThreadId> = self
            .accounts
            .keys()
            .filter(|id| self.in_tree(id, top))
            .cloned()
            .collect();
        for id in &gone {
            let parent = self.accounts.remove(id).and_then(|a| a.parent);
            if let Some(p) = parent.filter(|p| !gone.contains(p)) {
                if let Some(n) = self.children.get_mut(&p) {
                    *n = n.saturating_sub(1);
                }
            }
            self.children.remove(id);
            self.reopened.remove(id);
            for r in self.by_thread.remove(id).unwrap_or_default() {
                self.reservations.remove(&r);
            }
        }
    }

    /// Whether account `id` is of tree `top` (see [`Book::forget_tree`]).
    fn in_tree(&self, id: &ThreadId, top: &ThreadId) -> bool {
        let me = crate::core::owner::me();
        let mut cur = id;
        for step in 0..10_000 {
            if cur == top {
                return true;
            }
            let Some(a) = self.accounts.get(cur) else {
                return false;
            };
            // Below a placed account (its holder's), or a placed top held here.
            if a.placed && (step > 0 || a.owner == me) {
                return false;
            }
            match &a.parent {
                Some(p) => cur = p,
                None => return false,
            }
        }
        false
    }
}
