//! The one handler set of weft's API (SPEC §12), shared by both transports: `weft serve`'s HTTP
//! (under `/v1`) and every runtime's control socket. A request is a method, a path, a query
//! string and a JSON body; a reply is a status code and a JSON body, `{"error": …}` when refused.
//!
//! Threads are read from the project (any process's). Steering (cancel, inject, approve, deny)
//! goes to the thread's actor when this process runs it, else to the process that owns it,
//! through that process's control socket — so `weft cancel`, the HTTP API and the web page reach
//! the same handler.

use crate::core::ids::ThreadId;
use crate::core::limits::LimitSet;
use crate::provider::Route;
use crate::registry::ThreadFilter;
use crate::runtime::{ControlError, QueryError, Runtime};
use crate::thread::SpawnError;
use serde_json::{json, Map, Value};

/// One reply: an HTTP status code and a JSON body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reply {
    pub status: u16,
    pub body: Value,
}

fn ok(status: u16, body: Value) -> Reply {
    Reply { status, body }
}

fn refuse(status: u16, error: impl Into<String>) -> Reply {
    Reply {
        status,
        body: json!({ "error": error.into() }),
    }
}

/// A question the runtime could not answer: every variant is the server's failure (500).
/// Matched without a wildcard, so a new variant must choose its code.
pub(crate) fn query_failed(e: QueryError) -> Reply {
    let status = match &e {
        QueryError::Store(_) | QueryError::NoTranscript { .. } => 500,
    };
    refuse(status, e.to_string())
}

/// A steering request the thread did not take: a conflict with its state (409), whether it
/// runs elsewhere, stopped before answering or refused. Matched without a wildcard too.
fn control_failed(e: ControlError) -> Reply {
    let status = match &e {
        ControlError::NotRunning { .. }
        | ControlError::NoAnswer { .. }
        | ControlError::Refused(_) => 409,
    };
    refuse(status, e.to_string())
}

/// Where a steering request may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// To the thread's actor here, else to the process that owns it (`weft serve`'s HTTP).
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    Anywhere,
    /// Here only (a request that came over a control socket from another process).
    Local,
}

/// Answers one API request for `rt`.
pub(crate) async fn call(
    rt: &Runtime,
    method: &str,
    path: &str,
    query: &str,
    body: &[u8],
    reach: Reach,
) -> Reply {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return refuse(400, "the request body must be a JSON object"),
            Err(e) => return refuse(400, format!("the request body is not JSON: {e}")),
        }
    };
    match (method, segs.as_slice()) {
        ("GET", ["v1", "threads"]) => list(rt, query),
        ("POST", ["v1", "threads"]) => start(rt, &body).await,
        (m, ["v1", "threads", id, rest @ ..]) => {
            let id = match ThreadId::parse(id) {
                Ok(id) => id,
                Err(e) => return refuse(400, e.to_string()),
            };
            match (m, rest) {
                ("GET", []) => get(rt, &id),
                ("GET", ["tree"]) => tree(rt, &id),
                ("GET", ["transcript"]) => transcript(rt, &id, query),
                ("POST", [op @ ("cancel" | "inject" | "approve" | "deny")]) => {
                    steer(rt, &id, op, &body, reach).await
                }
                ("POST", ["placed_end"]) => placed_end(rt, &id, body, reach).await,
                _ => refuse(404, format!("no route {method} {path}")),
            }
        }
        _ => refuse(404, format!("no route {method} {path}")),
    }
}

/// `key=value&…` pairs, percent-decoded.
fn params(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn list(rt: &Runtime, query: &str) -> Reply {
    let mut f = ThreadFilter::default();
    for (k, v) in params(query) {
        match k.as_str() {
            "status" => f.status.extend(v.split(',').map(str::to_string)),
            "directive" => f.directive = Some(v),
            "root" => f.root = Some(v),
            "updated_since" => f.updated_since = Some(v),
            "limit" => match v.parse::<usize>() {
                Ok(n) if n > 0 => f.limit = Some(n.min(10_000)),
                _ => return refuse(400, format!("limit `{v}` is not a positive integer")),
            },
            other => {
                return refuse(
                    400,
                    format!(
                        "unknown filter `{other}` (status, directive, root, updated_since, limit)"
                    ),
                )
            }
        }
    }
    match rt.list(&f) {
        Ok(rows) => ok(200, json!({ "threads": rows })),
        Err(e) => query_failed(e),
    }
}

fn get(rt: &Runtime, id: &ThreadId) -> Reply {
    match rt.get(id) {
        Ok(Some(v)) => {
            let cost = json!({
                "turns": v.row.turns, "input_tokens": v.row.input_tokens,
                "output_tokens": v.row.output_tokens, "own_spend_nanos": v.row.own_spend_nanos,
                "spend_nanos": v.row.spend_nanos,
                "spend_usd": crate::core::money::Nanos(v.row.spend_nanos).to_string(),
            });
            let mut body = serde_json::to_value(&v).unwrap_or_default();
            body["cost"] = cost;
            ok(200, body)
        }
        Ok(None) => refuse(404, format!("no thread {id} in this project")),
        Err(e) => query_failed(e),
    }
}

fn tree(rt: &Runtime, id: &ThreadId) -> Reply {
    match rt.tree(id) {
        Ok(rows) if rows.is_empty() => refuse(404, format!("no thread {id} in this project")),
        Ok(rows) => ok(200, json!({ "root": id, "threads": rows })),
        Err(e) => query_failed(e),
    }
}

fn transcript(rt: &Runtime, id: &ThreadId, query: &str) -> Reply {
    let (mut after, mut limit) = (None, 200usize);
    for (k, v) in params(query) {
        match (k.as_str(), v.parse::<i64>()) {
            ("after", Ok(n)) => after = Some(n),
            ("limit", Ok(n)) if n > 0 => limit = (n as usize).min(5_000),
            _ => return refuse(400, format!("bad parameter `{k}={v}` (after=SEQ, limit=N)")),
        }
    }
    match rt.get(id) {
        Ok(Some(_)) => {}
        Ok(None) => return refuse(404, format!("no thread {id} in this project")),
        Err(e) => return query_failed(e),
    }
    match rt.transcript(id, after, limit) {
        Ok(page) => ok(200, serde_json::to_value(page).unwrap_or_default()),
        Err(e) => query_failed(e),
    }
}

/// `POST /v1/threads`: `{directive, inputs?, limits?, provider?, model?}`; answers at once with
/// the new root's id (201) while the thread runs on in this process.
async fn start(rt: &Runtime, body: &Value) -> Reply {
    const KEYS: [&str; 5] = ["directive", "inputs", "limits", "provider", "model"];
    if let Some(k) = body
        .as_object()
        .and_then(|o| o.keys().find(|k| !KEYS.contains(&k.as_str())))
    {
        return refuse(400, format!("unknown field `{k}` (expected {KEYS:?})"));
    }
    let Some(directive) = body["directive"].as_str().filter(|d| !d.trim().is_empty()) else {
        return refuse(400, "`directive` (a directive name) is required");
    };
    // Names only: a path would run any file the server can read, with whatever authority its
    // front matter claims (paths stay a convenience of the `weft` command line).
    if !crate::directive::valid_name(directive) || directive.ends_with(".md") {
        return refuse(400, format!("`{directive}`: over the API a directive is named by its library name (e.g. `research/fanout`), never by a path"));
    }
    let inputs = match &body["inputs"] {
        Value::Null => Map::new(),
        Value::Object(m) => m.clone(),
        _ => return refuse(400, "`inputs` must be an object"),
    };
    let mut overrides = LimitSet::default();
    match &body["limits"] {
        Value::Null => {}
        Value::Object(m) => {
            for (k, v) in m {
                if let Err(e) = overrides.set(k, v) {
                    return refuse(400, format!("limits.{k}: {e}"));
                }
            }
        }
        _ => return refuse(400, "`limits` must be an object of name: value"),
    }
    let text = |k: &str| -> Result<Option<String>, Reply> {
        match &body[k] {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            _ => Err(refuse(400, format!("`{k}` must be a string"))),
        }
    };
    let route = match (text("provider"), text("model")) {
        (Ok(provider), Ok(model)) => Route { provider, model },
        (Err(r), _) | (_, Err(r)) => return r,
    };
    let started = if route == Route::default() {
        rt.start(directive, inputs, overrides).await
    } else {
        rt.start_on(directive, inputs, overrides, route).await
    };
    match started {
        Ok(handle) => {
            let id = handle.id().clone();
            tokio::spawn(async move {
                let _ = handle.wait().await;
            });
            ok(201, json!({ "thread_id": id, "status": "running" }))
        }
        Err(e) => refuse(spawn_status(&e), e.to_string()),
    }
}

/// The status of a refused start: the request's fault (400) or the runtime's (500).
fn spawn_status(e: &SpawnError) -> u16 {
    match e {
        SpawnError::Directive(_)
        | SpawnError::Limit(_)
        | SpawnError::Denied(_)
        | SpawnError::Untrusted(_)
        | SpawnError::Config(_) => 400,
        SpawnError::Withdrawn(_) | SpawnError::Stopping(_) => 409,
        SpawnError::Ledger(_) | SpawnError::Registry(_) if e.is_limit() => 400,
        SpawnError::Ledger(_) | SpawnError::Registry(_) | SpawnError::Storage(_) => 500,
    }
}

/// A child of a thread here, placed on another node, ended there (sent by that node through
/// the database; see `server/placement.rs`). Never over HTTP: a client could end a child that
/// still runs. What it reports is checked against the registry, whose row must be terminal;
/// its spend is the ledger's (the stand-in settles it).
async fn placed_end(rt: &Runtime, id: &ThreadId, body: Value, reach: Reach) -> Reply {
    if matches!(reach, Reach::Anywhere) {
        return refuse(
            403,
            "a placed child's end comes from the node that ran it, not over HTTP",
        );
    }
    let mut report: crate::thread::ThreadReport = match serde_json::from_value(body) {
        Ok(r) => r,
        Err(e) => return refuse(400, format!("not a thread's report: {e}")),
    };
    if report.thread_id != *id {
        return refuse(400, "the report is of another thread");
    }
    match rt.get(id) {
        Ok(Some(v)) if v.row.status.is_terminal() => {
            let row = crate::thread::ThreadReport::of_row(&v.row);
            (report.status, report.error) = (row.status, row.error);
            (report.result, report.outputs) = (row.result, row.outputs);
        }
        // Never registered: its start failed on the node that took it (nothing ran, nothing
        // to show but the error; its spend is what the ledger holds).
        Ok(None) => {
            (report.result, report.outputs) = (None, None);
            if report.status != crate::core::status::Status::Cancelled {
                report.status = crate::core::status::Status::Error;
            }
        }
        Ok(Some(_)) => return refuse(409, format!("thread {id} has not ended")),
        Err(e) => return query_failed(e),
    }
    match rt.placed_ended(report).await {
        true => ok(202, json!({ "thread_id": id, "taken": true })),
        false => refuse(404, format!("no placed child {id} is waited for here")),
    }
}

/// Cancel, inject, approve or deny: here if this process runs the thread, else its owner.
async fn steer(rt: &Runtime, id: &ThreadId, op: &str, body: &Value, reach: Reach) -> Reply {
    let text = |k: &str| body[k].as_str().map(str::to_string);
    if op == "inject" && text("text").is_none() {
        return refuse(400, "`text` (the message) is required");
    }
    let local = match op {
        "cancel" => rt
            .cancel(id, &text("reason").unwrap_or_else(|| "cancelled".into()))
            .then(|| json!({ "thread_id": id, "status": "cancelling" })),
        _ => None,
    };
    if let Some(body) = local {
        return ok(202, body);
    }
    if op != "cancel" && rt.runs(id) {
        let done = match op {
            "inject" => rt
                .inject(id, &text("text").unwrap_or_default())
                .await
                .map(|()| json!({ "thread_id": id, "queued": true })),
            _ => rt
                .decide(
                    id,
                    text("call").as_deref(),
                    op == "approve",
                    text("reason").as_deref(),
                )
                .await
                .map(|call| json!({ "thread_id": id, "call": call, "decision": op })),
        };
        return match done {
            Ok(body) => ok(200, body),
            Err(e) => control_failed(e),
        };
    }
    let row = match rt.get(id) {
        Ok(Some(v)) => v.row,
        Ok(None) => return refuse(404, format!("no thread {id} in this project")),
        Err(e) => return query_failed(e),
    };
    if row.status.is_terminal() {
        return refuse(
            409,
            format!("thread {id} is {}; it can no longer be steered", row.status),
        );
    }
    if reach == Reach::Local || row.owner_pid == crate::core::owner::me() {
        return refuse(
            409,
            format!(
                "thread {id} is not running in process {}",
                std::process::id()
            ),
        );
    }
    forward(rt, &row, id, op, body).await
}

#[cfg(unix)]
async fn forward(
    rt: &Runtime,
    row: &crate::registry::ThreadRow,
    id: &ThreadId,
    op: &str,
    body: &Value,
) -> Reply {
    let req = json!({ "method": "POST", "path": format!("/v1/threads/{id}/{op}"), "body": body });
    match super::peer::request(rt.project(), row.owner_pid, &req).await {
        Ok(reply) => ok(
            reply["status"].as_u64().unwrap_or(502) as u16,
            reply["body"].clone(),
        ),
        Err(e) => refuse(502, e),
    }
}

#[cfg(not(unix))]
async fn forward(
    _rt: &Runtime,
    row: &crate::registry::ThreadRow,
    id: &ThreadId,
    _op: &str,
    _body: &Value,
) -> Reply {
    refuse(
        501,
        format!(
            "thread {id} runs in process {}; reaching it needs the control socket (Unix only)",
            row.owner_pid
        ),
    )
}
