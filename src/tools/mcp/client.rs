//! The `mcp` feature's [`McpHub`] (see `mcp.rs`): MCP servers spoken to through the `rmcp`
//! client, over stdio or streamable HTTP. Owns starting a server on first use, sharing it
//! between the threads of one runtime, starting it again after it died, and cancelling a call
//! (`notifications/cancelled`, sent by rmcp when the call's future is dropped). Must never offer
//! or call a tool the thread's capabilities do not cover, nor write a header's credential
//! anywhere.

use super::tool_name;
use crate::core::capability;
use crate::project::config::McpServerConfig;
use crate::provider::ToolSpec;
use rmcp::model::{CallToolRequestParams, Tool};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a server may take to start and answer `initialize` and `tools/list`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(600);
/// Result bytes kept; a longer result is kept whole in the thread's file area.
const MAX_RESULT: u64 = 64 * 1024;

/// A running server and the tools it listed.
struct Server {
    client: RunningService<RoleClient, ()>,
    tools: Vec<Tool>,
    /// A command server's process group (see [`Process`]).
    process: Option<Process>,
}

impl Server {
    /// Ends the server as the MCP stdio shutdown asks: its client closes (the server's stdin),
    /// then [`Process::ended`]. Bounded: a send blocked on a server that stopped reading its
    /// stdin holds rmcp's close, which is then given up.
    async fn close(self) {
        let Server {
            client, process, ..
        } = self;
        let closed = tokio::time::timeout(EXIT_GRACE, client.cancel()).await;
        if let Some(p) = process {
            // Not closed: the server never sees the end of its stdin, so it is not waited for.
            p.ended(closed.is_ok()).await;
        }
    }
}

/// A command server's process, in a process group of its own started like every tool process
/// (`tools/groups.rs`): its leader dies with weft however weft dies, the group is recorded for
/// recovery to reap, and killed whole — a grandchild the server left included — once the server
/// is done: closed ([`Server::close`], the runtime's close), or dropped (it stopped, its start
/// timed out or was abandoned; it still gets [`EXIT_GRACE`] to exit on the end of its stdin,
/// which closes with its client, when a runtime is there to wait), or weft exits abruptly.
struct Process {
    group: Option<crate::tools::groups::Recorded>,
    child: Option<tokio::process::Child>,
}

/// How long a server whose stdin closed may take to exit before its group is asked to end
/// (rmcp's own graceful shutdown waits as long), and then how long before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);
const TERM_GRACE: Duration = Duration::from_secs(2);

impl Process {
    /// The MCP stdio shutdown's end: the leader gets [`EXIT_GRACE`] to exit on the end of its
    /// stdin, the group then SIGTERM and [`TERM_GRACE`], and what is left is killed.
    async fn ended(mut self, stdin_closed: bool) {
        end_after_grace(self.group.take(), self.child.take(), stdin_closed).await;
    }
}

/// [`Process::ended`] of its parts: the leader gets `EXIT_GRACE` to exit on the end of its
/// stdin; then, if it has not or if it left processes behind, the whole group gets SIGTERM and
/// [`TERM_GRACE`] to end; what is left is killed first, then the leader (`kill_on_drop`).
async fn end_after_grace(
    group: Option<crate::tools::groups::Recorded>,
    mut child: Option<tokio::process::Child>,
    stdin_closed: bool,
) {
    if let Some(c) = child.as_mut() {
        let grace = if stdin_closed {
            EXIT_GRACE
        } else {
            Duration::ZERO
        };
        let exited = tokio::time::timeout(grace, c.wait()).await.is_ok();
        match group.as_ref().filter(|g| !exited || g.alive()) {
            Some(g) => {
                g.terminate();
                let until = tokio::time::Instant::now() + TERM_GRACE;
                // The leader reaped as it exits (a zombie leader would keep the group there).
                let ended = |c: &mut tokio::process::Child| {
                    matches!(c.try_wait(), Ok(Some(_))) && !g.alive()
                };
                while !ended(c) && tokio::time::Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            None if !exited => {
                let _ = tokio::time::timeout(TERM_GRACE, c.wait()).await;
            }
            None => {}
        }
    }
    drop(group);
    drop(child);
}

impl Drop for Process {
    fn drop(&mut self) {
        let (group, child) = (self.group.take(), self.child.take());
        if group.is_none() && child.is_none() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                // Its stdin closes as its client (dropped with it) ends.
                rt.spawn(end_after_grace(group, child, true));
            }
            // No runtime to wait in: the group first, then the leader.
            Err(_) => {
                drop(group);
                drop(child);
            }
        }
    }
}

/// The MCP servers of one runtime, started on first use and shared by its threads.
pub(crate) struct McpHub {
    configs: BTreeMap<String, McpServerConfig>,
    root: PathBuf,
    /// One slot per server; its lock serializes starting it.
    running: HashMap<String, tokio::sync::Mutex<Option<Arc<Server>>>>,
    /// The project's and the user's environment values (`weft env`), read when a server
    /// starts: a server is shared by every thread, so thread values cannot reach it.
    store: Option<Arc<crate::store::FileStore>>,
}

impl McpHub {
    /// A hub for `configs`; nothing starts until a thread may use a server.
    pub(crate) fn new(
        configs: BTreeMap<String, McpServerConfig>,
        root: PathBuf,
        store: Option<Arc<crate::store::FileStore>>,
    ) -> McpHub {
        let running = configs
            .keys()
            .map(|k| (k.clone(), tokio::sync::Mutex::new(None)))
            .collect();
        McpHub {
            configs,
            root,
            running,
            store,
        }
    }

    /// Whether `caps` let a thread use any server (its start may wait on one).
    pub(crate) fn wants(&self, caps: &[String]) -> bool {
        self.configs.keys().any(|name| super::may_use(name, caps))
    }

    /// The tools of every server `caps` let the thread use (starting those servers), and a
    /// problem line for each such server that could not be reached.
    pub(crate) async fn offered(&self, caps: &[String]) -> (Vec<ToolSpec>, Vec<String>) {
        let mut specs = Vec::new();
        let mut problems = Vec::new();
        for name in self.configs.keys() {
            if !super::may_use(name, caps) {
                continue;
            }
            match self.server(name).await {
                Ok(server) => specs.extend(
                    server
                        .tools
                        .iter()
                        .filter(|t| capability::allowed(caps, &super::capability(name, &t.name)))
                        .map(|t| ToolSpec {
                            name: tool_name(name, &t.name),
                            description: t.description.as_deref().unwrap_or_default().to_string(),
                            input_schema: Value::Object((*t.input_schema).clone()),
                        }),
                ),
                Err(e) => problems.push(e),
            }
        }
        (specs, problems)
    }

    /// The running server `name`, started (again) if it is not running.
    async fn server(&self, name: &str) -> Result<Arc<Server>, String> {
        let Some(slot) = self.running.get(name) else {
            return Err(format!(
                "no MCP server `{name}` is configured (mcp_servers)"
            ));
        };
        let mut slot = slot.lock().await;
        if let Some(s) = slot.as_ref().filter(|s| !s.client.is_closed()) {
            return Ok(s.clone());
        }
        if slot.is_some() {
            tracing::warn!(server = name, "MCP server stopped; starting it again");
        }
        let started = tokio::time::timeout(START_TIMEOUT, self.start(name))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "MCP server `{name}` did not start within {}s",
                    START_TIMEOUT.as_secs()
                ))
            })?;
        let server = Arc::new(started);
        *slot = Some(server.clone());
        Ok(server)
    }

    /// Drops `server` from its slot (if it is still the one there), so the next use starts the
    /// server again.
    async fn forget(&self, name: &str, server: &Arc<Server>) {
        if let Some(slot) = self.running.get(name) {
            let mut slot = slot.lock().await;
            if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, server)) {
                *slot = None;
            }
        }
    }

    async fn start(&self, name: &str) -> Result<Server, String> {
        let cfg = &self.configs[name];
        let fail = |e: String| format!("MCP server `{name}`: {e}");
        let shared = match &self.store {
            Some(store) => {
                let store = store.clone();
                tokio::task::spawn_blocking(move || store.env_shared())
                    .await
                    .map_err(|e| fail(e.to_string()))?
                    .map_err(|e| fail(format!("its environment cannot be read: {e}")))?
            }
            None => BTreeMap::new(),
        };
        let mut process = None;
        let client = match (&cfg.command, &cfg.url) {
            (Some(command), _) => {
                let mut cmd =
                    tokio::process::Command::new(crate::tools::process::resolve_program(command));
                cmd.args(&cfg.args).current_dir(&self.root).env_clear();
                for var in ["PATH", "HOME"]
                    .iter()
                    .copied()
                    .chain(cfg.env.iter().map(String::as_str))
                {
                    match shared.get(var) {
                        Some(v) => {
                            cmd.env(var, v);
                        }
                        None => {
                            if let Some(v) = std::env::var_os(var) {
                                cmd.env(var, v);
                            }
                        }
                    }
                }
                let (pipes, started) = self
                    .spawn(cmd, name)
                    .await
                    .map_err(|e| fail(format!("cannot start `{command}`: {e}")))?;
                process = Some(started);
                ().serve(pipes)
                    .await
                    .map_err(|e| fail(format!("initialize failed: {e}")))?
            }
            (None, Some(url)) => {
                let mut headers = std::collections::HashMap::new();
                for (h, v) in &cfg.headers {
                    let value =
                        expand_env(v, &shared).map_err(|e| fail(format!("header {h}: {e}")))?;
                    let (Ok(k), Ok(v)) = (
                        h.parse::<reqwest::header::HeaderName>(),
                        value.parse::<reqwest::header::HeaderValue>(),
                    ) else {
                        return Err(fail(format!("header {h}: not a valid HTTP header")));
                    };
                    headers.insert(k, v);
                }
                crate::provider::http::ensure_tls_provider();
                let config = rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(headers);
                let transport = StreamableHttpClientTransport::from_config(config);
                ().serve(transport)
                    .await
                    .map_err(|e| fail(format!("initialize at {url} failed: {e}")))?
            }
            (None, None) => return Err(fail("neither command nor url".into())),
        };
        let tools = client
            .list_all_tools()
            .await
            .map_err(|e| fail(format!("tools/list failed: {e}")))?;
        Ok(Server {
            client,
            tools,
            process,
        })
    }

    /// Starts a command server's process (its pipes, and the process as [`Process`]).
    async fn spawn(
        &self,
        mut cmd: tokio::process::Command,
        name: &str,
    ) -> std::io::Result<(
        (tokio::process::ChildStdout, tokio::process::ChildStdin),
        Process,
    )> {
        use std::process::Stdio;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = crate::tools::groups::spawn(cmd).await?;
        let procs = crate::project::Project {
            root: self.root.clone(),
        }
        .procs_dir();
        let pgid = child
            .id()
            .ok_or_else(|| std::io::Error::other("it exited at once"))?;
        let group = crate::tools::groups::record(Some(&procs), pgid, &format!("mcp server {name}"));
        let pipes = (child.stdout.take(), child.stdin.take());
        // Made before the pipes are checked: a start that fails here kills what it started.
        let process = Process {
            group: Some(group),
            child: Some(child),
        };
        let (Some(out), Some(input)) = pipes else {
            return Err(std::io::Error::other("its pipes were not opened"));
        };
        Ok(((out, input), process))
    }

    /// Closes every server not busy starting and not in a call, all at once (see
    /// [`Server::close`]): the runtime's close. One still in use stays in its slot and ends
    /// when it is dropped.
    pub(crate) async fn shutdown(&self) {
        let mut closing = tokio::task::JoinSet::new();
        for slot in self.running.values() {
            let Ok(mut slot) = slot.try_lock() else {
                continue;
            };
            match slot.take().map(Arc::try_unwrap) {
                Some(Ok(server)) => {
                    closing.spawn(server.close());
                }
                Some(Err(shared)) => *slot = Some(shared),
                None => {}
            }
        }
        while closing.join_next().await.is_some() {}
    }

    /// Calls `tool` of `server` with `input`; cancelling `cancel` abandons the call, which tells
    /// the server (`notifications/cancelled`). Returns (result text, is_error).
    pub(crate) async fn call(
        &self,
        (server, tool): (&str, &str),
        input: &Value,
        files: &std::path::Path,
        call_id: &str,
        cancel: CancellationToken,
        redactor: &crate::core::redact::Redactor,
    ) -> (String, bool) {
        let s = match self.server(server).await {
            Ok(s) => s,
            Err(e) => return (e, true),
        };
        if !s.tools.iter().any(|t| t.name == tool) {
            return (format!("MCP server `{server}` has no tool `{tool}`"), true);
        }
        let mut params = CallToolRequestParams::new(tool.to_string());
        match input {
            Value::Object(m) => params = params.with_arguments(m.clone()),
            Value::Null => {}
            other => {
                return (
                    format!("the input of `{tool}` must be an object, got {other}"),
                    true,
                )
            }
        }
        let call = s.client.call_tool(params);
        let result = tokio::select! {
            r = call => r,
            _ = cancel.cancelled() => {
                return (format!("MCP call `{tool}` on `{server}` was cancelled (the server was told)"), true);
            }
            _ = tokio::time::sleep(CALL_TIMEOUT) => {
                return (format!("MCP call `{tool}` on `{server}` timed out after {}s", CALL_TIMEOUT.as_secs()), true);
            }
        };
        match result {
            Ok(r) => {
                let parts: Vec<String> = r
                    .content
                    .iter()
                    .map(|c| match c.as_text() {
                        Some(t) => t.text.clone(),
                        None => serde_json::to_string(c).unwrap_or_default(),
                    })
                    .collect();
                let mut text = parts.join("\n");
                if text.is_empty() {
                    if let Some(v) = &r.structured_content {
                        text = v.to_string();
                    }
                }
                // Cleaned of secrets before it is cut, kept or returned.
                if let std::borrow::Cow::Owned(clean) = redactor.redact(&text) {
                    text = clean;
                }
                if text.len() as u64 > MAX_RESULT {
                    let total = text.len();
                    let name = tool_name(server, tool);
                    text = crate::tools::process::cut_and_keep(
                        &text, total, MAX_RESULT, files, &name, call_id, false,
                    );
                }
                (text, r.is_error.unwrap_or(false))
            }
            Err(e) => {
                if matches!(
                    e,
                    rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)
                ) {
                    // The server is gone: the next call starts it again.
                    self.forget(server, &s).await;
                }
                (
                    format!("MCP server `{server}` failed the call `{tool}`: {e}"),
                    true,
                )
            }
        }
    }
}

/// `${NAME}` references replaced by the variables' values (`weft env` values first, then
/// weft's own environment); a missing variable is an error.
fn expand_env(v: &str, shared: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = v;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(j) = after.find('}') else {
            return Err("an unclosed `${`".into());
        };
        let name = &after[..j];
        let value = match shared.get(name) {
            Some(v) => v.clone(),
            None => std::env::var(name).map_err(|_| {
                format!(
                    "environment variable {name} is not set (`weft env set {name} …` or export it)"
                )
            })?,
        };
        out.push_str(&value);
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
