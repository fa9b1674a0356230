//! weft — an actor-based orchestration runtime for hierarchical LLM agent threads.
//!
//! A directive (markdown with YAML front matter) becomes a thread: an actor that owns its
//! hash-chained transcript and signed `thread.json`, calls an LLM, runs tools and may spawn
//! child threads, all within budgets no subtree can exceed. Embed it like this:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use weft::{LimitSet, Project, Runtime};
//! let project = Project::find(&std::env::current_dir()?).ok_or("no .weft/ here")?;
//! let rt = Runtime::builder(project).open().await?;
//! let report = rt.run("research/fanout", Default::default(), LimitSet::default()).await?;
//! println!("{:?} {}", report.status, report.spend_nanos);
//! rt.close().await;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! One folder per concept of SPEC.md; dependencies point one way, from the surfaces down to
//! plain types (ARCHITECTURE.md has the map; `tests/it/layout.rs` enforces it):
//! `cli` → `server` → `runtime` → `thread` → `tools`, `hooks` → `store` → `ledger`,
//! `registry`, `provider` → `directive`, `record` → `project` → `core`.
//! - `core`: ids, money, limits, capabilities, statuses, the redactor — plain types, no I/O.
//! - `project`: a project's paths, the user's config folder, config, YAML error helpers.
//! - `directive`: front matter and Rye XML parsing, library lookup and `extends`, inputs/outputs.
//! - `record`: signing, transcript, thread.json, verification, group commit.
//! - `ledger`: the pure budget book, its actor and `ledger.db`.
//! - `registry`: `registry.db` and the actor that owns it (spawn admission).
//! - `provider`: the [`Provider`] trait and its types; scripted, OpenAI, Anthropic; selection.
//! - `store`: the [`ThreadStore`] boundary (files or memory): threads, events, metadata,
//!   delete, full-text search, KV, env values and secrets, scheduled effects.
//! - `tools`: tool results and the capability gate; command tools, the file area, `run_code`,
//!   MCP servers.
//! - `hooks`: the hooks engine (what an event fires).
//! - `thread`: the thread actor — a `Thread` of typed parts, its built-in tools, and the spawn
//!   procedure of SPEC §4 as typed stages.
//! - `runtime`: the public facade ([`Runtime`], [`ThreadHandle`]), resume, fork, crash recovery.
//! - `server`: the control endpoint and `weft serve`'s HTTP API (started by the CLI, never by
//!   the runtime).
//! - `cli`: the `weft` binary's commands.
//!
//! # Features
//! All on by default; a program embedding the library can turn them off
//! (`default-features = false`) and builds none of their dependencies:
//! - `cli` (clap, tracing-subscriber): the `weft` binary, its commands and control socket
//!   (`cli`, `server::control`).
//! - `server` (axum; implies `cli`): `weft serve`'s HTTP API and web page.
//! - `mcp` (rmcp): MCP tool servers. Without it a configured server is reported unavailable to
//!   each thread that may use it, and offers no tools.
//! - `otel` (OpenTelemetry; implies `cli`): the binary's OTLP span export. The spans themselves
//!   are plain `tracing` spans, there for any subscriber in every build.
//! - `js` (rquickjs): `run_code`'s JavaScript engine. Without it `run_code` is a tool error.
//!
//! Public: what a library user needs — the runtime and its handle, events and reports, the
//! provider trait and its types (plug in your own backend), directive, config and limit types,
//! and the error enums. Everything else is crate-private.
// One exception, `tools/groups.rs` `arm_parent_death`: the pre-exec hook that arms a tool
// leader's parent-death signal (no safe API can run code between fork and exec).
#![deny(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

#[cfg(feature = "cli")]
mod cli;
mod core;
mod directive;
mod hooks;
mod ledger;
mod project;
mod provider;
mod record;
mod registry;
mod runtime;
#[cfg(feature = "cli")]
mod server;
mod sql;
mod store;
mod thread;
mod tools;

pub use crate::core::ids::{IdError, ThreadId};
pub use crate::core::limits::{LimitError, LimitSet, Limits};
pub use crate::core::money::{MoneyError, Nanos, Price, Usage};
pub use crate::core::status::Status;
pub use crate::directive::{
    Declared, Directive, DirectiveError, DirectiveSignature, InputSpec, Library, ModelSpec,
    OnChildError, OutputSpec, OutputsError,
};
pub use crate::hooks::HookError;
pub use crate::ledger::Account;
pub use crate::project::config::{
    BuiltinHooks, Config, ConfigError, Durability, FileLimits, MaxTokensField, McpServerConfig,
    McpServerOpen, NoPrice, ProviderConfig, ProviderKind,
};
pub use crate::project::Project;
pub use crate::provider::{
    Block, BoxFuture, ErrorKind, LlmRequest, LlmResponse, Message, Provider, ProviderError, Role,
    Route, TextSink, ToolCall, ToolSpec,
};
pub use crate::record::render::{describe as describe_line, human_duration};
pub use crate::registry::{ThreadFilter, ThreadRow};
pub use crate::runtime::{
    diagnose, prefer_small_pages, Checkup, ControlError, Fork, Health, OpenError, Problem,
    QueryError, Recovered, Runtime, RuntimeBuilder, SubtreeEvents, ThreadHandle, ThreadStatus,
};
pub use crate::sql::{BadDatabaseUrl, DatabaseUrl};
pub use crate::store::{
    apply_edits, check_event, copy_to, export, import_deepagents, import_nova, Backfill, Collected,
    Copied, Deleted, Effect, EffectKind, EnvValue, FileStore, ImportError, Imported, MemoryStore,
    NewThread, Scope, SearchHit, SearchMessage, SearchQuery, StoreError, ThreadStore, ThreadView,
    TranscriptPage, APPENDABLE,
};
pub use crate::thread::{Event, SpawnError, ThreadReport};
pub use crate::tools::{kill_all_live as kill_tool_processes, ToolFileError};
/// The `tracing` target of weft's spans (`invoke_agent`, `chat`, `execute_tool`, with the GenAI
/// semantic-convention names): select it to export them with a subscriber of your own (the
/// `weft` binary's OTLP export, the `otel` feature, does the same).
pub const SPAN_TARGET: &str = crate::thread::SPAN_TARGET;
/// The cancellation token a [`Provider`] receives with every call (from `tokio-util`).
pub use tokio_util::sync::CancellationToken;

#[cfg(feature = "cli")]
#[doc(hidden)]
pub use crate::cli::telemetry::{init as init_telemetry, Telemetry};
/// The `weft` binary's glue (its argument type and entry point); not part of the library API.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub use crate::cli::{main as cli_main, Cli};

/// Not part of the API: weft's own integration tests and benchmarks reach internals through
/// this module. No stability promise; a library user has no reason to touch it. Thread actor
/// messages are deliberately absent, so nothing outside a runtime can forge a thread's report.
#[doc(hidden)]
pub mod internals {
    pub use crate::core::capability;
    pub use crate::core::failpoint::STEPS as FAILPOINTS;
    pub use crate::directive::parse as parse_directive;
    pub use crate::ledger::{Book, Grant, LedgerError, LedgerMsg, ReservationId};
    pub use crate::provider::anthropic::API_VERSION as ANTHROPIC_API_VERSION;
    pub use crate::record::place::Records;
    pub use crate::record::signing::{Signer, Trust, THREAD_DOMAIN};
    pub use crate::record::thread_doc::ThreadDoc;
    pub use crate::record::transcript::{
        check as check_transcript, read as read_transcript, TranscriptWriter,
    };
    pub use crate::record::verify::{verify_thread, Verdict};
    pub use crate::registry::{Admission, RegistryError, RegistryMsg, Store, ThreadRow};
    #[cfg(feature = "server")]
    pub use crate::server::http::serve as serve_http;
    pub use crate::store::messages as search_messages;
    pub use crate::thread::rebuild_conversation;

    /// Wakes the returned `Notify` at each notification on `channel` of the Postgres database
    /// `url` (what nodes wake on; tested in `tests/it/backends.rs`).
    pub fn listen(url: &str, channel: &str) -> Result<std::sync::Arc<tokio::sync::Notify>, String> {
        let url = crate::sql::DatabaseUrl::parse(url).map_err(|e| e.to_string())?;
        crate::sql::Db::listen(&url, &[channel.to_string()]).map_err(|e| e.to_string())
    }

    /// Sends a notification on `channel` of the Postgres database `url` as nodes do.
    pub fn notify(url: &str, channel: &str) -> Result<(), String> {
        let url = crate::sql::DatabaseUrl::parse(url).map_err(|e| e.to_string())?;
        let db = crate::sql::Db::postgres(&url).map_err(|e| e.to_string())?;
        db.notify(channel).map_err(|e| e.to_string())
    }

    /// Parsers of outside input, for the fuzz test (`tests/it/fuzz.rs`): each takes what a
    /// user or another program may write and must answer with a value or an error, never panic.
    pub mod fuzz {
        use std::path::Path;

        /// A hook file's text (written to `dir/hooks.yaml` and loaded as the project's; the
        /// user's hooks file is looked for in `dir/user/`).
        pub fn hooks(dir: &Path, text: &str) -> Result<(), String> {
            std::fs::write(dir.join("hooks.yaml"), text).map_err(|e| e.to_string())?;
            crate::hooks::Hooks::load(&dir.join("user"), dir, dir, Default::default())
                .map(|_| ())
                .map_err(|e| e.to_string())
        }

        /// A command tool file's text.
        pub fn tool(dir: &Path, text: &str) -> Result<(), String> {
            let file = dir.join("tool.yaml");
            crate::tools::parse_tool_file(&file, text, dir, &crate::thread::builtin_names())
                .map(|_| ())
                .map_err(|e| e.to_string())
        }

        /// An SSE `Last-Event-ID`.
        #[cfg(feature = "server")]
        pub fn event_id(text: &str) -> Option<(u64, u64, u64)> {
            crate::server::parse_event_id(text)
        }
    }

    /// The names of weft's built-in tools (no command tool may take one).
    pub fn builtin_tool_names() -> Vec<&'static str> {
        crate::thread::builtin_names()
    }

    /// The registry and ledger actors of a runtime (for benchmarks that drive them directly).
    pub fn actors(
        rt: &crate::Runtime,
    ) -> (ractor::ActorRef<RegistryMsg>, ractor::ActorRef<LedgerMsg>) {
        (rt.ctx().registry.clone(), rt.ctx().ledger.clone())
    }

    /// Verified thread.json documents the runtime holds in its cache (live parents only).
    pub fn verified_cached(rt: &crate::Runtime) -> usize {
        rt.ctx().verified.lock().map_or(0, |c| c.len())
    }

    /// Handoffs the runtime still links (a chain's links go once its last thread has stopped).
    pub fn successors_kept(rt: &crate::Runtime) -> usize {
        rt.ctx().successors.lock().map_or(0, |m| m.len())
    }

    /// The runtime's signing key (for benchmarks of the signature floor).
    pub fn signer(rt: &crate::Runtime) -> std::sync::Arc<Signer> {
        rt.ctx().signer.clone()
    }
}
