//! Firing hooks (SPEC §9) at a thread's moments: the engine (`crate::hooks`) picks the hooks an
//! event fires; this runs their actions where the thread's state is — injecting context into the
//! conversation, running commands as tasks (the event as JSON on stdin), spawning, appending the
//! usage record, lifting a limit once on `control: continue`. A failing hook is a `hook_failed`
//! transcript event and never changes the thread.

use super::spawn::{Deferred, Origin, SpawnRequest};
use super::state::Thread;
use crate::hooks::{Action, Control, Hook, HookEvent, Inject};
use crate::provider::Block;
use crate::record::line::Line;
use crate::thread::spawn::{defer, give_back};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// What the hooks of one event decided.
#[derive(Default)]
pub(crate) struct Fired {
    /// Context injected (for `thread_started` and `thread_continued`), in hook order.
    pub(crate) injected: Vec<String>,
    /// The first control decision of a hook that may decide (layers 0–3).
    pub(crate) control: Option<Control>,
}

impl Thread {
    /// Fires `event` with context `ctx`.
    pub(crate) fn fire(&mut self, event: HookEvent, mut ctx: Value) -> Fired {
        let hooks = self.hooks.list.clone();
        let mut firing = crate::hooks::firing(&hooks, event, &ctx);
        // A thread a hook's spawn led to never fires that hook again (no causal loops).
        firing.retain(|h| !self.doc.caused_by.contains(&h.id));
        let mut fired = Fired::default();
        if firing.is_empty() {
            return fired;
        }
        if let Some(o) = ctx.as_object_mut() {
            o.insert("event".into(), json!(event));
        }
        // A hook's command acts outside weft: what led to it is stored first.
        if firing
            .iter()
            .any(|h| matches!(h.action, crate::hooks::Action::Run { .. }))
        {
            self.settle_records();
        }
        for h in firing {
            match self.act(h, event, &ctx, &mut fired) {
                // The built-in usage record is the usage file's line, not a transcript event.
                Ok("usage_record") => {}
                Ok(kind) => self.log(Line::HookFired {
                    id: h.id.clone(),
                    event: event.as_str().into(),
                    action: kind.into(),
                    layer: h.layer,
                }),
                Err(error) => self.log(Line::HookFailed {
                    id: h.id.clone(),
                    event: Some(event.as_str().into()),
                    error,
                    source: Some(h.source.clone()),
                }),
            }
        }
        fired
    }

    /// Runs one hook's action; returns what it did (the transcript's `action`).
    fn act(
        &mut self,
        h: &Hook,
        event: HookEvent,
        ctx: &Value,
        fired: &mut Fired,
    ) -> Result<&'static str, String> {
        match &h.action {
            Action::Inject(i) => self.inject_text(i, ctx).map(|t| {
                fired.injected.push(t);
                "inject"
            }),
            Action::Control(_) if h.layer == 4 => Ok("control_observed"),
            Action::Control(c) => {
                fired.control.get_or_insert(*c);
                Ok("control")
            }
            Action::Run { argv, timeout } => {
                self.run_hook_command(&h.id, argv, *timeout, ctx);
                Ok("run")
            }
            Action::UsageRecord => self.usage_record(ctx).map(|()| "usage_record"),
            Action::Emit {
                event_type,
                payload,
            } => {
                let payload = crate::hooks::interpolate_value(payload, ctx);
                self.log(Line::HookEvent {
                    id: h.id.clone(),
                    event_type: event_type.clone(),
                    payload,
                });
                Ok("emit")
            }
            Action::Spawn { directive, inputs } => {
                let inputs = interpolated(inputs, ctx);
                let as_root = event == HookEvent::AfterComplete;
                self.hook_spawn(&h.id, directive, inputs, as_root)?;
                Ok(if as_root { "spawn_root" } else { "spawn" })
            }
        }
    }

    /// `control: continue` on a limit: lifts `limit` once (a turn or a tenth more tokens);
    /// spend, duration and depth are never lifted (money and time are not a hook's to give).
    pub(crate) fn lift_once(&mut self, limit: &str) -> bool {
        if self.hooks.lifted.iter().any(|l| l == limit) {
            self.log(continue_line(limit, Some("already lifted once")));
            return false;
        }
        match limit {
            "turns" => self.limits.turns += 1,
            "tokens" => self.limits.tokens += (self.limits.tokens / 10).max(1),
            other => {
                self.log(continue_line(other, Some("this limit is never lifted")));
                return false;
            }
        }
        self.hooks.lifted.push(limit.to_string());
        self.log(continue_line(limit, None));
        true
    }

    /// Adds injected context to the last user message (the first one, at the start).
    pub(crate) fn inject_context(&mut self, injected: Vec<String>) {
        if injected.is_empty() {
            return;
        }
        let text = injected.join("\n\n");
        self.talk
            .edit_last(|m| m.content.insert(0, Block::Text { text }));
    }

    fn inject_text(&self, i: &Inject, ctx: &Value) -> Result<String, String> {
        match i {
            Inject::Text(t) => Ok(crate::hooks::interpolate(t, ctx)),
            Inject::File(p) => {
                // Through no link out of the project (the path itself is checked when parsed).
                let root = self.ctx.project.root.canonicalize();
                let real = p.canonicalize();
                match (root, real) {
                    (Ok(root), Ok(real)) if real.starts_with(&root) => {
                        std::fs::read_to_string(&real)
                            .map_err(|e| format!("inject file {}: {e}", p.display()))
                    }
                    (_, Err(e)) => Err(format!("inject file {}: {e}", p.display())),
                    _ => Err(format!(
                        "inject file {}: it leads out of the project (a link); not read",
                        p.display()
                    )),
                }
            }
            Inject::Directive(name) => self
                .ctx
                .library
                .load_name(name)
                .map(|d| d.body)
                .map_err(|e| format!("inject directive `{name}`: {e}")),
        }
    }

    /// Runs a hook's command as a task (same process rules as command tools: own process
    /// group, cleared environment, killed at its timeout), tracked so the process waits for it
    /// at exit.
    fn run_hook_command(
        &self,
        id: &str,
        argv: &[String],
        timeout: std::time::Duration,
        ctx: &Value,
    ) {
        let tool = crate::tools::CommandTool::for_hook(id, argv.to_vec(), timeout);
        let root = self.ctx.project.root.clone();
        let area = self.ctx.store.files_dir(self.id());
        let input = ctx.clone();
        let id = id.to_string();
        let thread = self.doc.id.clone();
        // A hook's output is only logged: cleaned of secrets like a tool's.
        let env = crate::tools::CallEnv {
            vars: Default::default(),
            redactor: self.ctx.redactor(),
            procs: Some(self.ctx.project.procs_dir()),
        };
        // It carries its tree's cancel: killed when the tree is cancelled, even after this
        // thread has ended.
        let caused = self.ctx.caused.enter(&self.doc.root_id);
        let task = tokio::spawn(async move {
            let r = crate::tools::run_command(
                &tool,
                &input,
                &root,
                &area,
                &format!("hook-{id}"),
                caused.token.clone(),
                &env,
            )
            .await;
            drop(caused);
            if r.is_error {
                tracing::warn!(thread = %thread, hook = %id, "hook command failed: {}", r.content);
            }
        });
        self.ctx.track(task);
    }

    /// A hook's `spawn`: a child of the hooked thread (reported back like any child, paid from
    /// its account); on `after_complete`, when the thread is ending, a deferred child of its
    /// tree's root — its budget set aside from what the tree has left, refused if it does not
    /// fit — tracked so the process waits for it. Either way it and everything below it never
    /// fire hook `id` again (no causal loops).
    /// A deferred spawn is checked now (capability, inputs, limits, depth): a refusal is the
    /// hook's failure, in this thread's transcript.
    fn hook_spawn(
        &mut self,
        id: &str,
        directive: &str,
        inputs: Map<String, Value>,
        as_root: bool,
    ) -> Result<(), String> {
        let origin = match as_root {
            false => self.as_parent(),
            true => Origin::Deferred(Deferred {
                parent: self.doc.root_id.clone(),
                id: None,
            }),
        };
        let mut req = SpawnRequest::new(directive, inputs, origin);
        req.route = self.route.clone();
        req.hook = Some(id.to_string());
        if !as_root {
            self.start_child(format!("hook:{id}"), req, false);
            return Ok(());
        }
        super::spawn::check(&self.ctx, &req).map_err(|e| format!("spawn refused: {e}"))?;
        let ctx = self.ctx.clone();
        let (thread, hook) = (self.doc.id.clone(), id.to_string());
        let task = tokio::spawn(async move {
            // Boxed, as a child's start (see `start_child`): the future is large.
            if let Err(e) = Box::pin(spawn_deferred(&ctx, req)).await {
                tracing::warn!(thread = %thread, hook = %hook, "after_complete spawn refused: {e}")
            }
        });
        self.ctx.track(task);
        Ok(())
    }

    /// One line per thread, one `write` each (O_APPEND: lines of concurrent threads and
    /// processes never interleave), on a file kept open by the runtime.
    fn usage_record(&self, ctx: &Value) -> Result<(), String> {
        use std::io::Write;
        let path = self.ctx.project.weft().join("usage.jsonl");
        let line = crate::hooks::usage_line(ctx);
        let mut log = self
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
            .map_or(Ok(()), |f| f.write_all(&line))
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Sets aside a deferred child's budget and starts it at once, waiting for its end; the budget
/// goes back when it cannot start.
async fn spawn_deferred(
    ctx: &Arc<crate::thread::Ctx>,
    mut req: SpawnRequest,
) -> Result<(), super::SpawnError> {
    let root = match &req.origin {
        Origin::Deferred(d) => d.parent.clone(),
        _ => return Err(super::SpawnError::Storage("not a deferred spawn".into())),
    };
    let mut caused = ctx.caused.enter(&root);
    // Its tree's cancel withdraws it while it is still starting.
    req.withdrawn = Some(caused.token.clone());
    let (child, _) = defer(ctx, &req).await?;
    if let Origin::Deferred(d) = &mut req.origin {
        d.id = Some(child.clone());
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let actor = match super::spawn::spawn(ctx, req, Some(tx)).await {
        Ok((_, actor)) => actor,
        Err(e) => {
            give_back(ctx, child).await;
            return Err(e);
        }
    };
    if caused.is_thread(child.clone()) {
        ctx.send_cancel(&child, &actor, super::caused::CANCELLED_AS_IT_STARTED);
    }
    let _ = rx.await;
    Ok(())
}

/// A hook's `spawn` inputs, their text interpolated with the event's context.
fn interpolated(inputs: &Map<String, Value>, ctx: &Value) -> Map<String, Value> {
    inputs
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(t) => Value::String(crate::hooks::interpolate(t, ctx)),
                other => other.clone(),
            };
            (k.clone(), v)
        })
        .collect()
}

/// The `hook_control` line of a `continue` on `limit` (refused, or followed).
fn continue_line(limit: &str, refused: Option<&str>) -> Line {
    Line::HookControl {
        action: "continue".into(),
        limit: Some(limit.to_string()),
        refused: refused.map(str::to_string),
        retry: None,
    }
}
