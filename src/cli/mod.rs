//! The `weft` command line: argument parsing, human and `--json` output, and exit codes
//! (0 completed, 1 thread error, 2 usage or input error, 130 cancelled). One file per command
//! family; `live` draws the live tree.
//!
//! Glue only: every action goes through the library (the [`Runtime`], the registry store, the
//! records' verification). Errors are turned into messages and exit codes here, in one place.

pub(crate) use args::{Cmd, EnvAction, ForkArgs, MessageChange, ScheduleAction, ThreadsSub};
use clap::Parser;
pub(crate) use common::{
    failed, find_project, open_error, open_store, open_threads, parse_pairs, spawn_exit, usage,
    Exit,
};
use std::path::PathBuf;

/// `println!` that ignores a closed stdout (`weft threads | head` must not panic).
macro_rules! out {
    () => {{
        let _ = writeln!(std::io::stdout());
    }};
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod args;
mod cancel;
mod common;
mod history;
mod init;
mod live;
mod log;
#[cfg_attr(not(feature = "mcp-server"), allow(dead_code))]
mod mcp;
mod recover;
mod run;
mod schema;
mod serve;
mod show;
pub(crate) mod telemetry;
mod threads;
mod upkeep;
mod verify;

/// `weft --version`: the package's version and the commit it was built from (`build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("WEFT_COMMIT"),
    ")"
);

/// weft: run trees of LLM agent threads with budgets, limits and signed state.
#[derive(Parser, Debug)]
#[command(name = "weft", version = VERSION, about)]
pub struct Cli {
    /// Project folder (default: the nearest folder above holding .weft/).
    #[arg(long, global = true)]
    pub project: Option<PathBuf>,
    /// The PostgreSQL database that holds the project's state (`postgres://…`), over the
    /// config's `database:`; the same as `$WEFT_DATABASE_URL`. A password here is visible to
    /// other users in the process list: prefer the variable or the config file for it.
    #[arg(long, global = true, value_name = "URL")]
    pub database: Option<String>,
    /// The command.
    #[command(subcommand)]
    pub cmd: Cmd,
}

impl Cli {
    /// Makes `--database` the process's `$WEFT_DATABASE_URL`, which every config load reads.
    /// Call before any other thread starts (the environment is shared).
    pub fn apply_database(&self) {
        if let Some(url) = &self.database {
            std::env::set_var("WEFT_DATABASE_URL", url);
        }
    }
}

/// Runs the CLI; returns the exit code.
pub async fn main(cli: Cli) -> i32 {
    let res = match cli.cmd {
        Cmd::Init => init::init(cli.project),
        Cmd::Completions { shell } => completions(shell),
        Cmd::Schema { kind } => schema::print(kind),
        Cmd::Run {
            directive,
            inputs,
            choice,
            limits,
            json,
        } => run::run(cli.project, directive, inputs, choice.into(), limits, json).await,
        Cmd::Threads {
            sub: Some(ThreadsSub::Chain { id, json }),
            ..
        } => threads::chain(cli.project, id, json),
        Cmd::Threads {
            sub: None,
            tree,
            active,
            json,
        } => threads::threads(cli.project, tree, active, json),
        Cmd::Cancel { id, json } => cancel::cancel(cli.project, id, json).await,
        Cmd::Inject { id, text, json } => cancel::inject(cli.project, id, text, json).await,
        Cmd::Approve { id, call, json } => {
            cancel::decide(cli.project, id, call, true, None, json).await
        }
        Cmd::Deny {
            id,
            call,
            reason,
            json,
        } => cancel::decide(cli.project, id, call, false, reason, json).await,
        Cmd::Recover { json } => recover::recover(cli.project, json).await,
        Cmd::Resume {
            id,
            message,
            script,
            limits,
            json,
        } => run::resume(cli.project, id, message, script, limits, json).await,
        Cmd::Show { id, json } => show::show(cli.project, id, json),
        Cmd::Search {
            query,
            directive,
            limit,
            context,
            backfill,
            json,
        } => history::search(
            cli.project,
            query.map(|text| crate::store::SearchQuery {
                text,
                directive,
                limit,
                context,
            }),
            backfill,
            json,
        ),
        Cmd::Fork(fork) => run::fork(cli.project, fork).await,
        Cmd::Copy { to, json } => upkeep::copy(cli.project, &to, json),
        Cmd::Gc {
            older_than,
            status,
            dry_run,
            json,
        } => upkeep::gc(cli.project, &older_than, status, dry_run, json),
        Cmd::Doctor { fix, json } => upkeep::doctor(cli.project, fix, json).await,
        Cmd::Import {
            format,
            files,
            json,
        } => history::import(cli.project, &format, &files, json),
        Cmd::Export { id, format } => history::export(cli.project, id, &format),
        Cmd::Schedule { action, json } => history::schedule(cli.project, action, json),
        Cmd::Env { action } => history::env(cli.project, action),
        Cmd::Kv { id, key, json } => history::kv(cli.project, id, key, json),
        Cmd::Delete { id, subtree, json } => history::delete(cli.project, id, subtree, json),
        Cmd::Message { id, change, json } => history::message(cli.project, id, change, json),
        Cmd::Log {
            id,
            follow,
            json,
            tree,
        } => log::log(cli.project, id, follow, json, tree).await,
        Cmd::Serve {
            addr,
            public,
            node,
            node_lease,
            choice,
        } => serve::serve(cli.project, addr, public, (node, node_lease), choice.into()).await,
        Cmd::Mcp { choice } => mcp::mcp(cli.project, choice.into()).await,
        Cmd::Nodes { json } => serve::nodes(cli.project, json),
        Cmd::Verify(v) => verify::verify(cli.project, v),
    };
    exit_code(res)
}

/// The process's exit code for a command's outcome; an error's message goes to stderr.
fn exit_code(res: Result<i32, Exit>) -> i32 {
    match res {
        Ok(code) => code,
        Err(e) => {
            if !e.message.is_empty() {
                eprintln!("weft: {}", e.message);
            }
            e.code
        }
    }
}

/// `weft completions <shell>`: the shell's completion script on stdout, generated from the same
/// definition the arguments are parsed with (so it cannot drift).
fn completions(shell: clap_complete::Shell) -> Result<i32, Exit> {
    use clap::CommandFactory;
    use std::io::Write;
    // Into memory first: the generator panics when its writer fails (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "weft", &mut script);
    match std::io::stdout().lock().write_all(&script) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(failed(e)),
        _ => Ok(0),
    }
}
