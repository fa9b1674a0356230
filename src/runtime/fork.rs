//! `weft fork`: a new root thread that starts from a copy of another thread's conversation, with
//! its own budget. The source is only read.

use super::{Runtime, ThreadHandle};
use crate::core::ids::ThreadId;
use crate::core::limits::LimitSet;
use crate::provider::{Message, Role};
use crate::record::thread_doc::ForkedFrom;
use crate::thread::{Origin, Seed, SpawnError, SpawnRequest};
use serde_json::{Map, Value};

/// What to fork (see [`Runtime::fork`]).
#[derive(Debug, Clone, Default)]
pub struct Fork {
    /// Copy the conversation up to this transcript seq (default: all of it).
    pub at: Option<i64>,
    /// A new user message to go on with. Without one, the fork answers the last user message
    /// of the copy afresh.
    pub message: Option<String>,
    /// Run it under this directive instead of the source's (needed for imported threads).
    pub directive: Option<String>,
    /// Limit overrides (over the directive's own limits; the fork has its own budget).
    pub overrides: LimitSet,
}

impl Runtime {
    /// Starts a new root thread from a copy of `id`'s conversation (up to `fork.at`), with its
    /// own budget, `forked_from` in its registry row and thread.json. Message edits of the
    /// source are honoured; the source itself is not touched.
    pub async fn fork(&self, id: &ThreadId, fork: Fork) -> Result<ThreadHandle, SpawnError> {
        let store = &self.ctx.store;
        let src = self.ctx.verified_doc(id).map_err(SpawnError::Untrusted)?;
        let directive = match (&fork.directive, &src.imported) {
            (Some(d), _) => d.clone(),
            (None, Some(from)) => {
                return Err(SpawnError::Limit(format!(
                "thread {id} was imported ({}); name the directive to go on with: --directive NAME",
                from["format"].as_str().unwrap_or("history")
            )))
            }
            (None, None) => src.directive.clone(),
        };
        let lines = store
            .signed_lines(id)
            .map_err(|e| SpawnError::Untrusted(e.to_string()))?;
        let head = lines.last().and_then(|l| l["seq"].as_i64()).unwrap_or(-1);
        let at = fork.at.unwrap_or(head);
        if at < 0 || at > head {
            return Err(SpawnError::Limit(format!(
                "--at {at} is outside thread {id}'s transcript (seq 0 to {head}; `weft log {id}` shows them)"
            )));
        }
        // Edits apply wherever they were recorded, also to lines before `at`.
        let upto: Vec<Value> = crate::store::apply_edits(&lines)
            .into_iter()
            .filter(|l| l["seq"].as_i64().is_some_and(|s| s <= at))
            .collect();
        let (mut messages, calls_made) = crate::thread::rebuild_conversation(&upto);
        match &fork.message {
            Some(text) => messages.push(Message::user(text.clone())),
            None => {
                while messages.last().is_some_and(|m| m.role == Role::Assistant) {
                    messages.pop();
                }
            }
        }
        if messages.is_empty() {
            return Err(SpawnError::Limit(format!(
                "thread {id} has no user message up to seq {at} to fork from; give one with -m"
            )));
        }
        let seed = Seed {
            messages,
            calls_made,
            from: ForkedFrom {
                thread: id.clone(),
                seq: at,
            },
        };
        let mut req = SpawnRequest::new(directive, Map::new(), Origin::Fork(seed));
        req.overrides = fork.overrides;
        self.spawn_root(req).await
    }
}
