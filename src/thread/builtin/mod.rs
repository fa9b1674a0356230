//! weft's built-in tools as one enum, [`Builtin`] (mini-redis's `Command` is the model): for
//! each tool, its name, its spec, when it is offered, the capability a call needs and how it
//! runs are matches over the enum, so the compiler refuses a tool without any of them. The
//! names command tools may not take and the list offered to a model derive from it.
//!
//! One file per family runs its tools as methods of the thread: `manage` (SPEC §7: spawn,
//! wait, cancel, status, `directive_return`), `talk` (`notify_parent`, `set_status`), `state`
//! (`kv_get`/`kv_set`, `emit`, `set_env`, `run_code`), `schedule` (`schedule`,
//! `scheduled_list`, `scheduled_cancel`) and `files` (the file area, see `tools/files.rs`).
//! Slow work runs as a task that reports back by message; a bad argument is an error result
//! for the model, never a failure of the thread.

mod files;
mod manage;
mod schedule;
mod state;
mod talk;
mod tool;

pub(crate) use tool::{Builtin, Needs};

use crate::core::capability::allowed;
use crate::directive::Directive;
use crate::provider::{ToolCall, ToolSpec};
use crate::thread::specs::{Offered, SpecCache};
use crate::thread::state::Thread;
use crate::tools::{may_manage, CommandTools, ToolOutcome};
use serde_json::{json, Value};

/// What decides whether a tool is offered to a thread.
pub(crate) struct Offer<'a> {
    /// The thread's directive.
    pub(crate) directive: &'a Directive,
    /// Its capabilities.
    pub(crate) caps: &'a [String],
    /// Whether it has a parent.
    pub(crate) has_parent: bool,
}

impl Offer<'_> {
    fn allows(&self, cap: &str) -> bool {
        allowed(self.caps, cap)
    }

    fn has_area(&self) -> bool {
        self.allows("fs.read") || self.allows("fs.write")
    }
}

impl Builtin {
    /// Whether it is offered to a thread.
    fn offered(self, o: &Offer) -> bool {
        match self {
            Builtin::File(t) => o.allows(t.capability()),
            Builtin::KvGet | Builtin::KvSet => o.allows("kv"),
            Builtin::SetEnv => o.allows("env.set"),
            Builtin::RunCode => o.allows("code.run"),
            Builtin::Emit => o.allows("emit"),
            Builtin::Schedule | Builtin::ScheduledList | Builtin::ScheduledCancel => {
                o.allows("schedule")
            }
            Builtin::SpawnThread
            | Builtin::WaitThreads
            | Builtin::CancelThread
            | Builtin::ThreadStatus => may_manage(o.caps),
            // Nothing to return: the thread ends with its text answer.
            Builtin::DirectiveReturn => !o.directive.outputs.is_empty() || o.has_area(),
            Builtin::NotifyParent | Builtin::SetStatus => o.has_parent,
        }
    }

    /// Its spec as offered (`directive_return`'s is built from the directive's outputs).
    fn spec(self, o: &Offer) -> ToolSpec {
        match self {
            Builtin::File(t) => t.spec(),
            Builtin::KvGet
            | Builtin::KvSet
            | Builtin::SetEnv
            | Builtin::RunCode
            | Builtin::Emit => state::spec(self),
            Builtin::Schedule | Builtin::ScheduledList | Builtin::ScheduledCancel => {
                schedule::spec(self)
            }
            Builtin::SpawnThread
            | Builtin::WaitThreads
            | Builtin::CancelThread
            | Builtin::ThreadStatus => manage::spec(self),
            Builtin::DirectiveReturn => manage::return_spec(o.directive, o.has_area()),
            Builtin::NotifyParent | Builtin::SetStatus => talk::spec(self),
        }
    }
}

/// The names no command tool may take.
pub(crate) fn reserved_names() -> Vec<&'static str> {
    Builtin::ALL.iter().map(|b| b.name()).collect()
}

/// The tools offered to a thread: the built-ins it may use, with the project's command tools
/// it may call after the state and scheduling tools — one list (and its text bytes) shared by
/// every thread of `cache` with the same capabilities, parentage and declared outputs.
pub(crate) fn offered(o: &Offer, commands: &CommandTools, cache: &SpecCache) -> Offered {
    let outputs = serde_json::to_string(&o.directive.outputs).unwrap_or_default();
    cache.get((o.caps.to_vec(), o.has_parent, outputs), || {
        let builtins: Vec<Builtin> = Builtin::ALL.into_iter().filter(|b| b.offered(o)).collect();
        let allowed: Vec<u16> = commands
            .iter()
            .enumerate()
            .filter(|(_, t)| o.allows(&format!("tool.{}", t.name)))
            .map(|(i, _)| i as u16)
            .collect();
        build(o, &builtins, commands, &allowed)
    })
}

/// The list: built-ins up to `scheduled_cancel`, the allowed command tools, the other built-ins.
fn build(
    o: &Offer,
    builtins: &[Builtin],
    commands: &CommandTools,
    allowed: &[u16],
) -> Vec<ToolSpec> {
    let commands_at = builtins
        .iter()
        .position(|b| b.index() > Builtin::ScheduledCancel.index())
        .unwrap_or(builtins.len());
    let (before, after) = builtins.split_at(commands_at);
    let mut out: Vec<ToolSpec> = before.iter().map(|b| b.spec(o)).collect();
    out.extend(
        commands
            .iter()
            .enumerate()
            .filter(|(i, _)| allowed.contains(&(*i as u16)))
            .map(|(_, t)| ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                input_schema: t.input_schema.clone(),
            }),
    );
    out.extend(after.iter().map(|b| b.spec(o)));
    out
}

/// A call's input as the transcript keeps it: a secret `set_env` value is already hidden
/// (it is not yet among the known secrets when the call is logged).
pub(crate) fn loggable_input(call: &ToolCall) -> Value {
    let mut input = call.input.clone();
    if call.name == Builtin::SetEnv.name() && input["secret"] == true {
        let name = input["name"].as_str().unwrap_or("?").to_string();
        input["value"] = json!(format!("[secret:{name}]"));
    }
    input
}

impl Thread {
    /// Runs or starts one built-in call that passed the gate. `Some` = answered now; `None` = a
    /// task or waiter will answer.
    pub(crate) async fn run_builtin(&mut self, b: Builtin, call: ToolCall) -> Option<ToolOutcome> {
        match b {
            Builtin::DirectiveReturn => Some(self.directive_return(&call.input)),
            Builtin::NotifyParent => Some(self.notify_parent(&call.input)),
            Builtin::SetStatus => Some(self.set_status(&call.input)),
            Builtin::SpawnThread => self.spawn_thread(call),
            Builtin::WaitThreads => self.wait_threads(call),
            Builtin::CancelThread => Some(self.cancel_thread(&call.input).await),
            Builtin::ThreadStatus => Some(self.thread_status(&call.input).await),
            Builtin::KvGet | Builtin::KvSet => self.kv(b == Builtin::KvSet, call),
            Builtin::Emit => Some(self.emit(&call.input)),
            Builtin::SetEnv => self.set_env(call),
            Builtin::RunCode => self.run_code(call),
            Builtin::Schedule | Builtin::ScheduledList | Builtin::ScheduledCancel => {
                self.schedule_tools(b, call)
            }
            Builtin::File(t) => self.file_tool(t, call),
        }
    }
}
