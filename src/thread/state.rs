//! A thread actor's state: its phase, children, waiters, and the helpers that turn it into a
//! registry row, a report and a signed thread.json.

use super::{Ctx, ThreadMsg, ThreadReport, ToolOutcome};
use crate::core::ids::ThreadId;
use crate::core::limits::Limits;
use crate::core::money::{Nanos, Price, Usage};
use crate::core::status::Status;
use crate::directive::Directive;
use crate::provider::{Message, ToolSpec};
use crate::record::thread_doc::ThreadDoc;
use crate::record::transcript::TranscriptWriter;
use crate::registry::ThreadRow;
use ractor::ActorRef;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// How a thread is ending.
#[derive(Debug, Clone)]
pub(super) struct Ending {
    pub(super) status: Status,
    pub(super) result: Option<String>,
    pub(super) outputs: Option<Value>,
    pub(super) error: Option<String>,
}

pub(super) enum Phase {
    /// Between turns.
    Idle,
    /// Waiting for the LLM.
    Thinking,
    /// Waiting for tool results.
    Tools {
        order: Vec<String>,
        results: HashMap<String, ToolOutcome>,
        returned: Option<Value>,
    },
    /// Ending: waiting for children to acknowledge a cancel.
    Draining(Ending),
    /// Finalized.
    Done,
}

/// The LLM call under way: what was reserved for it and what its prompt was.
pub(super) struct Call {
    pub(super) reservation: crate::ledger::ReservationId,
    pub(super) reserved: Nanos,
    pub(super) prompt_bytes: u64,
    pub(super) messages: usize,
    /// The prompt-token bound and the output tokens granted: what a call whose bill the
    /// provider did not report is settled at.
    pub(super) prompt_tokens: u64,
    pub(super) max_output: u64,
}

/// What the last successful call's prompt was billed, for a tighter bound on the next one.
#[derive(Clone, Copy)]
pub(super) struct Billed {
    pub(super) prompt_tokens: u64,
    pub(super) prompt_bytes: u64,
    pub(super) messages: usize,
}

pub(super) struct Child {
    pub(super) actor: Option<ActorRef<ThreadMsg>>,
    pub(super) report: Option<ThreadReport>,
    /// Some call (spawn wait=true or wait_threads) has consumed or will consume the report.
    pub(super) claimed: bool,
}

pub(super) struct Waiter {
    pub(super) call_id: String,
    pub(super) ids: Vec<ThreadId>,
}

/// State of a thread actor.
pub(crate) struct ThreadState {
    pub(super) ctx: Arc<Ctx>,
    pub(super) provider: Arc<dyn crate::provider::Provider>,
    pub(super) directive: Arc<Directive>,
    pub(super) parent: Option<(ThreadId, ActorRef<ThreadMsg>)>,
    pub(super) limits: Limits,
    pub(super) price: Price,
    pub(super) doc: ThreadDoc,
    pub(super) transcript: TranscriptWriter,
    pub(super) on_finish: Option<oneshot::Sender<ThreadReport>>,
    /// Shared with in-flight requests (no copy per call); appended through `Arc::make_mut`.
    pub(super) system: Arc<str>,
    pub(super) messages: Arc<Vec<Message>>,
    pub(super) tools: Arc<Vec<ToolSpec>>,
    pub(super) phase: Phase,
    pub(super) calls_made: u64,
    pub(super) usage: Usage,
    pub(super) own_spend: Nanos,
    pub(super) started: Instant,
    pub(super) cancel: CancellationToken,
    pub(super) children: HashMap<ThreadId, Child>,
    pub(super) waiters: Vec<Waiter>,
    pub(super) announce: Vec<ThreadReport>,
    pub(super) timers: Vec<tokio::task::JoinHandle<()>>,
    /// The LLM call under way.
    pub(super) call: Option<Call>,
    /// The last successful call's billed prompt.
    pub(super) billed: Option<Billed>,
    /// Retries used for the current turn's call.
    pub(super) attempt: u32,
    /// `spawn_thread` calls whose task is still under way (by call id): a thread never
    /// finalizes before they report, so no child can start after its parent has ended.
    pub(super) spawning: std::collections::HashSet<String>,
    /// Tool calls running as tasks (commands, file operations): a thread ends only after each
    /// has reported (a cancel kills a command's process group at once).
    pub(super) tool_tasks: std::collections::HashSet<String>,
    /// Files named by `directive_return` (in this thread's area until the end, then copied to
    /// the parent's area, and these become the paths there).
    pub(super) returned_files: Vec<String>,
    /// File tools of one thread run one at a time (a size check and the write it allows are
    /// not interleaved with another call's).
    pub(super) files_lock: Arc<std::sync::Mutex<()>>,
    /// The hooks this thread runs, in order.
    pub(super) hooks: Arc<Vec<crate::hooks::Hook>>,
    /// Children that handed off, to the continuation that took each one's place.
    pub(super) continued_children: HashMap<ThreadId, ThreadId>,
    /// Signalled once this thread has finished ending, when its continuation holds its waiter.
    pub(super) ended: Option<tokio::sync::oneshot::Sender<()>>,
    /// Set when the thread ends `continued`: the conversation its continuation starts from.
    pub(super) handoff: Option<Vec<crate::provider::Message>>,
    /// Retries ordered by `error` hooks so far.
    pub(super) hook_retries: u32,
    /// Limits a `limit` hook has lifted once already.
    pub(super) lifted: Vec<String>,
    /// The inputs it was started with.
    pub(super) inputs: serde_json::Value,
    /// The tree's provider and model, passed on to children.
    pub(super) route: Option<Arc<crate::provider::Route>>,
    /// Its `invoke_agent` span (ended when it finishes).
    pub(super) span: tracing::Span,
    /// The `chat` span of the LLM call under way.
    pub(super) chat_span: Option<tracing::Span>,
    /// The `execute_tool` spans of calls not yet answered, by call id.
    pub(super) tool_spans: std::collections::HashMap<String, tracing::Span>,
    /// Messages waiting for the next turn: (from — "person" or a child's id, text).
    pub(super) inbox: Vec<(String, String)>,
    /// The thread's own status line (`set_status`).
    pub(super) status_text: Option<String>,
    /// Calls parked until a person approves or denies them, in the order they were made.
    pub(super) pending_approvals: Vec<crate::provider::ToolCall>,
    /// Spawns under way when `cancel_siblings` fired: their child is cancelled on arrival.
    pub(super) doomed: std::collections::HashSet<String>,
    /// The user and assistant messages logged so far, for the search index when it ends.
    pub(super) said: Vec<crate::store::SearchMessage>,
}

impl ThreadState {
    pub(super) fn id(&self) -> &ThreadId {
        &self.doc.id
    }

    /// Appends a line to the transcript and, when anyone listens, publishes it as an event.
    pub(super) fn log(&mut self, kind: &str, mut payload: Value) {
        // No secret reaches the transcript, live events or the search index.
        self.ctx.redactor().redact_value(&mut payload);
        let seq = self.transcript.head().seq + 1;
        let copy = self.ctx.publish_lines().then(|| payload.clone());
        let role = match kind {
            "message" => payload["role"].as_str().or(Some("user")),
            "assistant_text" => Some("assistant"),
            _ => None,
        };
        if let (Some(role), Some(text)) = (role, payload["text"].as_str()) {
            if !text.trim().is_empty() {
                self.said.push(crate::store::SearchMessage {
                    seq,
                    role: role.to_string(),
                    text: text.to_string(),
                });
            }
        }
        if let Err(e) = self.transcript.append(kind, payload) {
            tracing::error!(thread = %self.doc.id, "transcript append failed: {e}");
            return;
        }
        if let Some(data) = copy {
            let _ = self.ctx.events.send(super::Event::Line {
                id: self.doc.id.clone(),
                seq,
                kind: kind.to_string(),
                data: std::sync::Arc::new(data),
            });
        }
    }

    pub(super) fn live_children(&self) -> Vec<ThreadId> {
        self.children
            .iter()
            .filter(|(_, c)| c.report.is_none() && c.actor.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Brings thread.json's cost and head up to date (before signing).
    pub(super) fn refresh_doc(&mut self) {
        self.doc.cost.input_tokens = self.usage.input_tokens;
        self.doc.cost.output_tokens = self.usage.output_tokens;
        self.doc.cost.cache_read_tokens = self.usage.cache_read_tokens;
        self.doc.cost.own_spend_nanos = self.own_spend.0;
        self.doc.cost.elapsed_ms = self.started.elapsed().as_millis() as u64;
        self.doc.transcript_head = self.transcript.head().clone();
    }

    pub(super) fn sign_doc(&mut self, fsync: bool) {
        self.refresh_doc();
        let path = self.ctx.store.doc_path(self.id());
        let strict = self.ctx.config.durability == crate::project::config::Durability::Strict;
        if let Err(e) = self
            .doc
            .write_signed(&path, &self.ctx.signer, fsync || strict)
        {
            tracing::error!(thread = %self.doc.id, "thread.json write failed: {e}");
        }
    }

    pub(super) fn row(&self) -> ThreadRow {
        ThreadRow {
            directive: self.doc.directive.clone(),
            parent_id: self.doc.parent_id.clone(),
            created_at: self.doc.created_at.clone(),
            updated_at: crate::core::ids::now_ts(),
            model: self.doc.model.clone(),
            turns: self.doc.cost.turns,
            input_tokens: self.usage.input_tokens,
            output_tokens: self.usage.output_tokens,
            own_spend_nanos: self.own_spend.0,
            spend_nanos: self.doc.cost.spend_nanos.max(self.own_spend.0),
            result: self.doc.result.clone(),
            outputs: self.doc.outputs.clone(),
            error: self.doc.error.clone(),
            owner_pid: std::process::id(),
            waiting: super::approval::marker(self),
            status_text: self.status_text.clone(),
            ..ThreadRow::new(
                self.doc.id.clone(),
                self.doc.root_id.clone(),
                self.doc.status,
            )
        }
    }

    pub(super) fn report(&self) -> ThreadReport {
        ThreadReport {
            thread_id: self.doc.id.clone(),
            directive: self.doc.directive.clone(),
            status: self.doc.status,
            result: self.doc.result.clone(),
            outputs: self.doc.outputs.clone(),
            error: self.doc.error.clone(),
            turns: self.doc.cost.turns,
            input_tokens: self.usage.input_tokens,
            output_tokens: self.usage.output_tokens,
            cache_read_tokens: self.usage.cache_read_tokens,
            own_spend_nanos: self.own_spend,
            spend_nanos: Nanos(self.doc.cost.spend_nanos),
            overrun_nanos: Nanos(self.doc.cost.overrun_nanos),
            files: self.returned_files.clone(),
        }
    }
}
