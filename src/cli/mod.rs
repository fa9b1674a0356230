//! The `weft` command line: argument parsing, human and `--json` output, and exit codes
//! (0 completed, 1 thread error, 2 usage or input error, 130 cancelled). One file per command
//! family; `live` draws the live tree.
//!
//! Glue only: every action goes through the library (the [`Runtime`], the registry store, the
//! records' verification). Errors are turned into messages and exit codes here, in one place.

use crate::project::Project;
use crate::registry::Store;
use crate::runtime::OpenError;
use crate::thread::SpawnError;

pub(crate) use args::{Cmd, EnvAction, ForkArgs, MessageChange, ScheduleAction, ThreadsSub};
use clap::Parser;
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
mod history;
mod init;
mod live;
mod log;
mod recover;
mod run;
mod serve;
mod show;
pub(crate) mod telemetry;
mod threads;
mod upkeep;
mod verify;

/// weft: run trees of LLM agent threads with budgets, limits and signed state.
#[derive(Parser, Debug)]
#[command(name = "weft", version, about)]
pub struct Cli {
    /// Project folder (default: the nearest folder above holding .weft/).
    #[arg(long, global = true)]
    pub project: Option<PathBuf>,
    /// The command.
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// A CLI failure with its exit code.
#[derive(Debug)]
pub(crate) struct Exit {
    /// Exit code.
    pub code: i32,
    /// Message for stderr (may be empty).
    pub message: String,
}

/// A failure that is not the user's input (storage, I/O): exit code 1.
pub(super) fn failed(e: impl std::fmt::Display) -> Exit {
    Exit {
        code: 1,
        message: e.to_string(),
    }
}

pub(super) fn usage(message: impl std::fmt::Display) -> Exit {
    Exit {
        code: 2,
        message: message.to_string(),
    }
}

/// Runs the CLI; returns the exit code.
pub async fn main(cli: Cli) -> i32 {
    let res = match cli.cmd {
        Cmd::Init => init::init(cli.project),
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
        } => {
            let q = query.map(|text| crate::store::SearchQuery {
                text,
                directive,
                limit,
                context,
            });
            history::search(cli.project, q, backfill, json)
        }
        Cmd::Fork(fork) => run::fork(cli.project, fork).await,
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
            choice,
        } => serve::serve(cli.project, addr, public, choice.into()).await,
        Cmd::Verify { ids, all, json } => verify::verify(cli.project, ids, all, json),
    };
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

pub(super) fn find_project(explicit: Option<PathBuf>) -> Result<Project, Exit> {
    if let Some(p) = explicit {
        if !p.join(".weft").is_dir() {
            return Err(usage(format!(
                "{} has no .weft/ folder; run `weft init` there first",
                p.display()
            )));
        }
        return Ok(Project { root: p });
    }
    let cwd = std::env::current_dir().map_err(|e| usage(format!("no working directory: {e}")))?;
    Project::find(&cwd).ok_or_else(|| {
        usage(format!(
            "no .weft/ folder in {} or above; run `weft init` first",
            cwd.display()
        ))
    })
}

pub(super) fn parse_pairs(pairs: &[String], what: &str) -> Result<Vec<(String, String)>, Exit> {
    pairs
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.to_string()))
                .ok_or_else(|| usage(format!("{what} `{p}` is not key=value")))
        })
        .collect()
}

pub(super) fn spawn_exit(e: SpawnError) -> Exit {
    match e.is_internal() {
        true => Exit {
            code: 1,
            message: e.to_string(),
        },
        false => usage(e.to_string()),
    }
}

pub(super) fn open_error(e: OpenError) -> Exit {
    usage(e.to_string())
}

/// The project's thread store (what `log`, `search`, `fork`, `delete` and the other commands
/// on stored threads read and change).
pub(super) fn open_threads(project: &Project) -> Result<crate::store::FileStore, Exit> {
    crate::store::FileStore::open(project).map_err(failed)
}

pub(super) fn open_store(project: &Project) -> Result<Store, Exit> {
    Store::open_read_only(&project.state_dir().join("registry.db")).map_err(failed)
}
