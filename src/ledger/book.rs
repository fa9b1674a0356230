//! [`Book`]: the pure bookkeeping of every account and reservation. No I/O, no actors:
//! property-tested on its own.

use super::{Account, Grant, LedgerError, Reservation, ReservationId};
use crate::core::ids::ThreadId;
use crate::core::money::{Nanos, Price};
use std::collections::HashMap;

/// The in-memory ledger.
#[derive(Debug, Default)]
pub struct Book {
    pub(super) accounts: HashMap<ThreadId, Account>,
    pub(super) reservations: HashMap<ReservationId, Reservation>,
    /// Open reservation ids by reserving thread (so closing is not a scan of every reservation).
    pub(super) by_thread: HashMap<ThreadId, Vec<ReservationId>>,
    /// How many accounts in the book name each account as their parent (see [`Book::prune`]).
    pub(super) children: HashMap<ThreadId, u32>,
    /// Closed accounts opened again for a continuation below them (see [`Book::reopen`]).
    pub(super) reopened: std::collections::HashSet<ThreadId>,
    /// The last reservation id handed out.
    pub(super) next_id: u64,
}

impl Book {
    /// The account, if present.
    pub fn get(&self, id: &ThreadId) -> Option<&Account> {
        self.accounts.get(id)
    }

    /// Every account.
    pub fn accounts(&self) -> impl Iterator<Item = &Account> {
        self.accounts.values()
    }

    /// Open reservation ids of one thread's own calls.
    pub fn open_of(&self, id: &ThreadId) -> Vec<ReservationId> {
        self.by_thread.get(id).cloned().unwrap_or_default()
    }

    /// Open reservations.
    pub fn open_reservations(&self) -> usize {
        self.reservations.len()
    }

    /// The ids from `id` up to its root.
    pub fn chain(&self, id: &ThreadId) -> Result<Vec<ThreadId>, LedgerError> {
        let mut out = vec![id.clone()];
        let mut cur = self
            .accounts
            .get(id)
            .ok_or_else(|| LedgerError::Unknown(id.clone()))?;
        let me = crate::core::owner::me();
        while let Some(p) = cur
            .parent
            .as_ref()
            .filter(|_| !(cur.placed && cur.owner == me))
        {
            if out.len() > 10_000 || out.contains(p) {
                break;
            }
            out.push(p.clone());
            cur = self
                .accounts
                .get(p)
                .ok_or_else(|| LedgerError::Unknown(p.clone()))?;
        }
        Ok(out)
    }

    fn acct(&self, id: &ThreadId) -> &Account {
        // Chains are built from present accounts only.
        &self.accounts[id]
    }

    pub(super) fn acct_mut(&mut self, id: &ThreadId) -> &mut Account {
        self.accounts
            .get_mut(id)
            .expect("chain holds present accounts")
    }

    /// The largest reservation `id` could make now: `min(h0, min_k(h_{k+1} + pools up to k))`.
    pub fn allowance(&self, id: &ThreadId) -> Result<(Nanos, ThreadId), LedgerError> {
        let chain = self.chain(id)?;
        let mut best = (self.acct(id).headroom(), id.clone());
        let mut pools = Nanos::ZERO;
        for k in 0..chain.len().saturating_sub(1) {
            pools = pools.plus(self.acct(&chain[k]).pool_left);
            let up = &chain[k + 1];
            let a = self.acct(up).headroom().plus(pools);
            if a < best.0 {
                best = (a, up.clone());
            }
        }
        Ok(best)
    }

    /// Opens an account for `id` under `parent` with cap `max`. A non-zero `guarantee` is set
    /// aside out of the parent's chain; otherwise the chain must at least cover `min_first_call`.
    pub fn open(
        &mut self,
        id: &ThreadId,
        parent: Option<&ThreadId>,
        max: Nanos,
        guarantee: Nanos,
        min_first_call: Nanos,
    ) -> Result<(), LedgerError> {
        if self.accounts.contains_key(id) {
            return Err(LedgerError::Exists(id.clone()));
        }
        let mut pool = Nanos::ZERO;
        if let Some(p) = parent {
            let pa = self
                .accounts
                .get(p)
                .ok_or_else(|| LedgerError::Unknown(p.clone()))?;
            if pa.closed {
                return Err(LedgerError::Closed(p.clone()));
            }
            let guarantee = guarantee.min(max);
            let chain = self.chain(p)?;
            if guarantee > Nanos::ZERO {
                // The guarantee is held at the parent and in-flight on every ancestor above it.
                if let Some(short) = chain.iter().find(|a| self.acct(a).headroom() < guarantee) {
                    let available = chain
                        .iter()
                        .map(|a| self.acct(a).headroom())
                        .min()
                        .unwrap_or_default();
                    return Err(LedgerError::Insufficient {
                        account: short.clone(),
                        needed: guarantee,
                        available,
                    });
                }
                self.acct_mut(p).guaranteed = self.acct(p).guaranteed.plus(guarantee);
                for a in &chain[1..] {
                    self.acct_mut(a).inflight = self.acct(a).inflight.plus(guarantee);
                }
                pool = guarantee;
            } else {
                let (available, account) = self.allowance(p)?;
                if available < min_first_call || available <= Nanos::ZERO {
                    return Err(LedgerError::Insufficient {
                        account,
                        needed: min_first_call,
                        available,
                    });
                }
            }
        }
        if let Some(p) = parent {
            *self.children.entry(p.clone()).or_default() += 1;
        }
        self.accounts.insert(
            id.clone(),
            Account {
                id: id.clone(),
                parent: parent.cloned(),
                max,
                spent: Nanos::ZERO,
                own_spent: Nanos::ZERO,
                inflight: Nanos::ZERO,
                guaranteed: Nanos::ZERO,
                pool_left: pool,
                closed: false,
                owner: crate::core::owner::me(),
                placed: false,
            },
        );
        Ok(())
    }

    /// Sets aside, out of `parent`'s chain, the budget of work `parent` caused to start later
    /// (a deferred child): an account `id` under `parent` whose cap and guarantee are the same
    /// amount: `want` when `whole` (refused when the chain cannot hold that much: a schedule
    /// never starves its scheduler unnoticed; the caller lowers it), else at most what the chain
    /// has left; refused when that is below `min_first_call`. `parent` may be closed (a thread that ended): the amount is held
    /// as its guarantee and in flight above it, so nothing else in the tree can take it. The
    /// account belongs to no process (owner 0) until a thread takes it over ([`Book::adopt`]);
    /// closing it unstarted gives the amount back. Returns the amount.
    pub fn defer(
        &mut self,
        id: &ThreadId,
        parent: &ThreadId,
        want: Nanos,
        whole: bool,
        min_first_call: Nanos,
    ) -> Result<Nanos, LedgerError> {
        if self.accounts.contains_key(id) {
            return Err(LedgerError::Exists(id.clone()));
        }
        let chain = self.chain(parent)?;
        if let Some(top) = chain.last().filter(|t| self.held_placed(t)) {
            return Err(LedgerError::Placed(top.clone()));
        }
        let (short, available) = chain
            .iter()
            .map(|a| (a, self.acct(a).headroom()))
            .min_by_key(|(_, h)| *h)
            .map(|(a, h)| (a.clone(), h))
            .unwrap_or((parent.clone(), Nanos::ZERO));
        let amount = if whole { want } else { want.min(available) };
        if amount < min_first_call.max(Nanos(1)) {
            // Its own budget could not pay for a first call, whatever the tree has left.
            return Err(LedgerError::Insufficient {
                account: id.clone(),
                needed: min_first_call.max(Nanos(1)),
                available: amount,
            });
        }
        if amount > available {
            return Err(LedgerError::Insufficient {
                account: short,
                needed: amount,
                available,
            });
        }
        self.acct_mut(parent).guaranteed = self.acct(parent).guaranteed.plus(amount);
        for a in &chain[1..] {
            self.acct_mut(a).inflight = self.acct(a).inflight.plus(amount);
        }
        *self.children.entry(parent.clone()).or_default() += 1;
        self.accounts.insert(
            id.clone(),
            Account {
                id: id.clone(),
                parent: Some(parent.clone()),
                max: amount,
                spent: Nanos::ZERO,
                own_spent: Nanos::ZERO,
                inflight: Nanos::ZERO,
                guaranteed: Nanos::ZERO,
                pool_left: amount,
                closed: false,
                owner: 0,
                placed: false,
            },
        );
        Ok(amount)
    }

    /// A deferred child's thread takes over the account set aside for it (see
    /// [`Book::defer`]), once: it must be open, under `parent`, and not yet taken. Returns its
    /// cap.
    pub fn adopt(&mut self, id: &ThreadId, parent: &ThreadId) -> Result<Nanos, LedgerError> {
        let a = self
            .accounts
            .get_mut(id)
            .ok_or_else(|| LedgerError::Unknown(id.clone()))?;
        if a.closed {
            return Err(LedgerError::Closed(id.clone()));
        }
        if a.owner != 0 || a.parent.as_ref() != Some(parent) {
            return Err(LedgerError::Exists(id.clone()));
        }
        a.owner = crate::core::owner::me();
        Ok(a.max)
    }

    /// Reserves a call's worst case for `id` and every ancestor in one step, lowering the output
    /// tokens to what fits; refuses when not even `min_output` tokens fit.
    pub fn reserve(
        &mut self,
        id: &ThreadId,
        price: &Price,
        prompt_tokens: u64,
        want_output: u64,
        min_output: u64,
    ) -> Result<Grant, LedgerError> {
        let acct = self
            .accounts
            .get(id)
            .ok_or_else(|| LedgerError::Unknown(id.clone()))?;
        if acct.closed {
            return Err(LedgerError::Closed(id.clone()));
        }
        let (allow, short) = self.allowance(id)?;
        let fit = price.max_output_within(allow, prompt_tokens);
        let out = want_output.min(fit);
        if out < min_output.max(1).min(want_output.max(1)) {
            let needed = price.cost(&crate::core::money::Usage {
                input_tokens: prompt_tokens,
                output_tokens: min_output.max(1),
                cache_read_tokens: 0,
                cache_write_tokens: 0,
            });
            return Err(LedgerError::Insufficient {
                account: short,
                needed,
                available: allow,
            });
        }
        let amount = price.cost(&crate::core::money::Usage {
            input_tokens: prompt_tokens,
            output_tokens: out,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
        });
        let reservation = self.hold_amount(id, amount)?;
        Ok(Grant {
            reservation,
            max_output_tokens: out,
            amount,
        })
    }

    /// Holds `amount` in flight for `id` and up its chain, drawn from the pools (guarantees) on
    /// the way first; the caller has checked that it fits.
    pub(super) fn hold_amount(
        &mut self,
        id: &ThreadId,
        amount: Nanos,
    ) -> Result<ReservationId, LedgerError> {
        let chain = self.chain(id)?;
        let mut carry = amount;
        let mut edges = Vec::with_capacity(chain.len());
        self.acct_mut(id).inflight = self.acct(id).inflight.plus(amount);
        for k in 0..chain.len() - 1 {
            let cover = carry.min(self.acct(&chain[k]).pool_left);
            self.acct_mut(&chain[k]).pool_left = self.acct(&chain[k]).pool_left.minus(cover);
            let up = self.acct_mut(&chain[k + 1]);
            up.guaranteed = up.guaranteed.minus(cover);
            up.inflight = up.inflight.plus(carry);
            edges.push((carry, cover));
            carry = carry.minus(cover);
        }
        self.next_id += 1;
        let r = Reservation {
            id: ReservationId(self.next_id),
            chain,
            amount,
            edges,
        };
        self.by_thread.entry(id.clone()).or_default().push(r.id);
        self.reservations.insert(r.id, r);
        Ok(ReservationId(self.next_id))
    }

    /// Settles a reservation with the actual cost (exactly once; a second settle is a no-op).
    /// Returns false when the reservation was unknown (already settled or released).
    pub fn settle(&mut self, reservation: ReservationId, actual: Nanos) -> bool {
        let Some(r) = self.reservations.remove(&reservation) else {
            return false;
        };
        if let Some(ids) = r.chain.first().and_then(|t| self.by_thread.get_mut(t)) {
            ids.retain(|x| *x != reservation);
            if ids.is_empty() {
                self.by_thread.remove(&r.chain[0]);
            }
        }
        let Some(first) = r.chain.first() else {
            return true;
        };
        let t0 = self.acct_mut(first);
        t0.inflight = t0.inflight.minus(r.amount);
        t0.spent = t0.spent.plus(actual);
        t0.own_spent = t0.own_spent.plus(actual);
        let mut remaining = actual;
        // Pool amounts now spent, and unspent ones whose owner closed meanwhile: both were held
        // in-flight above their edge and are released there.
        let mut consumed_below = Nanos::ZERO;
        let mut released_below = Nanos::ZERO;
        for (k, (carried, cover)) in r.edges.iter().enumerate() {
            let consumed = remaining.min(*cover);
            remaining = remaining.minus(consumed);
            let back = cover.minus(consumed);
            let below_closed = self.acct(&r.chain[k]).closed;
            if !below_closed {
                let below = self.acct_mut(&r.chain[k]);
                below.pool_left = below.pool_left.plus(back);
            }
            let up = self.acct_mut(&r.chain[k + 1]);
            up.inflight = up
                .inflight
                .minus(*carried)
                .minus(consumed_below)
                .minus(released_below);
            if !below_closed {
                up.guaranteed = up.guaranteed.plus(back);
            }
            up.spent = up.spent.plus(actual);
            consumed_below = consumed_below.plus(consumed);
            if below_closed {
                released_below = released_below.plus(back);
            }
        }
        true
    }

    /// Closes an account: releases its open reservations (as unspent) and returns what is left
    /// of its guarantee. Exactly once: closing a closed account changes nothing.
    pub fn close(&mut self, id: &ThreadId) -> Result<Account, LedgerError> {
        let acct = self
            .accounts
            .get(id)
            .ok_or_else(|| LedgerError::Unknown(id.clone()))?;
        if acct.closed {
            return Ok(acct.clone());
        }
        let open = self.open_of(id);
        for r in open {
            self.settle(r, Nanos::ZERO);
        }
        let left = self.acct(id).pool_left;
        // A placed subtree's top held here: its guarantee is its parent's node's to give back.
        let top_here = self.acct(id).placed && self.acct(id).owner == crate::core::owner::me();
        if top_here && self.parent_held(id) {
            return self.close_merged(id);
        }
        if left > Nanos::ZERO && !top_here {
            if let Some(p) = self.acct(id).parent.clone() {
                let chain = self.chain(&p)?;
                self.acct_mut(&p).guaranteed = self.acct(&p).guaranteed.minus(left);
                for a in &chain[1..] {
                    self.acct_mut(a).inflight = self.acct(a).inflight.minus(left);
                }
            }
        }
        let a = self.acct_mut(id);
        a.pool_left = Nanos::ZERO;
        a.closed = true;
        Ok(a.clone())
    }

    /// Drops `id` from the book if it is closed and no account below it is left, then its
    /// parent on the same terms, and so on up. A closed account with nothing open below it can
    /// never be reserved against again, so a long-lived runtime does not keep every account it
    /// ever closed. Returns the dropped accounts' final state (for ledger.db).
    pub fn prune(&mut self, id: &ThreadId) -> Vec<Account> {
        let mut dropped = Vec::new();
        let mut cur = Some(id.clone());
        while let Some(id) = cur.take() {
            let Some(a) = self.accounts.get(&id) else {
                break;
            };
            let done = a.closed || self.reopened.contains(&id);
            if !done || self.children.get(&id).is_some_and(|n| *n > 0) {
                break;
            }
            let mut a = self.accounts.remove(&id).expect("present");
            a.closed = true;
            self.reopened.remove(&id);
            self.children.remove(&id);
            if let Some(p) = &a.parent {
                if let Some(n) = self.children.get_mut(p) {
                    *n = n.saturating_sub(1);
                }
                cur = Some(p.clone());
            }
            dropped.push(a);
        }
        dropped
    }

    /// Opens again, from their final rows, the closed accounts of `chain` (a thread and its
    /// ancestors, nearest first) that the book does not hold, so a continuation of a finished
    /// child draws on its original tree's caps: its calls are reserved against, and settled into,
    /// every ancestor's account as when the tree ran. Each is closed and dropped again when the
    /// last account below it is (see [`Book::prune`]). What they still hold for deferred
    /// children below them (their stored guarantee and in-flight amounts) stays held.
    pub fn reopen(&mut self, chain: Vec<Account>) {
        for mut a in chain {
            if self.accounts.contains_key(&a.id) {
                break;
            }
            // Its stored `guaranteed` and `inflight` stay: what it still holds for deferred
            // children set aside below it (nothing else is in flight on a closed account).
            a.closed = false;
            a.pool_left = Nanos::ZERO;
            a.owner = crate::core::owner::me();
            if let Some(p) = &a.parent {
                *self.children.entry(p.clone()).or_default() += 1;
            }
            self.reopened.insert(a.id.clone());
            self.accounts.insert(a.id.clone(), a);
        }
    }

    /// Opens again a closed account the book still holds (something below it is open), for a
    /// continuation below it; closed and dropped again like one [`Book::reopen`] loaded.
    pub fn reopen_held(&mut self, id: &ThreadId) {
        if let Some(a) = self.accounts.get_mut(id) {
            if a.closed {
                a.closed = false;
                self.reopened.insert(id.clone());
            }
        }
    }

    /// Accounts held in memory (open ones and the closed ancestors of open ones).
    pub fn len(&self) -> usize {
        self.accounts.len()
    }

    /// Whether the book holds no account.
    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }

    /// Every account whose `used > max` (empty when the invariant holds).
    pub fn violations(&self) -> Vec<Account> {
        self.accounts
            .values()
            .filter(|a| a.used() > a.max || a.inflight.0 < 0 || a.guaranteed.0 < 0)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ThreadId {
        ThreadId::parse(s).unwrap()
    }
    const P: Price = Price {
        input: 1_000_000,
        output: 1_000_000,
        cache_read: 0,
        cache_write: 0,
    }; // 1 nano/token

    #[test]
    fn reservations_cascade_and_lower_max_tokens() {
        let mut b = Book::default();
        b.open(&id("root"), None, Nanos(1000), Nanos::ZERO, Nanos::ZERO)
            .unwrap();
        b.open(
            &id("kid"),
            Some(&id("root")),
            Nanos(5000),
            Nanos::ZERO,
            Nanos(10),
        )
        .unwrap();
        let g = b.reserve(&id("kid"), &P, 100, 4096, 16).unwrap();
        assert_eq!(
            g.max_output_tokens, 900,
            "lowered to what the root can cover"
        );
        assert_eq!(b.get(&id("root")).unwrap().inflight, Nanos(1000));
        assert!(
            b.reserve(&id("root"), &P, 10, 100, 16).is_err(),
            "nothing left for a second call"
        );
        assert!(b.settle(g.reservation, Nanos(300)));
        assert!(!b.settle(g.reservation, Nanos(300)), "settles exactly once");
        let root = b.get(&id("root")).unwrap();
        assert_eq!((root.spent, root.inflight), (Nanos(300), Nanos::ZERO));
        assert_eq!(b.get(&id("kid")).unwrap().own_spent, Nanos(300));
    }

    #[test]
    fn guarantees_are_held_spent_first_and_returned() {
        let mut b = Book::default();
        b.open(&id("root"), None, Nanos(1000), Nanos::ZERO, Nanos::ZERO)
            .unwrap();
        b.open(
            &id("a"),
            Some(&id("root")),
            Nanos(1000),
            Nanos(600),
            Nanos::ZERO,
        )
        .unwrap();
        assert!(b
            .open(
                &id("b"),
                Some(&id("root")),
                Nanos(1000),
                Nanos(600),
                Nanos::ZERO
            )
            .is_err());
        b.open(
            &id("b"),
            Some(&id("root")),
            Nanos(1000),
            Nanos::ZERO,
            Nanos(10),
        )
        .unwrap();
        // b can only take the 400 not guaranteed to a.
        let gb = b.reserve(&id("b"), &P, 0, 10_000, 1).unwrap();
        assert_eq!(gb.amount, Nanos(400));
        // a still gets its full 600.
        let ga = b.reserve(&id("a"), &P, 0, 10_000, 1).unwrap();
        assert_eq!(ga.amount, Nanos(600));
        assert!(b.violations().is_empty());
        b.settle(ga.reservation, Nanos(100));
        assert_eq!(b.get(&id("a")).unwrap().pool_left, Nanos(500));
        b.close(&id("a")).unwrap();
        b.settle(gb.reservation, Nanos(50));
        let root = b.get(&id("root")).unwrap();
        assert_eq!(
            (root.spent, root.inflight, root.guaranteed),
            (Nanos(150), Nanos::ZERO, Nanos::ZERO)
        );
        assert!(b.violations().is_empty());
    }

    #[test]
    fn close_releases_open_reservations_once() {
        let mut b = Book::default();
        b.open(&id("root"), None, Nanos(1000), Nanos::ZERO, Nanos::ZERO)
            .unwrap();
        b.reserve(&id("root"), &P, 10, 100, 1).unwrap();
        let a = b.close(&id("root")).unwrap();
        assert_eq!((a.inflight, a.spent), (Nanos::ZERO, Nanos::ZERO));
        assert_eq!(b.open_reservations(), 0);
        assert!(b.close(&id("root")).is_ok());
        assert!(matches!(
            b.reserve(&id("root"), &P, 10, 100, 1),
            Err(LedgerError::Closed(_))
        ));
    }
}
