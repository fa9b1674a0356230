//! Durability on disk: fsyncing the folder of a file just created or renamed, and a
//! thread.json file written atomically. Below the transcript and thread.json writers, which
//! both need it.

use crate::sql::off_workers;
use std::fs::File;
use std::io::{self, Write};
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

/// thread.json on disk: the first version has nothing to protect and is created in place (one
/// inode, no rename; a crash mid-write leaves a torn file, which recovery rebuilds from the
/// registry); later ones go through a temp file and a rename (which keeps its mtime and
/// length). Returns the written file's stamp.
pub(super) fn write_doc_file(path: &Path, bytes: &[u8], fsync: bool) -> io::Result<DocStamp> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(mut f) => {
            f.write_all(bytes)?;
            if fsync {
                off_workers(|| f.sync_all())?;
                sync_parent(path)?;
            }
            stamp_of(&f)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => replace_doc_file(path, bytes, fsync),
        Err(e) => Err(e),
    }
}

/// Replaces the thread.json at `path` atomically (temp file, fsync, rename), creating it when
/// it is missing.
pub(super) fn replace_doc_file(path: &Path, bytes: &[u8], fsync: bool) -> io::Result<DocStamp> {
    let tmp = path.with_extension("json.tmp");
    let stamp = {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        if fsync {
            off_workers(|| f.sync_all())?;
        }
        stamp_of(&f)?
    };
    std::fs::rename(&tmp, path)?;
    if fsync {
        // The rename is only durable once the directory entry is.
        sync_parent(path)?;
    }
    Ok(stamp)
}

/// The stamp of an open thread.json (see `Records::doc_stamp`).
fn stamp_of(f: &File) -> io::Result<DocStamp> {
    file_stamp(&f.metadata()?)
}

/// A thread.json file's stamp from its metadata: its mtime and length.
pub(super) fn file_stamp(m: &std::fs::Metadata) -> io::Result<DocStamp> {
    Ok(DocStamp::File(m.modified()?, m.len()))
}

/// What tells whether a thread.json changed (see `Records::doc_stamp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DocStamp {
    /// A file's mtime and length.
    File(std::time::SystemTime, u64),
    /// The number of this process's last write of it.
    Written(u64),
}
