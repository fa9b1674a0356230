//! Surfaces that serve a running runtime to other processes: one API handler set (`api`) on two
//! transports — every runtime's local control socket (`control`) and `weft serve`'s HTTP with
//! Server-Sent Events and the web page (`http`, `events`, behind the `server` feature). Started by
//! whoever serves (the CLI, so the room is built with the `cli` feature); the runtime never
//! imports this room.

pub(crate) mod api;
pub(crate) mod control;
#[cfg(feature = "server")]
mod events;
#[cfg(feature = "server")]
pub(crate) mod http;
#[cfg(feature = "mcp-server")]
pub(crate) mod mcp;
pub(crate) mod peer;
pub(crate) mod placement;
pub(crate) mod relay;
#[cfg(feature = "server")]
mod remote;

/// An SSE `Last-Event-ID`, read (see `events.rs`).
#[cfg(feature = "server")]
pub(crate) fn parse_event_id(id: &str) -> Option<(u64, u64, u64)> {
    events::parse_id(id)
}
