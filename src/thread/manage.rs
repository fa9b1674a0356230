//! The thread-management tools (SPEC §7): `spawn_thread`, `wait_threads`, `cancel_thread`,
//! `thread_status`, `directive_return`. They act on the actor's own state, so they live here
//! rather than in `tools/`.
//!
//! Fast tools answer at once; `spawn_thread` runs as a task and reports by message; waits are
//! state in the actor, resolved when children report. A bad argument is an error result for the
//! model, never a failure of the thread.

use super::children::entry_claim;
use super::state::{Child, ThreadState, Waiter};
use super::{ParentLink, SpawnRequest, ThreadMsg};
use crate::core::ids::ThreadId;
use crate::core::limits::LimitSet;
use crate::core::money::Nanos;
use crate::directive::Directive;
use crate::provider::{ToolCall, ToolSpec};
use crate::registry::RegistryMsg;
use crate::tools::{may_manage, ToolOutcome};
use ractor::ActorRef;
use serde_json::{json, Value};
use std::time::Duration;

/// The tools offered to the model.
pub(super) fn offered(
    d: &Directive,
    caps: &[String],
    commands: &crate::tools::CommandTools,
) -> Vec<ToolSpec> {
    let mut out = Vec::new();
    let allowed = |cap: &str| crate::core::capability::allowed(caps, cap);
    out.extend(crate::tools::file_tool_specs(allowed));
    out.extend(super::state_tools::specs(allowed));
    out.extend(super::schedule::specs(allowed));
    out.extend(
        commands
            .iter()
            .filter(|t| allowed(&format!("tool.{}", t.name)))
            .map(|t| ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                input_schema: t.input_schema.clone(),
            }),
    );
    if may_manage(caps) {
        out.push(ToolSpec {
            name: "spawn_thread".into(),
            description: "Start a child thread running another directive. With wait=true (default) the child's result is returned; with wait=false its id is returned at once and its completion is announced later.".into(),
            input_schema: json!({"type":"object","properties":{
                "directive":{"type":"string"},"inputs":{"type":"object"},
                "limits":{"type":"object","description":"lower limits for the child (turns, tokens, spend, duration, depth, spawns, concurrency)"},
                "reserve":{"type":"number","description":"USD set aside for the child out of this thread's budget"},
                "wait":{"type":"boolean","default":true},
                "files":{"type":"array","items":{"type":"string"},"description":"paths in this thread's file area copied into the child's"}},"required":["directive"]}),
        });
        out.push(ToolSpec {
            name: "wait_threads".into(),
            description: "Wait for child threads (all live ones when ids is omitted) and return their results.".into(),
            input_schema: json!({"type":"object","properties":{"ids":{"type":"array","items":{"type":"string"}},"timeout":{"type":"number","description":"seconds"}}}),
        });
        out.push(ToolSpec {
            name: "cancel_thread".into(),
            description: "Cancel one of this thread's descendants and its subtree.".into(),
            input_schema: json!({"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}),
        });
        out.push(ToolSpec {
            name: "thread_status".into(),
            description: "Status, cost and outputs of one of this thread's descendants.".into(),
            input_schema: json!({"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}),
        });
    }
    let has_area = allowed("fs.read") || allowed("fs.write");
    if d.outputs.is_empty() && !has_area {
        // Nothing to return: the thread ends with its text answer.
        return out;
    }
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
    out.push(ToolSpec {
        name: "directive_return".into(),
        description: "Finish this thread with its structured outputs.".into(),
        input_schema: {
            if has_area && !d.outputs.contains_key("files") {
                props.insert(
                    "files".into(),
                    json!({"type":"array","items":{"type":"string"},"description":"paths in this thread's file area handed to its parent"}),
                );
            }
            json!({"type":"object","properties":props,"required":required})
        },
    });
    out
}

pub(super) fn directive_return(s: &mut ThreadState, input: &Value) -> ToolOutcome {
    let mut given = input.as_object().cloned().unwrap_or_default();
    // `files` names files of this thread's area for its parent, unless it is a declared output.
    let files = if s.directive.outputs.contains_key("files") {
        Vec::new()
    } else {
        match paths(given.remove("files").as_ref()) {
            Ok(f) => f,
            Err(e) => return ToolOutcome::err(e),
        }
    };
    let area = s.ctx.store.files_dir(s.id());
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
    match s.directive.check_outputs(&given) {
        Ok(()) => {
            s.returned_files = files;
            ToolOutcome {
                content: json!({"ok": true}).to_string(),
                is_error: false,
                returned: Some(Value::Object(given)),
            }
        }
        Err(m) => ToolOutcome::err(m.to_string()),
    }
}

pub(super) fn spawn_thread(
    me: &ActorRef<ThreadMsg>,
    s: &mut ThreadState,
    call: ToolCall,
) -> Option<ToolOutcome> {
    let input = &call.input;
    let directive = input
        .get("directive")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let inputs = match input.get("inputs") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Some(ToolOutcome::err(format!(
                "`inputs` must be an object, got {other}"
            )))
        }
    };
    let overrides = match input.get("limits") {
        None | Some(Value::Null) => LimitSet::default(),
        Some(Value::Object(m)) => match LimitSet::from_map(m) {
            Ok(l) => l,
            Err(e) => return Some(ToolOutcome::err(e.to_string())),
        },
        Some(other) => {
            return Some(ToolOutcome::err(format!(
                "`limits` must be an object, got {other}"
            )))
        }
    };
    let reserve = match input.get("reserve") {
        None | Some(Value::Null) => Nanos::ZERO,
        Some(v) => match Nanos::from_json_usd(v) {
            Ok(n) => n,
            Err(e) => return Some(ToolOutcome::err(format!("`reserve`: {e}"))),
        },
    };
    let wait = input.get("wait").and_then(Value::as_bool).unwrap_or(true);
    let attach = match paths(input.get("files")) {
        Ok(p) => p,
        Err(e) => return Some(ToolOutcome::err(e)),
    };
    let area = s.ctx.store.files_dir(s.id());
    for rel in &attach {
        if let Err(e) = crate::tools::resolve_in_area(&area, rel) {
            return Some(ToolOutcome::err(format!("`files`: {e}")));
        }
    }
    let req = SpawnRequest {
        directive,
        inputs,
        overrides,
        reserve,
        parent: None,
        cap: None,
        seed: None,
        continuation: None,
        attach,
        route: s.route.clone(),
        parent_span: None,
    };
    start_child(me, s, call.id, req, wait);
    None
}

/// Starts a child of this thread as a task (`spawn_thread`, a hook's `spawn`); it reports back
/// as [`ThreadMsg::ChildSpawned`] or [`ThreadMsg::SpawnRefused`] under `call_id`, and the thread
/// does not end while it is under way.
pub(super) fn start_child(
    me: &ActorRef<ThreadMsg>,
    s: &mut ThreadState,
    call_id: String,
    mut req: SpawnRequest,
    wait: bool,
) {
    s.spawning.insert(call_id.clone());
    req.parent_span = s.tool_spans.get(&call_id).cloned();
    let ctx = s.ctx.clone();
    req.parent = Some(ParentLink {
        id: s.doc.id.clone(),
        actor: me.clone(),
    });
    let me = me.clone();
    tokio::spawn(async move {
        match super::spawn(&ctx, req, None).await {
            Ok((child, actor)) => {
                let msg = ThreadMsg::ChildSpawned {
                    call_id,
                    child,
                    actor: actor.clone(),
                    wait,
                };
                if me.cast(msg).is_err() {
                    // The parent is already gone (e.g. killed after its cancel grace): the child
                    // must not outlive it.
                    let _ = actor.cast(ThreadMsg::Cancel {
                        reason: "its parent ended before it started".into(),
                    });
                }
            }
            Err(e) => {
                let _ = me.cast(ThreadMsg::SpawnRefused {
                    call_id,
                    error: format!("spawn refused: {e}"),
                });
            }
        }
    });
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

pub(super) fn wait_threads(
    me: &ActorRef<ThreadMsg>,
    s: &mut ThreadState,
    call: ToolCall,
) -> Option<ToolOutcome> {
    let ids: Vec<ThreadId> = match call.input.get("ids") {
        None | Some(Value::Null) => s.live_children(),
        Some(Value::Array(a)) => {
            let mut ids = Vec::new();
            for v in a {
                match parse_id(Some(v)) {
                    Ok(id) if s.children.contains_key(&id) => ids.push(id),
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
    for id in &ids {
        entry_claim(s, id);
    }
    // Reports already announced-to-be are now delivered by this call instead.
    s.announce.retain(|r| !ids.contains(&r.thread_id));
    if ids.iter().all(|id| {
        s.children
            .get(id)
            .is_some_and(|c: &Child| c.report.is_some())
    }) {
        return Some(wait_result(s, &ids, false));
    }
    if let Some(secs) = call
        .input
        .get("timeout")
        .and_then(Value::as_f64)
        .filter(|t| t.is_finite() && *t >= 0.0)
    {
        let me2 = me.clone();
        let call_id = call.id.clone();
        s.timers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(secs.min(86_400.0))).await;
            let _ = me2.cast(ThreadMsg::WaitTimeout { call_id });
        }));
    }
    s.waiters.push(Waiter {
        call_id: call.id,
        ids,
    });
    None
}

/// The result of a wait: each child's report, or `running` for those still live at a timeout.
pub(super) fn wait_result(s: &ThreadState, ids: &[ThreadId], timed_out: bool) -> ToolOutcome {
    let mut any_failed = false;
    let items: Vec<Value> = ids
        .iter()
        .map(
            |id| match s.children.get(id).and_then(|c| c.report.as_ref()) {
                Some(r) => {
                    any_failed |= r.status != crate::core::status::Status::Completed;
                    json!(r)
                }
                None => json!({ "thread_id": id, "status": "running" }),
            },
        )
        .collect();
    let mut out = if ids.len() == 1 && !timed_out {
        ToolOutcome::ok(items.into_iter().next().unwrap_or(Value::Null))
    } else {
        ToolOutcome::ok(json!({ "threads": items, "timed_out": timed_out }))
    };
    out.is_error = any_failed && ids.len() == 1;
    out
}

pub(super) async fn cancel_thread(s: &mut ThreadState, input: &Value) -> ToolOutcome {
    let id = match parse_id(input.get("id")) {
        Ok(id) => id,
        Err(e) => return ToolOutcome::err(e),
    };
    let direct = s
        .children
        .get(&id)
        .map(|c| (c.actor.clone(), c.report.is_some()));
    let actor = match direct {
        Some((_, true)) => {
            return ToolOutcome::ok(json!({ "thread_id": id, "status": "already finished" }))
        }
        Some((Some(a), false)) => a,
        _ => {
            let ok = ractor::call!(s.ctx.registry, |reply| RegistryMsg::IsDescendant {
                ancestor: s.doc.id.clone(),
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
    let _ = actor.cast(ThreadMsg::Cancel {
        reason: format!("cancel_thread by {}", s.doc.id),
    });
    ToolOutcome::ok(json!({ "thread_id": id, "status": "cancelling" }))
}

pub(super) async fn thread_status(s: &mut ThreadState, input: &Value) -> ToolOutcome {
    let id = match parse_id(input.get("id")) {
        Ok(id) => id,
        Err(e) => return ToolOutcome::err(e),
    };
    let desc = ractor::call!(s.ctx.registry, |reply| RegistryMsg::IsDescendant {
        ancestor: s.doc.id.clone(),
        id: id.clone(),
        reply
    });
    if !matches!(desc, Ok(Ok(true))) {
        return ToolOutcome::err(format!("{id} is not a descendant of this thread"));
    }
    match ractor::call!(s.ctx.registry, |reply| RegistryMsg::Get {
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
