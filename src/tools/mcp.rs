//! MCP tool servers (SPEC §8): `mcp_servers:` of the config, each a command spoken to over stdio
//! or a streamable HTTP endpoint.
//!
//! Owns the names of MCP tools (`mcp__<server>__<tool>`, capability `mcp.<server>.<tool>`) and
//! the [`McpHub`] of a runtime: with the `mcp` feature, the rmcp client (`mcp/client.rs`);
//! without it, a hub that offers no tools and reports each server a thread may use as
//! unavailable, saying why. Must never offer or call a tool the thread's capabilities do not
//! cover, nor write a header's credential anywhere.

#[cfg(feature = "mcp")]
mod client;
#[cfg(feature = "mcp")]
pub(crate) use client::McpHub;
#[cfg(not(feature = "mcp"))]
pub(crate) use off::McpHub;

/// The tool name offered to the model for `tool` of `server`.
#[cfg_attr(not(feature = "mcp"), allow(dead_code))] // no tools without the client
pub(crate) fn tool_name(server: &str, tool: &str) -> String {
    format!("mcp__{server}__{tool}")
}

/// `mcp__<server>__<tool>` → (server, tool).
pub(crate) fn split_name(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix("mcp__")?.split_once("__")
}

/// Whether `caps` let a thread use some tool of `server` (so its start may start the server).
pub(crate) fn may_use(server: &str, caps: &[String]) -> bool {
    !crate::core::capability::attenuate(&[format!("mcp.{server}.**")], caps).is_empty()
}

/// The capability a call of `tool` on `server` needs.
pub(crate) fn capability(server: &str, tool: &str) -> String {
    format!("mcp.{server}.{tool}")
}

/// A weft built without the `mcp` feature: MCP servers can be configured but never start.
#[cfg(not(feature = "mcp"))]
mod off {
    use crate::project::config::McpServerConfig;
    use crate::provider::ToolSpec;
    use serde_json::Value;
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;

    /// The MCP servers of one runtime, none of which can start.
    pub(crate) struct McpHub {
        configs: BTreeMap<String, McpServerConfig>,
    }

    /// Why no MCP server starts.
    fn unavailable(server: &str) -> String {
        format!(
            "MCP server `{server}` is unavailable: this weft was built without the `mcp` feature"
        )
    }

    impl McpHub {
        /// A hub for `configs` (the same arguments as the rmcp hub's).
        pub(crate) fn new(
            configs: BTreeMap<String, McpServerConfig>,
            _root: PathBuf,
            _store: Option<Arc<crate::store::FileStore>>,
        ) -> McpHub {
            McpHub { configs }
        }

        /// Whether `caps` let a thread use any server.
        pub(crate) fn wants(&self, caps: &[String]) -> bool {
            self.configs
                .keys()
                .any(|name| crate::tools::mcp::may_use(name, caps))
        }

        /// No tools, and a problem line for each server `caps` would let the thread use.
        pub(crate) async fn offered(&self, caps: &[String]) -> (Vec<ToolSpec>, Vec<String>) {
            let problems = self
                .configs
                .keys()
                .filter(|name| crate::tools::mcp::may_use(name, caps))
                .map(|name| unavailable(name))
                .collect();
            (Vec::new(), problems)
        }

        /// Nothing runs.
        pub(crate) async fn shutdown(&self) {}

        /// Refuses the call: (the reason, is_error).
        pub(crate) async fn call(
            &self,
            (server, _tool): (&str, &str),
            _input: &Value,
            _files: &Path,
            _call_id: &str,
            _cancel: CancellationToken,
            _redactor: &crate::core::redact::Redactor,
        ) -> (String, bool) {
            (unavailable(server), true)
        }
    }
}
