//! Continuation (SPEC §7): a thread whose next prompt would pass `continuation_threshold` of its
//! model's context window — or whose `limit` hook says `control: handoff` — ends `continued` and
//! a continuation thread takes over: same directive and capabilities, the conversation trimmed
//! (the first user message, then the most recent messages that fit in half the window, a tool
//! call never separated from its result), `continuation_of` / `chain_root` links, and the chain's
//! remaining budget on the same ledger account chain. A child's continuation takes its place
//! under the same parent (the parent re-keys the child); a root's hands its waiter over.

use super::state::{Child, ThreadState};
use super::{Continuation, ParentLink, SpawnRequest, ThreadMsg};
use crate::core::ids::ThreadId;
use crate::provider::{Block, Message, Role};
use ractor::ActorRef;
use serde_json::json;

/// Whether this thread may hand off now: it has taken a turn (a thread, or a continuation, whose
/// very first prompt is already too big would only hand the same prompt on, forever), and
/// nothing of its own is under way that would be lost.
pub(super) fn possible(s: &ThreadState) -> bool {
    s.doc.cost.turns > 0
        && s.live_children().is_empty()
        && s.spawning.is_empty()
        && s.tool_tasks.is_empty()
}

/// The conversation a continuation starts from, within `budget_bytes` (≈ tokens, one per byte).
pub(super) fn trimmed(messages: &[Message], budget_bytes: usize, from: &ThreadId) -> Vec<Message> {
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

/// Starts the continuation of `s` (terminal, `continued`, its ledger account closed) and hands
/// it the parent link or the root's waiter. Returns the new thread, or why it could not start.
pub(super) async fn start(s: &mut ThreadState, messages: Vec<Message>) -> Result<ThreadId, String> {
    let row = ractor::call!(s.ctx.registry, |reply| crate::registry::RegistryMsg::Get {
        id: s.doc.id.clone(),
        reply
    });
    let spawn_count = match row {
        Ok(Ok(Some(r))) => r.spawn_count,
        _ => 0,
    };
    let req = SpawnRequest {
        directive: s.doc.directive.clone(),
        inputs: Default::default(),
        overrides: Default::default(),
        reserve: crate::core::money::Nanos::ZERO,
        parent: s.parent.as_ref().map(|(id, actor)| ParentLink {
            id: id.clone(),
            actor: actor.clone(),
        }),
        cap: None,
        seed: None,
        continuation: Some(Continuation {
            of: s.doc.clone(),
            messages,
            calls_made: s.calls_made,
            spawn_count,
        }),
        attach: Vec::new(),
        route: s.route.clone(),
        parent_span: None,
    };
    // A root's waiter gets the continuation's report, but only once this thread has finished
    // ending (its registry row and thread.json): a process that exits on that report leaves
    // nothing of the chain half-written.
    let on_finish = match s.on_finish.take() {
        Some(waiter) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (ended_tx, ended_rx) = tokio::sync::oneshot::channel::<()>();
            s.ended = Some(ended_tx);
            tokio::spawn(async move {
                if let Ok(report) = rx.await {
                    let _ = ended_rx.await;
                    let _ = waiter.send(report);
                }
            });
            Some(tx)
        }
        None => None,
    };
    let (id, actor) = super::spawn(&s.ctx, req, on_finish)
        .await
        .map_err(|e| e.to_string())?;
    if let Ok(mut m) = s.ctx.successors.lock() {
        m.insert(s.doc.id.clone(), id.clone());
    }
    // The continuation itself tells the parent (`ChildContinued`, as it starts), so the parent
    // hears of it before its report.
    let _ = actor;
    Ok(id)
}

/// The parent's side: the continuation takes the old child's place (waits included). The old
/// child stays a live child until its own end is reported (so the parent never ends before it),
/// but its `continued` report is nobody's result.
pub(super) fn rekey(
    s: &mut ThreadState,
    old: &ThreadId,
    new: ThreadId,
    actor: ActorRef<ThreadMsg>,
) {
    let entry = s.children.entry(old.clone()).or_insert(Child {
        actor: None,
        report: None,
        claimed: false,
    });
    let entry = Child {
        actor: None,
        report: None,
        claimed: std::mem::replace(&mut entry.claimed, true),
    };
    s.children.insert(
        new.clone(),
        Child {
            actor: Some(actor),
            report: None,
            claimed: entry.claimed,
        },
    );
    for w in &mut s.waiters {
        for id in &mut w.ids {
            if id == old {
                *id = new.clone();
            }
        }
    }
    s.continued_children.insert(old.clone(), new.clone());
    s.log("child_continued", json!({ "old": old, "new": new }));
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
        super::super::conversation::message_text(m)
    }
}
