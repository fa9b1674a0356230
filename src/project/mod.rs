//! Where a project's files are ([`Project`]), the user's config folder, and the effective
//! configuration. Paths only: this room opens no database and starts nothing; the directive
//! library is built by `directive/` from a `Project`, never the other way round.

pub(crate) mod config;
mod mcp_server;
pub(crate) mod models;
mod node;
mod providers;
mod sections;
pub(crate) mod yaml;

use crate::core::ids::ThreadId;
use config::{Config, ConfigError};
use std::path::{Path, PathBuf};

/// The user's config folder (signing key, user config and directives): `$WEFT_HOME`, else `$XDG_CONFIG_HOME/weft`, else `~/.config/weft`.
pub(crate) fn user_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("WEFT_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(x).join("weft");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".config").join("weft")
}

/// Paths of a project.
#[derive(Debug, Clone)]
pub struct Project {
    /// The folder holding `.weft/`.
    pub root: PathBuf,
}

impl Project {
    /// Walks up from `start` to the first folder holding `.weft/`.
    pub fn find(start: &Path) -> Option<Project> {
        start
            .ancestors()
            .find(|d| d.join(".weft").is_dir())
            .map(|d| Project {
                root: d.to_path_buf(),
            })
    }
    /// `.weft/`.
    pub fn weft(&self) -> PathBuf {
        self.root.join(".weft")
    }
    /// `.weft/state/`.
    pub fn state_dir(&self) -> PathBuf {
        self.weft().join("state")
    }
    /// `.weft/state/anchors.jsonl`: the signed, chained final heads of finished roots.
    pub fn anchors_log(&self) -> PathBuf {
        self.state_dir().join("anchors.jsonl")
    }
    /// `.weft/state/procs/`: the process groups of running tool calls (see `tools/groups.rs`).
    pub fn procs_dir(&self) -> PathBuf {
        self.state_dir().join("procs")
    }
    /// `.weft/threads/<id>/`.
    pub fn thread_dir(&self, id: &ThreadId) -> PathBuf {
        self.weft().join("threads").join(id.as_str())
    }
    /// `.weft/trust/`.
    pub fn trust_dir(&self) -> PathBuf {
        self.weft().join("trust")
    }
    /// `directives/`: the project's own directives.
    pub fn directives_dir(&self) -> PathBuf {
        self.root.join("directives")
    }
    /// Where file areas live under `config`'s `files_root:` (absolute), None for each thread's
    /// own folder. Refused inside `.weft/`: a root there would lie within a thread's own area
    /// (or folder) and let it reach every other thread's files.
    pub fn files_root(&self, config: &Config) -> Result<Option<PathBuf>, ConfigError> {
        let Some(root) = &config.files_root else {
            return Ok(None);
        };
        let root = self.root.join(root);
        let normal: PathBuf = root.components().collect();
        if normal
            .components()
            .any(|c| c == std::path::Component::ParentDir)
            || normal.starts_with(self.weft())
        {
            return Err(ConfigError {
                file: self.weft().join("config.yaml"),
                line: None,
                message: format!(
                    "files_root: `{}` must be a folder outside .weft/ without `..` (threads' areas there could reach each other)",
                    root.display()
                ),
            });
        }
        Ok(Some(normal))
    }

    /// Effective config (user file, then project file).
    pub fn config(&self) -> Result<Config, ConfigError> {
        Config::load(
            Some(&crate::project::user_dir().join("config.yaml")),
            Some(&self.weft().join("config.yaml")),
        )
    }
}
