//! Group commit for the actors that own a database (ledger, registry).
//!
//! A change is applied at once; its reply is held. The first held reply queues a flush marker
//! message behind everything already in the mailbox; when the actor reaches it, it persists the
//! whole batch in one transaction and releases every held reply with the outcome. So no caller
//! proceeds on a change that is not stored, and concurrent callers share one commit.

/// A reply waiting for the batch's commit; it receives the commit error, if any.
pub(crate) type HeldReply<E> = Box<dyn FnOnce(Option<E>) + Send>;

/// Replies held until the next commit.
pub(crate) struct GroupCommit<E> {
    held: Vec<HeldReply<E>>,
    queued: bool,
}

impl<E> Default for GroupCommit<E> {
    fn default() -> Self {
        GroupCommit {
            held: Vec::new(),
            queued: false,
        }
    }
}

impl<E: Clone> GroupCommit<E> {
    /// Holds `reply`; `queue_flush` is called (to cast the flush marker) if none is queued.
    /// It returns whether the marker was queued.
    pub(crate) fn hold(&mut self, reply: HeldReply<E>, queue_flush: impl FnOnce() -> bool) {
        self.held.push(reply);
        if !self.queued {
            self.queued = queue_flush();
        }
    }

    /// Whether no reply is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Releases every held reply with the commit's outcome; the next hold queues a new marker.
    pub(crate) fn release(&mut self, outcome: &Result<(), E>) {
        self.queued = false;
        for reply in self.held.drain(..) {
            reply(outcome.as_ref().err().cloned());
        }
    }
}
