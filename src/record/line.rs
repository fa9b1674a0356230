//! Transcript lines as types: [`Line`], one variant per kind of line weft writes, with the
//! fields each carries. Writers build a `Line` (a thread actor through `Thread::log`, spawn's
//! first line, the ending of a thread whose actor is gone, a checkpoint, an edit through the
//! store); readers take one back with [`Line::parse`] instead of pulling fields out by key.
//!
//! The JSON is the format of record and these types do not change it: a variant serializes to
//! exactly the object its line has always carried — a field written as `null` is still `null`,
//! one left out is still left out — and the transcript writer adds `seq`, `ts` and `prev`
//! (after the fields, as written by `TranscriptWriter::append_typed`; in key order when the line
//! goes through a value). Field order is not part of the format; no variant may carry a field
//! named `seq`, `ts` or `prev` (a test below checks the ones with nested or flattened parts).
//!
//! Reading is tolerant, because transcripts outlive the code that wrote them: a missing field
//! takes its default (older lines lack fields added since; lines appended through the store
//! carry only what `store::check` requires, and the fields it does not check read as their
//! default when they hold another type), and a line of a kind this build does not know — or one
//! that does not fit its kind — is [`Line::Other`], kept whole, which readers skip or show as
//! it is. Thread ids, statuses and limits have no default: a line without them is `Other`.

use super::signing::SignatureBlock;
use crate::core::ids::{ReservationId, ThreadId};
use crate::core::limits::Limits;
use crate::core::money::{Nanos, Usage};
use crate::core::status::Status;
use serde::de::{DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One transcript line (its payload: `seq`, `ts` and `prev` belong to the transcript).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Line {
    /// The first line: what the thread was started as (written by spawn).
    ThreadStarted {
        /// The directive's name.
        #[serde(default)]
        directive: String,
        /// The sha256 of the directive's text.
        #[serde(default)]
        directive_hash: String,
        /// Where the directive was found.
        #[serde(default)]
        source: String,
        /// Its parent (`null` for a root).
        parent: Option<ThreadId>,
        /// The root of its tree.
        root: ThreadId,
        /// The model it calls.
        #[serde(default)]
        model: String,
        /// The provider's name.
        #[serde(default)]
        provider: String,
        /// Its resolved limits.
        limits: Limits,
        /// Its capabilities.
        #[serde(default)]
        capabilities: Vec<String>,
        /// The inputs it was started with.
        #[serde(default)]
        inputs: Map<String, Value>,
        /// The budget set aside for it out of its parent's.
        #[serde(default)]
        reserve_nanos: Nanos,
        /// The thread it continues (`null` unless a continuation).
        continuation_of: Option<ThreadId>,
    },
    /// A status transition (`running`).
    Status {
        /// The new status.
        status: Status,
    },
    /// The conversation a continuation inherits (before its first message).
    Conversation {
        /// The messages, as the provider's `Message` serializes them (this room is below the
        /// providers: it keeps them as JSON).
        #[serde(default)]
        messages: Value,
        /// LLM calls its chain made before it, attempts included.
        #[serde(default, deserialize_with = "lenient")]
        calls_made: u64,
    },
    /// A user message (the prompt, a nudge, children's reports, an inbox delivery) — or, from
    /// an import, any role's.
    Message {
        /// `user` (a thread's own), `assistant` or `system` (appended through the store).
        #[serde(default, deserialize_with = "lenient")]
        role: String,
        /// The text.
        #[serde(default, deserialize_with = "lenient")]
        text: String,
        /// Who sent it, for an inbox delivery (`person` or a child's id); left out otherwise.
        #[serde(
            default,
            deserialize_with = "lenient",
            skip_serializing_if = "Option::is_none"
        )]
        from: Option<String>,
    },
    /// The model's text of a turn.
    AssistantText {
        /// The text.
        #[serde(default, deserialize_with = "lenient")]
        text: String,
    },
    /// A tool call of the model.
    ToolUse {
        /// The call's id.
        #[serde(default, deserialize_with = "lenient")]
        id: String,
        /// The tool.
        #[serde(default)]
        name: String,
        /// Its arguments (as logged: a secret set by `set_env` is left out).
        #[serde(default)]
        input: Value,
    },
    /// A tool call's result.
    ToolResult {
        /// The id of the call it answers.
        #[serde(default, deserialize_with = "lenient")]
        id: String,
        /// The call failed or was refused.
        #[serde(default, deserialize_with = "lenient")]
        is_error: bool,
        /// The result text.
        #[serde(default)]
        content: String,
    },
    /// A tool call the capability gate refused.
    ToolDenied {
        /// The call's id.
        #[serde(default)]
        id: String,
        /// The tool.
        #[serde(default)]
        name: String,
        /// The capability it needed.
        #[serde(default)]
        capability: String,
    },
    /// An LLM call that ended (answered, failed for good, or abandoned), with what it cost.
    LlmCall {
        /// The model called.
        #[serde(default)]
        model: String,
        /// The provider's name (an answered call only).
        #[serde(skip_serializing_if = "Option::is_none")]
        provider: Option<String>,
        /// Its tokens (the upper bound when the provider did not report them).
        #[serde(default, deserialize_with = "lenient")]
        usage: Usage,
        /// What it cost (absent from the earliest `llm_retry` lines).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_nanos: Option<Nanos>,
        /// The ledger reservation it is settled against (None: a line from before calls
        /// recorded it).
        reservation: Option<ReservationId>,
        /// The provider did not report what it billed: `usage` is the upper bound.
        #[serde(default)]
        usage_incomplete: bool,
        /// Why it failed (a failed or abandoned call only).
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<CallError>,
        /// Why the model stopped (an answered call only).
        #[serde(skip_serializing_if = "Option::is_none")]
        stop_reason: Option<String>,
        /// How many streamed pieces the answer came in (an answered call only).
        #[serde(skip_serializing_if = "Option::is_none")]
        stream_deltas: Option<u64>,
    },
    /// An LLM call that failed and is tried again, with what it cost.
    LlmRetry {
        /// Which attempt this was (1 = the first).
        #[serde(default)]
        attempt: u32,
        /// The provider error's class (`rate_limited`, `overloaded`, …).
        #[serde(default)]
        kind: String,
        /// The provider's message.
        #[serde(default)]
        message: String,
        /// The model called.
        #[serde(default)]
        model: String,
        /// The wait the provider asked for (`null` if none).
        retry_after_ms: Option<u64>,
        /// The wait before the next attempt.
        #[serde(default)]
        wait_ms: u64,
        /// Its tokens.
        #[serde(default, deserialize_with = "lenient")]
        usage: Usage,
        /// What it cost (absent from the earliest `llm_retry` lines).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_nanos: Option<Nanos>,
        /// The ledger reservation it is settled against.
        reservation: Option<ReservationId>,
        /// The provider did not report what it billed.
        #[serde(default)]
        usage_incomplete: bool,
    },
    /// A provider billed more than the call's reservation.
    SpendOverrun {
        /// The call's reservation.
        #[serde(default)]
        reservation: ReservationId,
        /// What the call cost.
        #[serde(default)]
        cost_nanos: Nanos,
        /// How much more than reserved.
        #[serde(default)]
        overrun_nanos: Nanos,
        /// The model called.
        #[serde(default)]
        model: String,
    },
    /// A limit was hit.
    LimitHit {
        /// Which (`turns`, `tokens`, `spend`, `duration`).
        #[serde(default)]
        limit: String,
        /// What was used (left out for `duration`).
        #[serde(skip_serializing_if = "Option::is_none")]
        used: Option<String>,
        /// The limit.
        #[serde(default)]
        max: String,
    },
    /// The prompt passed the continuation threshold: the thread hands off.
    ContextFilling {
        /// The prompt's bound, in tokens.
        #[serde(default)]
        prompt_tokens: u64,
        /// The model's context window.
        #[serde(default)]
        window: u64,
        /// The threshold passed.
        #[serde(default)]
        threshold: u64,
    },
    /// What a hook's control decision did (or why it was refused).
    HookControl {
        /// `retry`, `continue` or `handoff`.
        #[serde(default)]
        action: String,
        /// The limit concerned (`continue`, `handoff`).
        #[serde(skip_serializing_if = "Option::is_none")]
        limit: Option<String>,
        /// Why it was not followed.
        #[serde(skip_serializing_if = "Option::is_none")]
        refused: Option<String>,
        /// The retry's number (`retry`).
        #[serde(skip_serializing_if = "Option::is_none")]
        retry: Option<u32>,
    },
    /// A hook fired.
    HookFired {
        /// The hook's id.
        #[serde(default)]
        id: String,
        /// The event it fired on.
        #[serde(default)]
        event: String,
        /// What it did (`inject`, `control`, `run`, `emit`, `spawn`, …).
        #[serde(default)]
        action: String,
        /// Its layer (0–4).
        #[serde(default)]
        layer: u8,
    },
    /// A hook's action failed (the thread goes on).
    HookFailed {
        /// The hook's id.
        #[serde(default)]
        id: String,
        /// The event it fired on (left out for a hook's refused spawn).
        #[serde(skip_serializing_if = "Option::is_none")]
        event: Option<String>,
        /// What went wrong.
        #[serde(default)]
        error: String,
        /// Where the hook was defined (left out for a hook's refused spawn).
        #[serde(skip_serializing_if = "Option::is_none")]
        source: Option<String>,
    },
    /// An event a hook emitted (Rye's emitter).
    HookEvent {
        /// The hook's id.
        #[serde(default)]
        id: String,
        /// The event's type.
        #[serde(default)]
        event_type: String,
        /// Its payload.
        #[serde(default)]
        payload: Value,
    },
    /// The thread failed (or its continuation could not start).
    Error {
        /// What went wrong.
        #[serde(default)]
        message: String,
    },
    /// The thread was asked to cancel.
    CancelRequested {
        /// Why.
        #[serde(default)]
        reason: String,
    },
    /// The thread is ending and cancels its live children.
    CancellingChildren {
        /// The children cancelled.
        #[serde(default)]
        children: Vec<ThreadId>,
    },
    /// A child started.
    ChildSpawned {
        /// The child.
        id: ThreadId,
        /// The call waits for it.
        #[serde(default)]
        wait: bool,
        /// The call (or `hook:<id>`) that started it.
        #[serde(default)]
        call_id: String,
    },
    /// A child ended.
    ChildFinished {
        /// The child.
        id: ThreadId,
        /// Its status.
        status: Status,
        /// Its subtree's spend (left out for a child killed after the grace).
        #[serde(skip_serializing_if = "Option::is_none")]
        spend_nanos: Option<Nanos>,
        /// Its error (`null` if none).
        error: Option<String>,
        /// The hash of its transcript's final line, which its final thread.json signs: its
        /// anchor (a rolled-back child no longer matches it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        head: Option<String>,
    },
    /// A child handed off: its continuation takes its place.
    ChildContinued {
        /// The child that handed off.
        old: ThreadId,
        /// Its continuation.
        new: ThreadId,
    },
    /// This thread handed off to a continuation.
    ContinuedBy {
        /// The continuation.
        id: ThreadId,
    },
    /// Files a completed thread handed to its parent.
    FilesReturned {
        /// The parent.
        to: ThreadId,
        /// Where they are in the parent's file area.
        #[serde(default)]
        paths: Vec<String>,
    },
    /// A file a completed thread could not hand to its parent.
    FilesNotReturned {
        /// The file, in the thread's own area.
        #[serde(default)]
        path: String,
        /// Why.
        #[serde(default)]
        error: String,
    },
    /// The last line before the final checkpoint: how the thread ended.
    ThreadFinished {
        /// Its terminal status.
        status: Status,
        /// Its error (`null` if none).
        error: Option<String>,
        /// Its subtree's spend.
        #[serde(default)]
        spend_nanos: Nanos,
        /// Its own calls' spend.
        #[serde(default)]
        own_spend_nanos: Nanos,
        /// What its actor recorded at the end (absent when it ended without its actor).
        #[serde(flatten)]
        run: Option<RunTotals>,
        /// How a thread without a live actor ended (`interrupted`, `killed`, `failed`).
        #[serde(skip_serializing_if = "Option::is_none")]
        error_kind: Option<String>,
    },
    /// The thread's short status line (`set_status`).
    StatusSet {
        /// The status line.
        #[serde(default)]
        status: String,
    },
    /// A message queued in the inbox (`weft inject`, `notify_parent`).
    MessageQueued {
        /// `person` or the child's id.
        #[serde(default)]
        from: String,
        /// The text.
        #[serde(default)]
        text: String,
    },
    /// An event the thread emitted (`emit`).
    Emit {
        /// Its name.
        #[serde(default)]
        event: String,
        /// Its data.
        #[serde(default)]
        data: Value,
    },
    /// A call parked until a person decides.
    ApprovalRequested {
        /// The call's id.
        #[serde(default)]
        id: String,
        /// The tool.
        #[serde(default)]
        name: String,
        /// Its arguments.
        #[serde(default)]
        input: Value,
    },
    /// A person's decision on a parked call.
    ApprovalDecided {
        /// The call's id.
        #[serde(default)]
        id: String,
        /// The tool.
        #[serde(default)]
        name: String,
        /// Approved or denied.
        #[serde(default)]
        approved: bool,
        /// The reason given (`null` if none).
        reason: Option<String>,
        /// Who decided (`person`).
        #[serde(default)]
        by: String,
    },
    /// An MCP server the thread may use could not start.
    McpUnavailable {
        /// What went wrong.
        #[serde(default)]
        message: String,
    },
    /// Its process died (recovery ended it).
    Interrupted(Gone),
    /// Its subtree did not end within its parent's cancel grace.
    Killed(Gone),
    /// Its actor panicked or stopped without finalizing.
    Failed(Gone),
    /// A signed checkpoint over the chain so far (written by the transcript itself).
    Checkpoint {
        /// The signature (None when missing or malformed: `weft verify` reports it; readers
        /// skip checkpoints whatever they hold).
        #[serde(default, deserialize_with = "lenient")]
        sig: Option<SignatureBlock>,
    },
    /// A message's new text (appended through the store; the signed line stays).
    MessageEdited {
        /// The seq of the message.
        target: i64,
        /// Its new text.
        #[serde(default)]
        text: String,
    },
    /// A message removed from the conversation (appended through the store).
    MessageDeleted {
        /// The seq of the message.
        target: i64,
    },
    /// A note (imports).
    Note {
        /// The note.
        #[serde(default)]
        text: String,
    },
    /// A line of a kind this build does not know, or that does not fit its kind: the whole
    /// object, `type` included.
    #[serde(untagged)]
    Other(Map<String, Value>),
}

/// Why an LLM call failed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct CallError {
    /// The provider error's class (`cancelled`, `server`, …).
    #[serde(default)]
    pub(crate) kind: String,
    /// What happened.
    #[serde(default)]
    pub(crate) message: String,
}

/// What a thread's actor records of its run in `thread_finished`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunTotals {
    /// Its final text (`null` if none).
    pub(crate) result: Option<String>,
    /// Its structured outputs (`null` if none).
    pub(crate) outputs: Option<Value>,
    /// Its turns.
    #[serde(default)]
    pub(crate) turns: u64,
    /// Its own calls' tokens.
    #[serde(default)]
    pub(crate) usage: Usage,
    /// What providers billed past reservations.
    #[serde(default)]
    pub(crate) overrun_nanos: Nanos,
}

/// How a thread ended without its actor (`interrupted`, `killed`, `failed`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Gone {
    /// The pid of the process that owned it.
    pub(crate) owner_pid: u32,
    /// A torn last line was set aside in `transcript.torn`.
    pub(crate) torn_line_kept: bool,
    /// Anything else to know (empty if nothing).
    pub(crate) note: String,
}

impl Line {
    /// A user message of the thread's own.
    pub(crate) fn user(text: String) -> Line {
        Line::Message {
            role: "user".into(),
            text,
            from: None,
        }
    }

    /// Reads a transcript line (its envelope ignored). Never fails: what does not fit a known
    /// kind is [`Line::Other`].
    pub(crate) fn parse(line: &Value) -> Line {
        Line::deserialize(line).unwrap_or_else(|_| Line::Other(Map::new()))
    }

    /// The line's kind (its `type`) and payload, as the transcript writer takes them.
    pub(crate) fn into_parts(self) -> (String, Value) {
        // Every key of a line is a string: serializing one cannot fail.
        let mut payload = serde_json::to_value(self).unwrap_or_default();
        let kind = payload
            .as_object_mut()
            .and_then(|o| o.remove("type"))
            .and_then(|t| t.as_str().map(str::to_string))
            .unwrap_or_default();
        (kind, payload)
    }
}

/// A field the store does not check on lines appended from outside: another JSON type reads as
/// the default, as a missing field does.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(d: D) -> Result<T, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(serde_json::from_value(v).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn no_line_carries_the_writers_own_keys() {
        let lines = [
            Line::ToolUse {
                id: "c1".into(),
                name: "kv_get".into(),
                input: json!({ "seq": 1, "ts": "x", "prev": "y" }),
            },
            Line::ThreadFinished {
                status: crate::core::status::Status::Completed,
                error: None,
                spend_nanos: crate::core::money::Nanos(1),
                own_spend_nanos: crate::core::money::Nanos(1),
                run: Some(RunTotals {
                    result: Some("done".into()),
                    outputs: Some(json!({ "seq": 1 })),
                    turns: 2,
                    usage: Default::default(),
                    overrun_nanos: crate::core::money::Nanos(0),
                }),
                error_kind: None,
            },
            Line::user("hi".into()),
            Line::Checkpoint { sig: None },
        ];
        for line in lines {
            let v = serde_json::to_value(&line).unwrap();
            let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
            for own in ["seq", "ts", "prev"] {
                assert!(!keys.iter().any(|k| *k == own), "{own} in {v}");
            }
            assert!(v.get("type").is_some(), "{v}");
        }
    }

    #[test]
    fn a_line_reads_back_as_written_and_an_unknown_one_whole() {
        let written = json!({ "id": "c1", "name": "kv_get", "input": { "key": "k" } });
        let (kind, payload) = Line::ToolUse {
            id: "c1".into(),
            name: "kv_get".into(),
            input: json!({ "key": "k" }),
        }
        .into_parts();
        assert_eq!((kind.as_str(), &payload), ("tool_use", &written));
        let unknown = json!({ "type": "from_the_future", "x": 1 });
        match Line::parse(&unknown) {
            Line::Other(m) => assert_eq!(Value::Object(m), unknown),
            other => panic!("read as {other:?}"),
        }
        let (kind, _) = Line::parse(&unknown).into_parts();
        assert_eq!(kind, "from_the_future");
    }
}
