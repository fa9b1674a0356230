//! The tool phase of a turn: each call through the capability gate (and, if it needs one, a
//! person's approval) to the built-in, MCP or command tool that runs it; results collected in
//! call order, then the next turn (or the end, after a valid `directive_return`).

use super::builtin::{Builtin, Needs};
use super::msg::ThreadMsg;
use super::state::{Ending, Phase, Thread};
use crate::core::status::Status;
use crate::hooks::HookEvent;
use crate::provider::{Block, Message, Role, ToolCall};
use crate::record::line::Line;
use crate::tools::{check, needed_capability, ToolOutcome};
use serde_json::json;
use std::collections::HashMap;

impl Thread {
    /// Runs or starts one tool call. `Some` = answered now; `None` = a task or waiter will
    /// answer.
    pub(crate) async fn dispatch_tool(&mut self, call: ToolCall) -> Option<ToolOutcome> {
        crate::core::failpoint::hit("tool.dispatch");
        let span = super::spans::tool(&self.life.span, &call.name, &call.id);
        self.work.spans.insert(call.id.clone(), span);
        if let Some(why) = unusable_arguments(&call) {
            return Some(ToolOutcome::err(why));
        }
        if !self.talk.tools.iter().any(|t| t.name == call.name) {
            let names: Vec<&str> = self.talk.tools.iter().map(|t| t.name.as_str()).collect();
            return Some(ToolOutcome::err(format!(
                "unknown or ungranted tool `{}` (available: {})",
                call.name,
                names.join(", ")
            )));
        }
        let needed = match Builtin::parse(&call.name) {
            Some(b) => b.needs(&call.input).map(|n| match n {
                Needs::Nothing => None,
                Needs::Capability(c) => Some(c),
            }),
            None => needed_capability(&call).map(Some),
        };
        let needed = match needed {
            Ok(n) => n,
            Err(m) => return Some(ToolOutcome::err(m)),
        };
        if let Some(cap) = &needed {
            if let Err(denied) = check(&self.doc.capabilities, cap, self.doc.id.as_str()) {
                self.log(Line::ToolDenied {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    capability: cap.clone(),
                });
                return Some(ToolOutcome::err(denied));
            }
        }
        if self.needs_approval(&call, needed.as_deref()) {
            self.park_for_approval(call);
            return None;
        }
        self.run_tool(call).await
    }

    /// Runs or starts one call that passed the gate (and, if it needed one, a person's
    /// approval).
    pub(crate) async fn run_tool(&mut self, call: ToolCall) -> Option<ToolOutcome> {
        if self.record.failed.is_some() {
            // The thread ends once this message is handled: nothing more of it starts.
            return Some(ToolOutcome::err(
                "not run: the thread's transcript could not be written",
            ));
        }
        if let Some(b) = Builtin::parse(&call.name) {
            return self.run_builtin(b, call).await;
        }
        // What a command or an MCP server does is seen outside weft: the lines announcing it
        // are stored first (records on a database server are queued until then).
        self.settle_records();
        if self.record.failed.is_some() {
            return Some(ToolOutcome::err(
                "not run: the thread's transcript could not be stored",
            ));
        }
        if call.name.starts_with("mcp__") {
            return self.mcp_tool(call);
        }
        if self.ctx.commands.get(&call.name).is_some() {
            return self.command_tool(call);
        }
        Some(ToolOutcome::err(format!(
            "tool `{}` has no implementation in this build",
            call.name
        )))
    }

    /// Runs `work` as a task that reports its outcome as [`ThreadMsg::ToolFinished`]; the
    /// thread does not end before it has.
    pub(crate) fn run_as_task(
        &mut self,
        call_id: String,
        work: impl std::future::Future<Output = ToolOutcome> + Send + 'static,
    ) {
        self.work.tasks.insert(call_id.clone());
        let me = self.me.clone();
        tokio::spawn(async move {
            let outcome = work.await;
            let _ = me.cast(ThreadMsg::ToolFinished { call_id, outcome });
        });
    }

    /// A tool of an MCP server, on a task (abandoned on cancel).
    fn mcp_tool(&mut self, call: ToolCall) -> Option<ToolOutcome> {
        let Some((server, tool)) = crate::tools::split_mcp_name(&call.name) else {
            return Some(ToolOutcome::err(format!(
                "`{}` is not an MCP tool name",
                call.name
            )));
        };
        let (server, tool) = (server.to_string(), tool.to_string());
        let ctx = self.ctx.clone();
        let cancel = self.life.cancel.child_token();
        let area = self.ctx.store.files_dir(self.id());
        let (id, input) = (call.id.clone(), call.input);
        self.ctx.refresh_secrets();
        let redactor = self.ctx.redactor();
        self.run_as_task(call.id, async move {
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

    /// A command tool, as a process on a task.
    fn command_tool(&mut self, call: ToolCall) -> Option<ToolOutcome> {
        let Some(tool) = self.ctx.commands.get(&call.name).cloned() else {
            return Some(ToolOutcome::err(format!("unknown tool `{}`", call.name)));
        };
        let root = self.ctx.project.root.clone();
        let area = self.ctx.store.files_dir(self.id());
        let cancel = self.life.cancel.child_token();
        let (id, input) = (call.id.clone(), call.input);
        self.ctx.refresh_secrets();
        let redactor = self.ctx.redactor();
        let (store, thread) = (self.ctx.store.clone(), self.id().clone());
        let procs = Some(self.ctx.project.procs_dir());
        self.run_as_task(call.id, async move {
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
            let env = crate::tools::CallEnv {
                vars,
                redactor,
                procs,
            };
            let r = crate::tools::run_command(&tool, &input, &root, &area, &id, cancel, &env).await;
            ToolOutcome {
                content: r.content,
                is_error: r.is_error,
                returned: None,
            }
        });
        None
    }

    /// A tool running as a task ended.
    pub(crate) async fn tool_finished(&mut self, call_id: String, outcome: ToolOutcome) {
        self.work.tasks.remove(&call_id);
        if matches!(self.phase, Phase::Draining(_)) {
            // Ending anyway, but what the tool did (or that it was killed) is recorded.
            self.log(Line::ToolResult {
                id: call_id.clone(),
                is_error: outcome.is_error,
                content: outcome.content.clone(),
            });
        }
        if !self.drained().await {
            self.tool_done(call_id, outcome).await;
        }
    }

    /// One call's result is in: recorded, and once the turn's results are all in, the next
    /// turn (or the end, after a valid `directive_return`).
    pub(crate) async fn tool_done(&mut self, call_id: String, mut outcome: ToolOutcome) {
        // A tool may print a secret (its env holds them): the model never reads it.
        self.ctx.refresh_secrets();
        if let std::borrow::Cow::Owned(clean) = self.ctx.redactor().redact(&outcome.content) {
            outcome.content = clean;
        }
        let Phase::Tools {
            pending,
            results,
            returned,
            ..
        } = &mut self.phase
        else {
            return;
        };
        // Not a call of this turn, or its result is already in.
        if !pending.remove(&call_id) {
            return;
        }
        if let Some(outputs) = &outcome.returned {
            *returned = Some(outputs.clone());
        }
        results.insert(call_id.clone(), outcome.clone());
        let done = pending.is_empty();
        if let Some(span) = self.work.spans.remove(&call_id) {
            if outcome.is_error {
                span.record("error.type", "tool_error");
            }
        }
        self.log(Line::ToolResult {
            id: call_id,
            is_error: outcome.is_error,
            content: outcome.content,
        });
        crate::core::failpoint::hit("tool.result");
        if done {
            self.results_in().await;
        }
    }

    /// Every result of the turn is in: they join the conversation in call order.
    async fn results_in(&mut self) {
        let Phase::Tools {
            order,
            mut results,
            returned,
            ..
        } = std::mem::replace(&mut self.phase, Phase::Idle)
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
        self.talk.push(Message {
            role: Role::User,
            content: blocks,
        });
        let Some(outputs) = returned else {
            let _ = self.me.cast(ThreadMsg::NextTurn);
            return;
        };
        if self.hooks.wants(HookEvent::DirectiveReturn) {
            let ctx = json!({ "thread_id": self.doc.id, "outputs": outputs,
                              "cost": { "turns": self.doc.cost.turns, "spend_nanos": self.calls.own_spend } });
            self.fire(HookEvent::DirectiveReturn, ctx);
        }
        let e = Ending {
            outputs: Some(outputs),
            ..Ending::with(Status::Completed)
        };
        self.finalize(e).await;
    }

    /// Starts the calls of a model's turn, in order.
    pub(crate) async fn start_tools(&mut self, calls: Vec<ToolCall>) {
        self.phase = Phase::Tools {
            order: calls.iter().map(|c| c.id.clone()).collect(),
            pending: calls.iter().map(|c| c.id.clone()).collect(),
            results: HashMap::new(),
            returned: None,
        };
        for call in calls {
            let id = call.id.clone();
            if let Some(outcome) = self.dispatch_tool(call).await {
                self.tool_done(id, outcome).await;
            }
        }
    }

    /// A person's decision on a parked call (`call` None: the only one parked).
    pub(crate) async fn decide(
        &mut self,
        call: Option<String>,
        approve: bool,
        reason: Option<String>,
    ) -> Result<String, String> {
        if self.phase.ending() {
            return Err(format!("thread {} is ending", self.doc.id));
        }
        let parked = self
            .work
            .take_parked(call.as_deref(), self.doc.id.as_str())?;
        self.log(Line::ApprovalDecided {
            id: parked.id.clone(),
            name: parked.name.clone(),
            approved: approve,
            reason: reason.clone(),
            by: "person".into(),
        });
        self.publish_waiting();
        let id = parked.id.clone();
        let outcome = match approve {
            true => self.run_tool(parked).await,
            false => {
                let why = reason.unwrap_or_else(|| "no reason given".into());
                Some(ToolOutcome::err(format!("denied by a person: {why}")))
            }
        };
        if let Some(outcome) = outcome {
            self.tool_done(id.clone(), outcome).await;
        }
        Ok(id)
    }
}

/// Why `call`'s arguments cannot be used (see [`crate::core::limits::UNPARSED`]): a clear
/// error for the model.
fn unusable_arguments(call: &ToolCall) -> Option<String> {
    let why = call.input.get(crate::core::limits::UNPARSED)?;
    let why: String = why.as_str().unwrap_or_default().chars().take(200).collect();
    Some(format!(
        "the arguments of `{}` were not used ({why}): they must be one JSON object nested at most {} levels deep",
        call.name,
        crate::core::limits::MAX_NESTING
    ))
}
