//! [`Builtin`]: which tool it is, its name, and the capability a call of it needs. The
//! leaf of `builtin/`: the family files and the offering (`mod.rs`) build on it.

use crate::tools::{spawn_capability, FileTool};
use serde_json::Value;

/// A tool weft itself provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Builtin {
    /// A file tool over the thread's own area.
    File(FileTool),
    /// `kv_get`: read the thread's key-value store.
    KvGet,
    /// `kv_set`: write it.
    KvSet,
    /// `set_env`: an environment value for the thread and its descendants.
    SetEnv,
    /// `run_code`: JavaScript in a sandbox.
    RunCode,
    /// `emit`: a custom event for live clients.
    Emit,
    /// `schedule`: a directive or tool later.
    Schedule,
    /// `scheduled_list`: the thread's effects.
    ScheduledList,
    /// `scheduled_cancel`: cancel one.
    ScheduledCancel,
    /// `spawn_thread`: start a child.
    SpawnThread,
    /// `wait_threads`: wait for children.
    WaitThreads,
    /// `cancel_thread`: cancel a descendant.
    CancelThread,
    /// `thread_status`: a descendant's status.
    ThreadStatus,
    /// `directive_return`: finish with structured outputs.
    DirectiveReturn,
    /// `notify_parent`: a message to the parent, now.
    NotifyParent,
    /// `set_status`: the thread's status line.
    SetStatus,
}

/// The capability a built-in's call needs.
pub(crate) enum Needs {
    /// None: every thread may call it.
    Nothing,
    /// This capability.
    Capability(String),
}

impl Builtin {
    /// Every built-in, in the order they are offered (command tools go after
    /// `ScheduledCancel`).
    pub(crate) const ALL: [Builtin; 21] = [
        Builtin::File(FileTool::Read),
        Builtin::File(FileTool::List),
        Builtin::File(FileTool::Find),
        Builtin::File(FileTool::Grep),
        Builtin::File(FileTool::Write),
        Builtin::File(FileTool::Delete),
        Builtin::KvGet,
        Builtin::KvSet,
        Builtin::SetEnv,
        Builtin::RunCode,
        Builtin::Emit,
        Builtin::Schedule,
        Builtin::ScheduledList,
        Builtin::ScheduledCancel,
        Builtin::SpawnThread,
        Builtin::WaitThreads,
        Builtin::CancelThread,
        Builtin::ThreadStatus,
        Builtin::DirectiveReturn,
        Builtin::NotifyParent,
        Builtin::SetStatus,
    ];

    /// Its place in [`Builtin::ALL`] (the order tools are offered in).
    pub(crate) fn index(self) -> u32 {
        Builtin::ALL.iter().position(|b| *b == self).unwrap_or(0) as u32
    }

    /// Its name (what the model calls).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Builtin::File(t) => t.name(),
            Builtin::KvGet => "kv_get",
            Builtin::KvSet => "kv_set",
            Builtin::SetEnv => "set_env",
            Builtin::RunCode => "run_code",
            Builtin::Emit => "emit",
            Builtin::Schedule => "schedule",
            Builtin::ScheduledList => "scheduled_list",
            Builtin::ScheduledCancel => "scheduled_cancel",
            Builtin::SpawnThread => "spawn_thread",
            Builtin::WaitThreads => "wait_threads",
            Builtin::CancelThread => "cancel_thread",
            Builtin::ThreadStatus => "thread_status",
            Builtin::DirectiveReturn => "directive_return",
            Builtin::NotifyParent => "notify_parent",
            Builtin::SetStatus => "set_status",
        }
    }

    /// The built-in called `name`.
    pub(crate) fn parse(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The capability a call with `input` needs (or why the call is malformed).
    pub(crate) fn needs(self, input: &Value) -> Result<Needs, String> {
        let cap = |c: &str| Ok(Needs::Capability(c.to_string()));
        match self {
            Builtin::DirectiveReturn | Builtin::NotifyParent | Builtin::SetStatus => {
                Ok(Needs::Nothing)
            }
            Builtin::SpawnThread => match input.get("directive").and_then(Value::as_str) {
                Some(d) => Ok(Needs::Capability(spawn_capability(d))),
                None => Err("spawn_thread needs a `directive` (string)".into()),
            },
            Builtin::WaitThreads | Builtin::CancelThread | Builtin::ThreadStatus => {
                cap("thread.spawn.**")
            }
            Builtin::KvGet | Builtin::KvSet => cap("kv"),
            Builtin::Emit => cap("emit"),
            Builtin::SetEnv => cap("env.set"),
            Builtin::RunCode => cap("code.run"),
            Builtin::Schedule | Builtin::ScheduledList | Builtin::ScheduledCancel => {
                cap("schedule")
            }
            Builtin::File(t) => cap(t.capability()),
        }
    }
}
