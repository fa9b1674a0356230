//! The hooks engine (SPEC §9): what runs when a thread starts, takes a step, hears from a child,
//! hits a limit or an error, and completes — without editing every directive.
//!
//! Owns loading the layers (0 user `hooks.yaml`, 1 the directive's front matter `hooks:`,
//! 2 built-in, 3 project `.weft/hooks.yaml`, 4 infrastructure), refusing duplicate ids across
//! them, parsing conditions and actions (Rye's `{primary, item_type, item_id}` shape included),
//! and choosing which hooks an event fires, in layer then definition order. Running an action is
//! the thread's (it owns the conversation and the transcript). Must never let a bad hook file
//! pass silently: errors name the file and the hook.

mod cond;
mod event;
#[cfg(feature = "cli")]
pub(crate) mod schema;

pub(crate) use cond::lookup;
use cond::Cond;
pub(crate) use event::HookEvent;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// What a hook does.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Add context to the conversation (`thread_started`, `thread_continued`).
    Inject(Inject),
    /// Run a command with the event as JSON on stdin (same process rules as command tools).
    Run {
        /// Program and arguments (no placeholders, no shell).
        argv: Vec<String>,
        /// Killed after this long.
        timeout: std::time::Duration,
    },
    /// Start a thread of `directive`: a child of the hooked thread (its capability and budget
    /// rules apply), or, on `after_complete`, a new root (the hooked thread has ended).
    Spawn {
        /// Directive name.
        directive: String,
        /// Its inputs (strings interpolate the event).
        inputs: serde_json::Map<String, Value>,
    },
    /// Decide what an `error` or `limit` does (observers of layer 4 never decide).
    Control(Control),
    /// Record an event in the transcript (`hook_event`, Rye's emitter): its type and payload,
    /// interpolated from the event.
    Emit {
        /// The event's type.
        event_type: String,
        /// Its payload (strings interpolate `${path}`).
        payload: Value,
    },
    /// Built in: append the usage record of a completed thread to `.weft/usage.jsonl`.
    UsageRecord,
}

/// A control decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// `error`: take the failed turn again (at most [`MAX_HOOK_RETRIES`] times per thread).
    Retry,
    /// End the thread (what happens anyway without a hook).
    Fail,
    /// `limit`: ignore this limit once (never spend or duration: money and time are not lifted).
    Continue,
    /// `limit`: continue in a new thread (turns, tokens and duration afresh; money never).
    Handoff,
}

/// Retries `control: retry` may order per thread.
pub(crate) const MAX_HOOK_RETRIES: u32 = 3;

/// Where injected context comes from.
#[derive(Debug, Clone)]
pub(crate) enum Inject {
    /// Literal text (`{input:k}` and `{path}` of the event interpolate).
    Text(String),
    /// A file of the project.
    File(PathBuf),
    /// The body of a directive, by name.
    Directive(String),
}

/// One hook.
#[derive(Debug, Clone)]
pub(crate) struct Hook {
    /// Unique across all layers.
    pub id: String,
    /// The event it fires on.
    pub event: HookEvent,
    /// When it fires (always, if None).
    pub condition: Option<Cond>,
    /// What it does.
    pub action: Action,
    /// Layer 0–4.
    pub layer: u8,
    /// Where it was defined.
    pub source: String,
}

/// A hook definition that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{source_name}: hook `{id}`: {message}")]
pub struct HookError {
    /// The file (or directive) defining it.
    pub source_name: String,
    /// The hook's id (or its position).
    pub id: String,
    /// What is wrong.
    pub message: String,
}

/// The hooks of a project: layers 0, 2, 3 and 4 (a directive's layer 1 joins per thread).
#[derive(Debug, Clone, Default)]
pub(crate) struct Hooks {
    all: Vec<Hook>,
}

pub(crate) use crate::project::config::BuiltinHooks as Builtins;

impl Hooks {
    /// Loads the user's and the project's hook files and the enabled built-ins.
    pub(crate) fn load(
        user_dir: &Path,
        project_weft: &Path,
        root: &Path,
        builtins: Builtins,
    ) -> Result<Hooks, HookError> {
        let mut all = Vec::new();
        let user = user_dir.join("hooks.yaml");
        all.extend(load_file(&user, 0, root)?);
        if builtins.usage_record {
            all.push(Hook {
                id: "builtin_usage_record".into(),
                event: HookEvent::AfterComplete,
                condition: None,
                action: Action::UsageRecord,
                layer: 2,
                source: "built-in".into(),
            });
        }
        all.extend(load_file(&project_weft.join("hooks.yaml"), 3, root)?);
        check_unique(&all)?;
        Ok(Hooks { all })
    }

    /// The hooks a thread of a directive runs: these plus the directive's own (layer 1), in
    /// layer order; a duplicate id across them is an error.
    pub(crate) fn with_directive(
        &self,
        hooks: Option<&Value>,
        source: &str,
        root: &Path,
    ) -> Result<Vec<Hook>, HookError> {
        let mut all = self.all.clone();
        if let Some(v) = hooks {
            all.extend(parse_list(v, 1, source, root)?);
        }
        check_unique(&all)?;
        all.sort_by_key(|h| h.layer);
        Ok(all)
    }
}

/// The hooks of `list` that `event` fires in `ctx`, in order.
pub(crate) fn firing<'a>(list: &'a [Hook], event: HookEvent, ctx: &Value) -> Vec<&'a Hook> {
    list.iter()
        .filter(|h| h.event == event)
        .filter(|h| h.condition.as_ref().is_none_or(|c| c.holds(ctx)))
        .collect()
}

fn check_unique(all: &[Hook]) -> Result<(), HookError> {
    for (i, h) in all.iter().enumerate() {
        if let Some(first) = all[..i].iter().find(|o| o.id == h.id) {
            return Err(HookError {
                source_name: h.source.clone(),
                id: h.id.clone(),
                message: format!(
                    "the id is already used by a hook in {}; ids are unique across layers",
                    first.source
                ),
            });
        }
    }
    Ok(())
}

fn load_file(path: &Path, layer: u8, root: &Path) -> Result<Vec<Hook>, HookError> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(Vec::new());
    };
    let source = path.display().to_string();
    let v: Value = serde_saphyr::from_str(&text).map_err(|e| HookError {
        source_name: source.clone(),
        id: "-".into(),
        message: crate::project::yaml::yaml_message(&e),
    })?;
    if v.is_null() {
        return Ok(Vec::new());
    }
    // `hooks:`, and the sections of Rye's own hook file: `builtin_hooks:` and `context_hooks:`
    // (taken at this file's layer) and `infra_hooks:` (observers, layer 4).
    let mut out = Vec::new();
    let mut found = false;
    for (key, at) in [
        ("hooks", layer),
        ("builtin_hooks", layer),
        ("context_hooks", layer),
        ("infra_hooks", 4),
    ] {
        if let Some(list) = v.get(key) {
            found = true;
            out.extend(parse_list(list, at, &source, root)?);
        }
    }
    if !found {
        return Err(HookError {
            source_name: source,
            id: "-".into(),
            message: "a hooks file holds `hooks: [ ... ]`".into(),
        });
    }
    Ok(out)
}

fn parse_list(v: &Value, layer: u8, source: &str, root: &Path) -> Result<Vec<Hook>, HookError> {
    let Some(items) = v.as_array() else {
        return Err(HookError {
            source_name: source.into(),
            id: "-".into(),
            message: "`hooks` is a list".into(),
        });
    };
    items
        .iter()
        .enumerate()
        .map(|(i, h)| parse_hook(h, i, layer, source, root))
        .collect()
}

fn parse_hook(
    h: &Value,
    i: usize,
    layer: u8,
    source: &str,
    root: &Path,
) -> Result<Hook, HookError> {
    let id = h
        .get("id")
        .and_then(Value::as_str)
        .map_or_else(|| format!("#{}", i + 1), str::to_string);
    let err = |message: String| HookError {
        source_name: source.into(),
        id: id.clone(),
        message,
    };
    if h.get("id").and_then(Value::as_str).is_none() {
        return Err(err("every hook needs an `id`".into()));
    }
    let name = h
        .get("event")
        .and_then(Value::as_str)
        .ok_or_else(|| err("every hook needs an `event`".into()))?;
    let Some(event) = HookEvent::parse(name) else {
        let known: Vec<&str> = HookEvent::ALL.iter().map(|e| e.as_str()).collect();
        return Err(err(format!(
            "unknown event `{name}` ({})",
            known.join(", ")
        )));
    };
    let condition = h
        .get("condition")
        .filter(|c| !c.is_null())
        .map(cond::parse)
        .transpose()
        .map_err(|m| err(format!("condition: {m}")))?;
    let action = h
        .get("action")
        .ok_or_else(|| err("every hook needs an `action`".into()))
        .and_then(|a| parse_action(a, name, root).map_err(|m| err(format!("action: {m}"))))?;
    let layer = match h.get("layer").and_then(Value::as_u64) {
        // Rye files name their layer; an infrastructure hook (4) only observes.
        Some(4) => 4,
        _ => layer,
    };
    Ok(Hook {
        id,
        event,
        condition,
        action,
        layer,
        source: source.into(),
    })
}

fn parse_action(a: &Value, event: &str, root: &Path) -> Result<Action, String> {
    if let Some(i) = a.get("inject") {
        return at_start(Action::Inject(parse_inject(i, root)?), event);
    }
    if let Some(sp) = a.get("spawn") {
        return parse_spawn(sp);
    }
    if let Some(r) = a.get("run") {
        return parse_run(r);
    }
    // Rye's shape: {primary: load|execute, item_type, item_id}.
    if let Some(primary) = a.get("primary").and_then(Value::as_str) {
        return parse_rye_action(a, primary, event, root);
    }
    if let Some(c) = a.get("control") {
        return parse_control(c.as_str().unwrap_or_default(), event);
    }
    Err(format!("unknown action {a} (inject, spawn, run)"))
}

/// `act` (an inject) if `event` is one where a thread starts, where there is a conversation to
/// add to before its first turn.
fn at_start(act: Action, event: &str) -> Result<Action, String> {
    if matches!(event, "thread_started" | "thread_continued") {
        Ok(act)
    } else {
        Err(format!(
            "inject works on thread_started and thread_continued, not {event}"
        ))
    }
}

/// `inject: {text | file | directive}`.
fn parse_inject(i: &Value, root: &Path) -> Result<Inject, String> {
    if let Some(t) = i.get("text").and_then(Value::as_str) {
        Ok(Inject::Text(t.into()))
    } else if let Some(f) = i.get("file").and_then(Value::as_str) {
        // A file of the project only: a hook (a directive's too, one downloaded included)
        // never puts other files of the machine into a prompt.
        let rel = Path::new(f);
        let inside = rel.components().all(|c| {
            matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        });
        if !inside {
            return Err(format!(
                "inject file `{f}`: a path inside the project (no `..`, not absolute)"
            ));
        }
        Ok(Inject::File(root.join(rel)))
    } else if let Some(d) = i.get("directive").and_then(Value::as_str) {
        Ok(Inject::Directive(d.into()))
    } else {
        Err("inject takes `text`, `file` or `directive`".into())
    }
}

/// `spawn: {directive, inputs?}`.
fn parse_spawn(sp: &Value) -> Result<Action, String> {
    let directive = sp
        .get("directive")
        .and_then(Value::as_str)
        .ok_or("spawn needs `directive` (a library name)")?;
    let inputs = match sp.get("inputs") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => return Err(format!("spawn `inputs` is a mapping, got {other}")),
    };
    Ok(Action::Spawn {
        directive: directive.into(),
        inputs,
    })
}

/// `run: {argv, timeout?}` (30 s unless set).
fn parse_run(r: &Value) -> Result<Action, String> {
    let argv: Vec<String> = r
        .get("argv")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if argv.is_empty() {
        return Err("run needs `argv` (a list: program and arguments)".into());
    }
    let timeout = match r.get("timeout").and_then(Value::as_str) {
        Some(t) => humantime::parse_duration(t).map_err(|e| format!("timeout `{t}`: {e}"))?,
        None => std::time::Duration::from_secs(30),
    };
    Ok(Action::Run { argv, timeout })
}

/// Rye's `{primary: load|execute, item_type, item_id, params?}` as the weft action it maps to.
fn parse_rye_action(a: &Value, primary: &str, event: &str, root: &Path) -> Result<Action, String> {
    let item_type = a.get("item_type").and_then(Value::as_str).unwrap_or("");
    let item_id = a.get("item_id").and_then(Value::as_str).unwrap_or("");
    // `knowledge/<id>.md` of the project, else RyeOS's own place, `.ai/knowledge/<id>.md`.
    let knowledge = || {
        let file = format!("{item_id}.md");
        let weft = root.join("knowledge").join(&file);
        let rye = root.join(".ai/knowledge").join(&file);
        Action::Inject(Inject::File(if !weft.exists() && rye.exists() {
            rye
        } else {
            weft
        }))
    };
    if item_type == "knowledge" && !crate::directive::valid_name(item_id) {
        return Err(format!("knowledge `{item_id}` is not a knowledge name (segments of letters, digits, `_-.`; no `..`, no absolute path)"));
    }
    match (primary, item_type) {
        ("load", "knowledge") | ("execute", "knowledge") => at_start(knowledge(), event),
        ("load", "directive") => at_start(Action::Inject(Inject::Directive(item_id.into())), event),
        ("execute", "tool") if item_id.ends_with("/control") => parse_control(
            match a.get("params").and_then(|p| p.get("action")).and_then(Value::as_str) {
                // weft has no limit approval yet: escalating ends the thread, as a limit does.
                Some("abort" | "escalate") => "fail",
                Some(other) => other,
                None => "",
            },
            event,
        ),
        ("execute", "tool") if item_id.ends_with("/emitter") => Ok(rye_emit(a, event)),
        ("execute", "directive") => Ok(Action::Spawn {
            directive: item_id.into(),
            inputs: a
                .get("params")
                .and_then(|p| p.get("inputs").or(Some(p)))
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        }),
        _ => Err(format!(
            "Rye action {primary} {item_type} `{item_id}` has no weft equivalent yet (load knowledge|directive map to inject, execute directive to spawn)"
        )),
    }
}

/// Rye's emitter tool: its params are the payload, `event_type` (default: the hook's event)
/// names the event.
fn rye_emit(a: &Value, event: &str) -> Action {
    let mut params = a.get("params").cloned().unwrap_or(json!({}));
    let event_type = params
        .as_object_mut()
        .and_then(|p| p.remove("event_type"))
        .and_then(|t| t.as_str().map(str::to_string))
        .unwrap_or_else(|| event.to_string());
    Action::Emit {
        event_type,
        payload: params,
    }
}

fn parse_control(what: &str, event: &str) -> Result<Action, String> {
    if !matches!(event, "error" | "limit") {
        return Err(format!(
            "control works on error and limit events, not {event}"
        ));
    }
    match (what, event) {
        ("retry", "error") => Ok(Action::Control(Control::Retry)),
        ("fail", _) => Ok(Action::Control(Control::Fail)),
        ("continue", "limit") => Ok(Action::Control(Control::Continue)),
        ("handoff", "limit") => Ok(Action::Control(Control::Handoff)),
        (other, _) => Err(format!(
            "control `{other}` on {event} (error: retry or fail; limit: continue, handoff or fail)"
        )),
    }
}

/// `{input:k}` (from `inputs`) and `{a.b}` (event paths) replaced in `text`.
pub(crate) fn interpolate(text: &str, ctx: &Value) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let Some(j) = after.find('}') else {
            out.push_str(&rest[i..]);
            return out;
        };
        let key = &after[..j];
        // Rye writes `${path}` and `${event.path}`: the `$` and `event.` are dropped.
        if out.ends_with('$') {
            out.pop();
        }
        let key = key.strip_prefix("event.").unwrap_or(key);
        let path = key
            .strip_prefix("input:")
            .map_or_else(|| key.to_string(), |k| format!("inputs.{k}"));
        match lookup(ctx, &path) {
            Some(Value::String(s)) => out.push_str(s),
            Some(v) if !key.is_empty() => out.push_str(&v.to_string()),
            _ => {
                out.push('{');
                out.push_str(key);
                out.push('}');
            }
        }
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    out
}

/// `payload` with every string interpolated from the event (a string that is exactly one
/// `${path}` takes the path's value, whatever its type).
pub(crate) fn interpolate_value(payload: &Value, ctx: &Value) -> Value {
    match payload {
        Value::String(t) => {
            let whole = t
                .strip_prefix("${")
                .and_then(|r| r.strip_suffix('}'))
                .filter(|k| !k.contains(['{', '}']));
            match whole.and_then(|k| lookup(ctx, k.strip_prefix("event.").unwrap_or(k))) {
                Some(v) => v.clone(),
                None => Value::String(interpolate(t, ctx)),
            }
        }
        Value::Array(a) => Value::Array(a.iter().map(|v| interpolate_value(v, ctx)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), interpolate_value(v, ctx)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The usage record of a completed thread (nova's shape), one line of `.weft/usage.jsonl`
/// with its newline. Its keys in alphabetical order, as the record has always been written;
/// serialized straight from the event, with no JSON value built between.
pub(crate) fn usage_line(ctx: &Value) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Usage<'a> {
        cache_read_tokens: &'a Value,
        cost_nanos: &'a Value,
        directive: &'a Value,
        duration_ms: &'a Value,
        input_tokens: &'a Value,
        output_tokens: &'a Value,
        status: &'a Value,
        thread_id: &'a Value,
        timestamp: String,
        turns: &'a Value,
    }
    let g = |p: &str| lookup(ctx, p).unwrap_or(&Value::Null);
    let usage = Usage {
        cache_read_tokens: g("cost.cache_read_tokens"),
        cost_nanos: g("cost.own_spend_nanos"),
        directive: g("directive"),
        duration_ms: g("duration_ms"),
        input_tokens: g("cost.input_tokens"),
        output_tokens: g("cost.output_tokens"),
        status: g("status"),
        thread_id: g("thread_id"),
        timestamp: crate::core::ids::now_ts(),
        turns: g("cost.turns"),
    };
    // Serializing borrowed values cannot fail.
    let mut line = serde_json::to_vec(&usage).unwrap_or_default();
    line.push(b'\n');
    line
}
