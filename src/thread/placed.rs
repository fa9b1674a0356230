//! Children placed on another node (#26; ARCHITECTURE.md, "Nodes"). When this node is full (its
//! [`Placer`] says so), `spawn_thread` does not start the child here: it plans and checks it as
//! for any child, sets its budget aside out of the tree (a deferred child's account, marked
//! placed), and queues it for a node with room. The parent gets a stand-in actor for it — the
//! [`PlacedChild`] — in its children like any other: a cancel sent to it reaches the child
//! wherever it runs (or withdraws it while it waits in the queue), and the child's end, relayed
//! from the node that ran it, comes back through it: the ledger settles what the subtree spent
//! against the guarantee, and the parent gets the report as from a local child.

use super::ctx::Ctx;
use super::msg::ThreadMsg;
use super::placer::{Placed, Placer};
use super::report::ThreadReport;
use super::spawn::SpawnRequest;
use crate::core::ids::ThreadId;
use crate::core::status::Status;
use crate::ledger::LedgerMsg;
use crate::registry::RegistryMsg;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use std::sync::Arc;

/// Starts child `req` of thread `parent` here, or — this node full — places it on a node with
/// room. A hook's spawn and a child given files start here (the files stay on this node), and
/// so does a child whose whole budget cannot be set aside from its parent's chain (a guarantee
/// is all of a placed subtree's budget): there it shares the chain call by call as on one
/// node, so a tree is never refused on several nodes what one node would run.
pub(crate) async fn start_child(
    ctx: &Arc<Ctx>,
    mut req: SpawnRequest,
    parent: (ThreadId, ActorRef<ThreadMsg>),
) -> Result<(ThreadId, ActorRef<ThreadMsg>), super::SpawnError> {
    let placeable = req.attach.is_empty() && req.hook.is_none();
    let placer = ctx.placement.placer.get().filter(|_| placeable).cloned();
    let max = placer.as_ref().and_then(|p| p.max_live());
    if let (Some(max), Some(placer)) = (max, placer) {
        match ctx.placement.try_slot(max) {
            Some(slot) => req.slot = Some(slot),
            // Boxed: placing is rare, and its future (a deferred start) is large; inline, every
            // child start's task carried (and tokio copied, on spawn and at its end) its room.
            None => match Box::pin(place(ctx, placer, &req, parent)).await {
                Err(e) if e.is_limit() => tracing::info!(
                    "a child runs on this full node: its budget cannot be set aside whole ({e})"
                ),
                placed => return placed,
            },
        }
    }
    super::spawn::spawn(ctx, req, None).await
}

/// Places `req` (a child of the thread `parent`) on another node and returns its id and its
/// stand-in actor, which forwards to `parent`.
async fn place(
    ctx: &Arc<Ctx>,
    placer: Arc<dyn Placer>,
    req: &SpawnRequest,
    parent: (ThreadId, ActorRef<ThreadMsg>),
) -> Result<(ThreadId, ActorRef<ThreadMsg>), super::SpawnError> {
    let (child, _amount) = super::spawn::defer(ctx, req).await?;
    let marked = ractor::call!(ctx.ledger, |reply| LedgerMsg::Place {
        id: child.clone(),
        reply
    });
    let queued = match marked {
        Ok(Ok(())) => {
            let placed = Placed::new(&req.directive, &req.inputs, &req.overrides);
            placer.queue(&child, &parent.0, &placed)
        }
        other => Err(format!("ledger: {other:?}")),
    };
    if let Err(e) = queued {
        super::spawn::give_back(ctx, child).await;
        return Err(super::SpawnError::Storage(format!(
            "cannot place the child: {e}"
        )));
    }
    let stand_in = PlacedChild {
        ctx: ctx.clone(),
        placer,
        child: child.clone(),
        directive: req.directive.clone(),
        parent: parent.1,
    };
    let (actor, _) = Actor::spawn(None, stand_in, ()).await.map_err(|e| {
        super::SpawnError::Storage(format!("cannot start the placed child's stand-in: {e}"))
    })?;
    Ok((child, actor))
}

/// The stand-in of a placed child in its parent's node.
struct PlacedChild {
    ctx: Arc<Ctx>,
    placer: Arc<dyn Placer>,
    child: ThreadId,
    directive: String,
    parent: ActorRef<ThreadMsg>,
}

impl Actor for PlacedChild {
    type Msg = ThreadMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, me: ActorRef<ThreadMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        if let Ok(mut m) = self.ctx.placement.stand_ins.lock() {
            m.insert(self.child.clone(), me.clone());
        }
        watch(self.ctx.clone(), self.child.clone(), me);
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<ThreadMsg>,
        msg: ThreadMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            // Withdrawn while queued: it ends here; else its end comes from where it runs.
            ThreadMsg::Cancel { reason }
                if self.placer.cancel(self.child.clone(), reason.clone()).await =>
            {
                let report =
                    not_started(&self.child, &self.directive, Status::Cancelled, WITHDRAWN);
                self.ended(&me, report).await;
            }
            ThreadMsg::ChildFinished(report) if report.thread_id == self.child => {
                self.ended(&me, *report).await;
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<ThreadMsg>,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        if let Ok(mut m) = self.ctx.placement.stand_ins.lock() {
            m.remove(&self.child);
        }
        Ok(())
    }
}

impl PlacedChild {
    /// The child ended (or was withdrawn): its spend settled against its guarantee, then its
    /// report to the parent; the stand-in stops.
    async fn ended(&self, me: &ActorRef<ThreadMsg>, mut report: ThreadReport) {
        let settled = ractor::call!(self.ctx.ledger, |reply| LedgerMsg::SettlePlaced {
            id: self.child.clone(),
            reply
        });
        match settled {
            Ok(Ok(a)) => report.spend_nanos = a.spent,
            other => {
                tracing::error!(thread = %self.child, "placed child's spend not settled: {other:?}")
            }
        }
        let _ = self.parent.cast(ThreadMsg::ChildFinished(Box::new(report)));
        me.stop(None);
    }
}

/// How often a stand-in reads its child's registry row.
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Looks at a terminal row, its end still not relayed, before the stand-in reports it from the
/// row (the relay was lost); a child adopted by another node is reported at once.
const RELAY_LOST_AFTER: u32 = 5;

/// Watches placed child `child`'s registry row while its stand-in `me` lives: a child that
/// ended without its end relayed here — its node died and another adopted it, or the relay was
/// lost — is reported to the stand-in from its row.
fn watch(ctx: Arc<Ctx>, child: ThreadId, me: ActorRef<ThreadMsg>) {
    tokio::spawn(async move {
        let (mut runner, mut ended_looks) = (None, 0);
        loop {
            tokio::time::sleep(LOOK_EVERY).await;
            if matches!(
                me.get_status(),
                ractor::ActorStatus::Stopping | ractor::ActorStatus::Stopped
            ) {
                return;
            }
            let row = ractor::call!(ctx.registry, |reply| RegistryMsg::Get {
                id: child.clone(),
                reply
            });
            let Ok(Ok(Some(r))) = row else { continue };
            // A continued child goes on in its continuation, which reports.
            if !r.status.is_terminal() || r.status == Status::Continued {
                runner = Some(r.owner_pid);
                continue;
            }
            ended_looks += 1;
            let adopted = runner.is_some_and(|o| o != r.owner_pid);
            if adopted || ended_looks >= RELAY_LOST_AFTER {
                tracing::warn!(thread = %child, adopted, "placed child ended without its end relayed: reported from its registry row");
                let report = ThreadReport::of_row(&r);
                let _ = me.cast(ThreadMsg::ChildFinished(Box::new(report)));
                return;
            }
        }
    });
}

/// The report of a placed child that never ran: withdrawn from the queue (`cancelled`), or its
/// start failed on the node that took it (`error`).
pub(crate) fn not_started(
    child: &ThreadId,
    directive: &str,
    status: Status,
    error: &str,
) -> ThreadReport {
    ThreadReport::ended(
        child.clone(),
        directive.to_string(),
        status,
        Some(error.to_string()),
    )
}

/// Why a withdrawn child ended.
const WITHDRAWN: &str = "cancelled while it waited for a node with room";
