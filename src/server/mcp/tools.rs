//! The tools weft offers MCP clients (their input schemas), and the short ones: listing the
//! directives open to clients, a thread's status, cancelling a tree, searching transcripts.

use super::access;
use crate::runtime::Runtime;
use crate::store::SearchQuery;
use rmcp::model::Tool;
use serde_json::{json, Map, Value};

/// A tool's input schema (a JSON object schema).
fn schema(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Every tool, with its description and input schema.
pub(super) fn list() -> Vec<Tool> {
    let id = json!({"type": "object", "properties": {"id": {"type": "string", "description": "a thread id (e.g. from run_directive)"}}, "required": ["id"], "additionalProperties": false});
    vec![
        Tool::new(
            "run_directive",
            "Run a weft directive as a budgeted agent tree and return its status, result, outputs, spend and thread id. Limits may only be lowered; the tree never spends more than its cap. Progress notifications name each thread as it starts and ends; cancelling the request cancels the tree.",
            schema(json!({"type": "object", "properties": {
                "directive": {"type": "string", "description": "a directive name from list_directives, e.g. research/fanout"},
                "inputs": {"type": "object", "description": "the directive's inputs by name"},
                "limits": {"type": "object", "description": "lower limits: turns, tokens, spend (USD), duration (e.g. 2m), depth, spawns, concurrency", "additionalProperties": {"type": ["string", "number"]}},
                "wait": {"type": "boolean", "description": "wait for the tree to end (default true); false returns the thread id at once", "default": true}
            }, "required": ["directive"], "additionalProperties": false})),
        ),
        Tool::new(
            "list_directives",
            "The directives MCP clients may run here: name, description, inputs (as JSON Schema) and outputs.",
            schema(json!({"type": "object", "properties": {}, "additionalProperties": false})),
        ),
        Tool::new(
            "thread_status",
            "A thread's status, turns, tokens, spend, result and outputs, and its children.",
            schema(id.clone()),
        ),
        Tool::new(
            "cancel_thread",
            "Cancel a running thread and everything under it.",
            schema(id),
        ),
        Tool::new(
            "search_threads",
            "Search the transcripts of the threads MCP clients may see; best matches first, with the messages around each.",
            schema(json!({"type": "object", "properties": {
                "query": {"type": "string", "description": "words to look for"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10}
            }, "required": ["query"], "additionalProperties": false})),
        ),
    ]
}

/// A directive's inputs as a JSON Schema object.
fn inputs_schema(d: &crate::directive::Directive) -> Value {
    let mut props = Map::new();
    let mut required = Vec::new();
    for (name, spec) in &d.inputs {
        let mut p = Map::new();
        if spec.kind != "any" {
            p.insert("type".into(), json!(spec.kind));
        }
        if let Some(desc) = &spec.description {
            p.insert("description".into(), json!(desc));
        }
        if let Some(def) = &spec.default {
            p.insert("default".into(), def.clone());
        }
        if spec.required {
            required.push(name.clone());
        }
        props.insert(name.clone(), Value::Object(p));
    }
    json!({"type": "object", "properties": props, "required": required})
}

/// `list_directives`: every library directive MCP clients may start (one that fails to parse is
/// listed with its error, so the author sees why).
pub(super) fn list_directives(rt: &Runtime) -> Result<Value, String> {
    let bounds = access::bounds(rt)?;
    let library = crate::directive::Library::for_project(rt.project());
    let mut out = Vec::new();
    for name in library.names().into_iter().filter(|n| bounds.opens(n)) {
        match library.load_name(&name) {
            // Listed by the name to send; one whose front matter renames it out of the open
            // patterns is not startable, so not listed.
            Ok(d) if bounds.opens(&d.name) => out.push(json!({
                "name": name, "resolves_to": (d.name != name).then_some(&d.name),
                "description": d.description,
                "inputs": inputs_schema(&d), "outputs": d.outputs,
            })),
            Ok(_) => {}
            Err(e) => out.push(json!({ "name": name, "error": e.to_string() })),
        }
    }
    Ok(json!({ "directives": out, "max_spend_usd": bounds.max_spend.to_string() }))
}

/// The thread id argument.
fn id_arg(args: &Value) -> Result<&str, String> {
    args["id"]
        .as_str()
        .ok_or_else(|| "`id` (a thread id) is required".to_string())
}

/// `thread_status`: the thread's row and its children's ids and statuses.
pub(super) fn thread_status(rt: &Runtime, args: &Value) -> Result<Value, String> {
    let row = access::visible(rt, id_arg(args)?)?;
    let children: Vec<Value> = rt
        .tree(&row.root_id)
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|r| r.parent_id.as_ref() == Some(&row.id))
        .map(|r| json!({ "id": r.id, "directive": r.directive, "status": r.status }))
        .collect();
    Ok(json!({
        "thread_id": row.id, "directive": row.directive, "status": row.status,
        "parent_id": row.parent_id, "root_id": row.root_id,
        "turns": row.turns, "input_tokens": row.input_tokens, "output_tokens": row.output_tokens,
        "spend_usd": crate::core::money::Nanos(row.spend_nanos).to_string(),
        "spend_nanos": row.spend_nanos,
        "result": row.result, "outputs": row.outputs, "error": row.error,
        "created_at": row.created_at, "updated_at": row.updated_at,
        "children": children,
    }))
}

/// `cancel_thread`: cancels the thread's subtree where it runs (this process, or the one that
/// owns it, through the same handler as the HTTP API).
pub(super) async fn cancel_thread(rt: &Runtime, args: &Value) -> Result<Value, String> {
    let row = access::visible(rt, id_arg(args)?)?;
    if row.status.is_terminal() {
        return Err(format!(
            "thread {} has already ended ({})",
            row.id, row.status
        ));
    }
    let path = format!("/v1/threads/{}/cancel", row.id);
    let body = json!({ "reason": "cancelled by an MCP client" }).to_string();
    let reply = crate::server::api::call(
        rt,
        "POST",
        &path,
        "",
        body.as_bytes(),
        crate::server::api::Reach::Anywhere,
    )
    .await;
    match reply.status {
        200..=299 => Ok(reply.body),
        _ => Err(reply.body["error"]
            .as_str()
            .unwrap_or("refused")
            .to_string()),
    }
}

/// `search_threads`: transcript search, over the threads MCP clients may see.
pub(super) fn search_threads(rt: &Runtime, args: &Value) -> Result<Value, String> {
    let text = args["query"]
        .as_str()
        .filter(|q| !q.trim().is_empty())
        .ok_or("`query` (words to look for) is required")?;
    let limit = match &args["limit"] {
        Value::Null => 10,
        v => v
            .as_u64()
            .filter(|n| (1..=100).contains(n))
            .ok_or("`limit` is a whole number from 1 to 100")? as usize,
    };
    let mut q = SearchQuery::new(text);
    // Threads MCP clients may not see are left out after the search: look well past `limit`.
    q.limit = 500;
    let hits = rt.search(&q).map_err(|e| e.to_string())?;
    let seen: Vec<_> = hits
        .into_iter()
        .filter(|h| access::visible(rt, h.thread_id.as_str()).is_ok())
        .take(limit)
        .collect();
    Ok(json!({ "hits": seen }))
}
