//! The local control endpoint: every runtime process listens on a Unix socket
//! `.weft/run/<pid>.sock` (removed on exit) so `weft cancel` from another terminal reaches the
//! process that owns a thread (found through the registry's `owner_pid`).
//!
//! Protocol: one JSON object per line each way. A request is an API call,
//! `{"method":"POST","path":"/v1/threads/<id>/cancel","query"?:…,"body"?:{…}}`, answered by the
//! same handlers as `weft serve`'s HTTP ([`super::api`]) as `{"status":…,"body":…}`; or
//! `{"op":"ping"}`. It only forwards messages to actors; it never touches thread state itself.

use super::api;
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

/// Answers one request line for `rt`: an API request (see [`super::api`]) or a ping.
pub(crate) async fn handle(rt: &Runtime, req: &Value) -> Value {
    if req.get("op").and_then(Value::as_str) == Some("ping") {
        return json!({ "status": 200, "body": { "pid": std::process::id() } });
    }
    let (Some(method), Some(path)) = (
        req.get("method").and_then(Value::as_str),
        req.get("path").and_then(Value::as_str),
    ) else {
        return json!({ "status": 400, "body": { "error": "expected {\"method\", \"path\", \"query\"?, \"body\"?} or {\"op\": \"ping\"}" } });
    };
    let query = req.get("query").and_then(Value::as_str).unwrap_or_default();
    let body = req.get("body").map(Value::to_string).unwrap_or_default();
    // A request that reached this process over its socket is answered here: forwarding it on
    // could only loop back.
    let reply = api::call(rt, method, path, query, body.as_bytes(), api::Reach::Local).await;
    json!({ "status": reply.status, "body": reply.body })
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
