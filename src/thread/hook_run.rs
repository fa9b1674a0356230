//! Firing hooks (SPEC §9) at a thread's moments: the engine (`crate::hooks`) picks the hooks an
//! event fires; this runs their actions where the thread's state is — injecting context into the
//! conversation, running commands as tasks (the event as JSON on stdin), appending the usage
//! record. A failing hook is a `hook_failed` transcript event and never changes the thread.

use super::state::ThreadState;
use super::{SpawnRequest, ThreadMsg};
use crate::hooks::{Action, Inject};
use crate::provider::Block;
use ractor::ActorRef;
use serde_json::{json, Value};
use std::sync::Arc;

/// What the hooks of one event decided.
#[derive(Default)]
pub(super) struct Fired {
    /// Context injected (for `thread_started` and `thread_continued`), in hook order.
    pub injected: Vec<String>,
    /// The first control decision of a hook that may decide (layers 0–3).
    pub control: Option<crate::hooks::Control>,
}

/// Whether any of this thread's hooks listens to `event` (so its context is built only then).
pub(super) fn wants(s: &ThreadState, event: &str) -> bool {
    s.hooks.iter().any(|h| h.event == event)
}

/// Fires `event` with context `ctx`.
pub(super) fn fire(
    me: &ActorRef<ThreadMsg>,
    s: &mut ThreadState,
    event: &str,
    mut ctx: Value,
) -> Fired {
    let hooks = s.hooks.clone();
    let firing = crate::hooks::firing(&hooks, event, &ctx);
    let mut fired = Fired::default();
    if firing.is_empty() {
        return fired;
    }
    if let Some(o) = ctx.as_object_mut() {
        o.insert("event".into(), json!(event));
    }
    for h in firing {
        let done: Result<&str, String> = match &h.action {
            Action::Inject(i) => inject_text(s, i, &ctx).map(|t| {
                fired.injected.push(t);
                "inject"
            }),
            Action::Control(c) => {
                if h.layer == 4 {
                    Ok("control_observed")
                } else {
                    fired.control.get_or_insert(*c);
                    Ok("control")
                }
            }
            Action::Run { argv, timeout } => {
                run(s, &h.id, argv, *timeout, &ctx);
                Ok("run")
            }
            Action::UsageRecord => usage_record(s, &ctx).map(|()| "usage_record"),
            Action::Emit {
                event_type,
                payload,
            } => {
                let payload = crate::hooks::interpolate_value(payload, &ctx);
                s.log(
                    "hook_event",
                    json!({ "id": h.id, "event_type": event_type, "payload": payload }),
                );
                Ok("emit")
            }
            Action::Spawn { directive, inputs } => {
                let inputs = inputs
                    .iter()
                    .map(|(k, v)| {
                        let v = match v {
                            Value::String(t) => Value::String(crate::hooks::interpolate(t, &ctx)),
                            other => other.clone(),
                        };
                        (k.clone(), v)
                    })
                    .collect();
                spawn(me, s, &h.id, directive, inputs, event == "after_complete");
                Ok(if event == "after_complete" {
                    "spawn_root"
                } else {
                    "spawn"
                })
            }
        };
        match done {
            // The built-in usage record is the usage file's line, not a transcript event.
            Ok("usage_record") => {}
            Ok(kind) => s.log(
                "hook_fired",
                json!({ "id": h.id, "event": event, "action": kind, "layer": h.layer }),
            ),
            Err(e) => s.log(
                "hook_failed",
                json!({ "id": h.id, "event": event, "error": e, "source": h.source }),
            ),
        }
    }
    fired
}

/// Adds injected context to the last user message (the first one, at the start).
pub(super) fn inject_into_conversation(s: &mut ThreadState, injected: Vec<String>) {
    if injected.is_empty() {
        return;
    }
    let text = injected.join("\n\n");
    if let Some(m) = Arc::make_mut(&mut s.messages).last_mut() {
        m.content.insert(0, Block::Text { text });
    }
}

fn inject_text(s: &ThreadState, i: &Inject, ctx: &Value) -> Result<String, String> {
    match i {
        Inject::Text(t) => Ok(crate::hooks::interpolate(t, ctx)),
        Inject::File(p) => {
            std::fs::read_to_string(p).map_err(|e| format!("inject file {}: {e}", p.display()))
        }
        Inject::Directive(name) => s
            .ctx
            .library
            .load_name(name)
            .map(|d| d.body)
            .map_err(|e| format!("inject directive `{name}`: {e}")),
    }
}

/// Runs a hook's command as a task (same process rules as command tools: own process group,
/// cleared environment, killed at its timeout), tracked so the process waits for it at exit.
fn run(s: &ThreadState, id: &str, argv: &[String], timeout: std::time::Duration, ctx: &Value) {
    let tool = crate::tools::CommandTool::for_hook(id, argv.to_vec(), timeout);
    let root = s.ctx.project.root.clone();
    let area = s.ctx.store.files_dir(s.id());
    let input = ctx.clone();
    let id = id.to_string();
    let thread = s.doc.id.clone();
    // A hook's output is only logged: cleaned of secrets like a tool's.
    let env = crate::tools::CallEnv {
        vars: Default::default(),
        redactor: s.ctx.redactor(),
    };
    let task = tokio::spawn(async move {
        let r = crate::tools::run_command(
            &tool,
            &input,
            &root,
            &area,
            &format!("hook-{id}"),
            tokio_util::sync::CancellationToken::new(),
            &env,
        )
        .await;
        if r.is_error {
            tracing::warn!(thread = %thread, hook = %id, "hook command failed: {}", r.content);
        }
    });
    track(s, task);
}

/// A hook's `spawn`: a child of the hooked thread (reported back like any child); on
/// `after_complete`, when the thread is ending, a new root with its directive's own limits — its
/// budget is its own, not drawn from the ended thread — tracked so the process waits for it.
fn spawn(
    me: &ActorRef<ThreadMsg>,
    s: &mut ThreadState,
    id: &str,
    directive: &str,
    inputs: serde_json::Map<String, Value>,
    as_root: bool,
) {
    let req = SpawnRequest {
        directive: directive.to_string(),
        inputs,
        overrides: Default::default(),
        reserve: crate::core::money::Nanos::ZERO,
        parent: None,
        cap: None,
        seed: None,
        continuation: None,
        attach: Vec::new(),
        route: s.route.clone(),
        parent_span: None,
    };
    if !as_root {
        return super::manage::start_child(me, s, format!("hook:{id}"), req, false);
    }
    let ctx = s.ctx.clone();
    let (thread, hook) = (s.doc.id.clone(), id.to_string());
    let task = tokio::spawn(async move {
        let (tx, rx) = tokio::sync::oneshot::channel();
        match super::spawn(&ctx, req, Some(tx)).await {
            Ok(_) => {
                let _ = rx.await;
            }
            Err(e) => {
                tracing::warn!(thread = %thread, hook = %hook, "after_complete spawn refused: {e}")
            }
        }
    });
    track(s, task);
}

/// One line per thread, one `write` each (O_APPEND: lines of concurrent threads and processes
/// never interleave), on a file kept open by the runtime.
/// Keeps a hook's task for `Runtime::drain_hooks` (dropping those already finished).
fn track(s: &ThreadState, task: tokio::task::JoinHandle<()>) {
    s.ctx.track(task);
}

fn usage_record(s: &ThreadState, ctx: &Value) -> Result<(), String> {
    use std::io::Write;
    let path = s.ctx.project.weft().join("usage.jsonl");
    let line = format!("{}\n", crate::hooks::usage_line(ctx));
    let mut log = s
        .ctx
        .usage_log
        .lock()
        .map_err(|_| "the usage log lock is poisoned".to_string())?;
    if log.is_none() {
        *log = Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?,
        );
    }
    log.as_mut()
        .map_or(Ok(()), |f| f.write_all(line.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))
}
