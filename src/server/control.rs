//! The local control endpoint: every runtime process listens on a Unix socket
//! `.weft/run/<pid>.sock` (removed on exit) so `weft cancel` from another terminal reaches the
//! process that owns a thread (found through the registry's `owner_pid`).
//!
//! Protocol: one JSON object per line each way. A request is an API call,
//! `{"method":"POST","path":"/v1/threads/<id>/cancel","query"?:…,"body"?:{…}}`, answered by the
//! same handlers as `weft serve`'s HTTP ([`super::api`]) as `{"status":…,"body":…}`; or
//! `{"op":"ping"}`. It only forwards messages to actors; it never touches thread state itself.
//! The other end — asking another process — is `peer.rs`.

use super::api;
use super::peer::{remove_stale, socket_path};
use crate::runtime::Runtime;
use serde_json::{json, Value};
use std::path::PathBuf;

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

/// Answers the API requests relayed through the database to this node (owner `me`; see
/// `relay.rs`) with [`handle`], until the runtime is gone.
pub(crate) fn answer_relayed(rt: &Runtime, me: u32) -> tokio::task::JoinHandle<()> {
    let weak = rt.downgrade();
    let project = rt.project().clone();
    tokio::spawn(async move {
        let mut db = None;
        let wake = super::relay::listen(&project, super::relay::channel(me)).await;
        let every = match wake {
            Some(_) => super::relay::LOOK_ANYWAY,
            None => super::relay::LOOK_EVERY,
        };
        loop {
            super::relay::nap(wake.as_deref(), every).await;
            let Some(rt) = Runtime::upgrade(&weak) else {
                return;
            };
            let (back, taken) = super::relay::take(project.clone(), db.take(), me).await;
            db = back;
            for (id, req) in taken {
                let reply = handle(&rt, &req).await;
                db = super::relay::reply_to(db, id, reply.to_string()).await;
            }
        }
    })
}

#[cfg(unix)]
mod imp {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::{UnixListener, UnixStream};

    /// Starts listening for `rt`; stale sockets of dead processes are removed first.
    pub(crate) fn listen(rt: &Runtime) -> std::io::Result<ControlEndpoint> {
        let project = rt.project();
        let dir = project.weft().join("run");
        std::fs::create_dir_all(&dir)?;
        // The socket takes requests without a token: only its owner may reach it (the folder
        // 0700, the socket 0600, and a connection from another user refused).
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        remove_stale(project);
        let path = socket_path(project, std::process::id());
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        let rt = rt.clone();
        let me = rustix::process::getuid();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let same_user = stream.peer_cred().is_ok_and(|c| c.uid() == me.as_raw());
                if same_user {
                    tokio::spawn(serve_conn(rt.clone(), stream));
                }
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
}

#[cfg(unix)]
pub(crate) use imp::listen;
