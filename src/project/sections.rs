//! Config sections for what threads act with and on: MCP servers, built-in hooks, the file area.
//! Parsed as part of `.weft/config.yaml` (see `config.rs`); kept apart so each file reads whole.

use serde::Deserialize;
use std::collections::BTreeMap;

/// Built-in hooks (config `builtin_hooks:`), each switchable off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct BuiltinHooks {
    /// `after_complete` usage record appended to `.weft/usage.jsonl`.
    pub usage_record: bool,
    /// A thread whose prompt passes `continuation_threshold` of its context window continues
    /// in a new thread (off: it fails with a context overflow instead).
    pub continuation: bool,
}

impl Default for BuiltinHooks {
    fn default() -> Self {
        BuiltinHooks {
            usage_record: true,
            continuation: true,
        }
    }
}

/// Size limits of a thread's file area (config `files:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimits {
    /// Largest file `file_write` may create (`files.max_file_bytes`).
    pub max_file_bytes: u64,
    /// Largest total size of one thread's file area (`files.max_area_bytes`).
    pub max_area_bytes: u64,
}

impl Default for FileLimits {
    fn default() -> Self {
        FileLimits {
            max_file_bytes: 10 * 1024 * 1024,
            max_area_bytes: 100 * 1024 * 1024,
        }
    }
}

/// One MCP tool server (config `mcp_servers.<name>`): a command run over stdio, or a streamable
/// HTTP endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// stdio: the program.
    #[serde(default)]
    pub command: Option<String>,
    /// stdio: its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// stdio: environment variables passed through (names; nothing else is inherited but PATH
    /// and HOME, which servers started by npx or uvx need).
    #[serde(default)]
    pub env: Vec<String>,
    /// HTTP: the endpoint, e.g. `http://127.0.0.1:3001/mcp`.
    #[serde(default)]
    pub url: Option<String>,
    /// HTTP: headers; values may name environment variables as `${NAME}`, and a header that
    /// carries a credential (authorization, cookie, *key*, *token*, *secret*) must.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl McpServerConfig {
    /// Why this server's entry cannot be used, if it cannot.
    pub(super) fn problem(&self, name: &str) -> Option<String> {
        let name_ok = !name.is_empty()
            && !name.contains("__")
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if !name_ok {
            return Some(format!(
                "mcp_servers.{name}: use lowercase letters, digits, `-` and single `_` (tools become `mcp__{name}__<tool>`)"
            ));
        }
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => {
                return Some(format!(
                    "mcp_servers.{name}: give `command` (stdio) or `url` (HTTP), not both"
                ))
            }
            (None, None) => {
                return Some(format!(
                    "mcp_servers.{name}: give `command` (stdio) or `url` (HTTP)"
                ))
            }
            _ => {}
        }
        for (h, v) in &self.headers {
            let lower = h.to_ascii_lowercase();
            let secret = ["authorization", "cookie", "key", "token", "secret"]
                .iter()
                .any(|w| lower.contains(w));
            if secret && !v.contains("${") {
                return Some(format!(
                    "mcp_servers.{name}.headers.{h}: a credential is never written in the file; name the environment variable holding it, e.g. \"Bearer ${{MY_TOKEN}}\""
                ));
            }
        }
        None
    }
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(super) struct RawFiles {
    #[serde(default)]
    pub(super) max_file_bytes: Option<u64>,
    #[serde(default)]
    pub(super) max_area_bytes: Option<u64>,
}
