//! The tools over a thread's own state (SPEC §10, Standard Agents' `ThreadState`): `kv_get` /
//! `kv_set` on its durable key-value store (capability `kv`), `emit`, a custom event for live
//! clients and the transcript (capability `emit`), `set_env`, an environment value for itself
//! and its descendants (capability `env.set`), and `run_code`, JavaScript in a sandbox
//! (capability `code.run`, see `tools/code.rs`). The store calls run as tasks: the actor
//! never waits on store.db.

use super::tool::Builtin;
use crate::provider::{ToolCall, ToolSpec};
use crate::record::line::Line;
use crate::store::ThreadStore;
use crate::thread::state::Thread;
use crate::tools::ToolOutcome;
use serde_json::{json, Value};

/// The spec of a state tool.
pub(super) fn spec(b: Builtin) -> ToolSpec {
    let (description, input_schema) = match b {
        Builtin::KvGet => (
            "Read a value this thread stored under `key` (null when there is none). The store is durable and this thread's own.",
            json!({"type":"object","properties":{"key":{"type":"string"}},"required":["key"]}),
        ),
        Builtin::KvSet => (
            "Store a JSON value under `key` in this thread's durable store; a null value deletes the key.",
            json!({"type":"object","properties":{"key":{"type":"string"},"value":{}},"required":["key","value"]}),
        ),
        Builtin::SetEnv => (
            "Set an environment value for this thread and its descendants' tools (a tool receives the variables its definition lists). With secret=true it is stored encrypted and never shown: every occurrence in transcripts, events and tool results reads [secret:NAME].",
            json!({"type":"object","properties":{"name":{"type":"string"},"value":{"type":"string"},"secret":{"type":"boolean","default":false}},"required":["name","value"]}),
        ),
        Builtin::RunCode => (
            "Run JavaScript (QuickJS, no modules, no network) and get the value of its last expression as JSON, with what it printed through console.log. Helpers: kv.get(key) / kv.set(key, value) for this thread's store, files.read(path) / files.write(path, text) / files.list(path) for its file area, as its permissions allow. Limits: 32 MiB, `timeout` seconds (default 5, at most 30).",
            json!({"type":"object","properties":{"source":{"type":"string"},"timeout":{"type":"number"}},"required":["source"]}),
        ),
        _ => (
            "Send a custom event (a name and any JSON data) to the people and programs watching this thread live; it is kept in the transcript too.",
            json!({"type":"object","properties":{"event":{"type":"string"},"data":{}},"required":["event"]}),
        ),
    };
    ToolSpec {
        name: b.name().into(),
        description: description.into(),
        input_schema,
    }
}

fn key_of(input: &Value) -> Result<String, ToolOutcome> {
    input
        .get("key")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| ToolOutcome::err("needs a `key` (string)"))
}

impl Thread {
    /// `kv_get` / `kv_set`, on a task.
    pub(crate) fn kv(&mut self, set: bool, call: ToolCall) -> Option<ToolOutcome> {
        let key = match key_of(&call.input) {
            Ok(k) => k,
            Err(e) => return Some(e),
        };
        let value = call.input.get("value").cloned();
        if set && value.is_none() {
            return Some(ToolOutcome::err(
                "kv_set needs a `value` (null deletes the key)",
            ));
        }
        let value = value.filter(|v| !v.is_null());
        let store = self.ctx.store.clone();
        let id = self.id().clone();
        let work = async move {
            let done = tokio::task::spawn_blocking(move || {
                if set {
                    let deleted = value.is_none();
                    store
                        .kv_set(&id, &key, value)
                        .map(|()| json!({ "key": key, "stored": !deleted, "deleted": deleted }))
                } else {
                    store
                        .kv_get(&id, &key)
                        .map(|v| json!({ "key": key, "value": v }))
                }
            })
            .await;
            match done {
                Ok(Ok(v)) => ToolOutcome::ok(v),
                Ok(Err(e)) => ToolOutcome::err(e.to_string()),
                Err(e) => ToolOutcome::err(format!("the key-value store failed: {e}")),
            }
        };
        self.run_as_task(call.id, work);
        None
    }

    /// `emit`: a transcript line that live clients receive as an `emit` event.
    pub(crate) fn emit(&mut self, input: &Value) -> ToolOutcome {
        let Some(event) = input.get("event").and_then(Value::as_str) else {
            return ToolOutcome::err("emit needs an `event` name (string)");
        };
        let ok = !event.is_empty()
            && event.len() <= 64
            && event
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
        if !ok {
            return ToolOutcome::err(format!(
                "`{event}` is not an event name: use 1–64 letters, digits, `_`, `-`, `.`, `:`"
            ));
        }
        let data = input.get("data").cloned().unwrap_or(Value::Null);
        if data.to_string().len() > 64 * 1024 {
            return ToolOutcome::err(
                "emit's data is over 64 KiB as JSON; keep big data in the file area",
            );
        }
        self.log(Line::Emit {
            event: event.to_string(),
            data,
        });
        ToolOutcome::ok(json!({ "emitted": event }))
    }

    /// `set_env`, on a task: the value in this thread's scope, seen by its descendants' next tool
    /// calls (resolution walks up the parent chain when a call starts).
    pub(crate) fn set_env(&mut self, call: ToolCall) -> Option<ToolOutcome> {
        let (Some(name), Some(value)) = (call.input["name"].as_str(), call.input["value"].as_str())
        else {
            return Some(ToolOutcome::err(
                "set_env needs `name` and `value` (strings)",
            ));
        };
        let (name, value) = (name.to_string(), value.to_string());
        let secret = call.input["secret"] == true;
        let store = self.ctx.store.clone();
        let scope = crate::store::Scope::Thread(self.id().clone());
        let work = async move {
            let done = tokio::task::spawn_blocking(move || {
                store
                    .env_set(&scope, &name, &value, secret)
                    .map(|()| json!({ "name": name, "secret": secret, "scope": "thread" }))
            })
            .await;
            match done {
                Ok(Ok(v)) => ToolOutcome::ok(v),
                Ok(Err(e)) => ToolOutcome::err(e.to_string()),
                Err(e) => ToolOutcome::err(format!("set_env failed: {e}")),
            }
        };
        self.run_as_task(call.id, work);
        None
    }

    /// `run_code`, on a blocking thread (the engine runs synchronously; its interrupt handler stops
    /// it on time, memory or this thread's cancel).
    pub(crate) fn run_code(&mut self, call: ToolCall) -> Option<ToolOutcome> {
        let Some(source) = call.input["source"].as_str().map(str::to_string) else {
            return Some(ToolOutcome::err(
                "run_code needs `source` (JavaScript text)",
            ));
        };
        let timeout = call.input["timeout"].as_f64();
        let caps = &self.doc.capabilities;
        let allowed = |c: &str| crate::core::capability::allowed(caps, c);
        let env = crate::tools::CodeEnv {
            thread: self.id().clone(),
            store: self.ctx.store.clone(),
            area: self.ctx.store.files_dir(self.id()),
            limits: self.ctx.config.files,
            allowed: (allowed("kv"), allowed("fs.read"), allowed("fs.write")),
            cancel: self.life.cancel.child_token(),
        };
        let work = async move {
            match tokio::task::spawn_blocking(move || crate::tools::run_code(&source, timeout, env))
                .await
            {
                Ok(Ok(v)) => ToolOutcome::ok(v),
                Ok(Err(e)) => ToolOutcome::err(e),
                Err(e) => ToolOutcome::err(format!("run_code failed: {e}")),
            }
        };
        self.run_as_task(call.id, work);
        None
    }
}
