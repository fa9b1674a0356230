//! A thread's conversation: the system prompt, the messages so far (shared with the call in
//! flight), the tools offered, and the messages waiting for its next turn.

use crate::provider::{Message, ToolSpec};
use std::sync::Arc;

/// A thread's conversation.
pub(crate) struct Talk {
    /// The system prompt (shared with in-flight requests: no copy per call).
    pub(crate) system: Arc<str>,
    /// The messages so far; appended through `Arc::make_mut`.
    pub(crate) messages: Arc<Vec<Message>>,
    /// The tools offered to the model.
    pub(crate) tools: Arc<Vec<ToolSpec>>,
    /// Messages waiting for the next turn: (from — "person" or a child's id, text).
    pub(crate) inbox: Vec<(String, String)>,
}

impl Talk {
    /// Appends `m` to the conversation.
    pub(crate) fn push(&mut self, m: Message) {
        Arc::make_mut(&mut self.messages).push(m);
    }
}
