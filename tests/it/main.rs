//! weft's integration tests: one binary, one module per area.

mod budget;
mod cli;
mod code;
mod continuation;
mod crash;
mod directives;
mod e2e_llm;
mod effects;
mod env;
mod fake_llm;
mod guarantees;
mod hooks;
mod interop;
mod layout;
mod lifecycle;
mod mcp;
mod messages;
mod otel;
mod providers;
mod serve;
mod state;
mod store;
mod support;
mod tools;
mod tree;
mod upkeep;
