//! The budget ledger (SPEC §5): every thread's account in integer nano-USD, per-call
//! reservations cascading up the ancestor chain, guarantees, and exactly-once release.
//!
//! [`Book`] is the pure bookkeeping; [`LedgerActor`] owns the one `Book` of a runtime and
//! persists every change to `ledger.db` in one IMMEDIATE transaction before replying.
//! The ledger knows nothing about providers, tokens or actors other than its callers: it only
//! moves nanos between accounts.
//!
//! # Model
//! `used(T) = spent + inflight + guaranteed ≤ max` for every account T, at every instant.
//! * `spent`: settled cost of T's own calls and of its whole subtree.
//! * `inflight`: reservations of calls running in T's subtree, less what guarantees already hold.
//! * `guaranteed`: set aside by T for children that asked `reserve`, not yet spent by them.
//!
//! A guarantee `G` granted by P to child C is held as `P.guaranteed += G` and as in-flight on
//! every ancestor of P, so nobody else in the tree can take it. A call of C (or of anything
//! below C) is covered by C's remaining guarantee first; only the uncovered part needs headroom
//! higher up. On settlement the actual spend consumes the covering guarantees lowest first and
//! whatever is unspent goes back to them.

use crate::ids::ThreadId;
use crate::money::{Nanos, Price};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rusqlite::{params, Connection};
use std::collections::HashMap;
use std::path::Path;

/// A ledger refusal or failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// Some account on the chain cannot cover the amount.
    #[error(
        "limit exceeded: spend — {needed} needed but only {available} remains (account {account})"
    )]
    Insufficient {
        /// The account that is short.
        account: ThreadId,
        /// What the operation needed.
        needed: Nanos,
        /// What the chain could still cover.
        available: Nanos,
    },
    /// No such account.
    #[error("no ledger account for thread {0}")]
    Unknown(ThreadId),
    /// The account was already closed.
    #[error("the ledger account of thread {0} is closed")]
    Closed(ThreadId),
    /// An account with that id exists.
    #[error("a ledger account for thread {0} already exists")]
    Exists(ThreadId),
    /// ledger.db could not be written; nothing was changed.
    #[error("ledger storage: {0}")]
    Storage(String),
}

/// One thread's account.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Account {
    /// The thread.
    pub id: ThreadId,
    /// Its parent's account, if any.
    pub parent: Option<ThreadId>,
    /// Spend cap of the subtree.
    pub max: Nanos,
    /// Settled spend of the subtree.
    pub spent: Nanos,
    /// Settled spend of the thread's own calls.
    pub own_spent: Nanos,
    /// Open reservations in the subtree beyond what guarantees hold.
    pub inflight: Nanos,
    /// Set aside for children's guarantees, not yet spent.
    pub guaranteed: Nanos,
    /// What is left of this thread's own guarantee from its parent.
    pub pool_left: Nanos,
    /// Closed: no further reservations.
    pub closed: bool,
    /// Process that opened the account (recovery closes accounts of dead processes).
    pub owner: u32,
}

impl Account {
    /// `spent + inflight + guaranteed`.
    pub fn used(&self) -> Nanos {
        self.spent.plus(self.inflight).plus(self.guaranteed)
    }
    /// `max − used` (never negative).
    pub fn headroom(&self) -> Nanos {
        Nanos((self.max.0 - self.used().0).max(0))
    }
}

/// An open reservation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reservation {
    /// Ledger-wide id.
    pub id: u64,
    /// The reserving thread, then its ancestors.
    pub chain: Vec<ThreadId>,
    /// The amount reserved.
    pub amount: Nanos,
    /// Per edge k (chain[k] → chain[k+1]): what was carried up and what chain[k]'s guarantee covered.
    pub edges: Vec<(Nanos, Nanos)>,
}

/// A granted call reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Reservation id to settle.
    pub reservation: u64,
    /// Output tokens the call may generate (possibly lowered to fit).
    pub max_output_tokens: u64,
    /// Nanos reserved.
    pub amount: Nanos,
}

/// The in-memory ledger.
#[derive(Debug, Default)]
pub struct Book {
    accounts: HashMap<ThreadId, Account>,
    reservations: HashMap<u64, Reservation>,
    /// Open reservation ids by reserving thread (so closing is not a scan of every reservation).
    by_thread: HashMap<ThreadId, Vec<u64>>,
    next_id: u64,
}

impl Book {
    /// Loads what an earlier process left open in ledger.db: every open account, the ancestors
    /// of those, and every open reservation (so recovery can release them exactly once).
    pub fn load(db: &Connection) -> Result<Book, LedgerError> {
        let st = |e: rusqlite::Error| LedgerError::Storage(e.to_string());
        let mut book = Book::default();
        let mut stmt = db
            .prepare(
                "WITH RECURSIVE keep(id) AS (
                   SELECT id FROM accounts WHERE closed=0
                   UNION SELECT a.parent FROM accounts a JOIN keep k ON a.id=k.id WHERE a.parent IS NOT NULL)
                 SELECT id,parent,max,spent,own_spent,inflight,guaranteed,pool_left,closed,owner
                 FROM accounts WHERE id IN keep",
            )
            .map_err(st)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    [
                        r.get::<_, i64>(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                    ],
                    r.get::<_, bool>(8)?,
                    r.get::<_, u32>(9)?,
                ))
            })
            .map_err(st)?;
        for row in rows {
            let (id, parent, n, closed, owner) = row.map_err(st)?;
            let (Ok(id), parent) = (
                ThreadId::parse(&id),
                parent.and_then(|p| ThreadId::parse(&p).ok()),
            ) else {
                continue;
            };
            book.accounts.insert(
                id.clone(),
                Account {
                    id,
                    parent,
                    max: Nanos(n[0]),
                    spent: Nanos(n[1]),
                    own_spent: Nanos(n[2]),
                    inflight: Nanos(n[3]),
                    guaranteed: Nanos(n[4]),
                    pool_left: Nanos(n[5]),
                    closed,
                    owner,
                },
            );
        }
        let mut stmt = db.prepare("SELECT body FROM reservations").map_err(st)?;
        let bodies = stmt.query_map([], |r| r.get::<_, String>(0)).map_err(st)?;
        for body in bodies {
            let body = body.map_err(st)?;
            match serde_json::from_str::<Reservation>(&body) {
                Ok(r) if r.chain.iter().all(|a| book.accounts.contains_key(a)) => {
                    book.next_id = book.next_id.max(r.id);
                    book.by_thread
                        .entry(r.chain[0].clone())
                        .or_default()
                        .push(r.id);
                    book.reservations.insert(r.id, r);
                }
                _ => tracing::warn!("ledger.db: unreadable reservation left as is: {body}"),
            }
        }
        // Ids continue after any earlier process's, with room so two processes rarely meet.
        let mut rnd = [0u8; 3];
        let _ = getrandom::fill(&mut rnd);
        book.next_id +=
            1 + (u64::from(rnd[0]) << 32 | u64::from(rnd[1]) << 24 | u64::from(rnd[2]) << 16);
        Ok(book)
    }

    /// The account, if present.
    pub fn get(&self, id: &ThreadId) -> Option<&Account> {
        self.accounts.get(id)
    }

    /// Every account.
    pub fn accounts(&self) -> impl Iterator<Item = &Account> {
        self.accounts.values()
    }

    /// Open reservation ids of one thread's own calls.
    pub fn open_of(&self, id: &ThreadId) -> Vec<u64> {
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
        while let Some(p) = &cur.parent {
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

    fn acct_mut(&mut self, id: &ThreadId) -> &mut Account {
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
                owner: std::process::id(),
            },
        );
        Ok(())
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
            let needed = price.cost(&crate::money::Usage {
                input_tokens: prompt_tokens,
                output_tokens: min_output.max(1),
                cache_read_tokens: 0,
            });
            return Err(LedgerError::Insufficient {
                account: short,
                needed,
                available: allow,
            });
        }
        let amount = price.cost(&crate::money::Usage {
            input_tokens: prompt_tokens,
            output_tokens: out,
            cache_read_tokens: 0,
        });
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
            id: self.next_id,
            chain,
            amount,
            edges,
        };
        self.by_thread.entry(id.clone()).or_default().push(r.id);
        self.reservations.insert(r.id, r);
        Ok(Grant {
            reservation: self.next_id,
            max_output_tokens: out,
            amount,
        })
    }

    /// Settles a reservation with the actual cost (exactly once; a second settle is a no-op).
    /// Returns false when the reservation was unknown (already settled or released).
    pub fn settle(&mut self, reservation: u64, actual: Nanos) -> bool {
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
        if left > Nanos::ZERO {
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

    /// Every account whose `used > max` (empty when the invariant holds).
    pub fn violations(&self) -> Vec<Account> {
        self.accounts
            .values()
            .filter(|a| a.used() > a.max || a.inflight.0 < 0 || a.guaranteed.0 < 0)
            .cloned()
            .collect()
    }
}

/// Messages of the ledger actor.
pub enum LedgerMsg {
    /// Open an account (see [`Book::open`]).
    Open {
        /// New account.
        id: ThreadId,
        /// Parent account.
        parent: Option<ThreadId>,
        /// Cap.
        max: Nanos,
        /// Guarantee asked by `reserve`.
        guarantee: Nanos,
        /// Cost of a minimal first call.
        min_first_call: Nanos,
        /// Reply.
        reply: RpcReplyPort<Result<(), LedgerError>>,
    },
    /// Reserve a call (see [`Book::reserve`]).
    Reserve {
        /// Reserving thread.
        id: ThreadId,
        /// Model price.
        price: Price,
        /// Estimated prompt tokens.
        prompt_tokens: u64,
        /// Output tokens wanted.
        want_output: u64,
        /// Fewest output tokens worth a call.
        min_output: u64,
        /// Reply.
        reply: RpcReplyPort<Result<Grant, LedgerError>>,
    },
    /// Settle a reservation with the actual cost.
    Settle {
        /// Reservation id.
        reservation: u64,
        /// Actual cost.
        actual: Nanos,
        /// Reply once persisted (None: fire and forget; later messages of the same sender are
        /// handled after it anyway).
        reply: Option<RpcReplyPort<Result<(), LedgerError>>>,
    },
    /// Close an account (exactly-once release).
    Close {
        /// The thread.
        id: ThreadId,
        /// Reply with the final account.
        reply: RpcReplyPort<Result<Account, LedgerError>>,
    },
    /// Read one account.
    Get {
        /// The thread.
        id: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Option<Account>>,
    },
    /// Open accounts with the process that opened each.
    OpenAccounts {
        /// Reply.
        reply: RpcReplyPort<Vec<(ThreadId, u32)>>,
    },
    /// Persist everything changed since the last flush, then release the held replies.
    Flush,
    /// Audit: invariant violations and open reservations.
    Audit {
        /// Reply: (violations, open reservations).
        reply: RpcReplyPort<(Vec<Account>, usize)>,
    },
}

/// The ledger actor: owns the [`Book`] and `ledger.db`.
///
/// Group commit: a change is applied to the book at once (one atomic actor step) and its reply
/// held back; a `Flush` marker queued behind it persists every change made since the last flush
/// in one IMMEDIATE transaction and only then releases the replies. So no caller proceeds on a
/// change that is not in ledger.db, and many concurrent callers share one commit.
pub struct LedgerActor;

type HeldReply = crate::batch::HeldReply<LedgerError>;

/// State of the ledger actor.
pub struct LedgerState {
    book: Book,
    db: Connection,
    dirty: std::collections::HashSet<ThreadId>,
    added: Vec<Reservation>,
    removed: Vec<(ThreadId, u64)>,
    held: crate::batch::GroupCommit<LedgerError>,
}

/// Opens (creating) `ledger.db` in WAL mode.
pub fn open_db(path: &Path) -> Result<Connection, LedgerError> {
    let db = Connection::open(path)
        .map_err(|e| LedgerError::Storage(format!("{}: {e}", path.display())))?;
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;
         CREATE TABLE IF NOT EXISTS accounts(
           id TEXT PRIMARY KEY, parent TEXT, max INTEGER NOT NULL, spent INTEGER NOT NULL,
           own_spent INTEGER NOT NULL, inflight INTEGER NOT NULL, guaranteed INTEGER NOT NULL,
           pool_left INTEGER NOT NULL, closed INTEGER NOT NULL, owner INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS reservations(
           id INTEGER NOT NULL, thread TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY(thread, id));",
    )
    .map_err(|e| LedgerError::Storage(e.to_string()))?;
    Ok(db)
}

impl LedgerState {
    /// Holds `reply` until the next flush, queueing one if none is.
    fn hold(&mut self, me: &ActorRef<LedgerMsg>, reply: HeldReply) {
        self.held.hold(reply, || me.cast(LedgerMsg::Flush).is_ok());
    }

    fn touch(&mut self, ids: &[ThreadId]) {
        self.dirty.extend(ids.iter().cloned());
    }

    /// Persists every change since the last flush in one IMMEDIATE transaction.
    fn persist(&mut self) -> Result<(), LedgerError> {
        let st = |e: rusqlite::Error| LedgerError::Storage(e.to_string());
        let tx = self
            .db
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(st)?;
        {
            let mut up = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO accounts(id,parent,max,spent,own_spent,inflight,guaranteed,pool_left,closed,owner)
                     VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)",
                )
                .map_err(st)?;
            for id in &self.dirty {
                if let Some(a) = self.book.get(id) {
                    up.execute(params![
                        a.id.as_str(),
                        a.parent.as_ref().map(ThreadId::as_str),
                        a.max.0,
                        a.spent.0,
                        a.own_spent.0,
                        a.inflight.0,
                        a.guaranteed.0,
                        a.pool_left.0,
                        a.closed,
                        a.owner
                    ])
                    .map_err(st)?;
                }
            }
            let mut ins = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO reservations(id,thread,body) VALUES(?1,?2,?3)",
                )
                .map_err(st)?;
            for r in &self.added {
                let body = serde_json::to_string(r).unwrap_or_default();
                ins.execute(params![r.id as i64, r.chain[0].as_str(), body])
                    .map_err(st)?;
            }
            let mut del = tx
                .prepare_cached("DELETE FROM reservations WHERE thread=?1 AND id=?2")
                .map_err(st)?;
            for (t, id) in &self.removed {
                del.execute(params![t.as_str(), *id as i64]).map_err(st)?;
            }
        }
        tx.commit().map_err(st)
    }

    fn flush(&mut self) {
        let res = self.persist();
        if let Err(e) = &res {
            tracing::error!(
                "ledger.db commit failed, {} change(s) not persisted: {e}",
                self.held.len()
            );
        }
        self.dirty.clear();
        self.added.clear();
        self.removed.clear();
        self.held.release(&res);
    }
}

impl Actor for LedgerActor {
    type Msg = LedgerMsg;
    type State = LedgerState;
    type Arguments = Connection;

    async fn pre_start(
        &self,
        _me: ActorRef<LedgerMsg>,
        db: Connection,
    ) -> Result<LedgerState, ActorProcessingErr> {
        let book = Book::load(&db)?;
        Ok(LedgerState {
            book,
            db,
            dirty: Default::default(),
            added: vec![],
            removed: vec![],
            held: Default::default(),
        })
    }

    async fn handle(
        &self,
        me: ActorRef<LedgerMsg>,
        msg: LedgerMsg,
        s: &mut LedgerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            LedgerMsg::Open {
                id,
                parent,
                max,
                guarantee,
                min_first_call,
                reply,
            } => {
                match s
                    .book
                    .open(&id, parent.as_ref(), max, guarantee, min_first_call)
                {
                    Ok(()) => {
                        let ids = s.book.chain(&id).unwrap_or_default();
                        s.touch(&ids);
                        s.hold(
                            &me,
                            Box::new(move |e| {
                                let _ = reply.send(e.map_or(Ok(()), Err));
                            }),
                        );
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            LedgerMsg::Reserve {
                id,
                price,
                prompt_tokens,
                want_output,
                min_output,
                reply,
            } => {
                match s
                    .book
                    .reserve(&id, &price, prompt_tokens, want_output, min_output)
                {
                    Ok(g) => {
                        if let Some(r) = s.book.reservations.get(&g.reservation).cloned() {
                            s.touch(&r.chain);
                            s.added.push(r);
                        }
                        s.hold(
                            &me,
                            Box::new(move |e| {
                                let _ = reply.send(e.map_or(Ok(g), Err));
                            }),
                        );
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            LedgerMsg::Settle {
                reservation,
                actual,
                reply,
            } => {
                let r = s.book.reservations.get(&reservation).cloned();
                match r {
                    Some(r) => {
                        s.book.settle(reservation, actual);
                        s.touch(&r.chain);
                        s.removed.push((r.chain[0].clone(), r.id));
                        // A settlement nobody waits for rides with the next commit (the caller's
                        // next reserve or close): its cost is already in the transcript, and
                        // recovery settles recorded calls, so it needs no commit of its own.
                        if let Some(reply) = reply {
                            s.hold(
                                &me,
                                Box::new(move |e| {
                                    let _ = reply.send(e.map_or(Ok(()), Err));
                                }),
                            );
                        }
                    }
                    None => {
                        if let Some(r) = reply {
                            let _ = r.send(Ok(()));
                        }
                    }
                }
            }
            LedgerMsg::Close { id, reply } => {
                let open: Vec<(ThreadId, u64)> = s
                    .book
                    .open_of(&id)
                    .into_iter()
                    .map(|r| (id.clone(), r))
                    .collect();
                match s.book.close(&id) {
                    Ok(a) => {
                        let ids = s.book.chain(&id).unwrap_or_default();
                        s.touch(&ids);
                        s.removed.extend(open);
                        s.hold(
                            &me,
                            Box::new(move |e| {
                                let _ = reply.send(e.map_or(Ok(a), Err));
                            }),
                        );
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            LedgerMsg::Flush => s.flush(),
            LedgerMsg::Get { id, reply } => {
                let _ = reply.send(s.book.get(&id).cloned());
            }
            LedgerMsg::OpenAccounts { reply } => {
                let open = s
                    .book
                    .accounts()
                    .filter(|a| !a.closed)
                    .map(|a| (a.id.clone(), a.owner))
                    .collect();
                let _ = reply.send(open);
            }
            LedgerMsg::Audit { reply } => {
                let _ = reply.send((s.book.violations(), s.book.open_reservations()));
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _me: ActorRef<LedgerMsg>,
        s: &mut LedgerState,
    ) -> Result<(), ActorProcessingErr> {
        if !s.held.is_empty() || !s.dirty.is_empty() {
            s.flush();
        }
        Ok(())
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
