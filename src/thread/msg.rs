//! The thread actor's messages, what it starts from, and what it reports when it ends.

use super::report::{StatusSnapshot, ThreadReport};
use crate::core::ids::ThreadId;
use crate::core::limits::Limits;
use crate::core::money::Price;
use crate::directive::Directive;
use crate::provider::{LlmResponse, Message, ProviderError};
use crate::record::thread_doc::ThreadDoc;
use crate::record::transcript::TranscriptWriter;
use crate::tools::ToolOutcome;
use ractor::{ActorRef, RpcReplyPort};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::oneshot;

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
        /// The wait's serial (`Kids::wait`).
        wait: u64,
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

/// Everything a thread actor starts from (built by the spawn stages).
pub(crate) struct ThreadArgs {
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
    /// A placed child's parent, on another node: told of its end there.
    pub report_to: Option<ThreadId>,
    /// Its place among this runtime's threads, held while the actor lives.
    pub slot: super::slot::Slot,
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
    /// For a start that may wait on an MCP server: fired when it is withdrawn meanwhile (its own
    /// cancel, its parent's; for a deferred child, its tree's), and the start gives up at once.
    pub withdrawn: Option<tokio_util::sync::CancellationToken>,
}
