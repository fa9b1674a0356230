//! The ledger actor: owns the runtime's one [`Book`] and `ledger.db`, with group commit.

use super::batch::{Undo, Unfolded};
use super::{Account, Book, Grant, LedgerError, Reservation, ReservationId};
use crate::core::ids::ThreadId;
use crate::core::money::{Nanos, Price};
use crate::sql::Db;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

/// Whether the process with this pid still runs.
pub(crate) type Alive = std::sync::Arc<dyn Fn(u32) -> bool + Send + Sync>;

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
    /// Set aside the budget of a deferred child (see [`Book::defer`]).
    Defer {
        /// The id the deferred child will run as.
        id: ThreadId,
        /// The thread it hangs under.
        parent: ThreadId,
        /// Its spend limit.
        want: Nanos,
        /// Set aside `want` whole or refuse; else at most what the chain has left.
        whole: bool,
        /// Cost of a minimal first call.
        min_first_call: Nanos,
        /// Reply: the amount set aside.
        reply: RpcReplyPort<Result<Nanos, LedgerError>>,
    },
    /// A deferred child's thread takes over its account (see [`Book::adopt`]); loaded from
    /// ledger.db when another process set it aside.
    Adopt {
        /// The deferred child.
        id: ThreadId,
        /// The thread it hangs under.
        parent: ThreadId,
        /// Reply: its cap.
        reply: RpcReplyPort<Result<Nanos, LedgerError>>,
    },
    /// Mark a deferred child's account placed on another node (see `placed.rs`).
    Place {
        /// The deferred child.
        id: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<(), LedgerError>>,
    },
    /// Take a placed account over as the top of what this process holds; reply: its cap.
    AdoptPlaced {
        /// The placed child.
        id: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<Nanos, LedgerError>>,
    },
    /// Settle a placed subtree that ended (from its stored final row) and close its account.
    SettlePlaced {
        /// The placed child.
        id: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<Account, LedgerError>>,
    },
    /// Take over the tree of a dead thread being adopted (see `trees.rs`).
    TakeOver {
        /// The dead thread.
        id: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<(), LedgerError>>,
    },
    /// Open again, for a continuation below it, the closed account of a finished thread and its
    /// closed ancestors (see [`Book::reopen`]); nothing if the book holds it.
    Reopen {
        /// The finished thread whose account the continuation opens under.
        id: ThreadId,
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
        reservation: ReservationId,
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
    /// A thread's open reservations and what each holds (recovery charges them at that bound).
    OpenOf {
        /// The thread.
        id: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Vec<(ReservationId, Nanos)>>,
    },
    /// Open placed accounts held in this book, each with its parent (see `placed.rs`).
    OpenPlaced {
        /// Reply: (child, parent) pairs.
        reply: RpcReplyPort<Vec<(ThreadId, ThreadId)>>,
    },
    /// Open accounts with the process that opened each.
    OpenAccounts {
        /// Reply.
        reply: RpcReplyPort<Vec<(ThreadId, u32)>>,
    },
    /// Persist everything changed since the last flush, then release the held replies.
    Flush,
    /// Accounts the book holds in memory (open ones and closed ancestors of open ones).
    Held {
        /// Reply.
        reply: RpcReplyPort<usize>,
    },
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
///
/// If that commit fails, the book and ledger.db must not drift apart. The batch holds two kinds
/// of change. *Decisions* (an account opened, a call reserved) are undone in the book by their
/// exact inverse (closing the new account, releasing the reservation unspent) and their callers
/// get the storage error: nothing was granted. *Facts* (a call's settlement, an account closed)
/// already happened and cannot be refused: they stay in the book, stay pending, and the commit is
/// retried until it lands (a crash meanwhile is repaired by recovery from the transcripts).
///
/// On SQLite a batch of only reservations and settlements — a turn's ledger work — is not
/// committed but written to the runtime's write-ahead journal before its replies go (see
/// `journal.rs` and `commit.rs`); the next commit, or a fold every so many records, stores it
/// in ledger.db.
pub(crate) struct LedgerActor;

type HeldReply = crate::record::batch::HeldReply<LedgerError>;

/// State of the ledger actor.
pub(crate) struct LedgerState {
    pub(super) book: Book,
    pub(super) db: Db,
    /// Whether a process (by pid) still runs (its owner lock is held).
    pub(super) alive: Alive,
    /// The batch: accounts changed, reservations added and removed since the last flush.
    pub(super) dirty: std::collections::HashSet<ThreadId>,
    pub(super) added: Vec<Reservation>,
    pub(super) removed: Vec<(ThreadId, ReservationId)>,
    /// Final rows of closed accounts the book has dropped (see [`Book::prune`]).
    pub(super) dropped: Vec<Account>,
    pub(super) undo: Vec<Undo>,
    pub(super) held: crate::record::batch::GroupCommit<LedgerError>,
    /// The batch holds a change other than reservations and settlements: it must commit.
    pub(super) must_commit: bool,
    /// This runtime's write-ahead journal (SQLite; None on a database server).
    pub(super) journal: Option<super::journal::Journal>,
    /// Journaled since the last fold.
    pub(super) unfolded: Unfolded,
    /// This runtime among the process's (see `holders.rs`).
    pub(super) seat: super::holders::Seat,
}

impl LedgerState {
    /// Holds `reply` until the next flush, queueing one if none is; the batch then commits.
    pub(super) fn hold(&mut self, me: &ActorRef<LedgerMsg>, reply: HeldReply) {
        self.must_commit = true;
        self.hold_journaled(me, reply);
    }

    /// Holds the reply of a change that may be journaled (a reservation, a settlement, a
    /// child's open or close): its batch is journaled unless something else in it must commit.
    fn hold_journaled(&mut self, me: &ActorRef<LedgerMsg>, reply: HeldReply) {
        self.held.hold(reply, || me.cast(LedgerMsg::Flush).is_ok());
    }

    pub(super) fn touch(&mut self, ids: &[ThreadId]) {
        self.dirty.extend(ids.iter().cloned());
    }

    pub(super) fn pending(&self) -> bool {
        !(self.dirty.is_empty()
            && self.added.is_empty()
            && self.removed.is_empty()
            && self.dropped.is_empty())
    }

    /// Drops `id` and its closed ancestors from the book once nothing below them is open,
    /// keeping their final rows for the next store.
    pub(super) fn prune(&mut self, id: &ThreadId) {
        for a in self.book.prune(id) {
            self.dirty.remove(&a.id);
            self.dropped.push(a);
        }
    }

    /// [`Self::prune`] after a refusal, which holds no reply: what it dropped (it may finish a
    /// reopened tree) is stored by a flush of its own.
    fn prune_refused(&mut self, me: &ActorRef<LedgerMsg>, id: &ThreadId) {
        let before = self.dropped.len();
        self.prune(id);
        if self.dropped.len() > before {
            let _ = me.cast(LedgerMsg::Flush);
        }
    }
}

/// One method per change a message asks of the book: each applies it at once and holds its
/// reply until the change is committed (see [`LedgerActor`]).
impl LedgerState {
    /// After [`Book::open`]: a new account is a decision of this batch; a refusal is answered
    /// at once.
    fn opened(
        &mut self,
        me: &ActorRef<LedgerMsg>,
        opened: Result<(), LedgerError>,
        id: ThreadId,
        parent: Option<ThreadId>,
        reply: RpcReplyPort<Result<(), LedgerError>>,
    ) {
        if let Err(e) = opened {
            // A chain opened again for this account is not needed after all.
            if let Some(p) = &parent {
                self.prune_refused(me, p);
            }
            let _ = reply.send(Err(e));
            return;
        }
        // A child's account joins a tree whose top is stored open (held, not finished): it
        // may be journaled. A tree's first account commits: it makes the tree known and held.
        let journaled = parent.is_some();
        if !journaled {
            self.seat.hold(&id);
        }
        self.open_decided(me, id, (), reply, journaled);
    }

    /// A new account is a decision of this batch: its chain is written, and `value` answered
    /// once the batch is stored (`journaled`, or committed), the account undone if it is not.
    fn open_decided<T: Send + 'static>(
        &mut self,
        me: &ActorRef<LedgerMsg>,
        id: ThreadId,
        value: T,
        reply: RpcReplyPort<Result<T, LedgerError>>,
        journaled: bool,
    ) {
        let ids = self.book.chain(&id).unwrap_or_default();
        self.touch(&ids);
        self.undo.push(Undo::Open(id));
        let reply: HeldReply = Box::new(move |e| {
            let _ = reply.send(e.map_or(Ok(value), Err));
        });
        match journaled {
            true => self.hold_journaled(me, reply),
            false => self.hold(me, reply),
        }
    }

    /// After [`Book::defer`]: the set-aside account is a decision of this batch.
    fn deferred(
        &mut self,
        me: &ActorRef<LedgerMsg>,
        set: Result<Nanos, LedgerError>,
        id: ThreadId,
        parent: ThreadId,
        reply: RpcReplyPort<Result<Nanos, LedgerError>>,
    ) {
        let amount = match set {
            Ok(a) => a,
            Err(e) => {
                self.prune_refused(me, &parent);
                let _ = reply.send(Err(e));
                return;
            }
        };
        self.open_decided(me, id, amount, reply, false);
    }

    /// After [`Book::reserve`]: a grant is a decision of this batch; a refusal is answered at
    /// once.
    fn reserved(
        &mut self,
        me: &ActorRef<LedgerMsg>,
        granted: Result<Grant, LedgerError>,
        reply: RpcReplyPort<Result<Grant, LedgerError>>,
    ) {
        let g = match granted {
            Ok(g) => g,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        if let Some(r) = self.book.reservations.get(&g.reservation).cloned() {
            self.touch(&r.chain);
            self.added.push(r);
        }
        self.undo.push(Undo::Reserve(g.reservation));
        self.hold_journaled(
            me,
            Box::new(move |e| {
                let _ = reply.send(e.map_or(Ok(g), Err));
            }),
        );
    }

    /// Settles `reservation` at `actual` (an unknown one is already settled).
    fn settle(
        &mut self,
        me: &ActorRef<LedgerMsg>,
        reservation: ReservationId,
        actual: Nanos,
        reply: Option<RpcReplyPort<Result<(), LedgerError>>>,
    ) {
        let Some(r) = self.book.reservations.get(&reservation).cloned() else {
            if let Some(r) = reply {
                let _ = r.send(Ok(()));
            }
            return;
        };
        self.book.settle(reservation, actual);
        self.touch(&r.chain);
        self.removed.push((r.chain[0].clone(), r.id));
        // A settlement nobody waits for rides with the next commit (the caller's next reserve
        // or close): its cost is already in the transcript, and recovery settles recorded
        // calls, so it needs no commit of its own.
        // A fact: if this commit fails it stays pending and is retried.
        if let Some(reply) = reply {
            self.hold_journaled(
                me,
                Box::new(move |_| {
                    let _ = reply.send(Ok(()));
                }),
            );
        }
    }

    /// Closes `id`'s account, its open reservations released.
    fn close(
        &mut self,
        me: &ActorRef<LedgerMsg>,
        id: ThreadId,
        reply: RpcReplyPort<Result<Account, LedgerError>>,
    ) {
        let open: Vec<(ThreadId, ReservationId)> = self
            .book
            .open_of(&id)
            .into_iter()
            .map(|r| (id.clone(), r))
            .collect();
        let a = match self.book.close(&id) {
            Ok(a) => a,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let ids = self.book.chain(&id).unwrap_or_default();
        self.touch(&ids);
        self.removed.extend(open);
        self.prune(&id);
        // A fact, like a settlement: kept and retried if this store fails. Journaled unless it
        // finishes the tree (see `commit.rs`).
        self.hold_journaled(
            me,
            Box::new(move |_| {
                let _ = reply.send(Ok(a));
            }),
        );
    }

    /// Open accounts with the process that opened each.
    fn open_accounts(&self) -> Vec<(ThreadId, u32)> {
        self.book
            .accounts()
            .filter(|a| !a.closed)
            .map(|a| (a.id.clone(), a.owner))
            .collect()
    }
}

impl Actor for LedgerActor {
    type Msg = LedgerMsg;
    type State = LedgerState;
    /// The ledger's database, who is alive, and where journals are kept (SQLite only).
    type Arguments = (Db, Alive, Option<std::path::PathBuf>);

    async fn pre_start(
        &self,
        _me: ActorRef<LedgerMsg>,
        (mut db, alive, journals): Self::Arguments,
    ) -> Result<LedgerState, ActorProcessingErr> {
        // What runtimes that are gone journaled is in ledger.db before anything is read from
        // it (reservation ids continue after theirs; their calls are charged at bound).
        if let Some(dir) = &journals {
            super::journal::fold_dead_now(&mut db, dir, &*alive)?;
        }
        let book = Book::load(&db)?;
        // Which database: thread ids repeat in copies of a project.
        let scope = match (db.url(), &journals) {
            (Some(url), _) => url.to_string(),
            (None, dir) => dir
                .as_ref()
                .map_or(String::new(), |d| d.display().to_string()),
        };
        let journal = journals
            .filter(|_| db.url().is_none())
            .map(|dir| super::journal::Journal::new(dir, db.fsyncs()));
        Ok(LedgerState {
            book,
            alive,
            db,
            dirty: Default::default(),
            added: vec![],
            removed: vec![],
            dropped: vec![],
            undo: vec![],
            held: Default::default(),
            must_commit: false,
            journal,
            unfolded: Default::default(),
            seat: super::holders::Seat::join(scope),
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
                let opened = s
                    .book
                    .open(&id, parent.as_ref(), max, guarantee, min_first_call);
                s.opened(&me, opened, id, parent, reply);
            }
            LedgerMsg::Defer {
                id,
                parent,
                want,
                whole,
                min_first_call,
                reply,
            } => {
                let set = s.book.defer(&id, &parent, want, whole, min_first_call);
                s.deferred(&me, set, id, parent, reply);
            }
            LedgerMsg::Adopt { id, parent, reply } => s.adopt(&me, id, parent, reply),
            LedgerMsg::Place { id, reply } => s.place(&me, id, reply),
            LedgerMsg::AdoptPlaced { id, reply } => s.adopt_placed(&me, id, reply),
            LedgerMsg::SettlePlaced { id, reply } => s.settle_placed(&me, id, reply),
            LedgerMsg::TakeOver { id, reply } => {
                let _ = reply.send(s.take_over(&id));
            }
            LedgerMsg::Reopen { id, reply } => {
                let _ = reply.send(s.reopen(id));
            }
            LedgerMsg::Reserve {
                id,
                price,
                prompt_tokens,
                want_output,
                min_output,
                reply,
            } => {
                let granted = s
                    .book
                    .reserve(&id, &price, prompt_tokens, want_output, min_output);
                s.reserved(&me, granted, reply);
            }
            LedgerMsg::Settle {
                reservation,
                actual,
                reply,
            } => s.settle(&me, reservation, actual, reply),
            LedgerMsg::Close { id, reply } => s.close(&me, id, reply),
            LedgerMsg::Flush => s.flush(Some(&me)),
            LedgerMsg::Get { id, reply } => {
                let _ = reply.send(s.book.get(&id).cloned());
            }
            LedgerMsg::OpenPlaced { reply } => {
                let _ = reply.send(s.open_placed());
            }
            LedgerMsg::OpenAccounts { reply } => {
                let _ = reply.send(s.open_accounts());
            }
            LedgerMsg::OpenOf { id, reply } => {
                let open = s.book.open_of(&id).into_iter();
                let held = open.filter_map(|r| Some((r, s.book.reservations.get(&r)?.amount)));
                let _ = reply.send(held.collect());
            }
            LedgerMsg::Held { reply } => {
                let _ = reply.send(s.book.len());
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
        s.stop();
        Ok(())
    }
}
