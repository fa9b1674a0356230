//! The thread-management tools (SPEC §7): `spawn_thread`, `wait_threads`, `cancel_thread`,
//! `thread_status`, `directive_return`. They act on the thread's own state (its children, its
//! waits, its outputs), so they live with the thread rather than in `tools/`.
//!
//! Fast tools answer at once; `spawn_thread` runs as a task and reports by message; waits are
//! state in the thread, resolved when children report.

use super::tool::Builtin;
use crate::core::ids::ThreadId;
use crate::core::limits::LimitSet;
use crate::core::money::Nanos;
use crate::directive::Directive;
use crate::provider::{ToolCall, ToolSpec};
use crate::registry::RegistryMsg;
use crate::thread::msg::ThreadMsg;
use crate::thread::spawn::{Origin, SpawnRequest};
use crate::thread::state::Thread;
use crate::tools::ToolOutcome;
use ractor::ActorRef;
use serde_json::{json, Value};
use std::time::Duration;

/// The spec of a thread-management tool (`directive_return` aside).
pub(super) fn spec(b: Builtin) -> ToolSpec {
    let (description, input_schema) = match b {
        Builtin::SpawnThread => (
            "Start a child thread running another directive. With wait=true (default) the child's result is returned; with wait=false its id is returned at once and its completion is announced later.",
            json!({"type":"object","properties":{
                "directive":{"type":"string"},"inputs":{"type":"object"},
                "limits":{"type":"object","description":"lower limits for the child (turns, tokens, spend, duration, depth, spawns, concurrency)"},
                "reserve":{"type":"number","description":"USD set aside for the child out of this thread's budget"},
                "wait":{"type":"boolean","default":true},
                "files":{"type":"array","items":{"type":"string"},"description":"paths in this thread's file area copied into the child's"}},"required":["directive"]}),
        ),
        Builtin::WaitThreads => (
            "Wait for child threads (all live ones when ids is omitted) and return their results.",
            json!({"type":"object","properties":{"ids":{"type":"array","items":{"type":"string"}},"timeout":{"type":"number","description":"seconds"}}}),
        ),
        Builtin::CancelThread => (
            "Cancel one of this thread's descendants and its subtree.",
            json!({"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}),
        ),
        _ => (
            "Status, cost and outputs of one of this thread's descendants.",
            json!({"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}),
        ),
    };
    ToolSpec {
        name: b.name().into(),
        description: description.into(),
        input_schema,
    }
}

/// `directive_return`'s spec: the directive's outputs, and `files` when the thread has a file
/// area.
pub(super) fn return_spec(d: &Directive, has_area: bool) -> ToolSpec {
    let mut props: serde_json::Map<String, Value> = d
        .outputs
        .iter()
        .map(|(k, o)| {
            let mut p = json!({ "description": o.description.clone().unwrap_or_default() });
            if o.kind != "any" {
                p["type"] = json!(o.kind);
            }
            (k.clone(), p)
        })
        .collect();
    let required: Vec<&String> = d
        .outputs
        .iter()
        .filter(|(_, o)| o.required)
        .map(|(k, _)| k)
        .collect();
    if has_area && !d.outputs.contains_key("files") {
        props.insert(
            "files".into(),
            json!({"type":"array","items":{"type":"string"},"description":"paths in this thread's file area handed to its parent"}),
        );
    }
    ToolSpec {
        name: Builtin::DirectiveReturn.name().into(),
        description: "Finish this thread with its structured outputs.".into(),
        input_schema: json!({"type":"object","properties":props,"required":required}),
    }
}

/// A `spawn_thread` call's request (parent and route set by the caller) and its `wait`.
fn child_request(input: &Value, origin: Origin) -> Result<(SpawnRequest, bool), String> {
    let directive = input
        .get("directive")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let inputs = match input.get("inputs") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => return Err(format!("`inputs` must be an object, got {other}")),
    };
    let mut req = SpawnRequest::new(directive, inputs, origin);
    req.overrides = match input.get("limits") {
        None | Some(Value::Null) => LimitSet::default(),
        Some(Value::Object(m)) => LimitSet::from_map(m).map_err(|e| e.to_string())?,
        Some(other) => return Err(format!("`limits` must be an object, got {other}")),
    };
    req.reserve = match input.get("reserve") {
        None | Some(Value::Null) => Nanos::ZERO,
        Some(v) => Nanos::from_json_usd(v).map_err(|e| format!("`reserve`: {e}"))?,
    };
    req.attach = paths(input.get("files"))?;
    let wait = input.get("wait").and_then(Value::as_bool).unwrap_or(true);
    Ok((req, wait))
}

/// `files: [paths]` of a tool input (absent: none).
fn paths(v: Option<&Value>) -> Result<Vec<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("`files` lists paths (strings), got {i}"))
            })
            .collect(),
        Some(other) => Err(format!("`files` must be a list of paths, got {other}")),
    }
}

fn parse_id(v: Option<&Value>) -> Result<ThreadId, String> {
    let text = v
        .and_then(Value::as_str)
        .ok_or("`id` (string) is required")?;
    ThreadId::parse(text).map_err(|e| e.to_string())
}

impl Thread {
    /// `directive_return {outputs…, files?}`: checks the outputs; a valid call completes the
    /// thread once the turn's results are in.
    pub(crate) fn directive_return(&mut self, input: &Value) -> ToolOutcome {
        let mut given = input.as_object().cloned().unwrap_or_default();
        // `files` names files of this thread's area for its parent, unless it is a declared output.
        let files = if self.directive.outputs.contains_key("files") {
            Vec::new()
        } else {
            match paths(given.remove("files").as_ref()) {
                Ok(f) => f,
                Err(e) => return ToolOutcome::err(e),
            }
        };
        let area = self.ctx.store.files_dir(self.id());
        for rel in &files {
            match crate::tools::resolve_in_area(&area, rel) {
                Ok(p) if p.exists() => {}
                Ok(_) => {
                    return ToolOutcome::err(format!(
                        "`files`: `{rel}` does not exist in the file area"
                    ))
                }
                Err(e) => return ToolOutcome::err(format!("`files`: {e}")),
            }
        }
        match self.directive.check_outputs(&given) {
            Ok(()) => {
                self.work.returned_files = files;
                ToolOutcome {
                    content: json!({"ok": true}).to_string(),
                    is_error: false,
                    returned: Some(Value::Object(given)),
                }
            }
            Err(m) => ToolOutcome::err(m.to_string()),
        }
    }

    /// `spawn_thread {directive, inputs, limits, reserve, wait, files}`: starts the child as a
    /// task.
    pub(crate) fn spawn_thread(&mut self, call: ToolCall) -> Option<ToolOutcome> {
        let (mut req, wait) = match child_request(&call.input, self.as_parent()) {
            Ok(r) => r,
            Err(e) => return Some(ToolOutcome::err(e)),
        };
        let area = match req.attach.is_empty() {
            true => Default::default(),
            false => self.ctx.store.files_dir(self.id()),
        };
        for rel in &req.attach {
            if let Err(e) = crate::tools::resolve_in_area(&area, rel) {
                return Some(ToolOutcome::err(format!("`files`: {e}")));
            }
        }
        req.route = self.route.clone();
        self.start_child(call.id, req, wait);
        None
    }

    /// `wait_threads {ids?, timeout?}`.
    pub(crate) fn wait_threads(&mut self, call: ToolCall) -> Option<ToolOutcome> {
        let ids: Vec<ThreadId> = match call.input.get("ids") {
            None | Some(Value::Null) => self.kids.live(),
            Some(Value::Array(a)) => {
                let mut ids = Vec::new();
                for v in a {
                    match parse_id(Some(v)) {
                        Ok(id) if self.kids.map.contains_key(&id) => ids.push(id),
                        Ok(id) => {
                            return Some(ToolOutcome::err(format!(
                                "{id} is not a child of this thread"
                            )))
                        }
                        Err(e) => return Some(ToolOutcome::err(e)),
                    }
                }
                ids
            }
            Some(other) => {
                return Some(ToolOutcome::err(format!(
                    "`ids` must be a list of thread ids, got {other}"
                )))
            }
        };
        // A child that handed off answers through its continuation; the answer's shape is
        // the one asked for (one child, or a list).
        let single = ids.len() == 1;
        let ids = self.kids.latest_ids(ids);
        for id in &ids {
            self.kids.claim(id);
        }
        // Reports already announced-to-be are now delivered by this call instead.
        self.kids.announce.retain(|r| !ids.contains(&r.thread_id));
        if self.kids.all_reported(&ids) {
            return Some(self.kids.wait_result(&ids, single, false));
        }
        let timeout = call
            .input
            .get("timeout")
            .and_then(Value::as_f64)
            .filter(|t| t.is_finite() && *t >= 0.0);
        let call_id = call.id.clone();
        let wait = self.kids.wait(call.id, ids, single);
        if let Some(secs) = timeout {
            let after = Duration::from_secs_f64(secs.min(86_400.0));
            self.after(after, ThreadMsg::WaitTimeout { call_id, wait });
        }
        None
    }

    /// `cancel_thread {id}`: one of this thread's descendants and its subtree.
    pub(crate) async fn cancel_thread(&mut self, input: &Value) -> ToolOutcome {
        let id = match parse_id(input.get("id")) {
            Ok(id) => id,
            Err(e) => return ToolOutcome::err(e),
        };
        let direct = self
            .kids
            .map
            .get(&id)
            .map(|c| (c.actor.clone(), c.report.is_some()));
        let actor = match direct {
            Some((_, true)) => {
                return ToolOutcome::ok(json!({ "thread_id": id, "status": "already finished" }))
            }
            Some((Some(a), false)) => a,
            _ => {
                let ok = ractor::call!(self.ctx.registry, |reply| RegistryMsg::IsDescendant {
                    ancestor: self.doc.id.clone(),
                    id: id.clone(),
                    reply
                });
                if !matches!(ok, Ok(Ok(true))) {
                    return ToolOutcome::err(format!("{id} is not a descendant of this thread"));
                }
                match ractor::registry::where_is(id.to_string()) {
                    Some(cell) => ActorRef::<ThreadMsg>::from(cell),
                    None => {
                        return ToolOutcome::ok(
                            json!({ "thread_id": id, "status": "already finished" }),
                        )
                    }
                }
            }
        };
        let reason = format!("cancel_thread by {}", self.doc.id);
        self.ctx.send_cancel(&id, &actor, &reason);
        ToolOutcome::ok(json!({ "thread_id": id, "status": "cancelling" }))
    }

    /// `thread_status {id}`: one of this thread's descendants.
    pub(crate) async fn thread_status(&mut self, input: &Value) -> ToolOutcome {
        let id = match parse_id(input.get("id")) {
            Ok(id) => id,
            Err(e) => return ToolOutcome::err(e),
        };
        let desc = ractor::call!(self.ctx.registry, |reply| RegistryMsg::IsDescendant {
            ancestor: self.doc.id.clone(),
            id: id.clone(),
            reply
        });
        if !matches!(desc, Ok(Ok(true))) {
            return ToolOutcome::err(format!("{id} is not a descendant of this thread"));
        }
        match ractor::call!(self.ctx.registry, |reply| RegistryMsg::Get {
            id: id.clone(),
            reply
        }) {
            Ok(Ok(Some(r))) => ToolOutcome::ok(json!({
                "thread_id": r.id, "directive": r.directive, "status": r.status, "turns": r.turns,
                "spend_nanos": r.spend_nanos, "result": r.result, "outputs": r.outputs, "error": r.error,
            })),
            _ => ToolOutcome::err(format!("no status for {id}")),
        }
    }
}
