//! Durability on disk: fsyncing the folder of a file just created or renamed. Below the
//! transcript and thread.json writers, which both need it.

use crate::sql::off_workers;
use std::path::Path;

/// Fsyncs the directory holding `path`, so a create or rename in it survives a power loss.
pub(crate) fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => {
            off_workers(|| std::fs::File::open(dir)?.sync_all())
        }
        _ => Ok(()),
    }
}
