//! Subtrees placed on another node (#26; see ARCHITECTURE.md, "Nodes"): the parent's node sets
//! the child's budget aside as a deferred child's (`Defer`) and marks the account placed
//! (`Place`); the node that runs the child takes the account over as the top of what it holds
//! (`AdoptPlaced`: that one account read from the ledger, never the tree above it), and its book
//! stops every chain there; at the child's end the parent's node settles what the subtree spent
//! (`SettlePlaced`: the account's final row, as its holder stored it) against the guarantee and
//! gives back the rest.

use super::actor::{LedgerMsg, LedgerState};
use super::{Account, Book, LedgerError};
use crate::core::ids::ThreadId;
use crate::core::money::Nanos;
use ractor::{ActorRef, RpcReplyPort};

impl LedgerState {
    /// Marks deferred account `id` placed (a fact of this batch).
    pub(super) fn place(
        &mut self,
        me: &ActorRef<LedgerMsg>,
        id: ThreadId,
        reply: RpcReplyPort<Result<(), LedgerError>>,
    ) {
        let Some(a) = self.book.accounts.get_mut(&id) else {
            let _ = reply.send(Err(LedgerError::Unknown(id)));
            return;
        };
        a.placed = true;
        self.touch(std::slice::from_ref(&id));
        self.hold(
            me,
            Box::new(move |e| drop(reply.send(e.map_or(Ok(()), Err)))),
        );
    }

    /// Takes placed account `id` over for this process, once; returns its cap.
    pub(super) fn adopt_placed(
        &mut self,
        me: &ActorRef<LedgerMsg>,
        id: ThreadId,
        reply: RpcReplyPort<Result<Nanos, LedgerError>>,
    ) {
        let taken = self.take_placed(&id);
        match taken {
            Ok(cap) => {
                self.touch(std::slice::from_ref(&id));
                self.hold(
                    me,
                    Box::new(move |e| drop(reply.send(e.map_or(Ok(cap), Err)))),
                );
            }
            Err(e) => drop(reply.send(Err(e))),
        }
    }

    fn take_placed(&mut self, id: &ThreadId) -> Result<Nanos, LedgerError> {
        // Always the stored row: a copy this book loaded at its start may be stale.
        self.fold()?;
        let stored =
            super::db::account(&self.db, id)?.ok_or_else(|| LedgerError::Unknown(id.clone()))?;
        // A taker that died before registering the child leaves the account to the next.
        if !stored.placed || (stored.owner != 0 && (self.alive)(stored.owner)) {
            return Err(LedgerError::Exists(id.clone()));
        }
        if stored.closed {
            return Err(LedgerError::Closed(id.clone()));
        }
        let mut a = stored;
        a.owner = crate::core::owner::me();
        let cap = a.max;
        self.book.accounts.insert(id.clone(), a);
        Ok(cap)
    }

    /// Settles placed account `id` from its final stored row (its holder closed it) and closes
    /// it here; returns the account.
    pub(super) fn settle_placed(
        &mut self,
        me: &ActorRef<LedgerMsg>,
        id: ThreadId,
        reply: RpcReplyPort<Result<Account, LedgerError>>,
    ) {
        let settled = self
            .fold()
            .and_then(|()| super::db::account(&self.db, &id))
            .and_then(|row| {
                let row = row.ok_or_else(|| LedgerError::Unknown(id.clone()))?;
                if row.closed && self.book.get(&id).is_none() {
                    // Owner 0: settled already on the parent's side, and dropped since.
                    if row.owner == 0 {
                        return Ok(row);
                    }
                    // Closed by its holder, never settled: its parent's tree was adopted here
                    // (which reads open accounts only). Settled from the guarantee it was.
                    self.guarantee_again(&row)?;
                }
                match (row.closed, row.owner) {
                    (true, _) => self.book.settle_placed(&id, row.spent, row.own_spent),
                    // Never taken by a node (withdrawn, or its start failed): all of it comes back.
                    (false, 0) => self.book.settle_placed(&id, Nanos::ZERO, Nanos::ZERO),
                    // Its holder still spends from the guarantee until it closes the account.
                    (false, _) => Err(LedgerError::Exists(id.clone())),
                }
            });
        match settled {
            Ok(a) => {
                let ids = self.book.chain(&id).unwrap_or_default();
                self.touch(&ids);
                self.prune(&id);
                self.hold(
                    me,
                    Box::new(move |e| drop(reply.send(e.map_or(Ok(a), Err)))),
                );
            }
            Err(e) => drop(reply.send(Err(e))),
        }
    }
}

impl LedgerState {
    /// Puts placed account `row` (closed by the node that ran it) back in this book as its
    /// parent's node sees it — a guarantee of its whole cap, nothing settled — under its parent's
    /// chain, which must be this process's tree.
    fn guarantee_again(&mut self, row: &Account) -> Result<(), LedgerError> {
        let parent = row
            .parent
            .clone()
            .ok_or_else(|| LedgerError::Unknown(row.id.clone()))?;
        super::db::load_chain(&self.db, &mut self.book, &parent)?;
        let top = self.book.chain(&parent)?.last().cloned();
        let holder = top.as_ref().and_then(|t| self.book.get(t)).map(|t| t.owner);
        if holder != Some(crate::core::owner::me()) {
            return Err(LedgerError::Busy {
                root: top.unwrap_or(parent),
                pid: holder.unwrap_or(0),
            });
        }
        let mut view = row.clone();
        super::db::parent_view(&mut view);
        self.book.accounts.insert(view.id.clone(), view);
        *self.book.children.entry(parent).or_default() += 1;
        Ok(())
    }

    /// Open placed accounts of this book (children of its trees running elsewhere, or queued),
    /// each with its parent.
    pub(super) fn open_placed(&self) -> Vec<(ThreadId, ThreadId)> {
        let placed = self.book.accounts().filter(|a| a.placed && !a.closed);
        placed
            .filter_map(|a| Some((a.id.clone(), a.parent.clone()?)))
            .collect()
    }
}

impl Book {
    /// The end of a subtree placed on another node (its account `id`, set aside here by
    /// [`Book::defer`]): what it spent there (`spent`, `own` its thread's own) is settled here
    /// as one reservation covered by its guarantee, and the rest of the guarantee goes back up
    /// the chain as the account closes. Its spend never exceeds the guarantee (its holder's book
    /// capped it there); anything beyond is charged all the same, never dropped.
    pub fn settle_placed(
        &mut self,
        id: &ThreadId,
        spent: Nanos,
        own: Nanos,
    ) -> Result<Account, LedgerError> {
        let a = self
            .accounts
            .get(id)
            .ok_or_else(|| LedgerError::Unknown(id.clone()))?;
        if a.closed {
            return Ok(a.clone());
        }
        let r = self.hold_amount(id, spent)?;
        self.settle(r, spent);
        self.acct_mut(id).own_spent = own;
        self.close(id)
    }

    /// Whether `id` is a placed subtree's top that this process holds.
    pub(super) fn held_placed(&self, id: &ThreadId) -> bool {
        self.accounts
            .get(id)
            .is_some_and(|a| a.placed && a.owner == crate::core::owner::me())
    }

    /// Whether this book also holds the parent of `id` (a placed subtree's top, taken over by
    /// the node that holds its parent's tree: after one of the two nodes died and the other
    /// adopted its threads).
    pub(super) fn parent_held(&self, id: &ThreadId) -> bool {
        let me = crate::core::owner::me();
        let parent = self.accounts.get(id).and_then(|a| a.parent.as_ref());
        // The top of the parent's chain is this process's (copies read of a tree another
        // process holds are not: their rows are that process's to write).
        let top = parent
            .and_then(|p| self.chain(p).ok())
            .and_then(|c| c.last().cloned());
        top.and_then(|t| self.accounts.get(&t))
            .is_some_and(|t| t.owner == me)
    }

    /// Closes placed top `id` whose parent this book holds too: the subtree's holder closes it
    /// and the parent's node settles it, both here — what the subtree spent is settled against
    /// its guarantee up the parent's chain ([`Book::settle_placed`]), the rest given back.
    pub(super) fn close_merged(&mut self, id: &ThreadId) -> Result<Account, LedgerError> {
        let a = self.acct_mut(id);
        let (spent, own) = (a.spent, a.own_spent);
        // The parent's view of the account: a guarantee nothing was settled against yet.
        a.owner = 0;
        a.spent = Nanos::ZERO;
        a.own_spent = Nanos::ZERO;
        a.inflight = Nanos::ZERO;
        self.settle_placed(id, spent, own)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Book;
    use crate::core::ids::ThreadId;
    use crate::core::money::Nanos;

    fn id(s: &str) -> ThreadId {
        ThreadId::parse(s).unwrap()
    }

    /// The parent's book: a placed child's guarantee is held up the chain while it runs
    /// elsewhere; its end settles what it spent there and gives the rest back, to the nano.
    #[test]
    fn a_placed_subtree_settles_its_spend_and_gives_the_rest_back() {
        let mut b = Book::default();
        b.open(&id("root"), None, Nanos(1000), Nanos::ZERO, Nanos::ZERO)
            .unwrap();
        b.open(
            &id("mid"),
            Some(&id("root")),
            Nanos(800),
            Nanos::ZERO,
            Nanos::ZERO,
        )
        .unwrap();
        let set = b
            .defer(&id("kid"), &id("mid"), Nanos(300), false, Nanos(1))
            .unwrap();
        assert_eq!(set, Nanos(300));
        assert_eq!(b.get(&id("mid")).unwrap().guaranteed, Nanos(300));
        assert_eq!(b.get(&id("root")).unwrap().inflight, Nanos(300));
        let a = b.settle_placed(&id("kid"), Nanos(120), Nanos(70)).unwrap();
        assert!(a.closed);
        assert_eq!((a.spent, a.own_spent), (Nanos(120), Nanos(70)));
        for up in ["mid", "root"] {
            let u = b.get(&id(up)).unwrap();
            assert_eq!(
                (u.spent, u.inflight, u.guaranteed),
                (Nanos(120), Nanos::ZERO, Nanos::ZERO),
                "{up}"
            );
        }
        // Settled once: a second report changes nothing.
        b.settle_placed(&id("kid"), Nanos(120), Nanos(70)).unwrap();
        assert_eq!(b.get(&id("root")).unwrap().spent, Nanos(120));
    }

    /// One book both: the parent's node adopted the placed child's subtree after the child's
    /// node died. The subtree's spend, settled at the top it holds, reaches the parent's chain
    /// when the top closes, and the rest of the guarantee comes back — the same totals as
    /// when the two books are apart.
    #[test]
    fn a_placed_subtree_adopted_by_its_parents_node_settles_once_up_the_chain() {
        let mut b = Book::default();
        b.open(&id("root"), None, Nanos(1000), Nanos::ZERO, Nanos::ZERO)
            .unwrap();
        b.defer(&id("kid"), &id("root"), Nanos(300), false, Nanos(1))
            .unwrap();
        // Taken over here as a top (what the dead node's book held: a call in flight).
        let kid = b.accounts.get_mut(&id("kid")).unwrap();
        kid.placed = true;
        kid.owner = crate::core::owner::me();
        assert_eq!(b.chain(&id("kid")).unwrap(), vec![id("kid")]);
        let price = crate::core::money::Price {
            input: 1_000_000,
            output: 1_000_000,
            cache_read: 0,
            cache_write: 0,
        };
        let g = b.reserve(&id("kid"), &price, 50, 100, 16).unwrap();
        assert!(b.settle(g.reservation, Nanos(140)));
        let closed = b.close(&id("kid")).unwrap();
        assert!(closed.closed);
        assert_eq!(closed.spent, Nanos(140));
        let root = b.get(&id("root")).unwrap();
        assert_eq!(
            (root.spent, root.inflight, root.guaranteed),
            (Nanos(140), Nanos::ZERO, Nanos::ZERO)
        );
        // The parent's node's own settling of it, later, changes nothing.
        b.settle_placed(&id("kid"), Nanos(140), Nanos(140)).unwrap();
        assert_eq!(b.get(&id("root")).unwrap().spent, Nanos(140));
    }

    /// Nothing is set aside for later inside a subtree placed here: it would outlive the
    /// guarantee its parent's node settles at its end.
    #[test]
    fn nothing_is_deferred_inside_a_placed_subtree_held_here() {
        let mut b = Book::default();
        b.open(&id("root"), None, Nanos(1000), Nanos::ZERO, Nanos::ZERO)
            .unwrap();
        b.defer(&id("kid"), &id("root"), Nanos(300), true, Nanos(1))
            .unwrap();
        let kid = b.accounts.get_mut(&id("kid")).unwrap();
        kid.placed = true;
        kid.owner = crate::core::owner::me();
        let refused = b.defer(&id("later"), &id("kid"), Nanos(100), true, Nanos(1));
        assert!(
            matches!(refused, Err(super::super::LedgerError::Placed(ref t)) if *t == id("kid")),
            "{refused:?}"
        );
    }

    /// The holder's book: a placed account it took over is the top of every chain below it.
    #[test]
    fn a_held_placed_account_is_the_top_of_its_chains() {
        let mut b = Book::default();
        b.open(
            &id("kid"),
            Some(&id("elsewhere")),
            Nanos(300),
            Nanos::ZERO,
            Nanos::ZERO,
        )
        .unwrap_err();
        let mut kid = super::super::Account {
            id: id("kid"),
            parent: Some(id("elsewhere")),
            max: Nanos(300),
            spent: Nanos::ZERO,
            own_spent: Nanos::ZERO,
            inflight: Nanos::ZERO,
            guaranteed: Nanos::ZERO,
            pool_left: Nanos(300),
            closed: false,
            owner: crate::core::owner::me(),
            placed: true,
        };
        b.accounts.insert(id("kid"), kid.clone());
        b.open(
            &id("leaf"),
            Some(&id("kid")),
            Nanos(500),
            Nanos::ZERO,
            Nanos::ZERO,
        )
        .unwrap();
        assert_eq!(b.chain(&id("leaf")).unwrap(), vec![id("leaf"), id("kid")]);
        let price = crate::core::money::Price {
            input: 1_000_000,
            output: 1_000_000,
            cache_read: 0,
            cache_write: 0,
        };
        let g = b.reserve(&id("leaf"), &price, 100, 1000, 16).unwrap();
        assert_eq!(
            g.max_output_tokens, 200,
            "capped by the guarantee the kid holds"
        );
        assert!(b.settle(g.reservation, Nanos(250)));
        let closed = b.close(&id("kid")).unwrap();
        assert_eq!(closed.spent, Nanos(250));
        // Held by another process: not a top here.
        kid.owner = 0;
        b.accounts.insert(id("kid"), kid);
        assert!(
            b.chain(&id("kid")).is_err(),
            "its parent is not in this book"
        );
    }
}
