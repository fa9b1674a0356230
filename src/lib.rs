//! weft — an actor-based orchestration runtime for hierarchical LLM agent threads.
//!
//! # Layout
//! - [`directive`] / [`directive_rye`]: directive files → validated [`directive::Directive`].
//! - [`limits`]: limit sets and their inheritance; [`capability`]: permission matching.
//! - [`config`]: `.weft/config.yaml`; [`money`]: nano-USD and prices; [`ids`]: thread ids.
//! - [`runtime`]: the public [`runtime::Runtime`] API and the spawn procedure.
//! - [`thread`]: the thread actor and its turn loop; [`ledger`]: the budget ledger actor;
//!   [`registry`]: the supervisor actor and registry.db.
//! - [`provider`]: LLM backends; [`transcript`], [`state`], [`signing`]: durable, signed records.
//! - [`batch`]: group commit shared by the actors that own a database.
//! - [`verify`]: checking thread.json signatures and transcript chains; [`cli`]: the `weft` binary.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod batch;
pub mod capability;
pub mod cli;
pub mod config;
pub mod control;
pub mod directive;
pub mod directive_rye;
pub mod ids;
pub mod ledger;
pub mod limits;
pub mod money;
pub mod provider;
pub mod recovery;
pub mod registry;
pub mod runtime;
pub mod signing;
pub mod state;
pub mod thread;
pub mod transcript;
pub mod verify;
