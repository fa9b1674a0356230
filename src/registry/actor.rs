//! The registry actor: the only writer of registry.db at run time, with group commit.

use super::{Admission, RegistryError, Store, ThreadRow};
use crate::core::ids::ThreadId;
use crate::sql::off_workers;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

/// Messages of the registry actor.
pub enum RegistryMsg {
    /// Register a new thread, with admission for children.
    Register {
        /// The row (status `created`).
        row: Box<ThreadRow>,
        /// Admission against the parent's limits.
        admit: Option<Admission>,
        /// Reply.
        reply: RpcReplyPort<Result<(), RegistryError>>,
    },
    /// Update a row (status, cost, result).
    Update {
        /// The row.
        row: Box<ThreadRow>,
        /// Reply, when the caller must know it is stored (terminal transitions).
        reply: Option<RpcReplyPort<Result<(), RegistryError>>>,
    },
    /// Read one row.
    Get {
        /// Thread id.
        id: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<Option<ThreadRow>, RegistryError>>,
    },
    /// Is `id` a descendant of `ancestor`?
    IsDescendant {
        /// The ancestor.
        ancestor: ThreadId,
        /// The candidate.
        id: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<bool, RegistryError>>,
    },
    /// The unfinished rows of `id`'s subtree (itself included), deepest first.
    UnfinishedSubtree {
        /// The subtree's root.
        id: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<Vec<ThreadRow>, RegistryError>>,
    },
    /// Rows still created/running.
    Unfinished {
        /// Reply.
        reply: RpcReplyPort<Result<Vec<ThreadRow>, RegistryError>>,
    },
    /// The owners of rows still created/running.
    UnfinishedOwners {
        /// Reply.
        reply: RpcReplyPort<Result<Vec<u32>, RegistryError>>,
    },
    /// Recovery: finalize a row whose owner is gone.
    FinishInterrupted {
        /// The row (status, error, spend set).
        row: Box<ThreadRow>,
        /// Reply.
        reply: RpcReplyPort<Result<(), RegistryError>>,
    },
    /// Link a continuation to the thread it continues.
    LinkContinuation {
        /// The continued thread.
        old: ThreadId,
        /// The continuation.
        new: ThreadId,
        /// First thread of the chain.
        chain_root: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<(), RegistryError>>,
    },
    /// Recovery: claim an unfinished row of a dead owner before repairing it (committed at
    /// once; true for exactly one claimant).
    Claim {
        /// The thread.
        id: ThreadId,
        /// The dead owner's pid, as recovery read it.
        from: u32,
        /// Reply.
        reply: RpcReplyPort<Result<bool, RegistryError>>,
    },
    /// Commit the batch and release held replies.
    Flush,
    /// The kept rows' lag is over: write them, and commit (see [`ROW_LAG`]).
    Lagged,
    /// Rows of one tree.
    Tree {
        /// Root id.
        root: ThreadId,
        /// Reply.
        reply: RpcReplyPort<Result<Vec<ThreadRow>, RegistryError>>,
    },
}

/// The registry actor actor: sole writer of registry.db during a run.
///
/// Group commit, as the ledger: writes go into one open IMMEDIATE transaction and their replies
/// are held; a `Flush` marker queued behind them commits and releases the replies. Reads see the
/// batch's writes (same connection).
pub(crate) struct RegistryActor;

type HeldReply = crate::record::batch::HeldReply<RegistryError>;

/// How long a running thread's row update (a turn counted, spend so far) may wait in memory
/// before it is written: the updates of busy threads in that window coalesce into one row write
/// each, and a thread that ends within it writes only its terminal row. 100 ms: nobody sees
/// the difference (`weft status` is a person), a busy turn loop commits 50× less than at 2 ms,
/// and most leaves of a fan-out (half of them at 20 ms) end before their running row is due.
/// Nobody waits on them (SPEC §11: nothing depends on them; thread.json and the transcript are
/// the truth, and recovery treats `created` and `running` alike).
const ROW_LAG: std::time::Duration = std::time::Duration::from_millis(100);

/// State of the registry actor.
pub(crate) struct RegistryActorState {
    store: Store,
    held: crate::record::batch::GroupCommit<RegistryError>,
    /// Rows of unfinished threads not yet written, newest per thread (see [`ROW_LAG`]); written
    /// at the lag's flush, or before any read and any write they could matter to (all but a
    /// registration and another row's update), so those see them in order.
    pending: std::collections::HashMap<ThreadId, Box<ThreadRow>>,
    /// A flush for `pending` is scheduled.
    lagging: bool,
    /// Children the last commit refused (admission decided at the commit, on Postgres), for
    /// their held replies.
    refused: Refused,
}

/// Children a commit refused, with why, until their held replies take them.
type Refused = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<ThreadId, RegistryError>>>;

impl RegistryActorState {
    /// Keeps an unfinished thread's row for the next flush (at most [`ROW_LAG`] away).
    fn lag(&mut self, me: &ActorRef<RegistryMsg>, row: Box<ThreadRow>) {
        self.pending.insert(row.id.clone(), row);
        if !self.lagging {
            me.send_after(ROW_LAG, || RegistryMsg::Lagged);
            self.lagging = true;
        }
    }

    /// What comes before a message's own work: a running row kept, the lag's flush and a
    /// commit handled whole (None), and the kept rows written where they matter.
    fn before(&mut self, me: &ActorRef<RegistryMsg>, msg: RegistryMsg) -> Option<RegistryMsg> {
        match msg {
            RegistryMsg::Update { row, reply: None } if !row.status.is_terminal() => {
                self.lag(me, row);
                return None;
            }
            RegistryMsg::Lagged => {
                self.lagging = false;
                self.catch_up(me);
                self.flush();
                return None;
            }
            // A commit of what is held: the kept rows wait for their lag.
            RegistryMsg::Flush => {
                self.flush();
                return None;
            }
            // A newer row of the thread sets every column: a kept one is superseded. The other
            // kept rows wait for their flush: this write is of one row, and none of them.
            RegistryMsg::Update { ref row, .. } => {
                self.pending.remove(&row.id);
            }
            // A registration reads and writes what a kept row never changes: a parent's spawn
            // count, a continuation's link, and which threads are live (a kept row is of a
            // live thread, as its stored row is).
            RegistryMsg::Register { .. } => {}
            _ => self.catch_up(me),
        }
        Some(msg)
    }

    /// Writes the kept rows into the batch (committed with it).
    fn catch_up(&mut self, me: &ActorRef<RegistryMsg>) {
        if self.pending.is_empty() {
            return;
        }
        for (_, row) in std::mem::take(&mut self.pending) {
            self.write(me, |st| st.update(&row), None);
        }
    }

    /// Runs a write in the batch; its outcome is replied after the commit.
    fn write(
        &mut self,
        me: &ActorRef<RegistryMsg>,
        op: impl FnOnce(&mut Store) -> Result<(), RegistryError>,
        reply: Option<RpcReplyPort<Result<(), RegistryError>>>,
    ) {
        let res = self.store.begin_batch().and_then(|_| op(&mut self.store));
        if let Err(e) = &res {
            tracing::error!("registry write failed: {e}");
        }
        let held: HeldReply = Box::new(move |commit_err| {
            if let Some(r) = reply {
                let _ = r.send(match (res, commit_err) {
                    (Err(e), _) => Err(e),
                    (Ok(()), Some(e)) => Err(e),
                    (Ok(()), None) => Ok(()),
                });
            }
        });
        self.held.hold(held, || me.cast(RegistryMsg::Flush).is_ok());
    }

    fn flush(&mut self) {
        let res = self.store.commit_batch();
        if let Err(e) = &res {
            tracing::error!("registry commit failed: {e}");
        }
        // Never fails open: a poisoned map is still the map.
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.extend(self.store.take_refused());
        drop(refused);
        self.held.release(&res);
    }

    /// A registration stored with the batch; its reply says, after the commit, whether the
    /// commit admitted it (its admission may be decided there).
    fn registered(
        &mut self,
        me: &ActorRef<RegistryMsg>,
        id: ThreadId,
        reply: RpcReplyPort<Result<(), RegistryError>>,
    ) {
        let refused = self.refused.clone();
        let held: HeldReply = Box::new(move |commit_err| {
            let refusal = refused
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            let _ = reply.send(match (commit_err, refusal) {
                (Some(e), _) => Err(e),
                (None, Some(why)) => Err(why),
                (None, None) => Ok(()),
            });
        });
        self.held.hold(held, || me.cast(RegistryMsg::Flush).is_ok());
    }
}

impl Actor for RegistryActor {
    type Msg = RegistryMsg;
    type State = RegistryActorState;
    type Arguments = Store;

    async fn pre_start(
        &self,
        _me: ActorRef<RegistryMsg>,
        store: Store,
    ) -> Result<RegistryActorState, ActorProcessingErr> {
        Ok(RegistryActorState {
            store,
            held: Default::default(),
            pending: Default::default(),
            lagging: false,
            refused: Default::default(),
        })
    }

    async fn handle(
        &self,
        me: ActorRef<RegistryMsg>,
        msg: RegistryMsg,
        s: &mut RegistryActorState,
    ) -> Result<(), ActorProcessingErr> {
        let Some(msg) = s.before(&me, msg) else {
            return Ok(());
        };
        match msg {
            RegistryMsg::Register { row, admit, reply } => {
                // Refusals found by a read are answered at once; a stored row (or, on
                // Postgres, an admission the commit decides) waits for the commit.
                let res = s
                    .store
                    .begin_batch()
                    .and_then(|_| s.store.register(&row, admit.as_ref()));
                match res {
                    Ok(()) => s.registered(&me, row.id.clone(), reply),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        // A refusal writes nothing, but `begin_batch` took the write lock: with
                        // no write held for a queued commit, end the transaction now, or every
                        // other process waits on it until this one writes again.
                        if s.held.is_empty() {
                            s.flush();
                        }
                    }
                }
            }
            RegistryMsg::Update { row, reply } => s.write(&me, |st| st.update(&row), reply),
            RegistryMsg::FinishInterrupted { row, reply } => {
                s.write(&me, |st| st.finish_interrupted(&row), Some(reply))
            }
            RegistryMsg::LinkContinuation {
                old,
                new,
                chain_root,
                reply,
            } => s.write(
                &me,
                |st| st.link_continuation(old.as_str(), new.as_str(), chain_root.as_str()),
                Some(reply),
            ),
            // Handled whole in `before`.
            RegistryMsg::Flush | RegistryMsg::Lagged => {}
            RegistryMsg::Claim { id, from, reply } => {
                // Its own transaction, committed before the reply: the claim must be visible
                // to every other process before the claimant touches the thread's files.
                s.flush();
                let store = &mut s.store;
                let _ = reply.send(off_workers(|| {
                    store.claim(id.as_str(), from, crate::core::owner::me())
                }));
            }
            RegistryMsg::Get { id, reply } => {
                let _ = reply.send(s.store.get(id.as_str()));
            }
            RegistryMsg::IsDescendant {
                ancestor,
                id,
                reply,
            } => {
                let _ = reply.send(s.store.is_descendant(ancestor.as_str(), id.as_str()));
            }
            RegistryMsg::UnfinishedSubtree { id, reply } => {
                let _ = reply.send(s.store.unfinished_subtree(id.as_str()));
            }
            RegistryMsg::Unfinished { reply } => {
                let _ = reply.send(s.store.unfinished());
            }
            RegistryMsg::UnfinishedOwners { reply } => {
                let _ = reply.send(s.store.unfinished_owners());
            }
            RegistryMsg::Tree { root, reply } => {
                let _ = reply.send(s.store.tree(root.as_str()));
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _me: ActorRef<RegistryMsg>,
        s: &mut RegistryActorState,
    ) -> Result<(), ActorProcessingErr> {
        s.catch_up(&_me);
        s.flush();
        Ok(())
    }
}
