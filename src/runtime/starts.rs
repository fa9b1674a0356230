//! A root's start its caller may withdraw while it waits (for a spawn slot, for an MCP server
//! the directive may use): `weft run`'s Ctrl-C before its thread has started, an MCP client's
//! cancel of `run_directive` (`start_for_client`). The token joins
//! the start's own (`thread::ctx::Starting`), so the one mechanism that withdraws a child's
//! start withdraws a root's.

use super::{Runtime, ThreadHandle};
use crate::core::limits::LimitSet;
use crate::thread::{Origin, SpawnError, SpawnRequest};
use serde_json::{Map, Value};

impl Runtime {
    /// This runtime (sharing everything), whose roots' starts (`start`, `resume`, `fork`) are
    /// withdrawn by `token` while they may still wait — for a spawn slot, for an MCP server
    /// the directive may use (up to its start timeout): what `weft run` does with a Ctrl-C
    /// before its thread has started. A withdrawn start is undone, its row `cancelled`, and
    /// returns [`SpawnError::Withdrawn`].
    pub fn withdrawn_by(&self, token: tokio_util::sync::CancellationToken) -> Runtime {
        Runtime {
            starts_withdrawn: Some(token),
            ..self.clone()
        }
    }

    /// Starts a root for an outside client (an MCP client): `directive` by library name only,
    /// one `bounds` opens; `lower` may only lower the directive's own limits, and its spend is
    /// at most `bounds.max_spend`.
    #[cfg_attr(not(feature = "mcp-server"), allow(dead_code))]
    pub(crate) async fn start_for_client(
        &self,
        directive: &str,
        inputs: Map<String, Value>,
        lower: LimitSet,
        bounds: crate::thread::ClientBounds,
        withdrawn: tokio_util::sync::CancellationToken,
    ) -> Result<ThreadHandle, SpawnError> {
        let mut req = SpawnRequest::new(directive, inputs, Origin::Client(bounds));
        req.overrides = lower;
        req.withdrawn = Some(withdrawn);
        self.spawn_root(req).await
    }
}
