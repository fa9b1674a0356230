//! The thread actor's messages, what it starts from, and what it reports when it ends.

use super::Ctx;
use crate::core::ids::ThreadId;
use crate::core::limits::Limits;
use crate::core::money::{Nanos, Price};
use crate::core::status::Status;
use crate::directive::Directive;
use crate::provider::{LlmResponse, Message, ProviderError};
use crate::record::thread_doc::ThreadDoc;
use crate::record::transcript::TranscriptWriter;
use crate::tools::ToolOutcome;
use ractor::{ActorRef, RpcReplyPort};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::oneshot;

/// What a finished thread reports to its parent (and to `weft run`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadReport {
    /// Thread id.
    pub thread_id: ThreadId,
    /// Directive name.
    pub directive: String,
    /// Terminal status.
    pub status: Status,
    /// Final text.
    pub result: Option<String>,
    /// Structured outputs.
    pub outputs: Option<Value>,
    /// Error message.
    pub error: Option<String>,
    /// LLM calls made.
    pub turns: u64,
    /// Prompt tokens of the thread's own calls.
    pub input_tokens: u64,
    /// Output tokens of the thread's own calls.
    pub output_tokens: u64,
    /// Prompt tokens of the thread's own calls read from the provider's cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// The thread's own spend.
    pub own_spend_nanos: Nanos,
    /// The whole subtree's spend.
    pub spend_nanos: Nanos,
    /// What providers billed beyond the thread's reservations (zero unless a provider broke
    /// its prompt bound; the thread then ended and its subtree made no further call).
    #[serde(default)]
    pub overrun_nanos: Nanos,
    /// Files the thread returned, copied into its parent's file area (paths there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
}

/// A snapshot for `Status` queries.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StatusSnapshot {
    /// Current status.
    pub status: Status,
    /// Turns so far.
    pub turns: u64,
    /// Live children.
    pub live_children: Vec<ThreadId>,
}

/// Messages of a thread actor.
pub(crate) enum ThreadMsg {
    /// Begin the turn loop.
    Start,
    /// Run the next turn.
    NextTurn,
    /// An LLM call ended.
    LlmDone {
        /// The reservation it ran under.
        reservation: crate::ledger::ReservationId,
        /// What the call returned.
        outcome: Result<LlmResponse, ProviderError>,
    },
    /// A `spawn_thread` task started a child.
    ChildSpawned {
        /// The tool call.
        call_id: String,
        /// The child.
        child: ThreadId,
        /// Its actor.
        actor: ActorRef<ThreadMsg>,
        /// Whether the call waits for the child.
        wait: bool,
    },
    /// A `spawn_thread` task could not start its child.
    SpawnRefused {
        /// The tool call.
        call_id: String,
        /// Why, for the model.
        error: String,
    },
    /// A tool running as a task (a command, a file operation) ended.
    ToolFinished {
        /// The tool call.
        call_id: String,
        /// Its result.
        outcome: ToolOutcome,
    },
    /// A person's decision on a call waiting for approval.
    Decide {
        /// The call (None: the only one waiting).
        call: Option<String>,
        /// Approve (run it) or deny (an error result for the model).
        approve: bool,
        /// Why, for the model and the transcript.
        reason: Option<String>,
        /// The call decided, or why nothing was.
        reply: RpcReplyPort<Result<String, String>>,
    },
    /// A message for the thread's next turn (`weft inject`, a child's `notify_parent`).
    Inject {
        /// "person" or the sending child's id.
        from: String,
        /// The message.
        text: String,
        /// Whether it was queued (None: a child's notification, nobody waits).
        reply: Option<RpcReplyPort<Result<(), String>>>,
    },
    /// A child handed off to its continuation, which takes its place.
    ChildContinued {
        /// The child that ended `continued`.
        old: ThreadId,
        /// Its continuation.
        new: ThreadId,
        /// The continuation's actor.
        actor: ActorRef<ThreadMsg>,
    },
    /// A child ended.
    ChildFinished(Box<ThreadReport>),
    /// A `wait_threads` timeout fired.
    WaitTimeout {
        /// The tool call.
        call_id: String,
    },
    /// Cancel this thread and its subtree.
    Cancel {
        /// Why (recorded in the transcript).
        reason: String,
    },
    /// The duration limit fired.
    DurationExpired,
    /// Children did not acknowledge a cancel in time.
    GraceExpired,
    /// Report status.
    Status(RpcReplyPort<StatusSnapshot>),
}

/// Everything a thread actor starts from (built by [`crate::thread::spawn`]).
pub(crate) struct ThreadArgs {
    /// Runtime wiring.
    pub ctx: Arc<Ctx>,
    /// The LLM backend this thread calls.
    pub provider: Arc<dyn crate::provider::Provider>,
    /// The directive.
    pub directive: Arc<Directive>,
    /// The conversation to start from: the rendered prompt, or a continuation's history.
    pub messages: Vec<Message>,
    /// LLM calls already made by the chain (a continuation's scripted turns play on from there).
    pub calls_made: u64,
    /// Parent id and actor.
    pub parent: Option<(ThreadId, ActorRef<ThreadMsg>)>,
    /// Resolved limits.
    pub limits: Limits,
    /// Model price.
    pub price: Price,
    /// thread.json as first signed.
    pub doc: ThreadDoc,
    /// The transcript, opened.
    pub transcript: TranscriptWriter,
    /// Where a root reports.
    pub on_finish: Option<oneshot::Sender<ThreadReport>>,
    /// The hooks this thread runs (every layer, the directive's included), in order.
    pub hooks: Vec<crate::hooks::Hook>,
    /// The inputs it was started with (hooks interpolate `{input:k}`).
    pub inputs: Value,
    /// The tree's provider and model, if it was started with its own.
    pub route: Option<Arc<crate::provider::Route>>,
    /// Its `invoke_agent` span.
    pub span: tracing::Span,
}
