//! A thread's conversation: the system prompt, the messages so far (shared with the call in
//! flight), the tools offered, and the messages waiting for its next turn.

use crate::provider::{message_bytes, Message, ToolSpec};
use std::sync::Arc;

/// A thread's conversation.
pub(crate) struct Talk {
    /// The system prompt (shared with in-flight requests: no copy per call).
    pub(crate) system: Arc<str>,
    /// The messages so far; changed only through [`Talk::push`] and [`Talk::edit_last`]
    /// (appended through `Arc::make_mut`), which keep `bytes` true.
    pub(crate) messages: Arc<Vec<Message>>,
    /// The tools offered to the model.
    pub(crate) tools: Arc<Vec<ToolSpec>>,
    /// The text bytes of system, messages and tools (`provider::prompt_bytes`), kept as the
    /// conversation grows.
    bytes: u64,
    /// Messages waiting for the next turn: (from — "person" or a child's id, text).
    pub(crate) inbox: Vec<(String, String)>,
}

impl Talk {
    /// A conversation of `messages` under `system`, offered `tools` (with their text bytes).
    pub(crate) fn new(
        system: Arc<str>,
        messages: Vec<Message>,
        (tools, tools_bytes): (Arc<Vec<ToolSpec>>, u64),
    ) -> Talk {
        let bytes =
            system.len() as u64 + messages.iter().map(message_bytes).sum::<u64>() + tools_bytes;
        Talk {
            system,
            messages: Arc::new(messages),
            tools,
            bytes,
            inbox: Vec::new(),
        }
    }

    /// Appends `m` to the conversation.
    pub(crate) fn push(&mut self, m: Message) {
        self.bytes += message_bytes(&m);
        Arc::make_mut(&mut self.messages).push(m);
    }

    /// Changes the last message with `edit`.
    pub(crate) fn edit_last(&mut self, edit: impl FnOnce(&mut Message)) {
        if let Some(m) = Arc::make_mut(&mut self.messages).last_mut() {
            self.bytes -= message_bytes(m);
            edit(m);
            self.bytes += message_bytes(m);
        }
    }

    /// The text bytes of system, messages and tools.
    pub(crate) fn prompt_bytes(&self) -> u64 {
        self.bytes
    }
}
