//! [`ThreadHandle`]: what a library user holds for a started root thread — its id, its status,
//! its subtree's events, cancel, and the report when it ends. The thread's actor stays private:
//! a handle can only ask, never forge a thread's messages.

use crate::core::ids::ThreadId;
use crate::core::status::Status;
use crate::thread::{
    end_subtree, Ctx, DeadEnd, DeadKind, Event, SpawnError, StatusSnapshot, ThreadMsg, ThreadReport,
};
use ractor::ActorRef;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::{broadcast, oneshot};

/// A started root thread.
pub struct ThreadHandle {
    id: ThreadId,
    actor: ActorRef<ThreadMsg>,
    done: oneshot::Receiver<ThreadReport>,
    /// Subscribed before the thread started; handed out by the first [`ThreadHandle::events`].
    first_events: Option<broadcast::Receiver<Event>>,
    ctx: Arc<Ctx>,
}

/// A live thread's status.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ThreadStatus {
    /// Current status.
    pub status: Status,
    /// Turns so far.
    pub turns: u64,
    /// Its children still running.
    pub live_children: Vec<ThreadId>,
}

impl ThreadHandle {
    pub(super) fn new(
        id: ThreadId,
        actor: ActorRef<ThreadMsg>,
        done: oneshot::Receiver<ThreadReport>,
        events: broadcast::Receiver<Event>,
        ctx: Arc<Ctx>,
    ) -> ThreadHandle {
        ThreadHandle {
            id,
            actor,
            done,
            first_events: Some(events),
            ctx,
        }
    }

    /// The thread's id.
    pub fn id(&self) -> &ThreadId {
        &self.id
    }

    /// Cancels the thread (a root) and its subtree, with the work its tree caused, as
    /// `Runtime::cancel` does (after a handoff, the continuation that took over).
    /// False when it has already ended and nothing it caused runs.
    pub fn cancel(&self, reason: &str) -> bool {
        super::cancel::thread(&self.ctx, &self.id, reason)
    }

    /// The thread's status while it runs; None once it has ended (its report then comes from
    /// [`ThreadHandle::wait`]).
    pub async fn status(&self) -> Option<ThreadStatus> {
        let s: StatusSnapshot = ractor::call!(self.actor, ThreadMsg::Status).ok()?;
        (!s.status.is_terminal()).then_some(ThreadStatus {
            status: s.status,
            turns: s.turns,
            live_children: s.live_children,
        })
    }

    /// The live events of this thread's subtree. The first call sees every event from the
    /// thread's start; later calls see events from the moment they are made.
    pub fn events(&mut self) -> SubtreeEvents {
        self.ctx
            .wants_lines
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.progress_events()
    }

    /// [`Self::events`] without asking for transcript lines or streamed text (see
    /// `Runtime::progress_events`).
    pub fn progress_events(&mut self) -> SubtreeEvents {
        let rx = self
            .first_events
            .take()
            .unwrap_or_else(|| self.ctx.events.subscribe());
        SubtreeEvents {
            rx,
            members: HashSet::from([self.id.clone()]),
        }
    }

    /// Waits for the thread to end and returns its report. A thread whose actor died without
    /// finalizing (a panic) is finalized here, with its whole subtree, as `error`.
    ///
    /// The events subscription taken at the start is dropped when `wait` is called, not when
    /// the thread ends: dropping one steps over every event sent since it was taken (up to the
    /// channel's 16,384), which for 10⁴ roots waited on at once cost seconds.
    pub fn wait(
        mut self,
    ) -> impl std::future::Future<Output = Result<ThreadReport, SpawnError>> + Send + 'static {
        self.first_events = None;
        async move {
            match self.done.await {
                Ok(report) => Ok(report),
                Err(_) => {
                    let end = DeadEnd {
                        status: Status::Error,
                        kind: DeadKind::Failed,
                        error: format!(
                            "thread {} stopped without finalizing (its actor failed)",
                            self.id
                        ),
                    };
                    // Boxed: a waiter that never gets here holds only the handle.
                    Ok(Box::pin(end_subtree(&self.ctx, &self.id, &end)).await)
                }
            }
        }
    }
}

/// The events of one subtree, in order. Slow readers never slow threads: a reader that falls
/// more than the channel's capacity behind skips what it missed (the transcripts keep it all).
pub struct SubtreeEvents {
    rx: broadcast::Receiver<Event>,
    members: HashSet<ThreadId>,
}

impl SubtreeEvents {
    /// The next event of the subtree; None once the runtime is gone.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            let ev = match self.rx.recv().await {
                Ok(ev) => ev,
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            if let Event::Started {
                id,
                parent: Some(p),
                ..
            } = &ev
            {
                if self.members.contains(p) {
                    self.members.insert(id.clone());
                }
            }
            if self.members.contains(ev.thread_id()) {
                return Some(ev);
            }
        }
    }
}
