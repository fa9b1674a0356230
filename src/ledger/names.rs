//! The ledger journals' files by name: which exist (`<owner>-<nonce>.jsonl`), which this
//! process's runtimes keep, and which are dead (see `journal.rs`).

use std::path::{Path, PathBuf};

/// The names of the journals this process's runtimes keep (see `journal.rs`).
pub(super) fn kept() -> &'static std::sync::Mutex<std::collections::HashSet<String>> {
    static KEPT: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    KEPT.get_or_init(Default::default)
}

/// Whether this process keeps the journal `name`.
pub(super) fn is_kept(name: &str) -> bool {
    kept().lock().map_or(true, |k| k.contains(name))
}

/// The journals in `dir`: path, name and owner (none when the folder does not exist).
pub(super) fn listed(dir: &Path) -> std::io::Result<Vec<(PathBuf, String, u32)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str()?.strip_suffix(".jsonl"));
        let name = name.map(str::to_string);
        let owner = name
            .as_ref()
            .and_then(|n| n.split('-').next()?.parse::<u32>().ok());
        if let (Some(name), Some(owner)) = (name, owner) {
            out.push((path, name, owner));
        }
    }
    Ok(out)
}

/// Whether journal `name` of `owner` is dead (see the module's doc).
pub(super) fn is_dead(owner: u32, name: &str, alive: &(dyn Fn(u32) -> bool + Send + Sync)) -> bool {
    match owner == crate::core::owner::me() {
        true => !is_kept(name),
        false => !alive(owner),
    }
}
