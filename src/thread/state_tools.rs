//! The tools over a thread's own state (SPEC §10, Standard Agents' `ThreadState`): `kv_get` /
//! `kv_set` on its durable key-value store (capability `kv`), `emit`, a custom event for live
//! clients and the transcript (capability `emit`), and `set_env`, an environment value for
//! itself and its descendants (capability `env.set`), and `run_code`, JavaScript in a sandbox
//! (capability `code.run`, see `tools/code.rs`). The store calls run as tasks: the actor
//! never waits on store.db.

use super::state::ThreadState;
use super::ThreadMsg;
use crate::provider::{ToolCall, ToolSpec};
use crate::store::ThreadStore;
use crate::tools::ToolOutcome;
use ractor::ActorRef;
use serde_json::{json, Value};

/// The specs of the state tools `allowed` grants.
pub(super) fn specs(allowed: impl Fn(&str) -> bool) -> Vec<ToolSpec> {
    let mut out = Vec::new();
    if allowed("kv") {
        out.push(ToolSpec {
            name: "kv_get".into(),
            description: "Read a value this thread stored under `key` (null when there is none). The store is durable and this thread's own.".into(),
            input_schema: json!({"type":"object","properties":{"key":{"type":"string"}},"required":["key"]}),
        });
        out.push(ToolSpec {
            name: "kv_set".into(),
            description: "Store a JSON value under `key` in this thread's durable store; a null value deletes the key.".into(),
            input_schema: json!({"type":"object","properties":{"key":{"type":"string"},"value":{}},"required":["key","value"]}),
        });
    }
    if allowed("env.set") {
        out.push(ToolSpec {
            name: "set_env".into(),
            description: "Set an environment value for this thread and its descendants' tools (a tool receives the variables its definition lists). With secret=true it is stored encrypted and never shown: every occurrence in transcripts, events and tool results reads [secret:NAME].".into(),
            input_schema: json!({"type":"object","properties":{"name":{"type":"string"},"value":{"type":"string"},"secret":{"type":"boolean","default":false}},"required":["name","value"]}),
        });
    }
    if allowed("code.run") {
        out.push(ToolSpec {
            name: "run_code".into(),
            description: "Run JavaScript (QuickJS, no modules, no network) and get the value of its last expression as JSON, with what it printed through console.log. Helpers: kv.get(key) / kv.set(key, value) for this thread's store, files.read(path) / files.write(path, text) / files.list(path) for its file area, as its permissions allow. Limits: 32 MiB, `timeout` seconds (default 5, at most 30).".into(),
            input_schema: json!({"type":"object","properties":{"source":{"type":"string"},"timeout":{"type":"number"}},"required":["source"]}),
        });
    }
    if allowed("emit") {
        out.push(ToolSpec {
            name: "emit".into(),
            description: "Send a custom event (a name and any JSON data) to the people and programs watching this thread live; it is kept in the transcript too.".into(),
            input_schema: json!({"type":"object","properties":{"event":{"type":"string"},"data":{}},"required":["event"]}),
        });
    }
    out
}

fn key_of(input: &Value) -> Result<String, ToolOutcome> {
    input
        .get("key")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| ToolOutcome::err("needs a `key` (string)"))
}

/// `kv_get` / `kv_set`, on a task.
pub(super) fn kv(
    me: &ActorRef<ThreadMsg>,
    s: &mut ThreadState,
    call: ToolCall,
) -> Option<ToolOutcome> {
    let key = match key_of(&call.input) {
        Ok(k) => k,
        Err(e) => return Some(e),
    };
    let set = call.name == "kv_set";
    let value = call.input.get("value").cloned();
    if set && value.is_none() {
        return Some(ToolOutcome::err(
            "kv_set needs a `value` (null deletes the key)",
        ));
    }
    let value = value.filter(|v| !v.is_null());
    let store = s.ctx.store.clone();
    let id = s.id().clone();
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
    super::tool_phase::run_as_task(me, s, call.id, work);
    None
}

/// `emit`: a transcript line that live clients receive as an `emit` event.
pub(super) fn emit(s: &mut ThreadState, input: &Value) -> ToolOutcome {
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
    s.log("emit", json!({ "event": event, "data": data }));
    ToolOutcome::ok(json!({ "emitted": event }))
}

/// A call's input as the transcript keeps it: a secret `set_env` value is already hidden
/// (it is not yet among the known secrets when the call is logged).
pub(super) fn loggable_input(call: &ToolCall) -> Value {
    let mut input = call.input.clone();
    if call.name == "set_env" && input["secret"] == true {
        let name = input["name"].as_str().unwrap_or("?").to_string();
        input["value"] = json!(format!("[secret:{name}]"));
    }
    input
}

/// `set_env`, on a task: the value in this thread's scope, seen by its descendants' next tool
/// calls (resolution walks up the parent chain when a call starts).
pub(super) fn set_env(
    me: &ActorRef<ThreadMsg>,
    s: &mut ThreadState,
    call: ToolCall,
) -> Option<ToolOutcome> {
    let (Some(name), Some(value)) = (call.input["name"].as_str(), call.input["value"].as_str())
    else {
        return Some(ToolOutcome::err(
            "set_env needs `name` and `value` (strings)",
        ));
    };
    let (name, value) = (name.to_string(), value.to_string());
    let secret = call.input["secret"] == true;
    let store = s.ctx.store.clone();
    let scope = crate::store::Scope::Thread(s.id().clone());
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
    super::tool_phase::run_as_task(me, s, call.id, work);
    None
}

/// `run_code`, on a blocking thread (the engine runs synchronously; its interrupt handler stops
/// it on time, memory or this thread's cancel).
pub(super) fn run_code(
    me: &ActorRef<ThreadMsg>,
    s: &mut ThreadState,
    call: ToolCall,
) -> Option<ToolOutcome> {
    let Some(source) = call.input["source"].as_str().map(str::to_string) else {
        return Some(ToolOutcome::err(
            "run_code needs `source` (JavaScript text)",
        ));
    };
    let timeout = call.input["timeout"].as_f64();
    let caps = &s.doc.capabilities;
    let allowed = |c: &str| crate::core::capability::allowed(caps, c);
    let env = crate::tools::CodeEnv {
        thread: s.id().clone(),
        store: s.ctx.store.clone(),
        area: s.ctx.store.files_dir(s.id()),
        limits: s.ctx.config.files,
        allowed: (allowed("kv"), allowed("fs.read"), allowed("fs.write")),
        cancel: s.cancel.child_token(),
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
    super::tool_phase::run_as_task(me, s, call.id, work);
    None
}
