//! weft's integration tests: one binary, one module per area.

mod budget;
mod cli;
mod directives;
mod lifecycle;
mod support;
mod tree;
