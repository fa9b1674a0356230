//! JSON Schema of a hooks file (`.weft/hooks.yaml`, the user's `hooks.yaml`) and of a
//! directive's `hooks:` list, for editors (`weft schema hooks`). Hooks are read from YAML by
//! hand (`parse_hook`, `parse_action`, `cond::parse`), so this schema is written beside them;
//! its events come from [`HookEvent::ALL`] and its condition operators from the same list the
//! parser names, and `weft schema`'s test validates every hooks file in the repository.

use super::cond::OPS;
use super::HookEvent;
use serde_json::{json, Value};

/// One hook.
fn hook() -> Value {
    let events: Vec<&str> = HookEvent::ALL.iter().map(|e| e.as_str()).collect();
    json!({
        "type": "object",
        "required": ["id", "event", "action"],
        "properties": {
            "id": { "type": "string", "description": "unique across every layer" },
            "event": { "enum": events },
            "condition": { "anyOf": [ { "type": "null" }, { "$ref": "#/$defs/condition" } ] },
            "action": { "$ref": "#/$defs/action" },
            "layer": { "type": "integer", "description": "Rye files name their layer; 4 only observes" },
            "description": { "type": "string" }
        }
    })
}

/// What a hook does: inject, spawn, run, control, or Rye's `{primary, item_type, item_id}`.
fn action() -> Value {
    json!({
        "type": "object",
        "anyOf": [
            { "required": ["inject"], "properties": { "inject": {
                "type": "object",
                "description": "add context before the first turn: text, a file of the project, or a directive's body",
                "properties": { "text": { "type": "string" }, "file": { "type": "string" }, "directive": { "type": "string" } },
                "minProperties": 1 } } },
            { "required": ["spawn"], "properties": { "spawn": {
                "type": "object", "required": ["directive"],
                "properties": { "directive": { "type": "string" }, "inputs": { "type": "object" } } } } },
            { "required": ["run"], "properties": { "run": {
                "type": "object", "required": ["argv"],
                "properties": { "argv": { "type": "array", "items": { "type": "string" }, "minItems": 1 },
                                "timeout": { "type": "string", "description": "e.g. 30s" } } } } },
            { "required": ["control"], "properties": { "control": { "enum": ["retry", "fail", "continue", "handoff"] } } },
            { "required": ["primary"], "properties": {
                "primary": { "enum": ["load", "execute"] },
                "item_type": { "type": "string" }, "item_id": { "type": "string" },
                "params": { "type": "object" } } }
        ]
    })
}

/// A condition: `{path, op?, value?}`, or `all`/`any` of conditions, or `not` one.
fn condition() -> Value {
    json!({
        "type": "object",
        "oneOf": [
            { "required": ["path"], "properties": {
                "path": { "type": "string", "description": "a dotted path into the event, e.g. thread.depth" },
                "op": { "enum": OPS }, "value": {} } },
            { "required": ["all"], "properties": { "all": { "type": "array", "items": { "$ref": "#/$defs/condition" } } } },
            { "required": ["any"], "properties": { "any": { "type": "array", "items": { "$ref": "#/$defs/condition" } } } },
            { "required": ["not"], "properties": { "not": { "$ref": "#/$defs/condition" } } }
        ]
    })
}

/// The definitions a hooks list refers to.
pub(crate) fn defs() -> Value {
    json!({ "hook": hook(), "action": action(), "condition": condition() })
}

/// JSON Schema of a hooks file: `hooks:` (and Rye's `builtin_hooks`, `context_hooks`,
/// `infra_hooks`), each a list of hooks.
pub(crate) fn json_schema() -> Value {
    let list = json!({ "type": "array", "items": { "$ref": "#/$defs/hook" } });
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "weft hooks file",
        "type": ["object", "null"],
        "properties": {
            "hooks": list, "builtin_hooks": list, "context_hooks": list, "infra_hooks": list
        },
        "anyOf": [
            { "type": "null" },
            { "required": ["hooks"] }, { "required": ["builtin_hooks"] },
            { "required": ["context_hooks"] }, { "required": ["infra_hooks"] }
        ],
        "$defs": defs()
    })
}
