//! Record files into a database server's tables: `weft copy --to` (every thread of a project
//! moved to an empty database) and the adoption of record files a project on a server still
//! has (written by a weft before records moved to the server: each is moved in once, at open,
//! then set aside under `.weft/records-moved/`, never deleted).

use super::place::Records;
use super::tables::{queue_copy, Copy};
use crate::core::ids::ThreadId;
use crate::project::Project;
use crate::sql::{Db, Lock, SqlError};
use std::io;

/// Rows queued per table.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counts {
    pub(crate) lines: u64,
    pub(crate) docs: u64,
    pub(crate) anchors: u64,
}

/// What to do with a record ending in a torn line (a crash mid-append no recovery set aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Torn {
    /// Refuse, naming the record (a copy is of whole records).
    Refuse,
    /// Move the whole lines; the torn piece stays in the file set aside.
    Skip,
}

/// The whole lines of `bytes` (named `name`), as `torn` says.
fn whole(name: String, mut bytes: Vec<u8>, torn: Torn) -> io::Result<Vec<u8>> {
    if bytes.is_empty() || bytes.ends_with(b"\n") {
        return Ok(bytes);
    }
    match torn {
        Torn::Refuse => Err(io::Error::other(format!(
            "{name} ends in a torn line; run `weft recover` (it sets the line aside) and copy again"
        ))),
        Torn::Skip => {
            bytes.truncate(bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1));
            Ok(bytes)
        }
    }
}

/// Queues (to go with `target`'s commit) the transcript and thread.json of each of `ids` in
/// `files`, and the anchor log when `anchors`.
pub(crate) fn queue_files(
    files: &Records,
    target: &Db,
    ids: &[ThreadId],
    anchors: bool,
    torn: Torn,
) -> io::Result<Counts> {
    let mut n = Counts::default();
    let sql = |e: SqlError| io::Error::other(e.0);
    for id in ids {
        if let Some(bytes) = files.transcript(id)? {
            let bytes = whole(files.transcript_name(id), bytes, torn)?;
            n.lines += queue_copy(target, Copy::Transcript(id.as_str(), &bytes)).map_err(sql)?;
        }
        if let Some(bytes) = files.doc(id)? {
            n.docs += queue_copy(target, Copy::Doc(id.as_str(), &bytes)).map_err(sql)?;
        }
    }
    if anchors {
        let log = whole(files.anchors_name(), files.anchors()?, torn)?;
        n.anchors = queue_copy(target, Copy::Anchors(&log)).map_err(sql)?;
    }
    Ok(n)
}

/// Moves the record files `project` still has into `records`' server (a no-op for records
/// kept in files): every thread whose records the server lacks, and the anchor log while the
/// server's is empty, in one transaction; then the files are set aside under
/// `.weft/records-moved/`. Returns how many threads moved.
pub(crate) fn adopt_files(records: &Records, project: &Project) -> io::Result<usize> {
    if records.on_files() {
        return Ok(0);
    }
    // Once a pass found (and moved) everything for this database, later opens skip the scan
    // of every thread's folder: this weft never writes record files beside a server.
    let marker = project.state_dir().join("records-adopted");
    let this = records.thread_name_all();
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == this) {
        return Ok(0);
    }
    let moved = adopt_now(records, project)?;
    if let Err(e) =
        std::fs::create_dir_all(project.state_dir()).and_then(|()| std::fs::write(&marker, &this))
    {
        tracing::warn!("{}: {e}", marker.display());
    }
    Ok(moved)
}

/// [`adopt_files`]'s pass.
fn adopt_now(records: &Records, project: &Project) -> io::Result<usize> {
    let files = Records::files(project);
    let found: Vec<ThreadId> = match files.thread_ids() {
        Ok(ids) => ids
            .into_iter()
            .filter(|id| files.has_record_files(id))
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let log = project.anchors_log();
    if found.is_empty() && !log.exists() {
        return Ok(0);
    }
    let mut moved = Vec::new();
    let mut log_moved = false;
    records.with_server(|db| {
        db.begin_write(Lock::Records)?;
        for id in &found {
            let held = db.row(
                "SELECT 1 FROM thread_docs WHERE thread=?1
                 UNION ALL SELECT 1 FROM transcript_lines WHERE thread=?1 LIMIT 1",
                crate::sql::params![id.as_str()],
            )?;
            if held.is_none() {
                moved.push(id.clone());
            }
        }
        let empty = db.row("SELECT 1 FROM anchor_lines LIMIT 1", &[])?.is_none();
        log_moved = log.exists() && empty;
        queue_files(&files, db, &moved, log_moved, Torn::Skip)
            .map_err(|e| SqlError(e.to_string()))?;
        db.commit()
    })?;
    set_aside(project, &moved, log_moved)?;
    if log.exists() && !log_moved {
        tracing::warn!(
            "{}: not moved to the database, whose anchor log already has lines; left as is",
            log.display()
        );
    }
    Ok(moved.len())
}

/// Moves the record files of `ids` (and the anchor log) to `.weft/records-moved/`.
fn set_aside(project: &Project, ids: &[ThreadId], log: bool) -> io::Result<()> {
    let aside = project.weft().join("records-moved");
    for id in ids {
        let from = project.thread_dir(id);
        let to = aside.join(id.as_str());
        std::fs::create_dir_all(&to)?;
        for name in [
            "transcript.jsonl",
            "thread.json",
            "transcript.torn",
            "thread.json.torn",
        ] {
            match std::fs::rename(from.join(name), to.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    if log {
        std::fs::create_dir_all(&aside)?;
        std::fs::rename(project.anchors_log(), aside.join("anchors.jsonl"))?;
    }
    Ok(())
}
