//! Tools a model may call, and the capability gate in front of every call (SPEC §8).
//!
//! Owns what a tool result is ([`ToolOutcome`]) and which capability a call needs. Must never
//! let a call through that the thread's capabilities do not cover: a denial is an error result
//! for the model, never a failure of the thread. The thread-management tools act on the thread
//! actor's own state and live in `thread/`; command tools (`command.rs`, run by `process.rs`,
//! input checked by `schema.rs`) and the file area (`files.rs`) live here.

mod code;
mod command;
mod files;
mod glob;
pub(crate) mod groups;
mod mcp;
mod process;
mod schema;

pub(crate) use code::{run as run_code, CodeEnv};
#[cfg(feature = "cli")]
pub(crate) use command::json_schema as tool_schema;
pub use command::ToolFileError;
pub(crate) use command::{parse as parse_tool_file, CommandTool, CommandTools};
pub(crate) use files::{copy_between, resolve as resolve_in_area, FileTool};
pub use groups::kill_all_live;
pub(crate) use groups::reap as reap_groups;
pub(crate) use mcp::{split_name as split_mcp_name, McpHub};
pub(crate) use process::CallEnv;

use crate::core::capability;
use crate::provider::ToolCall;
use serde_json::{json, Value};

/// Runs a file tool (see [`files::run`]).
pub(crate) use files::run as run_file_tool;
/// Runs a command tool (see [`process::run`]).
pub(crate) use process::run as run_command;

/// Whether `name` (a directive name or relative path) matches the glob `pattern`.
pub(crate) fn glob_matches(pattern: &str, name: &str) -> bool {
    glob::Glob::new(pattern).matches(name)
}

/// A tool's result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolOutcome {
    /// Result text for the model (JSON for built-ins).
    pub content: String,
    /// Failed or refused.
    pub is_error: bool,
    /// Set by a valid `directive_return`: the outputs that complete the thread.
    pub returned: Option<Value>,
}

impl ToolOutcome {
    /// A successful JSON result.
    pub(crate) fn ok(v: Value) -> ToolOutcome {
        ToolOutcome {
            content: v.to_string(),
            is_error: false,
            returned: None,
        }
    }
    /// An error result.
    pub(crate) fn err(msg: impl Into<String>) -> ToolOutcome {
        ToolOutcome {
            content: json!({ "error": msg.into() }).to_string(),
            is_error: true,
            returned: None,
        }
    }
}

/// May a thread holding `caps` use the thread-management tools?
pub(crate) fn may_manage(caps: &[String]) -> bool {
    // A capability under `thread.spawn.` is one at once (asked at every transition).
    caps.iter().any(|c| {
        c.strip_prefix("thread.spawn.")
            .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('.'))
    }) || !capability::attenuate(&["thread.spawn.**".to_string()], caps).is_empty()
}

/// The capability a call of a tool that is not one of weft's built-ins needs: an MCP tool's
/// (`mcp.<server>.<tool>`) or a command tool's (`tool.<name>`). Built-in tools say their own
/// (`thread/builtin/`).
pub(crate) fn needed_capability(call: &ToolCall) -> Result<String, String> {
    let name = call.name.as_str();
    if !name.starts_with("mcp__") {
        return Ok(format!("tool.{name}"));
    }
    match mcp::split_name(name) {
        Some((server, tool)) => Ok(mcp::capability(server, tool)),
        None => Err(format!(
            "`{name}` is not an MCP tool name (mcp__<server>__<tool>)"
        )),
    }
}

/// The capability that lets a thread spawn directive `name` (`/` becomes `.`).
pub(crate) fn spawn_capability(name: &str) -> String {
    format!("thread.spawn.{}", name.replace('/', "."))
}

/// The gate: `Ok` when `caps` grant `cap`, else the denial message for the model.
pub(crate) fn check(caps: &[String], cap: &str, thread: &str) -> Result<(), String> {
    let ok = if cap == "thread.spawn.**" {
        may_manage(caps)
    } else {
        capability::allowed(caps, cap)
    };
    if ok {
        return Ok(());
    }
    let held = if caps.is_empty() {
        "none".to_string()
    } else {
        caps.join(", ")
    };
    Err(format!(
        "permission denied: `{cap}` is not granted to thread {thread} (it holds: {held})"
    ))
}
