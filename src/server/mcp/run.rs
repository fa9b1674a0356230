//! `run_directive`: a tree started for an MCP client through the runtime's one door
//! ([`Runtime::start_for_client`]), waited for while progress notifications name each thread
//! as it starts and ends; the client's cancellation cancels the tree.

use super::access;
use crate::core::limits::LimitSet;
use crate::runtime::Runtime;
use crate::thread::{Event, ThreadReport};
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The longest a progress notification may wait for the client to take it.
const SEND_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The arguments of `run_directive`, checked.
struct Ask {
    directive: String,
    inputs: Map<String, Value>,
    lower: LimitSet,
    wait: bool,
}

fn ask(args: &Value) -> Result<Ask, String> {
    const KEYS: [&str; 4] = ["directive", "inputs", "limits", "wait"];
    if let Some(k) = args
        .as_object()
        .and_then(|o| o.keys().find(|k| !KEYS.contains(&k.as_str())))
    {
        return Err(format!("unknown argument `{k}` (expected {KEYS:?})"));
    }
    let directive = match &args["directive"] {
        Value::String(d) if !d.trim().is_empty() => d,
        Value::Null | Value::String(_) => {
            return Err("`directive` (a name from list_directives) is required".into())
        }
        other => return Err(format!("`directive` must be a string, not {other}")),
    };
    let inputs = match &args["inputs"] {
        Value::Null => Map::new(),
        Value::Object(m) => m.clone(),
        _ => return Err("`inputs` must be an object of name: value".into()),
    };
    let lower = match &args["limits"] {
        Value::Null => LimitSet::default(),
        Value::Object(m) => LimitSet::from_map(m).map_err(|e| format!("limits: {e}"))?,
        _ => return Err("`limits` must be an object of name: value".into()),
    };
    let wait = match &args["wait"] {
        Value::Null => true,
        Value::Bool(b) => *b,
        _ => return Err("`wait` must be true or false".into()),
    };
    Ok(Ask {
        directive: directive.to_string(),
        inputs,
        lower,
        wait,
    })
}

/// What a client gets back of a tree that ended.
fn outcome(r: &ThreadReport) -> Value {
    json!({
        "thread_id": r.thread_id, "directive": r.directive, "status": r.status,
        "result": r.result, "outputs": r.outputs, "error": r.error,
        "spend_usd": r.spend_nanos.to_string(), "spend_nanos": r.spend_nanos.0,
        "turns": r.turns,
    })
}

/// How many trees MCP clients have running in this process (shared by every session).
#[derive(Clone, Default)]
pub(crate) struct LiveTrees(Arc<AtomicU64>);

/// One live tree of a client, counted until dropped.
struct Counted(Arc<AtomicU64>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl LiveTrees {
    /// Counts one more tree, or says why not: `max` are running.
    fn take(&self, max: u64) -> Result<Counted, String> {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1))
            .map(|_| Counted(self.0.clone()))
            .map_err(|n| format!("{n} trees started by MCP clients are running, the most mcp_server.max_live_trees allows; wait for one to end or cancel one"))
    }
}

/// `run_directive`.
pub(super) async fn run_directive(
    rt: &Runtime,
    live: &LiveTrees,
    args: &Value,
    context: &RequestContext<RoleServer>,
) -> Result<Value, String> {
    let bounds = access::bounds(rt)?;
    let max_live = rt
        .config()
        .mcp_server
        .as_ref()
        .map_or(1, |m| m.max_live_trees);
    let ask = ask(args)?;
    let counted = live.take(max_live)?;
    let handle = rt
        .start_for_client(
            &ask.directive,
            ask.inputs,
            ask.lower,
            bounds,
            // The client's cancel withdraws a start that waits (for a spawn slot, an MCP server).
            context.ct.clone(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let id = handle.id().clone();
    rt.claim_effects_of(&id).await;
    if context.ct.is_cancelled() {
        // Cancelled while it started: the client will never learn its id.
        rt.cancel(&id, "cancelled by the MCP client");
    }
    if !ask.wait {
        let waiting = handle.wait();
        rt.ctx().track(tokio::spawn(async move {
            let _ = waiting.await;
            drop(counted);
        }));
        return Ok(json!({ "thread_id": id, "status": "running" }));
    }
    let outcome = wait_telling(rt, handle, context).await;
    drop(counted);
    outcome
}

/// Waits for the tree of `handle`, telling the client of each thread that starts and ends,
/// and cancels it when the client cancels the request.
async fn wait_telling(
    rt: &Runtime,
    mut handle: crate::runtime::ThreadHandle,
    context: &RequestContext<RoleServer>,
) -> Result<Value, String> {
    let id = handle.id().clone();
    // Only starts and ends are told: no transcript line is needed.
    let mut events = handle.progress_events();
    let mut progress = Progress {
        peer: context.peer.clone(),
        token: context.meta.get_progress_token(),
        started: 0,
        ended: 0,
        root: id.clone(),
        root_told: false,
    };
    let done = handle.wait();
    tokio::pin!(done);
    let (mut cancelled, mut open) = (false, true);
    loop {
        tokio::select! {
            report = &mut done => {
                let r = report.map_err(|e| e.to_string())?;
                // The root's end may come before its event: it is told once either way.
                if !progress.root_told {
                    progress.tell(&Event::Finished(Box::new(r.clone()))).await;
                }
                return Ok(outcome(&r));
            }
            _ = context.ct.cancelled(), if !cancelled => {
                cancelled = true;
                rt.cancel(&id, "cancelled by the MCP client");
            }
            ev = events.next(), if open => match ev {
                Some(ev) => progress.tell(&ev).await,
                None => open = false,
            },
        }
    }
}

/// Progress notifications of one request: the threads of its tree started and ended so far.
struct Progress {
    peer: Peer<RoleServer>,
    token: Option<ProgressToken>,
    started: u64,
    ended: u64,
    /// The tree's root, and whether its end was told.
    root: crate::core::ids::ThreadId,
    root_told: bool,
}

impl Progress {
    async fn tell(&mut self, ev: &Event) {
        let message = match ev {
            Event::Started { id, directive, .. } => {
                self.started += 1;
                format!("started {id} ({directive})")
            }
            Event::Finished(r) => {
                self.ended += 1;
                self.root_told |= r.thread_id == self.root;
                format!(
                    "{} {} ({}), {}",
                    r.status, r.thread_id, r.directive, r.spend_nanos
                )
            }
            _ => return,
        };
        let Some(token) = self.token.clone() else {
            return;
        };
        // Each thread counts twice, once started and once ended: progress only ever grows.
        let p = ProgressNotificationParam::new(token, (self.started + self.ended) as f64)
            .with_total((2 * self.started) as f64)
            .with_message(message);
        // A client that stops reading never holds the tree's cancel or its end for long.
        let _ = tokio::time::timeout(SEND_WAIT, self.peer.notify_progress(p)).await;
    }
}
