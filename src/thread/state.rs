//! The living thread: [`Thread`], the state of one thread actor — who it is, what it was
//! started with, and its parts (calls, children, tool work, hooks, conversation, record,
//! lifetime) — with the helpers that turn it into transcript lines, a registry row, a report
//! and a signed thread.json.
//!
//! What a thread *does* is in the files beside this one, each an `impl Thread` block over one
//! concern; the actor (`actor.rs`) only routes messages to them.

use super::ctx::{Ctx, Event};
use super::msg::ThreadMsg;
use super::parts::{Calls, HookState, Kids, Life, Record, Talk, ToolWork};
use super::report::ThreadReport;
use crate::core::ids::ThreadId;
use crate::core::limits::Limits;
use crate::core::money::{Nanos, Price};
use crate::core::redact::Redactor;
use crate::core::status::Status;
use crate::directive::Directive;
use crate::provider::{Provider, Route};
use crate::record::line::Line;
use crate::record::thread_doc::ThreadDoc;
use crate::registry::{RegistryMsg, ThreadRow};
use crate::tools::ToolOutcome;
use ractor::ActorRef;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// How a thread is ending.
#[derive(Debug, Clone)]
pub(crate) struct Ending {
    /// Its terminal status.
    pub(crate) status: Status,
    /// Its final text.
    pub(crate) result: Option<String>,
    /// Its structured outputs.
    pub(crate) outputs: Option<Value>,
    /// Its error message.
    pub(crate) error: Option<String>,
}

impl Ending {
    /// Ends with `status` and nothing else.
    pub(crate) fn with(status: Status) -> Ending {
        Ending {
            status,
            result: None,
            outputs: None,
            error: None,
        }
    }

    /// Ends `error` with `message`.
    pub(crate) fn error(message: String) -> Ending {
        Ending {
            error: Some(message),
            ..Ending::with(Status::Error)
        }
    }
}

/// Where the turn loop stands.
pub(crate) enum Phase {
    /// Between turns.
    Idle,
    /// Waiting for the LLM.
    Thinking,
    /// Waiting for tool results.
    Tools {
        /// The calls of the turn, in the order the model made them.
        order: Vec<String>,
        /// The calls whose result is not in yet (a set: a turn of 1,000 spawns looked each
        /// result's call up in `order`, half a million string compares).
        pending: HashSet<String>,
        /// The results in so far.
        results: HashMap<String, ToolOutcome>,
        /// The outputs of a valid `directive_return` among them.
        returned: Option<Value>,
    },
    /// Ending: waiting for children, tasks and the call under way to finish.
    Draining(Ending),
    /// Finalized.
    Done,
}

impl Phase {
    /// Draining or done: nothing new starts.
    pub(crate) fn ending(&self) -> bool {
        matches!(self, Phase::Draining(_) | Phase::Done)
    }
}

/// One thread actor's state.
pub(crate) struct Thread {
    /// Its own actor: where its tasks report back.
    pub(crate) me: ActorRef<ThreadMsg>,
    /// What every thread of the runtime shares.
    pub(crate) ctx: Arc<Ctx>,
    /// The LLM backend it calls.
    pub(crate) provider: Arc<dyn Provider>,
    /// Its directive.
    pub(crate) directive: Arc<Directive>,
    /// Its parent's id and actor (None for a root).
    pub(crate) parent: Option<(ThreadId, ActorRef<ThreadMsg>)>,
    /// Its parent on another node, if it was placed here (see `thread/placed.rs`).
    pub(crate) report_to: Option<ThreadId>,
    /// Its place among this runtime's threads (given back when the actor's state drops).
    pub(crate) _slot: super::slot::Slot,
    /// Its resolved limits (a `limit` hook may lift turns or tokens once).
    pub(crate) limits: Limits,
    /// Its model's price.
    pub(crate) price: Price,
    /// The inputs it was started with (hooks interpolate `{input:k}`).
    pub(crate) inputs: Value,
    /// The tree's provider and model, passed on to children.
    pub(crate) route: Option<Arc<Route>>,
    /// Its thread.json as it stands (signed at every transition).
    pub(crate) doc: ThreadDoc,
    /// Its short status line (`set_status`).
    pub(crate) status_text: Option<String>,
    /// Where its turn loop stands.
    pub(crate) phase: Phase,
    /// Its transcript.
    pub(crate) record: Record,
    /// Its conversation.
    pub(crate) talk: Talk,
    /// Its LLM calls.
    pub(crate) calls: Calls,
    /// Its children and the calls waiting for them.
    pub(crate) kids: Kids,
    /// Its tool work under way.
    pub(crate) work: ToolWork,
    /// Its hooks.
    pub(crate) hooks: HookState,
    /// Its lifetime.
    pub(crate) life: Life,
}

impl Thread {
    /// Its id.
    pub(crate) fn id(&self) -> &ThreadId {
        &self.doc.id
    }

    /// Appends a line to the transcript and, when anyone listens, publishes it as an event.
    /// A failed append is kept: the actor ends the thread `error` once the message at hand is
    /// handled (see [`Thread::record_failure`]).
    pub(crate) fn log(&mut self, line: Line) {
        // No secret reaches the transcript, live events or the search index.
        let redactor = self.ctx.redactor();
        let seq = self.record.next_seq();
        self.remember_said(seq, &line, &redactor);
        let publish = self.ctx.publish_lines();
        // Nothing to redact and nobody watching lines: the line goes out as it serializes.
        if redactor.is_empty() && !publish {
            if let Err(e) = self.record.transcript.append_typed(&line) {
                self.append_failed(&line.into_parts().0, e);
            }
            return;
        }
        let (kind, mut payload) = line.into_parts();
        redactor.redact_value(&mut payload);
        let copy = publish.then(|| payload.clone());
        if let Err(e) = self.record.transcript.append(&kind, payload) {
            self.append_failed(&kind, e);
            return;
        }
        if let Some(data) = copy {
            let _ = self.ctx.events.send(Event::Line {
                id: self.doc.id.clone(),
                seq,
                kind,
                data: Arc::new(data),
            });
        }
    }

    /// A line (or the checkpoint after it) could not be written: the thread ends `error`.
    fn append_failed(&mut self, kind: &str, e: std::io::Error) {
        tracing::error!(thread = %self.doc.id, "transcript append failed: {e}");
        let lost = format!(
            "the transcript could not be written at its `{kind}` line (that line, or the checkpoint after it, was lost): {e}"
        );
        self.record.failed.get_or_insert(lost);
    }

    /// Keeps a user or assistant message for the search index (its secrets redacted).
    fn remember_said(&mut self, seq: i64, line: &Line, redactor: &Redactor) {
        let (role, text) = match line {
            Line::Message { role, text, .. } => (role.as_str(), text),
            Line::AssistantText { text } => ("assistant", text),
            _ => return,
        };
        if text.trim().is_empty() {
            return;
        }
        self.record.said.push(crate::store::SearchMessage {
            seq,
            role: role.to_string(),
            text: redactor.redact(text).into_owned(),
        });
    }

    /// The failure of a transcript append not yet acted on (taken).
    /// Waits until this thread's records so far are stored (they are queued on a database
    /// server; files need nothing): before a step others see — a tool's run, a hook's. A
    /// failure is the thread's record failure (it ends `error`).
    pub(crate) fn settle_records(&mut self) {
        if let Err(e) = self.record.transcript.settle() {
            self.record
                .failed
                .get_or_insert(format!("the transcript could not be stored: {e}"));
        }
    }

    pub(crate) fn record_failure(&mut self) -> Option<String> {
        match self.phase {
            Phase::Done => None,
            _ => self.record.failed.take(),
        }
    }

    /// Brings thread.json's cost and head up to date (before signing).
    pub(crate) fn refresh_doc(&mut self) {
        let usage = self.calls.usage;
        self.doc.cost.input_tokens = usage.input_tokens;
        self.doc.cost.output_tokens = usage.output_tokens;
        self.doc.cost.cache_read_tokens = usage.cache_read_tokens;
        self.doc.cost.own_spend_nanos = self.calls.own_spend.0;
        self.doc.cost.elapsed_ms = self.life.started.elapsed().as_millis() as u64;
        self.doc.transcript_head = self.record.transcript.head().clone();
    }

    /// Signs and writes thread.json as it stands.
    pub(crate) fn sign_doc(&mut self, fsync: bool) {
        self.refresh_doc();
        let strict = self.ctx.config.durability == crate::project::config::Durability::Strict;
        match self
            .doc
            .write_stamped(self.ctx.store.records(), &self.ctx.signer, fsync || strict)
        {
            Ok(Some(stamp)) if self.may_spawn() => self.ctx.vouch_for(&self.doc, stamp),
            Ok(_) => {}
            Err(e) => tracing::error!(thread = %self.doc.id, "thread.json write failed: {e}"),
        }
    }

    /// Whether this thread may start children (the spawn capability, depth and spawns left):
    /// its children's spawns read its thread.json.
    fn may_spawn(&self) -> bool {
        self.limits.depth > 0
            && self.limits.spawns > 0
            && crate::tools::may_manage(&self.doc.capabilities)
    }

    /// Its registry row as it stands.
    pub(crate) fn row(&self) -> ThreadRow {
        let usage = self.calls.usage;
        ThreadRow {
            directive: self.doc.directive.clone(),
            parent_id: self.doc.parent_id.clone(),
            created_at: self.doc.created_at.clone(),
            updated_at: crate::core::ids::now_ts(),
            model: self.doc.model.clone(),
            turns: self.doc.cost.turns,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            own_spend_nanos: self.calls.own_spend.0,
            spend_nanos: self.doc.cost.spend_nanos.max(self.calls.own_spend.0),
            result: self.doc.result.clone(),
            outputs: self.doc.outputs.clone(),
            error: self.doc.error.clone(),
            owner_pid: crate::core::owner::me(),
            waiting: self.work.waiting_marker(),
            status_text: self.status_text.clone(),
            ..ThreadRow::new(
                self.doc.id.clone(),
                self.doc.root_id.clone(),
                self.doc.status,
            )
        }
    }

    /// Sends its row to the registry (not waited for: the registry's batch writes it).
    pub(crate) fn publish_row(&self) {
        let _ = self.ctx.registry.cast(RegistryMsg::Update {
            row: Box::new(self.row()),
            reply: None,
        });
    }

    /// Its report as it stands.
    pub(crate) fn report(&self) -> ThreadReport {
        let usage = self.calls.usage;
        ThreadReport {
            thread_id: self.doc.id.clone(),
            directive: self.doc.directive.clone(),
            status: self.doc.status,
            result: self.doc.result.clone(),
            outputs: self.doc.outputs.clone(),
            error: self.doc.error.clone(),
            turns: self.doc.cost.turns,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            own_spend_nanos: self.calls.own_spend,
            spend_nanos: Nanos(self.doc.cost.spend_nanos),
            overrun_nanos: Nanos(self.doc.cost.overrun_nanos),
            files: self.work.returned_files.clone(),
            final_head: self
                .doc
                .status
                .is_terminal()
                .then(|| self.doc.transcript_head.hash.clone()),
        }
    }

    /// Sends itself `msg` after `wait` (a timer aborted when the thread ends).
    pub(crate) fn after(&mut self, wait: Duration, msg: ThreadMsg) {
        let me = self.me.clone();
        self.life.timers.push(tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = me.cast(msg);
        }));
    }
}
