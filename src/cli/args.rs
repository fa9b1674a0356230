//! The command line as clap reads it: every subcommand and its arguments (the commands
//! themselves live in the sibling files).

use clap::Subcommand;
use std::path::PathBuf;

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Create .weft/ with a commented config in the project folder.
    Init,
    /// Print a shell completion script: `weft completions bash > ~/.local/share/bash-completion/completions/weft`
    /// (zsh: into a folder on `$fpath` as `_weft`; fish: `~/.config/fish/completions/weft.fish`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the JSON Schema of a file weft reads, for editors: `directive` (front matter),
    /// `config` (.weft/config.yaml), `tool` (tools/*.yaml) or `hooks` (hooks.yaml).
    Schema {
        /// directive, config, tool or hooks.
        kind: SchemaKind,
    },
    /// Run a directive as a root thread.
    Run {
        /// Directive name (project → user → built-in) or path to a .md file.
        directive: String,
        /// Input, as key=value (repeatable).
        #[arg(short = 'i', long = "input")]
        inputs: Vec<String>,
        #[command(flatten)]
        choice: ChoiceArgs,
        /// Limit override, as name=value (repeatable).
        #[arg(long = "limit")]
        limits: Vec<String>,
        /// Print one JSON object instead of the live tree.
        #[arg(long)]
        json: bool,
    },
    /// List threads (`threads chain <id>`: a continuation chain).
    Threads {
        /// `chain <id>`.
        #[command(subcommand)]
        sub: Option<ThreadsSub>,
        /// As trees.
        #[arg(long)]
        tree: bool,
        /// Only created/running.
        #[arg(long)]
        active: bool,
        /// JSON array.
        #[arg(long)]
        json: bool,
    },
    /// A thread's transcript, readable (`--follow` tails it live from any terminal).
    Log {
        /// Thread id.
        id: String,
        /// Keep printing new lines until the thread (with --tree: its subtree) has ended.
        #[arg(short = 'f', long)]
        follow: bool,
        /// The lines as stored, one JSON object each (with `thread_id`).
        #[arg(long)]
        json: bool,
        /// Interleave the thread's whole subtree, each line tagged with its thread.
        #[arg(long)]
        tree: bool,
    },
    /// Show one thread.
    Show {
        /// Thread id.
        id: String,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a running thread and its subtree (from any terminal).
    Cancel {
        /// Thread id.
        id: String,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send a running thread a message, delivered before its next turn (from any terminal).
    Inject {
        /// Thread id.
        id: String,
        /// The message.
        text: String,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Approve a call waiting for a person's approval (from any terminal).
    Approve {
        /// Thread id.
        id: String,
        /// The call, when several wait (see `weft show`).
        #[arg(long)]
        call: Option<String>,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Deny a call waiting for a person's approval: the model gets an error result.
    Deny {
        /// Thread id.
        id: String,
        /// The call, when several wait (see `weft show`).
        #[arg(long)]
        call: Option<String>,
        /// Why (the model reads it).
        #[arg(long)]
        reason: Option<String>,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Finalize threads left running by a process that is gone.
    Recover {
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Search finished threads' messages (full text, best match per thread).
    Search {
        /// Words to look for.
        #[arg(required_unless_present = "backfill")]
        query: Option<String>,
        /// Only threads of this directive.
        #[arg(long)]
        directive: Option<String>,
        /// At most this many threads.
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Messages of context on each side of a hit.
        #[arg(long, default_value_t = 3)]
        context: usize,
        /// Index what the index lacks, drop entries of deleted threads, print both counts.
        #[arg(long)]
        backfill: bool,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start a new thread from a copy of another's conversation (its own budget).
    Fork(ForkArgs),
    /// Delete a finished thread: its files, registry row and search entries.
    Delete {
        /// Thread id.
        id: String,
        /// Delete its descendants too (needed when it has children).
        #[arg(long)]
        subtree: bool,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Edit or delete a message of a finished thread (appended as an event; the signed
    /// history keeps the original).
    Message {
        /// Thread id.
        id: String,
        #[command(subcommand)]
        change: MessageChange,
        /// JSON.
        #[arg(long, global = true)]
        json: bool,
    },
    /// Show a thread's key-value store (what its `kv_set` calls stored).
    Kv {
        /// Thread id.
        id: String,
        /// Only this key.
        key: Option<String>,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy the project's registry, ledger and store from its SQLite files into an empty
    /// PostgreSQL database (then name it in the config's `database:` to run there).
    Copy {
        /// The target, `postgres://USER:PASSWORD@HOST:PORT/DB`.
        #[arg(long)]
        to: String,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove finished trees nothing changed for a while (subtrees together), then VACUUM.
    Gc {
        /// Only trees unchanged for this long (e.g. 30d, 12h, 0s).
        #[arg(long = "older-than", default_value = "30d")]
        older_than: String,
        /// Only trees whose root ended so (completed, error, cancelled, continued); repeatable.
        #[arg(long = "status")]
        status: Vec<String>,
        /// Say what would go; remove nothing.
        #[arg(long = "dry-run")]
        dry_run: bool,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Health figures and the reconciliation of registry, files and ledger.
    Doctor {
        /// Repair what is safe to repair, and say what was done.
        #[arg(long)]
        fix: bool,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Import threads from another system as read-only history (searchable, forkable).
    Import {
        /// `nova` (thread .jsonl files) or `deepagents` (threads.json).
        format: String,
        /// The files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a thread out in another format (to stdout).
    Export {
        /// Thread id.
        id: String,
        /// `nova` or `markdown`.
        #[arg(long, default_value = "markdown")]
        format: String,
    },
    /// Environment values for tools: set, unset, list (thread → parents → project → user).
    Env {
        #[command(subcommand)]
        action: EnvAction,
    },
    /// Scheduled effects: list them, or cancel a pending one.
    Schedule {
        #[command(subcommand)]
        action: Option<ScheduleAction>,
        /// JSON.
        #[arg(long, global = true)]
        json: bool,
    },
    /// Continue an ended thread as a new continuation thread.
    Resume {
        /// Thread id.
        id: String,
        /// The new user message.
        #[arg(
            short = 'm',
            long = "message",
            default_value = "Continue where you left off."
        )]
        message: String,
        /// Scripted provider file.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Limit override (can only lower), as name=value.
        #[arg(long = "limit")]
        limits: Vec<String>,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve the HTTP API, live events (SSE) and the web page of the live tree.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:7474")]
        addr: String,
        /// Allow an address other machines can reach.
        #[arg(long)]
        public: bool,
        /// Join the project's database as node NAME: a lease others see (`weft nodes`),
        /// renewed while this server runs; refused while another holder's lease runs.
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
        /// Seconds a node's lease runs without renewal (renewed every fifth of it; default
        /// `node: { lease }` of the config, else 5).
        #[arg(long, value_name = "SECS")]
        node_lease: Option<f64>,
        #[command(flatten)]
        choice: ChoiceArgs,
    },
    /// Serve this project as an MCP server over stdin/stdout (for Claude Code, Claude Desktop,
    /// Cursor, …): tools run_directive, list_directives, thread_status, cancel_thread,
    /// search_threads; transcripts as resources. What clients may start is `mcp_server:` of the
    /// config (nothing until it is set).
    Mcp {
        #[command(flatten)]
        choice: ChoiceArgs,
    },
    /// List the project's nodes (`weft serve --node`): lease, epoch, process, live threads.
    Nodes {
        /// JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Verify signatures and transcript chains.
    Verify(VerifyArgs),
}

/// Which file `weft schema` describes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaKind {
    /// A directive's front matter.
    Directive,
    /// `.weft/config.yaml` (and the user's config).
    Config,
    /// A command tool file, `tools/*.yaml`.
    Tool,
    /// A hooks file, `.weft/hooks.yaml` (and the user's `hooks.yaml`).
    Hooks,
}

/// `weft threads` subcommands.
#[derive(Subcommand, Debug)]
pub enum ThreadsSub {
    /// Print the continuation chain a thread belongs to, oldest first.
    Chain {
        /// Any thread of the chain.
        id: String,
        /// JSON array.
        #[arg(long)]
        json: bool,
    },
}

/// `weft schedule` actions.
#[derive(Subcommand, Debug)]
pub enum ScheduleAction {
    /// Every effect, soonest first (the default).
    List {
        /// Only this thread's.
        #[arg(long)]
        thread: Option<String>,
    },
    /// Cancel a pending effect.
    Cancel {
        /// The effect id (`fx-…`).
        id: String,
    },
}

/// `weft env` actions.
#[derive(Subcommand, Debug)]
pub enum EnvAction {
    /// Set a value (project scope unless --thread or --user).
    Set {
        /// Variable name.
        name: String,
        /// The value; `-` reads it from stdin (keeps a secret out of shell history).
        value: String,
        /// Store it encrypted and redact it everywhere.
        #[arg(long, conflicts_with = "text")]
        secret: bool,
        /// A plain value (the default).
        #[arg(long)]
        text: bool,
        /// This thread's own value (its descendants see it too).
        #[arg(long, conflicts_with = "user")]
        thread: Option<String>,
        /// The user's value, for every project.
        #[arg(long)]
        user: bool,
    },
    /// Remove a value.
    Unset {
        /// Variable name.
        name: String,
        /// From this thread's values.
        #[arg(long, conflicts_with = "user")]
        thread: Option<String>,
        /// From the user's values.
        #[arg(long)]
        user: bool,
    },
    /// List values: the project's and the user's, or what a thread resolves (--thread).
    List {
        /// What this thread's tools would receive.
        #[arg(long)]
        thread: Option<String>,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `weft message` changes.
#[derive(Subcommand, Debug)]
pub enum MessageChange {
    /// Replace a message's text.
    Edit {
        /// The message's transcript line (see `weft log`).
        seq: i64,
        /// The new text.
        text: String,
    },
    /// Remove a message from the conversation.
    Delete {
        /// The message's transcript line.
        seq: i64,
    },
}

/// What `weft fork` is given.
#[derive(clap::Args, Debug)]
pub struct ForkArgs {
    /// Thread to copy.
    pub id: String,
    /// Copy up to this transcript line (see `weft log`).
    #[arg(long)]
    pub at: Option<i64>,
    /// A new user message to go on with (without one, the last user message is answered
    /// afresh).
    #[arg(short = 'm', long = "message")]
    pub message: Option<String>,
    /// Run under this directive instead of the source's (needed for imported threads).
    #[arg(long)]
    pub directive: Option<String>,
    /// Scripted provider file.
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Limit override, as name=value.
    #[arg(long = "limit")]
    pub limits: Vec<String>,
    /// JSON.
    #[arg(long)]
    pub json: bool,
}

/// Which provider and model the threads of `weft run` / `weft serve` use.
#[derive(clap::Args, Debug)]
pub struct ChoiceArgs {
    /// Scripted provider file (every thread started here plays it).
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Provider (a name under `providers:` in config) for every thread.
    #[arg(long)]
    pub provider: Option<String>,
    /// Model id for every thread.
    #[arg(long)]
    pub model: Option<String>,
}

impl From<ChoiceArgs> for crate::provider::Choice {
    fn from(c: ChoiceArgs) -> Self {
        crate::provider::Choice {
            script: c.script,
            provider: c.provider,
            model: c.model,
        }
    }
}

/// What `weft verify` is given.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Thread ids (default with --all: every thread).
    pub ids: Vec<String>,
    /// Every thread of the project.
    #[arg(long)]
    pub all: bool,
    /// Every thread of this root's tree, and that none is missing (the registry's rows and
    /// every child its transcripts name must have their records).
    #[arg(long, value_name = "ROOT")]
    pub tree: Option<String>,
    /// JSON.
    #[arg(long)]
    pub json: bool,
}
