//! What an MCP client may see and stop: the trees whose root runs a directive it could start
//! (`mcp_server.directives`). A thread outside them is answered as if it did not exist.

use crate::core::ids::ThreadId;
use crate::registry::{ThreadFilter, ThreadRow};
use crate::runtime::Runtime;
use crate::thread::ClientBounds;

/// The bounds of MCP clients, or the error that says how to open some.
pub(super) fn bounds(rt: &Runtime) -> Result<ClientBounds, String> {
    match &rt.config().mcp_server {
        Some(open) => Ok(ClientBounds {
            who: "MCP clients",
            directives: open.directives.clone(),
            max_spend: open.max_spend,
        }),
        None => Err(format!(
            "weft's MCP server opens no directive yet: add `mcp_server: {{ max_spend: 0.25, directives: [\"research/*\"] }}` to {} (the most one tree may spend, in USD, and the directive names MCP clients may start)",
            rt.project().weft().join("config.yaml").display()
        )),
    }
}

/// Whether a tree whose root runs `directive` is open to MCP clients.
fn opens(rt: &Runtime, directive: &str) -> bool {
    bounds(rt).is_ok_and(|b| b.opens(directive))
}

/// Thread `id` when its tree is open to MCP clients; else an error that says it is not there.
pub(super) fn visible(rt: &Runtime, id: &str) -> Result<ThreadRow, String> {
    let missing = || format!("no thread {id} that MCP clients may see");
    let id = ThreadId::parse(id.trim()).map_err(|e| e.to_string())?;
    let row = rt
        .get(&id)
        .map_err(|e| e.to_string())?
        .ok_or_else(missing)?
        .row;
    let root = match row.root_id == row.id {
        true => row.directive.clone(),
        false => match rt.get(&row.root_id).map_err(|e| e.to_string())? {
            Some(v) => v.row.directive,
            None => return Err(missing()),
        },
    };
    match opens(rt, &root) {
        true => Ok(row),
        false => Err(missing()),
    }
}

/// The `limit` most recently updated threads MCP clients may see.
pub(super) fn visible_threads(rt: &Runtime, limit: usize) -> Result<Vec<ThreadRow>, String> {
    // Threads of trees clients may not see are left out after the listing: look well past it.
    let f = ThreadFilter {
        limit: Some(5_000),
        ..Default::default()
    };
    let rows = rt.list(&f).map_err(|e| e.to_string())?;
    let roots: std::collections::HashMap<ThreadId, String> = rows
        .iter()
        .filter(|r| r.id == r.root_id)
        .map(|r| (r.id.clone(), r.directive.clone()))
        .collect();
    let open = |r: &ThreadRow| match roots.get(&r.root_id) {
        Some(d) => opens(rt, d),
        None => visible(rt, r.id.as_str()).is_ok(),
    };
    Ok(rows.into_iter().filter(open).take(limit).collect())
}
