//! weft as an MCP server (rmcp's server side): `weft mcp` over stdio, and `/mcp` of `weft
//! serve` over streamable HTTP behind its bearer token. An MCP client (Claude Code, Claude
//! Desktop, Cursor, …) hands weft a directive with a hard cap and gets its result back.
//!
//! What a client may start is `mcp_server:` of the config (nothing until it is set); a tree it
//! starts goes through the runtime's one door as [`crate::thread::Origin::Client`]: a library
//! name only, limits only lowered, spend at most `max_spend`. It sees and stops only trees whose
//! root runs a directive it could start.

mod access;
mod run;
mod tools;

use crate::runtime::Runtime;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    Resource, ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;

/// The handler every MCP session gets: the runtime it starts trees on.
#[derive(Clone)]
pub(crate) struct WeftMcp {
    rt: Runtime,
    /// The trees clients run in this process (every session's).
    live: run::LiveTrees,
}

impl WeftMcp {
    pub(crate) fn new(rt: Runtime, live: run::LiveTrees) -> WeftMcp {
        WeftMcp { rt, live }
    }
}

/// A tool's answer: its JSON as text and as structured content, marked an error when refused.
fn answer(result: Result<Value, String>) -> CallToolResult {
    match result {
        Ok(v) => CallToolResult::structured(v),
        Err(e) => CallToolResult::error(vec![ContentBlock::text(e)]),
    }
}

/// The URI of a thread's transcript resource.
fn transcript_uri(id: &crate::core::ids::ThreadId) -> String {
    format!("weft://threads/{id}/transcript")
}

impl ServerHandler for WeftMcp {
    fn get_info(&self) -> ServerConfig {
        let caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .build();
        InitializeResult::new(caps)
            .with_server_info(Implementation::new("weft", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "weft runs directives as budgeted, cancellable agent trees. `list_directives` \
                 names what you may start; `run_directive` runs one and returns its result and \
                 spend; a tree never spends more than its cap.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::list()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.unwrap_or_default());
        let result = match request.name.as_ref() {
            "run_directive" => run::run_directive(&self.rt, &self.live, &args, &context).await,
            "list_directives" => tools::list_directives(&self.rt),
            "thread_status" => tools::thread_status(&self.rt, &args),
            "cancel_thread" => tools::cancel_thread(&self.rt, &args).await,
            "search_threads" => tools::search_threads(&self.rt, &args),
            other => {
                return Err(ErrorData::invalid_params(
                    format!("no tool `{other}` (run_directive, list_directives, thread_status, cancel_thread, search_threads)"),
                    None,
                ))
            }
        };
        Ok(answer(result).into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let rows = access::visible_threads(&self.rt, 200).map_err(internal)?;
        let items = rows
            .into_iter()
            .map(|r| {
                Resource::new(transcript_uri(&r.id), format!("{} {}", r.directive, r.id))
                    .with_description(format!("transcript of thread {} ({})", r.id, r.status))
                    .with_mime_type("application/json")
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(items))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let t = ResourceTemplate::new("weft://threads/{id}/transcript", "transcript")
            .with_description("a thread's transcript: its messages, tool calls and LLM calls, as stored (secrets redacted)")
            .with_mime_type("application/json");
        Ok(ListResourceTemplatesResult::with_all_items(vec![t]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let id = request
            .uri
            .strip_prefix("weft://threads/")
            .and_then(|r| r.strip_suffix("/transcript"))
            .ok_or_else(|| {
                ErrorData::resource_not_found(
                    format!(
                        "`{}` is not a weft resource (weft://threads/<id>/transcript)",
                        request.uri
                    ),
                    None,
                )
            })?;
        let id = access::visible(&self.rt, id)
            .map_err(|e| ErrorData::resource_not_found(e, None))?
            .id;
        let page = self.rt.transcript(&id, None, 5_000).map_err(internal)?;
        let text = serde_json::to_string(&page).map_err(internal)?;
        let contents = ResourceContents::text(text, request.uri).with_mime_type("application/json");
        Ok(ReadResourceResult::new(vec![contents]).into())
    }
}

fn internal(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(e.to_string(), None)
}

/// Serves MCP over this process's stdin and stdout until the client closes them.
#[cfg(feature = "cli")]
pub(crate) async fn serve_stdio(rt: Runtime) -> Result<(), String> {
    use rmcp::ServiceExt;
    let running = WeftMcp::new(rt, Default::default())
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("the MCP client's handshake failed: {e}"))?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| format!("the MCP session failed: {e}"))
}

/// The streamable HTTP service of `/mcp` (sessions kept in this process). `public`: any host
/// name may reach it (the bearer token guards it); else only loopback names, against DNS
/// rebinding.
#[cfg(feature = "server")]
pub(crate) fn http_service(
    rt: Runtime,
    public: bool,
    stop: tokio_util::sync::CancellationToken,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    WeftMcp,
    rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    use std::sync::Arc;
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = stop;
    if public {
        config = config.disable_allowed_hosts();
    }
    // A session idle this long is closed (its requests, and their trees, cancelled): longer
    // than any tree runs quietly (rmcp's default, 5 min, cut a long call's tree short).
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(std::time::Duration::from_secs(24 * 3600));
    let live = run::LiveTrees::default();
    StreamableHttpService::new(
        move || Ok(WeftMcp::new(rt.clone(), live.clone())),
        Arc::new(sessions),
        config,
    )
}
