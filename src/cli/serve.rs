//! `weft serve`: the HTTP API, live events and the web page for this project, until Ctrl-C
//! (which cancels the threads it runs and waits for them to end). Behind the `server` feature;
//! without it the command says so.

use super::Exit;
#[cfg(feature = "server")]
use super::{find_project, usage};
use crate::provider::Choice;
#[cfg(feature = "server")]
use std::io::Write;
use std::path::PathBuf;

/// The node this server joins as: `--node NAME` / `--node-lease`, over `node:` in the config.
pub(super) struct NodeArgs {
    pub(super) name: String,
    pub(super) lease: f64,
    pub(super) max_live_threads: Option<i64>,
}

#[cfg(feature = "server")]
impl NodeArgs {
    /// The flags over the config's `node:` (None: no node).
    fn resolve(
        project: &crate::project::Project,
        name: Option<String>,
        lease: Option<f64>,
    ) -> Result<Option<NodeArgs>, Exit> {
        let config = project.config().map_err(super::failed)?.node;
        let (name, cfg_lease, max) = match (name, config) {
            (None, None) => return Ok(None),
            (Some(n), c) => (
                n,
                c.as_ref().map(|c| c.lease),
                c.and_then(|c| c.max_live_threads),
            ),
            (None, Some(c)) => match c.name {
                Some(n) => (n, Some(c.lease), c.max_live_threads),
                None => {
                    return Err(super::failed(
                        "`node:` in .weft/config.yaml has no `name`: give one (`node: { name: a }`) or start with `weft serve --node NAME`",
                    ))
                }
            },
        };
        Ok(Some(NodeArgs {
            name,
            lease: lease.unwrap_or_else(|| cfg_lease.map_or(5.0, |d| d.as_secs_f64())),
            max_live_threads: max.map(|m| i64::try_from(m).unwrap_or(i64::MAX)),
        }))
    }
}

/// `weft nodes`: every node of the project, its lease and live threads.
pub(super) fn nodes(explicit: Option<PathBuf>, as_json: bool) -> Result<i32, Exit> {
    let project = super::find_project(explicit)?;
    let nodes = crate::runtime::node::list(&project).map_err(super::failed)?;
    if as_json {
        out!("{}", serde_json::to_string(&nodes).unwrap_or_default());
        return Ok(0);
    }
    if nodes.is_empty() {
        out!("no nodes (start one with `weft serve --node NAME`)");
    }
    for n in &nodes {
        let lease = match n.alive {
            true => format!("alive, {:.1} s left", n.lease_left_ms as f64 / 1000.0),
            false => format!("expired {:.1} s ago", -n.lease_left_ms as f64 / 1000.0),
        };
        let cap = n
            .max_live_threads
            .map_or(String::new(), |m| format!(" of {m}"));
        out!(
            "{:<16} {lease:<24} epoch {:<4} pid {}@{}  {}  {} live{cap}",
            n.name,
            n.epoch,
            n.pid,
            n.host,
            n.addr,
            n.live_threads
        );
    }
    Ok(0)
}

/// A weft built without the `server` feature has no HTTP server: the command fails, saying why.
#[cfg(not(feature = "server"))]
pub(super) async fn serve(
    _explicit: Option<PathBuf>,
    _addr: String,
    _public: bool,
    _node: (Option<String>, Option<f64>),
    _choice: Choice,
) -> Result<i32, Exit> {
    Err(super::failed(
        "`weft serve` is not available: this weft was built without the `server` feature",
    ))
}

#[cfg(feature = "server")]
pub(super) async fn serve(
    explicit: Option<PathBuf>,
    addr: String,
    public: bool,
    (node, lease): (Option<String>, Option<f64>),
    choice: Choice,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let node = NodeArgs::resolve(&project, node, lease)?;
    let sock: std::net::SocketAddr = addr
        .parse()
        .map_err(|e| usage(format!("--addr `{addr}` is not host:port ({e})")))?;
    if !sock.ip().is_loopback() && !public {
        return Err(usage(format!(
            "{addr} is reachable from other machines; pass --public to serve there (the bearer token is then all that guards your threads and budget)"
        )));
    }
    let listener = tokio::net::TcpListener::bind(sock)
        .await
        .map_err(|e| usage(format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr().map_err(super::failed)?;
    // The name first: a node refused its name starts nothing (no recovery, no effects).
    let joined = match &node {
        Some(n) => Some(join_node(&project, n, &local.to_string())?),
        None => None,
    };
    let max_live = node.as_ref().and_then(|n| n.max_live_threads);
    let node = match joined {
        Some(j) => Some(Node::start(&project, j, max_live)?),
        None => None,
    };
    let (rt, _control) = super::run::open_serving(super::run::chosen(&project, choice)).await?;
    let _tasks = match &node {
        Some(n) => n.attach(&rt).await,
        None => None,
    };
    let token = crate::server::http::token(&project)
        .map_err(|e| usage(format!("cannot make .weft/serve.token: {e}")))?;
    #[cfg(feature = "mcp-server")]
    crate::server::http::mcp_token(&project)
        .map_err(|e| usage(format!("cannot make .weft/mcp.token: {e}")))?;
    let lease = node.map(|n| n.held);
    out!("weft serve: http://{local}/#token={token}");
    out!("  API under http://{local}/v1 — header `Authorization: Bearer <.weft/serve.token>`; Ctrl-C stops");
    #[cfg(feature = "mcp-server")]
    out!("  MCP at http://{local}/mcp — header `Authorization: Bearer <.weft/mcp.token>` (opens only what `mcp_server:` does)");
    let _ = std::io::stdout().flush();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(crate::server::http::serve(
        rt.clone(),
        listener,
        token,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let lost = match &lease {
        Some(held) => tokio::select! {
            _ = wait_for_stop() => None,
            why = held.lost() => Some(why),
        },
        None => {
            wait_for_stop().await;
            None
        }
    };
    match &lost {
        Some(why) => {
            eprintln!("weft serve: stopping — {why}; cancelling the threads this server runs")
        }
        None => out!("weft serve: stopping — cancelling the threads this server runs"),
    }
    let _ = stop_tx.send(());
    stop_threads(&rt, "weft serve stopped").await;
    server.abort();
    rt.close().await;
    if let Some(l) = lease {
        // A lost lease is not given up (another may hold the name), nor waited for: its renewer
        // may hang on a connection that is gone.
        match lost {
            Some(_) => l.abandon(),
            None => l.stop(),
        }
    }
    Ok(if lost.is_some() { 1 } else { 0 })
}

/// Cancels the threads this process runs, waits for them to end (their cancel grace and 10 s
/// more at most) and for the work their hooks left.
#[cfg_attr(not(any(feature = "server", feature = "mcp-server")), allow(dead_code))]
pub(super) async fn stop_threads(rt: &crate::runtime::Runtime, why: &str) {
    let mine = crate::registry::ThreadFilter {
        status: vec!["created".into(), "running".into()],
        ..Default::default()
    };
    for r in rt.list(&mine).unwrap_or_default() {
        rt.cancel(&r.id, why);
    }
    let deadline =
        std::time::Instant::now() + rt.config().cancel_grace + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline
        && rt
            .list(&mine)
            .unwrap_or_default()
            .iter()
            .any(|r| r.owner_pid == crate::core::owner::me())
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    rt.drain_hooks().await;
}

/// A node being served: its lease (renewed from the join on, even while the runtime opens) and
/// its owner number on a shared database.
#[cfg(feature = "server")]
struct Node {
    held: Held,
    owner: Option<u32>,
    length: std::time::Duration,
    /// Its capacity: at this many live threads, new children go to nodes with room.
    max_live: Option<i64>,
    /// The runtime, once open (the renewer reports its live threads).
    rt: std::sync::Arc<std::sync::OnceLock<crate::runtime::Runtime>>,
}

#[cfg(feature = "server")]
impl Node {
    /// After the join, before the runtime opens: on a shared database the process owns what it
    /// starts by its lease's number, and every table is fenced (nothing may be adopted before);
    /// the lease is renewed from now on.
    fn start(
        project: &crate::project::Project,
        (lease, length): (crate::runtime::node::Lease, std::time::Duration),
        max_live: Option<i64>,
    ) -> Result<Node, Exit> {
        let owner = lease.owner();
        let rt = std::sync::Arc::new(std::sync::OnceLock::new());
        let held = Held::start(lease, length, rt.clone());
        if let Some(o) = owner {
            crate::core::owner::become_node(o, length);
            crate::runtime::fence::fence_now(project).map_err(|e| {
                super::failed(format!(
                    "cannot fence the database's tables against nodes that lose their lease ({e}); a node needs Postgres 12+ and a role that may create triggers"
                ))
            })?;
        }
        Ok(Node {
            held,
            owner,
            length,
            max_live,
            rt,
        })
    }

    /// Once the runtime is open: its live threads are reported, dead nodes watched, relayed
    /// requests answered, children placed on nodes with room when it is full and queued ones
    /// taken while it has room, and (with `auto_resume`) the threads recovery adopted at the
    /// open resumed.
    async fn attach(
        &self,
        rt: &crate::runtime::Runtime,
    ) -> Option<[tokio::task::JoinHandle<()>; 3]> {
        let _ = self.rt.set(rt.clone());
        let owner = self.owner?;
        rt.resume_adopted(rt.recovered()).await;
        let max = self
            .max_live
            .map(|m| usize::try_from(m).unwrap_or(usize::MAX));
        let placer = crate::server::placement::NodePlacer::new(rt, max);
        rt.set_placer(placer.clone());
        Some([
            rt.watch_nodes(self.length / 2),
            crate::server::control::answer_relayed(rt, owner),
            crate::server::placement::take_queued(rt, placer),
        ])
    }
}

/// A node's lease, renewed on a thread of its own until stopped (then given up).
#[cfg(feature = "server")]
struct Held {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    renewer: std::thread::JoinHandle<()>,
    /// Milliseconds after `since` of the last renewal that held; `u64::MAX`: the lease was
    /// taken over.
    last_ok: std::sync::Arc<std::sync::atomic::AtomicU64>,
    since: std::time::Instant,
    length: std::time::Duration,
}

/// The longest lease `--node-lease` takes, in seconds.
#[cfg(feature = "server")]
const MAX_LEASE: f64 = 300.0;

/// Joins the project's database as node `n` (refused while another holder's lease runs).
#[cfg(feature = "server")]
fn join_node(
    project: &crate::project::Project,
    n: &NodeArgs,
    addr: &str,
) -> Result<(crate::runtime::node::Lease, std::time::Duration), Exit> {
    use crate::runtime::node::{join, Joining};
    if !(n.lease.is_finite() && (0.5..=MAX_LEASE).contains(&n.lease)) {
        return Err(usage(format!(
            "--node-lease is between 0.5 and {MAX_LEASE} seconds, not {}",
            n.lease
        )));
    }
    let fine = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if n.name.is_empty() || n.name.len() > 64 || !n.name.chars().all(fine) {
        return Err(usage(format!(
            "--node `{}`: a node's name is 1 to 64 letters, digits, `.`, `_` or `-`",
            n.name.escape_debug()
        )));
    }
    let length = std::time::Duration::from_secs_f64(n.lease);
    let joining = Joining {
        name: &n.name,
        addr,
        max_live_threads: n.max_live_threads,
        length,
    };
    let lease = join(project, &joining).map_err(super::failed)?;
    Ok((lease, length))
}

#[cfg(feature = "server")]
impl Held {
    /// Renews `lease` every fifth of `length` with the count of live threads `rt` runs (0 until
    /// it is open).
    fn start(
        mut lease: crate::runtime::node::Lease,
        length: std::time::Duration,
        rt: std::sync::Arc<std::sync::OnceLock<crate::runtime::Runtime>>,
    ) -> Held {
        use std::sync::atomic::Ordering::Relaxed;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let last_ok = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let since = std::time::Instant::now();
        let (flag, ok) = (stop.clone(), last_ok.clone());
        let renewer = std::thread::spawn(move || {
            let mut next = std::time::Instant::now() + length / 5;
            while !flag.load(Relaxed) {
                if std::time::Instant::now() < next {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    continue;
                }
                next = std::time::Instant::now() + length / 5;
                let started = since.elapsed().as_millis() as u64;
                let live = rt.get().map_or(0, |rt| rt.live_here() as i64);
                match lease.renew(live) {
                    Ok(()) => ok.store(started, Relaxed),
                    Err(e) if e.is_lost() => {
                        ok.store(u64::MAX, Relaxed);
                        return;
                    }
                    Err(e) => tracing::warn!("node lease not renewed: {e}"),
                }
            }
            lease.leave();
        });
        Held {
            stop,
            renewer,
            last_ok,
            since,
            length,
        }
    }

    /// Resolves when the lease is lost: taken over, or not renewed for a whole lease length
    /// (counted from the start of the last renewal that held, whatever the renewer is doing,
    /// so a hung connection loses it too; another node may take the name from then on).
    async fn lost(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        loop {
            tokio::time::sleep(self.length / 10).await;
            let ok = self.last_ok.load(Relaxed);
            if ok == u64::MAX {
                return "the node lost its lease: another node took the name after it expired"
                    .into();
            }
            let since_ok = self
                .since
                .elapsed()
                .saturating_sub(std::time::Duration::from_millis(ok));
            if since_ok >= self.length {
                return format!(
                    "the node's lease ran out: not renewed for {:.1} s",
                    since_ok.as_secs_f64()
                );
            }
        }
    }

    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.renewer.join();
    }

    /// Stops renewing without waiting for the renewer.
    fn abandon(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Ctrl-C, or SIGTERM on Unix.
#[cfg(any(feature = "server", feature = "mcp-server"))]
pub(super) async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
