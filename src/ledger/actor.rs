//! The ledger actor: owns the runtime's one [`Book`] and `ledger.db`, with group commit.

use super::{Account, Book, Grant, LedgerError, Reservation};
use crate::core::ids::ThreadId;
use crate::core::money::{Nanos, Price};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rusqlite::{params, Connection};

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
pub(crate) struct LedgerActor;

type HeldReply = crate::record::batch::HeldReply<LedgerError>;

/// State of the ledger actor.
pub(crate) struct LedgerState {
    book: Book,
    db: Connection,
    dirty: std::collections::HashSet<ThreadId>,
    added: Vec<Reservation>,
    removed: Vec<(ThreadId, u64)>,
    held: crate::record::batch::GroupCommit<LedgerError>,
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
