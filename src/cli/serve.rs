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

/// A weft built without the `server` feature has no HTTP server: the command fails, saying why.
#[cfg(not(feature = "server"))]
pub(super) async fn serve(
    _explicit: Option<PathBuf>,
    _addr: String,
    _public: bool,
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
    wait_for_stop().await;
    out!("weft serve: stopping — cancelling the threads this server runs");
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
    Ok(0)
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
