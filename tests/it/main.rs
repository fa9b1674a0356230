//! weft's integration tests: one binary, one module per area. A module (or test) that needs a
//! feature is built only with it; those that drive the `weft` binary need `cli`.

#[cfg(feature = "cli")]
mod anchors;
mod backends;
mod budget;
#[cfg(feature = "cli")]
mod cli;
#[cfg(feature = "server")]
mod cluster;
#[cfg(all(feature = "cli", feature = "js"))]
mod code;
mod continuation;
#[cfg(feature = "cli")]
mod crash;
mod directives;
#[cfg(feature = "cli")]
mod door;
mod e2e_llm;
#[cfg(feature = "cli")]
mod effects;
#[cfg(feature = "server")]
mod env;
mod fake_llm;
mod fuzz;
mod guarantees;
mod hooks;
#[cfg(feature = "cli")]
mod input;
#[cfg(feature = "cli")]
mod interop;
mod layout;
#[cfg(feature = "cli")]
mod lifecycle;
#[cfg(feature = "mcp")]
mod mcp;
#[cfg(all(feature = "mcp-server", feature = "server"))]
mod mcp_server;
#[cfg(feature = "cli")]
mod messages;
#[cfg(feature = "server")]
mod nodes;
#[cfg(feature = "otel")]
mod otel;
#[cfg(feature = "server")]
mod page;
mod pg;
#[cfg(feature = "server")]
mod placement;
#[cfg(feature = "cli")]
mod procs;
mod providers;
mod records;
#[cfg(feature = "server")]
mod redact;
#[cfg(feature = "cli")]
mod ryeos;
#[cfg(feature = "cli")]
mod schema;
#[cfg(feature = "server")]
mod serve;
#[cfg(feature = "cli")]
mod state;
#[cfg(feature = "cli")]
mod store;
mod support;
#[cfg(feature = "cli")]
mod tools;
mod tree;
#[cfg(feature = "cli")]
mod upkeep;
