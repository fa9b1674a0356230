//! Messages into live threads (Standard Agents' contract): `weft inject` from any terminal and
//! `notify_parent` from a child are queued in the thread's inbox and delivered as user messages
//! before its next turn (a thread between turns takes its next turn at once); every one is in
//! the transcript.

use super::state::Thread;
use crate::provider::Message;
use crate::record::line::Line;

/// Longest message one `inject` or `notify_parent` may carry.
const MAX_MESSAGE: usize = 64 * 1024;

impl Thread {
    /// Queues `text` (from `from`: "person" or a child's id) for the next turn.
    pub(crate) fn queue_message(&mut self, from: &str, text: String) -> Result<(), String> {
        if self.phase.ending() {
            return Err(format!("thread {} is ending", self.doc.id));
        }
        if text.len() > MAX_MESSAGE {
            return Err(format!(
                "the message has {} bytes; at most {MAX_MESSAGE} may be sent",
                text.len()
            ));
        }
        self.log(Line::MessageQueued {
            from: from.to_string(),
            text: text.clone(),
        });
        self.talk.inbox.push((from.to_string(), text));
        Ok(())
    }

    /// Delivers the queued messages as user messages (called before each turn).
    pub(crate) fn deliver_inbox(&mut self) {
        for (from, text) in std::mem::take(&mut self.talk.inbox) {
            let text = if from == "person" {
                text
            } else {
                format!("Message from child thread {from}: {text}")
            };
            self.log(Line::Message {
                role: "user".into(),
                text: text.clone(),
                from: Some(from),
            });
            self.talk.push(Message::user(text));
        }
    }
}
