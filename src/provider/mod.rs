//! Providers: the LLM backends behind one trait (SPEC §1): scripted, OpenAI-compatible and
//! Anthropic HTTP, or a library user's own implementation of [`Provider`]; `select` picks one
//! (and a model) per thread.
//!
//! Owns the provider-neutral conversation types and error classification. A provider must never
//! touch the ledger, the transcript or the registry: it returns usage and the thread accounts.

pub(crate) mod anthropic;
pub(crate) mod http;
pub(crate) mod openai;
pub(crate) mod scripted;
mod select;

pub use select::Route;
pub(crate) use select::{Choice, Providers};

use crate::core::ids::ThreadId;
use crate::core::money::Usage;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user (prompt, tool results, notices).
    User,
    /// The model.
    Assistant,
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call by the model.
    ToolUse {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments.
        input: serde_json::Value,
    },
    /// A tool's result.
    ToolResult {
        /// Id of the call answered.
        id: String,
        /// Result text (JSON for built-ins).
        content: String,
        /// The call failed or was refused.
        is_error: bool,
    },
}

/// One conversation message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Speaker.
    pub role: Role,
    /// Content blocks.
    pub content: Vec<Block>,
}

impl Message {
    /// A user text message.
    pub fn user(text: impl Into<String>) -> Message {
        Message {
            role: Role::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON schema of the input.
    pub input_schema: serde_json::Value,
}

/// One LLM call.
#[derive(Debug, Clone)]
pub struct LlmRequest {
    /// Model id.
    pub model: String,
    /// System prompt.
    pub system: std::sync::Arc<str>,
    /// Conversation so far.
    pub messages: std::sync::Arc<Vec<Message>>,
    /// Tools offered.
    pub tools: std::sync::Arc<Vec<ToolSpec>>,
    /// Output token cap granted by the ledger.
    pub max_tokens: u64,
    /// Directive name (the scripted provider keys its script by it).
    pub directive: String,
    /// The calling thread.
    pub thread_id: ThreadId,
    /// How many calls (attempts included) this thread made before this one.
    pub call_index: u64,
    /// Where streamed text goes as it arrives (live clients' `token` events); None: nowhere.
    pub on_text: Option<TextSink>,
    /// The text bytes of system, messages and tools when the caller counted them as the
    /// conversation grew (a thread does); None: counted from the request when needed.
    pub known_prompt_bytes: Option<u64>,
}

/// A receiver of streamed text deltas. Called on the provider's task: it must not block.
#[derive(Clone)]
pub struct TextSink(pub std::sync::Arc<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for TextSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TextSink")
    }
}

impl TextSink {
    /// Hands `text` on (nothing for an empty delta).
    pub fn send(&self, text: &str) {
        if !text.is_empty() {
            (self.0)(text);
        }
    }
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Call id.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments.
    pub input: serde_json::Value,
}

/// Bounds what a model sent (untrusted): a call whose arguments nest deeper than
/// [`MAX_NESTING`](crate::core::limits::MAX_NESTING) keeps only why, before anything of it is
/// logged or run.
pub(crate) fn bound_nesting(calls: &mut [ToolCall]) {
    for c in calls {
        c.input = crate::core::limits::bounded_input(std::mem::take(&mut c.input));
    }
}

/// The input of a call whose streamed arguments are not JSON (see
/// [`unparsed`](crate::core::limits::unparsed)).
pub(crate) fn not_json(args: &str) -> serde_json::Value {
    crate::core::limits::unparsed(format!("not JSON ({} characters)", args.chars().count()))
}

/// A completed call.
#[derive(Debug, Clone, Default)]
pub struct LlmResponse {
    /// Text answer (possibly empty).
    pub text: String,
    /// Tool calls (possibly none).
    pub tool_calls: Vec<ToolCall>,
    /// Billed usage.
    pub usage: Usage,
    /// Why generation stopped (`end_turn`, `tool_use`, `max_tokens`).
    pub stop_reason: String,
    /// Streamed deltas received (0 when the provider does not stream).
    pub stream_deltas: u64,
    /// The provider did not report what it billed (a server that sends no usage): `usage` is
    /// what could be counted, and the thread settles the call at its upper bound.
    pub usage_incomplete: bool,
}

/// The classes of LLM failure (SPEC §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// 429.
    RateLimited,
    /// 529 / overloaded.
    Overloaded,
    /// 5xx.
    Server,
    /// No answer in time.
    Timeout,
    /// Connection failed or dropped.
    Connection,
    /// 401/403.
    Auth,
    /// 400/422.
    InvalidRequest,
    /// Prompt larger than the model's window.
    ContextOverflow,
    /// The call was cancelled.
    Cancelled,
    /// The scripted provider has no such turn, or its script is wrong.
    Script,
}

impl ErrorKind {
    /// Its name, as serialized (`rate_limited`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Server => "server",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Connection => "connection",
            ErrorKind::Auth => "auth",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::ContextOverflow => "context_overflow",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Script => "script",
        }
    }

    /// Parses a script's `error.kind`.
    pub fn parse(s: &str) -> Option<ErrorKind> {
        serde_json::from_value(serde_json::Value::String(s.into())).ok()
    }
    /// Worth retrying?
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited
                | ErrorKind::Overloaded
                | ErrorKind::Server
                | ErrorKind::Timeout
                | ErrorKind::Connection
        )
    }
}

/// A failed call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ProviderError {
    /// Class.
    pub kind: ErrorKind,
    /// What happened and what to do.
    pub message: String,
    /// Server-requested wait before retrying.
    pub retry_after: Option<Duration>,
    /// Usage billed despite the failure, as far as the provider reported it.
    pub usage: Usage,
    /// The call may have been billed beyond `usage`: it was cut short (cancelled, dropped,
    /// timed out) after the server may have taken it. The thread then settles it at its upper
    /// bound: the prompt bound unless prompt tokens were reported, and every output token
    /// granted. False when nothing can have been billed (refused connection, an error status).
    pub usage_incomplete: bool,
}

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// An LLM backend.
pub trait Provider: Send + Sync {
    /// Provider name for transcripts.
    fn name(&self) -> &str;
    /// An upper bound — never an estimate — on the prompt tokens (input and cache reads
    /// together) the request will be billed for: the ledger reserves it as the call's worst case.
    /// `template_overhead` is what the model's chat template adds to a call (config
    /// `prompt_overhead_tokens`). The default holds for every byte-level tokenizer (at most one
    /// token per byte of text) with a few template tokens per message; a backend that can count
    /// exactly may answer less.
    fn prompt_token_bound(&self, req: &LlmRequest, template_overhead: u64) -> u64 {
        prompt_bytes(req) + PER_MESSAGE_TOKENS * (req.messages.len() as u64 + 1) + template_overhead
    }
    /// Makes the call; must return promptly with `Cancelled` when `cancel` fires.
    fn complete(
        &self,
        req: LlmRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<Result<LlmResponse, ProviderError>>;
}

/// A conservative estimate: one token per 3 bytes plus per-message overhead.
/// Template tokens around each message (role markers, separators) counted by the default bound.
pub(crate) const PER_MESSAGE_TOKENS: u64 = 8;

/// The bytes of everything a request sends as text: system prompt, every message block, tool
/// specs. A byte-level tokenizer emits at most one token per byte of it.
/// A thread counts them as its conversation grows ([`LlmRequest::known_prompt_bytes`]), so a
/// turn does not re-serialize every earlier tool input (that was O(conversation) per turn).
pub(crate) fn prompt_bytes(req: &LlmRequest) -> u64 {
    if let Some(known) = req.known_prompt_bytes {
        debug_assert_eq!(
            known,
            counted_prompt_bytes(req),
            "a stale prompt byte count"
        );
        return known;
    }
    counted_prompt_bytes(req)
}

fn counted_prompt_bytes(req: &LlmRequest) -> u64 {
    req.system.len() as u64
        + req.messages.iter().map(message_bytes).sum::<u64>()
        + tools_bytes(&req.tools)
}

/// The text bytes of one message (see [`prompt_bytes`]).
pub(crate) fn message_bytes(m: &Message) -> u64 {
    let bytes: usize = m
        .content
        .iter()
        .map(|b| match b {
            Block::Text { text } => text.len(),
            Block::ToolUse { id, name, input } => id.len() + name.len() + json_len(input),
            Block::ToolResult { id, content, .. } => id.len() + content.len(),
        })
        .sum();
    bytes as u64
}

/// The text bytes of the tool specs (see [`prompt_bytes`]).
pub(crate) fn tools_bytes(tools: &[ToolSpec]) -> u64 {
    let bytes: usize = tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + json_len(&t.input_schema))
        .sum();
    bytes as u64
}

/// The length of `v`'s compact JSON, counted without building the string.
fn json_len(v: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// The scripted provider's stand-in for a tokenizer (1 token per 3 bytes): what it bills when a
/// script gives no usage.
pub(crate) fn heuristic_prompt_tokens(req: &LlmRequest) -> u64 {
    let mut bytes = req.system.len() + req.model.len();
    for m in req.messages.iter() {
        bytes += 16;
        for b in &m.content {
            bytes += match b {
                Block::Text { text } => text.len(),
                Block::ToolUse { name, input, .. } => name.len() + input.to_string().len(),
                Block::ToolResult { content, .. } => content.len(),
            };
        }
    }
    for t in req.tools.iter() {
        bytes += t.name.len() + t.description.len() + t.input_schema.to_string().len();
    }
    (bytes as u64).div_ceil(3) + 8
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    #[test]
    fn an_error_kind_is_named_as_it_is_serialized() {
        use ErrorKind::*;
        for k in [
            RateLimited,
            Overloaded,
            Server,
            Timeout,
            Connection,
            Auth,
            InvalidRequest,
            ContextOverflow,
            Cancelled,
            Script,
        ] {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            assert_eq!(ErrorKind::parse(k.as_str()), Some(k));
        }
    }
}
