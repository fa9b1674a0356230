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

/// `--node NAME` and its lease length in seconds.
pub(super) struct NodeArgs {
    pub(super) name: String,
    pub(super) lease: f64,
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
    _node: Option<NodeArgs>,
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
    node: Option<NodeArgs>,
    choice: Choice,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let sock: std::net::SocketAddr = addr
        .parse()
        .map_err(|e| usage(format!("--addr `{addr}` is not host:port ({e})")))?;
    if !sock.ip().is_loopback() && !public {
        return Err(usage(format!(
            "{addr} is reachable from other machines; pass --public to serve there (the bearer token is then all that guards your threads and budget)"
        )));
    }
    let (rt, _control) = super::run::open_serving(super::run::chosen(&project, choice)).await?;
    let token = crate::server::http::token(&project)
        .map_err(|e| usage(format!("cannot make .weft/serve.token: {e}")))?;
    let listener = tokio::net::TcpListener::bind(sock)
        .await
        .map_err(|e| usage(format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr().map_err(super::failed)?;
    let (lease, lost) = match &node {
        Some(n) => {
            let (held, lost) = hold_lease(&project, n, &local.to_string(), &rt)?;
            (Some(held), lost)
        }
        None => (None, tokio::sync::oneshot::channel().1),
    };
    out!("weft serve: http://{local}/#token={token}");
    out!("  API under http://{local}/v1 — header `Authorization: Bearer <.weft/serve.token>`; Ctrl-C stops");
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
    let lost = tokio::select! {
        _ = wait_for_stop() => None,
        Ok(why) = lost => Some(why),
    };
    match &lost {
        Some(why) => {
            eprintln!("weft serve: stopping — {why}; cancelling the threads this server runs")
        }
        None => out!("weft serve: stopping — cancelling the threads this server runs"),
    }
    let _ = stop_tx.send(());
    let mine = crate::registry::ThreadFilter {
        status: vec!["created".into(), "running".into()],
        ..Default::default()
    };
    for r in rt.list(&mine).unwrap_or_default() {
        rt.cancel(&r.id, "weft serve stopped");
    }
    let deadline =
        std::time::Instant::now() + rt.config().cancel_grace + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline
        && rt
            .list(&mine)
            .unwrap_or_default()
            .iter()
            .any(|r| r.owner_pid == std::process::id())
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    rt.drain_hooks().await;
    server.abort();
    if let Some(l) = lease {
        l.stop();
    }
    Ok(if lost.is_some() { 1 } else { 0 })
}

/// A node's lease, renewed on a thread of its own until stopped (then given up).
#[cfg(feature = "server")]
struct Held {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    renewer: std::thread::JoinHandle<()>,
}

#[cfg(feature = "server")]
impl Held {
    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.renewer.join();
    }
}

/// Joins as node `n` and renews its lease every fifth of its length with the count of live
/// threads this process runs; the receiver hears why, if the lease is lost (the name was taken
/// over after it expired, or the database stayed unreachable past it).
#[cfg(feature = "server")]
fn hold_lease(
    project: &crate::project::Project,
    n: &NodeArgs,
    addr: &str,
    rt: &crate::runtime::Runtime,
) -> Result<(Held, tokio::sync::oneshot::Receiver<String>), Exit> {
    use crate::runtime::node::{join, Joining};
    if !(n.lease.is_finite() && n.lease >= 0.5) {
        return Err(usage("--node-lease is at least 0.5 seconds"));
    }
    let length = std::time::Duration::from_secs_f64(n.lease);
    let mut lease = join(
        project,
        &Joining {
            name: &n.name,
            addr,
            max_live_threads: None,
            length,
        },
    )
    .map_err(super::failed)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (flag, rt) = (stop.clone(), rt.clone());
    let renewer = std::thread::spawn(move || {
        let every = length / 5;
        let mut failing_since: Option<std::time::Instant> = None;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(every);
            let live = rt.live_here() as i64;
            match lease.renew(live) {
                Ok(()) => failing_since = None,
                Err(e) if e.to_string().contains("lost its lease") => {
                    let _ = tx.send(e.to_string());
                    return;
                }
                Err(e) => {
                    let since = *failing_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() >= length {
                        let _ = tx.send(format!("its lease ran out: {e}"));
                        return;
                    }
                }
            }
        }
        lease.leave();
    });
    Ok((Held { stop, renewer }, rx))
}

/// Ctrl-C, or SIGTERM on Unix.
#[cfg(feature = "server")]
async fn wait_for_stop() {
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
