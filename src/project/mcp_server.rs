//! `mcp_server:` in `.weft/config.yaml`: what MCP clients of `weft mcp` (and of `/mcp` on
//! `weft serve`) may start. Nothing until it is set: a client's `run_directive` is refused with
//! the lines to add.

use crate::core::money::Nanos;
use serde::Deserialize;

/// `mcp_server:` as written.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMcpServer {
    #[serde(default)]
    max_spend: Option<serde_json::Value>,
    #[serde(default)]
    directives: Vec<String>,
    #[serde(default)]
    max_live_trees: Option<u64>,
}

/// `mcp_server:` checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerOpen {
    /// The most one tree a client starts may spend (its root's spend cap is lowered to it).
    pub max_spend: Nanos,
    /// Directive-name patterns a client may start (`research/*`, `**`); none: nothing.
    pub directives: Vec<String>,
    /// The most trees MCP clients may have running at once in one process (default 4): with
    /// `max_spend`, at most their product is at stake at any moment.
    pub max_live_trees: u64,
}

/// Checks `mcp_server:`: `max_spend` is required (a USD amount above zero), every pattern a
/// directive name with `*`, `**` or `?`.
pub(crate) fn check(raw: RawMcpServer) -> Result<McpServerOpen, String> {
    let max_spend = match &raw.max_spend {
        None => return Err("mcp_server: `max_spend` is required: the most one tree an MCP client starts may spend, in USD (e.g. `max_spend: 0.25`)".into()),
        Some(v) => Nanos::from_json_usd(v).map_err(|e| format!("mcp_server: max_spend: {e}"))?,
    };
    if max_spend <= Nanos::ZERO {
        return Err(
            "mcp_server: max_spend must be above zero (remove `mcp_server:` to open nothing)"
                .into(),
        );
    }
    let fine = |c: char| c.is_ascii_alphanumeric() || "_-./*?".contains(c);
    if let Some(bad) = raw
        .directives
        .iter()
        .find(|p| p.is_empty() || !p.chars().all(fine) || p.split('/').any(|s| s == ".."))
    {
        return Err(format!(
            "mcp_server: directives: `{}` is not a directive-name pattern (letters, digits, `_-./`, with `*`, `**` or `?`)",
            bad.escape_debug()
        ));
    }
    let max_live_trees = raw.max_live_trees.unwrap_or(4);
    if max_live_trees == 0 {
        return Err(
            "mcp_server: max_live_trees must be at least 1 (remove `mcp_server:` to open nothing)"
                .into(),
        );
    }
    Ok(McpServerOpen {
        max_spend,
        directives: raw.directives,
        max_live_trees,
    })
}
