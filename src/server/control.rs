//! The local control endpoint: every runtime process listens on a Unix socket
//! `.weft/run/<pid>.sock` (removed on exit) so `weft cancel` from another terminal reaches the
//! process that owns a thread (found through the registry's `owner_pid`).
//!
//! Protocol: one JSON object per line each way. Requests: `{"op":"cancel","id":…}`,
//! `{"op":"approve"|"deny","id":…,"call"?:…,"reason"?:…}`, `{"op":"inject","id":…,"text":…}`,
//! `{"op":"ping"}`. Replies: `{"ok":true,…}` or `{"ok":false,"error":…}`. It only forwards
//! messages to actors; it never touches thread state itself.

use crate::core::ids::ThreadId;
use crate::project::Project;
use crate::runtime::Runtime;
use serde_json::{json, Value};
use std::path::PathBuf;

/// The socket path of process `pid` in `project`.
pub(crate) fn socket_path(project: &Project, pid: u32) -> PathBuf {
    project.weft().join("run").join(format!("{pid}.sock"))
}

/// A listening endpoint; dropping it stops listening and removes the socket.
pub(crate) struct ControlEndpoint {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ControlEndpoint {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The request's `id`, or the error reply.
fn thread_id(req: &Value) -> Result<ThreadId, Value> {
    match req.get("id").and_then(Value::as_str).map(ThreadId::parse) {
        Some(Ok(id)) => Ok(id),
        Some(Err(e)) => Err(json!({ "ok": false, "error": e })),
        None => Err(json!({ "ok": false, "error": "`id` is required" })),
    }
}

/// Answers one request for `rt`.
pub(crate) async fn handle(rt: &Runtime, req: &Value) -> Value {
    let op = req.get("op").and_then(Value::as_str);
    if op == Some("inject") {
        let id = match thread_id(req) {
            Ok(id) => id,
            Err(e) => return e,
        };
        let Some(text) = req.get("text").and_then(Value::as_str) else {
            return json!({ "ok": false, "error": "`text` is required" });
        };
        return match rt.inject(&id, text).await {
            Ok(()) => json!({ "ok": true, "thread_id": id, "queued": true }),
            Err(e) => json!({ "ok": false, "error": e }),
        };
    }
    if let Some(op @ ("approve" | "deny")) = op {
        let id = match thread_id(req) {
            Ok(id) => id,
            Err(e) => return e,
        };
        let call = req.get("call").and_then(Value::as_str);
        let reason = req.get("reason").and_then(Value::as_str);
        return match rt.decide(&id, call, op == "approve", reason).await {
            Ok(call) => json!({ "ok": true, "thread_id": id, "call": call, "decision": op }),
            Err(e) => json!({ "ok": false, "error": e }),
        };
    }
    match op {
        Some("ping") => json!({ "ok": true, "pid": std::process::id() }),
        Some("cancel") => {
            let id = match thread_id(req) {
                Ok(id) => id,
                Err(e) => return e,
            };
            let reason = req
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("weft cancel")
                .to_string();
            if rt.cancel(&id, &reason) {
                json!({ "ok": true, "status": "cancelling", "thread_id": id })
            } else {
                json!({ "ok": false, "error": format!("thread {id} is not running in process {}", std::process::id()) })
            }
        }
        _ => {
            json!({ "ok": false, "error": "unknown op (expected cancel, approve, deny, inject or ping)" })
        }
    }
}

/// Removes the sockets of processes that are gone.
pub(crate) fn remove_stale(project: &Project) {
    let Ok(entries) = std::fs::read_dir(project.weft().join("run")) else {
        return;
    };
    for e in entries.flatten() {
        let stale = e
            .file_name()
            .to_str()
            .and_then(|n| n.strip_suffix(".sock"))
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| !crate::runtime::owner::alive(&project.state_dir(), pid));
        if stale {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(unix)]
mod imp {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::{UnixListener, UnixStream};

    /// Starts listening for `rt`; stale sockets of dead processes are removed first.
    pub(crate) fn listen(rt: &Runtime) -> std::io::Result<ControlEndpoint> {
        let project = rt.project();
        let dir = project.weft().join("run");
        std::fs::create_dir_all(&dir)?;
        remove_stale(project);
        let path = socket_path(project, std::process::id());
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let rt = rt.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_conn(rt.clone(), stream));
            }
        });
        Ok(ControlEndpoint { path, task })
    }

    async fn serve_conn(rt: Runtime, stream: UnixStream) {
        let (r, mut w) = stream.into_split();
        let mut lines = BufReader::new(r).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let reply = match serde_json::from_str::<Value>(&line) {
                Ok(req) => handle(&rt, &req).await,
                Err(e) => json!({ "ok": false, "error": format!("not JSON: {e}") }),
            };
            if w.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                return;
            }
        }
    }

    /// Sends one request to process `pid`'s endpoint and returns its reply.
    pub(crate) async fn request(project: &Project, pid: u32, req: &Value) -> Result<Value, String> {
        let path = socket_path(project, pid);
        let stream = UnixStream::connect(&path)
            .await
            .map_err(|e| format!("cannot reach process {pid} at {}: {e}", path.display()))?;
        let (r, mut w) = stream.into_split();
        w.write_all(format!("{req}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut lines = BufReader::new(r).lines();
        let line = tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line())
            .await
            .map_err(|_| format!("process {pid} did not answer within 10s"))?
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("process {pid} closed the connection"))?;
        serde_json::from_str(&line).map_err(|e| format!("bad reply from process {pid}: {e}"))
    }
}

#[cfg(unix)]
pub(crate) use imp::{listen, request};
