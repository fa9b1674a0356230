//! What every command shares: the exit a command ends with ([`Exit`]: code and message, turned
//! into the process's exit status in one place, `main`), finding the project, and opening its
//! stores.

use crate::project::Project;
use crate::registry::Store;
use crate::runtime::OpenError;
use crate::thread::SpawnError;
use std::path::PathBuf;

/// A CLI failure with its exit code.
#[derive(Debug)]
pub(crate) struct Exit {
    /// Exit code.
    pub code: i32,
    /// Message for stderr (may be empty).
    pub message: String,
}

/// A failure that is not the user's input (storage, I/O): exit code 1.
pub(crate) fn failed(e: impl std::fmt::Display) -> Exit {
    Exit {
        code: 1,
        message: e.to_string(),
    }
}

pub(crate) fn usage(message: impl std::fmt::Display) -> Exit {
    Exit {
        code: 2,
        message: message.to_string(),
    }
}

pub(crate) fn find_project(explicit: Option<PathBuf>) -> Result<Project, Exit> {
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

pub(crate) fn parse_pairs(pairs: &[String], what: &str) -> Result<Vec<(String, String)>, Exit> {
    pairs
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.to_string()))
                .ok_or_else(|| usage(format!("{what} `{p}` is not key=value")))
        })
        .collect()
}

pub(crate) fn spawn_exit(e: SpawnError) -> Exit {
    match e.is_internal() {
        true => Exit {
            code: 1,
            message: e.to_string(),
        },
        false => usage(e.to_string()),
    }
}

pub(crate) fn open_error(e: OpenError) -> Exit {
    usage(e.to_string())
}

/// The project's thread store (what `log`, `search`, `fork`, `delete` and the other commands
/// on stored threads read and change).
pub(crate) fn open_threads(project: &Project) -> Result<crate::store::FileStore, Exit> {
    crate::store::FileStore::open(project).map_err(failed)
}

/// Whether the project has a registry yet: on its database server, or in registry.db.
pub(crate) fn has_registry(project: &Project) -> bool {
    project.config().is_ok_and(|c| c.database.is_some())
        || project.state_dir().join("registry.db").exists()
}

pub(crate) fn open_store(project: &Project) -> Result<Store, Exit> {
    Store::read_project(project).map_err(failed)
}

/// Ctrl-C, or SIGTERM on Unix: both ask a weft process to stop the same way.
pub(crate) async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// A command's stop signals (Ctrl-C, SIGTERM), listened for from the moment it is made: one
/// that arrives while nothing waits for it is kept for the next [`Stops::next`]. A listener
/// made later misses it, and with weft's handler in place the signal is then lost: a Ctrl-C
/// between `weft run`'s tree ending and its wait for what the tree caused did nothing.
pub(crate) struct Stops {
    #[cfg(unix)]
    signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Stops {
    /// Starts listening.
    pub(crate) fn listen() -> Stops {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let signals = signal(SignalKind::interrupt())
                .and_then(|i| Ok((i, signal(SignalKind::terminate())?)))
                .ok();
            Stops { signals }
        }
        #[cfg(not(unix))]
        Stops {}
    }

    /// The next stop signal (one already delivered since [`Stops::listen`] included).
    pub(crate) async fn next(&mut self) {
        #[cfg(unix)]
        if let Some((int, term)) = self.signals.as_mut() {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            return;
        }
        stop_signal().await;
    }
}

/// On a second stop signal the process exits at once (130), killing every tool process group
/// it still runs first (nothing of a call outlives weft).
pub(crate) fn exit_on_second_signal() {
    tokio::spawn(async {
        stop_signal().await;
        crate::tools::kill_all_live();
        std::process::exit(130);
    });
}
