//! `weft mcp`: this project as an MCP server over stdin and stdout, until the client closes
//! them or the process is told to stop (then the threads it runs are cancelled and waited
//! for, as `weft serve` does). Nothing but the protocol is written to stdout.

use super::Exit;
use crate::provider::Choice;
use std::path::PathBuf;

/// A weft built without the `mcp-server` feature has no MCP server: the command says so.
#[cfg(not(feature = "mcp-server"))]
pub(super) async fn mcp(_explicit: Option<PathBuf>, _choice: Choice) -> Result<i32, Exit> {
    Err(super::failed(
        "`weft mcp` is not available: this weft was built without the `mcp-server` feature",
    ))
}

#[cfg(feature = "mcp-server")]
pub(super) async fn mcp(explicit: Option<PathBuf>, choice: Choice) -> Result<i32, Exit> {
    let project = super::find_project(explicit)?;
    // Scheduled work of the project is not this short-lived process's to run (its clients' trees'
    // is): other work would be cancelled when the client goes away.
    let builder = super::run::chosen(&project, choice).effects_of_none();
    let (rt, _control) = super::run::open_serving(builder).await?;
    if rt.config().mcp_server.is_none() {
        eprintln!(
            "weft mcp: no directive is open to MCP clients yet; add `mcp_server: {{ max_spend: 0.25, directives: [\"research/*\"] }}` to {}",
            project.weft().join("config.yaml").display()
        );
    }
    let outcome = tokio::select! {
        served = crate::server::mcp::serve_stdio(rt.clone()) => served,
        _ = super::serve::wait_for_stop() => Ok(()),
    };
    super::serve::stop_threads(&rt, "weft mcp stopped").await;
    rt.close().await;
    match outcome {
        Ok(()) => Ok(0),
        Err(e) => Err(super::failed(format!("weft mcp: {e}"))),
    }
}
