//! Continuation (SPEC §7): a thread whose next prompt would pass `continuation_threshold` of its
//! model's context window — or whose `limit` hook says `control: handoff` — ends `continued` and
//! a continuation thread takes over: same directive and capabilities, the conversation trimmed
//! (the first user message, then the most recent messages that fit in half the window, a tool
//! call never separated from its result), `continuation_of` / `chain_root` links, and the chain's
//! remaining budget on the same ledger account chain. A child's continuation takes its place
//! under the same parent (the parent re-keys the child); a root's hands its waiter over.

use super::ctx::Starting;
use super::spawn::{Continuation, Origin, ParentLink, SpawnError, SpawnRequest};
use super::state::Thread;
use crate::core::ids::ThreadId;
use crate::provider::{Block, Message, Role};

impl Thread {
    /// Whether this thread may hand off now: it has taken a turn (a thread, or a continuation,
    /// whose very first prompt is already too big would only hand the same prompt on, forever),
    /// and nothing of its own is under way that would be lost.
    pub(crate) fn can_hand_off(&self) -> bool {
        self.doc.cost.turns > 0
            && !self.kids.any_live()
            && self.kids.spawning.is_empty()
            && self.work.tasks.is_empty()
    }
}

/// The conversation a continuation starts from, within `budget_bytes` (≈ tokens, one per byte).
pub(crate) fn trimmed(messages: &[Message], budget_bytes: usize, from: &ThreadId) -> Vec<Message> {
    let size = |m: &Message| -> usize {
        m.content
            .iter()
            .map(|b| match b {
                Block::Text { text } => text.len(),
                Block::ToolUse { id, name, input } => {
                    id.len() + name.len() + input.to_string().len()
                }
                Block::ToolResult { id, content, .. } => id.len() + content.len(),
            })
            .sum::<usize>()
            + 16
    };
    let Some((first, rest)) = messages.split_first() else {
        return Vec::new();
    };
    let mut used = size(first);
    let mut start = rest.len();
    while start > 0 && used + size(&rest[start - 1]) <= budget_bytes {
        used += size(&rest[start - 1]);
        start -= 1;
    }
    // Never keep a tool result whose call was cut.
    while start < rest.len()
        && rest[start]
            .content
            .iter()
            .any(|b| matches!(b, Block::ToolResult { .. }))
    {
        start += 1;
    }
    let mut out = Vec::with_capacity(rest.len() - start + 1);
    let mut head = first.clone();
    head.content.push(Block::Text {
        text: format!(
            "(This conversation continues thread {from}; {} earlier message(s) were left out to fit the context window.)",
            start
        ),
    });
    out.push(head);
    out.extend_from_slice(&rest[start..]);
    // A continuation's next call needs a user message last.
    if out.last().is_some_and(|m| m.role == Role::Assistant) {
        out.push(Message::user("Continue."));
    }
    out
}

impl Thread {
    /// Starts the continuation of this thread (terminal, `continued`, its ledger account
    /// closed) and hands it the parent link or the root's waiter. Returns the new thread, or
    /// why it could not start.
    pub(crate) async fn start_continuation(
        &mut self,
        messages: Vec<Message>,
    ) -> Result<ThreadId, SpawnError> {
        let row = ractor::call!(self.ctx.registry, |reply| {
            crate::registry::RegistryMsg::Get {
                id: self.doc.id.clone(),
                reply,
            }
        });
        let spawn_count = match row {
            Ok(Ok(Some(r))) => r.spawn_count,
            _ => 0,
        };
        let parent = self.parent.as_ref().map(|(id, actor)| ParentLink {
            id: id.clone(),
            actor: actor.clone(),
        });
        let continuation = Continuation {
            of: self.doc.clone(),
            messages,
            calls_made: self.calls.made,
            spawn_count,
        };
        let origin = Origin::Continue(Box::new(continuation), parent);
        let mut req = SpawnRequest::new(self.doc.directive.clone(), Default::default(), origin);
        req.route = self.route.clone();
        // A root's waiter goes to the continuation once it has started (until then, and if it
        // cannot start, this thread's own report is the waiter's).
        let (on_finish, report) = match self.life.on_finish {
            Some(_) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        // This thread's cancel meanwhile (its own, its parent's cascade) withdraws the start,
        // which may wait on an MCP server up to its start timeout: the start is registered
        // under this thread's id (a cancel noted before withdraws it at once).
        let handing_off = Starting::new(&self.ctx, &self.doc.id, None);
        req.withdrawn = Some(handing_off.token.clone());
        // The continuation itself tells the parent (`ChildContinued`, as it starts), so the
        // parent hears of it before its report.
        // Boxed: the spawn's state would otherwise sit inline in every thread actor's task (it
        // is awaited from the actor's own handler), for a rare handoff.
        let spawned = Box::pin(super::spawn::spawn(&self.ctx, req, on_finish)).await;
        // A cancel noted for this thread stays noted: the continuation takes it as it starts,
        // or this actor's stop forgets it (`Ctx::hand_on_cancel`).
        handing_off.ran();
        let (id, _) = spawned?;
        if let Some(report) = report {
            self.hand_over_waiter(report);
        }
        // Known before this actor stops: a cancel still queued here then goes on to the
        // continuation (`Ctx::hand_on_cancel`).
        if let Ok(mut m) = self.ctx.successors.lock() {
            m.insert(self.doc.id.clone(), id.clone());
        }
        Ok(id)
    }

    /// A root's waiter gets the continuation's report, but only once this thread has finished
    /// ending (its registry row and thread.json): a process that exits on that report leaves
    /// nothing of the chain half-written.
    fn hand_over_waiter(
        &mut self,
        report: tokio::sync::oneshot::Receiver<crate::thread::report::ThreadReport>,
    ) {
        let Some(waiter) = self.life.on_finish.take() else {
            return;
        };
        let (ended_tx, ended_rx) = tokio::sync::oneshot::channel::<()>();
        self.life.ended = Some(ended_tx);
        tokio::spawn(async move {
            if let Ok(report) = report.await {
                let _ = ended_rx.await;
                let _ = waiter.send(report);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str) -> Message {
        Message {
            role: Role::Assistant,
            content: vec![Block::ToolUse {
                id: id.into(),
                name: "t".into(),
                input: json!({}),
            }],
        }
    }
    fn result(id: &str, size: usize) -> Message {
        Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                id: id.into(),
                content: "r".repeat(size),
                is_error: false,
            }],
        }
    }

    #[test]
    fn trimming_keeps_the_prompt_and_never_splits_a_call_from_its_result() {
        let id = ThreadId::parse("t-1").unwrap();
        let msgs = vec![
            Message::user("PROMPT"),
            call("a"),
            result("a", 500),
            call("b"),
            result("b", 100),
        ];
        // Room for b's call and result, not a's result: a's call must not stay alone either.
        let out = trimmed(&msgs, 400, &id);
        assert!(conversation_text(&out[0]).starts_with("PROMPT"));
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(matches!(&out[1].content[0], Block::ToolUse { id, .. } if id == "b"));
        assert!(matches!(&out[2].content[0], Block::ToolResult { id, .. } if id == "b"));
        // Room for b's result only: it goes too (its call was cut), leaving the prompt.
        let out = trimmed(&msgs, 150, &id);
        assert_eq!(out.len(), 1);
        // Everything fits: nothing left out.
        assert_eq!(trimmed(&msgs, usize::MAX, &id).len(), 5);
    }

    fn conversation_text(m: &Message) -> String {
        crate::thread::conversation::message_text(m)
    }
}
