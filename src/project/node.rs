//! `node:` in `.weft/config.yaml`: the node a project's `weft serve` joins its database as
//! (see `runtime/node.rs`; `--node` wins).

use serde::Deserialize;
use std::time::Duration;

/// `node:` as written.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNode {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    lease: Option<String>,
    #[serde(default)]
    max_live_threads: Option<u64>,
}

/// `node:`: this project's `weft serve` joins its database as a named node (`--node` wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// The node's name (None: `weft serve --node NAME` names it; the config gives its lease and
    /// capacity, shared by every node of a project).
    pub name: Option<String>,
    /// How long its lease runs without renewal (0.5 s to 5 min; default 5 s).
    pub lease: Duration,
    /// Its capacity, shown by `weft nodes`.
    pub max_live_threads: Option<u64>,
}

/// `node:` checked: a name (if given) of 1 to 64 letters, digits, `.`, `_` or `-`; a lease of
/// 0.5 s to 5 min (default 5 s).
pub(crate) fn check(n: RawNode) -> Result<NodeConfig, String> {
    let fine = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if let Some(name) = n
        .name
        .as_ref()
        .filter(|m| m.is_empty() || m.len() > 64 || !m.chars().all(fine))
    {
        return Err(format!(
            "node: name `{}`: a node's name is 1 to 64 letters, digits, `.`, `_` or `-`",
            name.escape_debug()
        ));
    }
    let lease = match &n.lease {
        None => Duration::from_secs(5),
        Some(l) => humantime::parse_duration(l)
            .ok()
            .filter(|d| (Duration::from_millis(500)..=Duration::from_secs(300)).contains(d))
            .ok_or_else(|| {
                format!("node: lease `{l}` is not a duration from 0.5s to 5m (e.g. 5s)")
            })?,
    };
    Ok(NodeConfig {
        name: n.name,
        lease,
        max_live_threads: n.max_live_threads,
    })
}
