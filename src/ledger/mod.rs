//! The budget ledger (SPEC §5): every thread's account in integer nano-USD, per-call
//! reservations cascading up the ancestor chain, guarantees, and exactly-once release.
//!
//! [`Book`] is the pure bookkeeping; [`LedgerActor`] owns the one `Book` of a runtime and
//! persists every change before replying: in one IMMEDIATE transaction on `ledger.db`, or — a
//! batch of only reservations and settlements, on SQLite — in one record of its write-ahead
//! journal, folded into `ledger.db` by the next commit (`journal.rs`).
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

use crate::core::ids::ThreadId;
use crate::core::money::Nanos;
mod actor;
mod batch;
mod book;
mod commit;
mod db;
mod holders;
mod journal;
mod names;
mod outside;
mod placed;
mod trees;

pub use crate::core::ids::ReservationId;
pub use actor::LedgerMsg;
pub(crate) use actor::{Alive, LedgerActor};
pub use book::Book;
pub(crate) use db::open_db;
pub(crate) use outside::{fold_journals, unfolded_owners};

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
    /// Another live process holds the accounts of this tree (see `trees.rs`).
    #[error("the tree of {root} is in use by another weft process, or another runtime of one (pid {pid}): run its work there, or again once that process (or runtime) has ended")]
    Busy {
        /// The tree's first account.
        root: ThreadId,
        /// The process holding it (this one, when another of its runtimes does).
        pid: u32,
    },
    /// Budget set aside for later (a scheduled directive, a hook's spawn, a child placed on
    /// another node) cannot come out of a subtree placed on this node: its guarantee is settled
    /// with its parent's node when it ends, and what was set aside would outlive it.
    #[error("budget cannot be set aside for later inside {0}, a subtree placed on this node by another node: start that work from the tree's own node")]
    Placed(ThreadId),
    /// ledger.db could not be written; nothing was changed.
    #[error("ledger storage: {0}")]
    Storage(String),
}

/// One thread's account.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// Placed on another node (#26): its subtree runs there from a guarantee carved out of its
    /// parent's chain, and its holder (`owner`) treats it as the top of what it holds.
    pub placed: bool,
}

impl Account {
    /// The top of what its holder holds: a tree's first account, or a placed subtree's.
    pub fn is_top(&self) -> bool {
        self.parent.is_none() || self.placed
    }

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
pub(crate) struct Reservation {
    /// Ledger-wide id.
    pub id: ReservationId,
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
    pub reservation: ReservationId,
    /// Output tokens the call may generate (possibly lowered to fit).
    pub max_output_tokens: u64,
    /// Nanos reserved.
    pub amount: Nanos,
}
