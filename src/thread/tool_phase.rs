//! The tool phase of a turn: results collected in call order, then the next turn (or the end,
//! after a valid `directive_return`).

use super::state::{Ending, Phase, ThreadState};
use super::{manage, ToolOutcome};
use super::{ThreadActor, ThreadMsg};
use crate::core::status::Status;
use crate::provider::ToolCall;
use crate::provider::{Block, Message, Role};
use crate::tools::{check, needed_capability};
use ractor::ActorRef;
use serde_json::json;
use std::sync::Arc;

impl ThreadActor {
    pub(super) async fn tool_done(
        &self,
        me: &ActorRef<ThreadMsg>,
        s: &mut ThreadState,
        call_id: String,
        mut outcome: ToolOutcome,
    ) {
        // A tool may print a secret (its env holds them): the model never reads it.
        s.ctx.refresh_secrets();
        if let std::borrow::Cow::Owned(clean) = s.ctx.redactor().redact(&outcome.content) {
            outcome.content = clean;
        }
        let Phase::Tools {
            order,
            results,
            returned,
        } = &mut s.phase
        else {
            return;
        };
        if !order.contains(&call_id) || results.contains_key(&call_id) {
            return;
        }
        if let Some(outputs) = &outcome.returned {
            *returned = Some(outputs.clone());
        }
        results.insert(call_id.clone(), outcome.clone());
        let done = results.len() == order.len();
        if let Some(span) = s.tool_spans.remove(&call_id) {
            if outcome.is_error {
                span.record("error.type", "tool_error");
            }
        }
        s.log(
            "tool_result",
            json!({ "id": call_id, "is_error": outcome.is_error, "content": outcome.content }),
        );
        crate::core::failpoint::hit("tool.result");
        if !done {
            return;
        }
        let Phase::Tools {
            order,
            mut results,
            returned,
        } = std::mem::replace(&mut s.phase, Phase::Idle)
        else {
            return;
        };
        let blocks: Vec<Block> = order
            .iter()
            .filter_map(|id| {
                results.remove(id).map(|r| Block::ToolResult {
                    id: id.clone(),
                    content: r.content,
                    is_error: r.is_error,
                })
            })
            .collect();
        Arc::make_mut(&mut s.messages).push(Message {
            role: Role::User,
            content: blocks,
        });
        if let Some(outputs) = returned {
            if super::hook_run::wants(s, "directive_return") {
                let ctx = json!({ "thread_id": s.doc.id, "outputs": outputs,
                                  "cost": { "turns": s.doc.cost.turns, "spend_nanos": s.own_spend } });
                super::hook_run::fire(me, s, "directive_return", ctx);
            }
            let e = Ending {
                status: Status::Completed,
                result: None,
                outputs: Some(outputs),
                error: None,
            };
            return self.finalize(me, s, e).await;
        }
        let _ = me.cast(ThreadMsg::NextTurn);
    }
}

/// Runs `work` as a task that reports its outcome as [`ThreadMsg::ToolFinished`]; the thread
/// does not end before it has.
pub(super) fn run_as_task(
    me: &ActorRef<ThreadMsg>,
    s: &mut ThreadState,
    call_id: String,
    work: impl std::future::Future<Output = ToolOutcome> + Send + 'static,
) {
    s.tool_tasks.insert(call_id.clone());
    let me = me.clone();
    tokio::spawn(async move {
        let outcome = work.await;
        let _ = me.cast(ThreadMsg::ToolFinished { call_id, outcome });
    });
}

/// Runs or starts one tool call. `Some` = answered now; `None` = a task or waiter will answer.
pub(super) async fn dispatch(
    me: &ActorRef<ThreadMsg>,
    s: &mut ThreadState,
    call: ToolCall,
) -> Option<ToolOutcome> {
    crate::core::failpoint::hit("tool.dispatch");
    let span = super::spans::tool(&s.span, &call.name, &call.id);
    s.tool_spans.insert(call.id.clone(), span);
    if !s.tools.iter().any(|t| t.name == call.name) {
        let names: Vec<&str> = s.tools.iter().map(|t| t.name.as_str()).collect();
        return Some(ToolOutcome::err(format!(
            "unknown or ungranted tool `{}` (available: {})",
            call.name,
            names.join(", ")
        )));
    }
    let needed = match needed_capability(&call) {
        Ok(n) => n,
        Err(m) => return Some(ToolOutcome::err(m)),
    };
    if let Some(cap) = &needed {
        if let Err(denied) = check(&s.doc.capabilities, cap, s.doc.id.as_str()) {
            s.log(
                "tool_denied",
                json!({ "id": call.id, "name": call.name, "capability": cap }),
            );
            return Some(ToolOutcome::err(denied));
        }
    }
    if super::approval::required(s, &call, needed.as_deref()) {
        super::approval::park(s, call);
        return None;
    }
    run(me, s, call).await
}

/// Runs or starts one call that passed the gate (and, if it needed one, a person's approval).
pub(super) async fn run(
    me: &ActorRef<ThreadMsg>,
    s: &mut ThreadState,
    call: ToolCall,
) -> Option<ToolOutcome> {
    match call.name.as_str() {
        "directive_return" => Some(manage::directive_return(s, &call.input)),
        "notify_parent" => Some(super::messages::notify_parent(s, &call.input)),
        "set_status" => Some(super::messages::set_status(s, &call.input)),
        "spawn_thread" => manage::spawn_thread(me, s, call),
        "kv_get" | "kv_set" => super::state_tools::kv(me, s, call),
        "emit" => Some(super::state_tools::emit(s, &call.input)),
        "set_env" => super::state_tools::set_env(me, s, call),
        "run_code" => super::state_tools::run_code(me, s, call),
        "schedule" | "scheduled_list" | "scheduled_cancel" => super::schedule::run(me, s, call),
        "wait_threads" => manage::wait_threads(me, s, call),
        "cancel_thread" => Some(manage::cancel_thread(s, &call.input).await),
        "thread_status" => Some(manage::thread_status(s, &call.input).await),
        name if crate::tools::FILE_TOOLS.iter().any(|(n, _)| *n == name) => {
            let area = s.ctx.store.files_dir(s.id());
            let limits = s.ctx.config.files;
            let (name, input) = (call.name.clone(), call.input.clone());
            let lock = s.files_lock.clone();
            run_as_task(me, s, call.id, async move {
                let res = tokio::task::spawn_blocking(move || {
                    let _one_at_a_time = lock.lock().unwrap_or_else(|p| p.into_inner());
                    crate::tools::run_file_tool(&name, &input, &area, limits)
                })
                .await;
                match res {
                    Ok(Ok(v)) => ToolOutcome::ok(v),
                    Ok(Err(m)) => ToolOutcome::err(m),
                    Err(e) => ToolOutcome::err(format!("file tool failed: {e}")),
                }
            });
            None
        }
        name if name.starts_with("mcp__") => {
            let Some((server, tool)) = crate::tools::split_mcp_name(name) else {
                return Some(ToolOutcome::err(format!(
                    "`{name}` is not an MCP tool name"
                )));
            };
            let (server, tool) = (server.to_string(), tool.to_string());
            let ctx = s.ctx.clone();
            let cancel = s.cancel.child_token();
            let input = call.input.clone();
            let area = s.ctx.store.files_dir(s.id());
            let id = call.id.clone();
            s.ctx.refresh_secrets();
            let redactor = s.ctx.redactor();
            run_as_task(me, s, call.id, async move {
                let (content, is_error) = ctx
                    .mcp
                    .call((&server, &tool), &input, &area, &id, cancel, &redactor)
                    .await;
                ToolOutcome {
                    content,
                    is_error,
                    returned: None,
                }
            });
            None
        }
        name if s.ctx.commands.get(name).is_some() => {
            let Some(tool) = s.ctx.commands.get(name).cloned() else {
                return Some(ToolOutcome::err("unknown tool"));
            };
            let root = s.ctx.project.root.clone();
            let area = s.ctx.store.files_dir(s.id());
            let cancel = s.cancel.child_token();
            let (id, input) = (call.id.clone(), call.input.clone());
            s.ctx.refresh_secrets();
            let redactor = s.ctx.redactor();
            let (store, thread) = (s.ctx.store.clone(), s.id().clone());
            run_as_task(me, s, call.id, async move {
                // The thread's values, read when the call starts (a `set_env` of an ancestor
                // reaches it here).
                let vars = match tool.env.is_empty() {
                    true => Ok(Default::default()),
                    false => tokio::task::spawn_blocking(move || store.env_resolve(&thread))
                        .await
                        .map_err(|e| e.to_string())
                        .and_then(|r| r.map_err(|e| e.to_string())),
                };
                let vars = match vars {
                    Ok(v) => v
                        .into_values()
                        .filter_map(|e| Some((e.name, e.value?)))
                        .collect(),
                    Err(e) => {
                        return ToolOutcome::err(format!(
                            "tool `{}`: its environment cannot be read: {e}",
                            tool.name
                        ))
                    }
                };
                let env = crate::tools::CallEnv { vars, redactor };
                let r =
                    crate::tools::run_command(&tool, &input, &root, &area, &id, cancel, &env).await;
                ToolOutcome {
                    content: r.content,
                    is_error: r.is_error,
                    returned: None,
                }
            });
            None
        }
        _ => Some(ToolOutcome::err(format!(
            "tool `{}` has no implementation in this build",
            call.name
        ))),
    }
}
