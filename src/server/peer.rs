//! Reaching another process's control endpoint (`control.rs` is this process's own): where
//! its socket is, one request and its reply, and removing the sockets of processes gone.

use crate::project::Project;
use serde_json::Value;
use std::path::PathBuf;

/// The socket path of process `pid` in `project`.
pub(crate) fn socket_path(project: &Project, pid: u32) -> PathBuf {
    project.weft().join("run").join(format!("{pid}.sock"))
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

/// Sends one request to process `pid`'s endpoint and returns its reply.
#[cfg(unix)]
pub(crate) async fn request(project: &Project, pid: u32, req: &Value) -> Result<Value, String> {
    if crate::core::owner::is_node(pid) {
        // A node on a shared database, maybe on another machine: through the database.
        return super::relay::ask(project, pid, req).await;
    }
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::UnixStream;
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
