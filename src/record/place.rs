//! Where a project's thread records are kept ([`Records`]): each thread's transcript, its
//! signed thread.json and the project's anchor log — files under `.weft/` (the embedded
//! default), or tables on the project's database server (`record/server.rs`). The bytes are
//! the same either way: a record read from the server is what the file would hold, so the
//! readers, the verifier and the exporters parse one format.
//!
//! The one place that says where a record is. Knows bytes and names, not their format (that is
//! `transcript`, `thread_doc` and `anchors`).

pub(crate) use super::disk::DocStamp;
use super::disk::{file_stamp, replace_doc_file, write_doc_file};
use super::server::Server;
use crate::core::ids::ThreadId;
use crate::project::config::{Config, Durability};
use crate::project::Project;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Where a project's thread records are kept (cheap to clone).
#[derive(Clone)]
pub struct Records {
    place: Place,
}

#[derive(Clone)]
enum Place {
    /// `.weft/threads/<id>/{transcript.jsonl,thread.json}` and `.weft/state/anchors.jsonl`.
    Files { threads: PathBuf, anchors: PathBuf },
    /// The project's database server.
    Server(Arc<Server>),
}

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.place {
            Place::Files { threads, .. } => write!(f, "Records({})", threads.display()),
            Place::Server(s) => write!(f, "Records({})", s.shown()),
        }
    }
}

impl Records {
    /// The records of `project` as `config` places them: on its `database:` server, else in
    /// its files.
    pub fn of(project: &Project, config: &Config) -> Records {
        match &config.database {
            Some(url) => Records {
                place: Place::Server(Arc::new(Server::new(
                    url.clone(),
                    config.durability == Durability::Strict,
                ))),
            },
            None => Records::files(project),
        }
    }

    /// The records of `project` as its config places them.
    pub fn open(project: &Project) -> Result<Records, crate::project::config::ConfigError> {
        Ok(Records::of(project, &project.config()?))
    }

    /// The records in `project`'s files, whatever its config says.
    pub fn files(project: &Project) -> Records {
        Records {
            place: Place::Files {
                threads: project.weft().join("threads"),
                anchors: project.anchors_log(),
            },
        }
    }

    /// Whether the records are files.
    pub fn on_files(&self) -> bool {
        matches!(self.place, Place::Files { .. })
    }

    fn dir(threads: &Path, id: &ThreadId) -> PathBuf {
        threads.join(id.as_str())
    }

    /// How `id`'s record `file` (what it is called as a file) is named in messages: its
    /// file, or that record of the thread on the server.
    fn record_name(&self, id: &ThreadId, file: &str, on_server: &str) -> String {
        match &self.place {
            Place::Files { threads, .. } => Self::dir(threads, id).join(file).display().to_string(),
            Place::Server(s) => format!("{} {on_server} of {id}", s.shown()),
        }
    }

    /// How `id`'s transcript is named in messages.
    pub fn transcript_name(&self, id: &ThreadId) -> String {
        self.record_name(id, "transcript.jsonl", "transcript")
    }

    /// How `id`'s thread.json is named in messages.
    pub fn doc_name(&self, id: &ThreadId) -> String {
        self.record_name(id, "thread.json", "thread.json")
    }

    /// How the thread `id` is named in messages: its folder, or the thread on the server.
    pub fn thread_name(&self, id: &ThreadId) -> String {
        match &self.place {
            Place::Files { threads, .. } => Self::dir(threads, id).display().to_string(),
            Place::Server(s) => format!("{} thread {id}", s.shown()),
        }
    }

    /// Where every thread's records are, named in messages.
    pub fn thread_name_all(&self) -> String {
        match &self.place {
            Place::Files { threads, .. } => threads.display().to_string(),
            Place::Server(s) => format!("{} thread records", s.shown()),
        }
    }

    /// Every thread with records (a folder, or a line or thread.json on the server).
    pub fn thread_ids(&self) -> io::Result<Vec<ThreadId>> {
        let names = match &self.place {
            Place::Files { threads, .. } => std::fs::read_dir(threads)?
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect(),
            Place::Server(s) => s.threads()?,
        };
        Ok(names
            .iter()
            .filter_map(|n| ThreadId::parse(n).ok())
            .collect())
    }

    /// How the anchor log is named in messages.
    pub fn anchors_name(&self) -> String {
        match &self.place {
            Place::Files { anchors, .. } => anchors.display().to_string(),
            Place::Server(s) => format!("{} anchor log", s.shown()),
        }
    }

    /// What tells anchor logs apart within this process: the log file's absolute path (a
    /// relative project root never names another project's log; no file is read for it), or
    /// the server's.
    pub(crate) fn anchors_key(&self) -> String {
        match &self.place {
            Place::Files { anchors, .. } => std::path::absolute(anchors)
                .unwrap_or_else(|_| anchors.clone())
                .to_string_lossy()
                .into_owned(),
            Place::Server(_) => self.anchors_name(),
        }
    }

    /// Whether `id` has any record (its folder, or a line or thread.json on the server).
    pub(crate) fn has(&self, id: &ThreadId) -> io::Result<bool> {
        match &self.place {
            Place::Files { threads, .. } => Ok(Self::dir(threads, id).exists()),
            Place::Server(s) => s.has(id.as_str()),
        }
    }

    /// Whether `id` has a transcript or thread.json file (records kept in files).
    pub(crate) fn has_record_files(&self, id: &ThreadId) -> bool {
        match &self.place {
            Place::Files { threads, .. } => {
                let dir = Self::dir(threads, id);
                dir.join("transcript.jsonl").exists() || dir.join("thread.json").exists()
            }
            Place::Server(_) => false,
        }
    }

    /// Runs `f` on a connection to the records' server (an error for records in files).
    pub(crate) fn with_server<T>(
        &self,
        f: impl FnOnce(&mut crate::sql::Db) -> Result<T, crate::sql::SqlError>,
    ) -> io::Result<T> {
        match &self.place {
            Place::Files { .. } => Err(io::Error::other("the records are files, not on a server")),
            Place::Server(s) => s.with(f),
        }
    }

    /// A new, empty transcript for `id` (its folder made; fails if a transcript file exists:
    /// transcripts are never rewritten). `strict`: the new file and its folder reach the disk.
    pub(crate) fn create_transcript(&self, id: &ThreadId, strict: bool) -> io::Result<Lines> {
        match &self.place {
            Place::Files { threads, .. } => {
                let dir = Self::dir(threads, id);
                let path = dir.join("transcript.jsonl");
                let create = || {
                    std::fs::OpenOptions::new()
                        .append(true)
                        .create_new(true)
                        .open(&path)
                };
                // Its folder is usually there already (a spawn makes it first).
                let file = match create() {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        std::fs::create_dir_all(&dir)?;
                        create()?
                    }
                    other => other?,
                };
                if strict {
                    super::disk::sync_parent(&path)?;
                    super::disk::sync_parent(&dir)?;
                }
                Ok(Lines::file(file, path))
            }
            Place::Server(s) => Ok(Lines::Server {
                server: s.clone(),
                thread: Arc::from(id.as_str()),
            }),
        }
    }

    /// `id`'s existing transcript, to append to.
    pub(crate) fn append_to(&self, id: &ThreadId) -> io::Result<Lines> {
        match &self.place {
            Place::Files { threads, .. } => {
                let path = Self::dir(threads, id).join("transcript.jsonl");
                Ok(Lines::file(open_append(&path)?, path))
            }
            Place::Server(s) => Ok(Lines::Server {
                server: s.clone(),
                thread: Arc::from(id.as_str()),
            }),
        }
    }

    /// Holds `id`'s transcript for one writer across processes until the returned guard is
    /// dropped: its file's lock, or an advisory lock on the server held by a connection of
    /// its own (closed with the guard, which releases it).
    pub(crate) fn lock_transcript(&self, id: &ThreadId) -> io::Result<Box<dyn Send>> {
        match &self.place {
            Place::Files { threads, .. } => {
                let f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(Self::dir(threads, id).join("transcript.jsonl"))?;
                f.lock()?;
                Ok(Box::new(f))
            }
            Place::Server(s) => Ok(Box::new(s.lock_thread(id.as_str())?)),
        }
    }

    /// `id`'s transcript bytes (None: it has none).
    pub fn transcript(&self, id: &ThreadId) -> io::Result<Option<Vec<u8>>> {
        match &self.place {
            Place::Files { threads, .. } => {
                read_if_there(&Self::dir(threads, id).join("transcript.jsonl"))
            }
            Place::Server(s) => s.transcript(id.as_str()),
        }
    }

    /// `id`'s complete lines added since `cursor` (0 at first; this moves it on; a torn last
    /// line waits for its end), for following a transcript as it grows. None is found where
    /// there is no transcript yet.
    #[cfg_attr(not(feature = "cli"), allow(dead_code))]
    pub(crate) fn new_lines(&self, id: &ThreadId, cursor: &mut u64) -> io::Result<Vec<Vec<u8>>> {
        match &self.place {
            Place::Files { threads, .. } => {
                use std::io::{Read, Seek};
                let path = Self::dir(threads, id).join("transcript.jsonl");
                let Some(mut f) = std::fs::File::open(path).ok() else {
                    return Ok(Vec::new());
                };
                f.seek(io::SeekFrom::Start(*cursor))?;
                let mut buf = Vec::new();
                f.read_to_end(&mut buf)?;
                let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
                    return Ok(Vec::new());
                };
                *cursor += end as u64 + 1;
                Ok(buf[..end]
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .map(<[u8]>::to_vec)
                    .collect())
            }
            Place::Server(s) => {
                let lines = s.lines_after(id.as_str(), *cursor as i64 - 1)?;
                *cursor += lines.len() as u64;
                Ok(lines)
            }
        }
    }

    /// Cuts `id`'s transcript back to its first `good_len` bytes, the rest (a torn last line)
    /// moved to `transcript.torn` beside it. Only files have torn lines.
    pub(crate) fn set_aside_torn(&self, id: &ThreadId, good_len: usize) -> io::Result<()> {
        let Place::Files { threads, .. } = &self.place else {
            return Ok(());
        };
        let path = Self::dir(threads, id).join("transcript.jsonl");
        let bytes = std::fs::read(&path)?;
        if good_len >= bytes.len() {
            return Ok(());
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path.with_extension("torn"))?;
        f.write_all(&bytes[good_len..])?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        let t = std::fs::OpenOptions::new().write(true).open(&path)?;
        t.set_len(good_len as u64)?;
        t.sync_all()
    }

    /// Writes `id`'s signed thread.json: the first version created in place, later ones
    /// replacing it atomically (temp file, rename); `fsync`: on the disk before it returns.
    /// Returns the stamp of the file it wrote, read from the written file itself (None on a
    /// server, whose write may still be queued).
    pub(crate) fn put_doc(
        &self,
        id: &ThreadId,
        bytes: &[u8],
        fsync: bool,
    ) -> io::Result<Option<DocStamp>> {
        match &self.place {
            Place::Files { threads, .. } => {
                write_doc_file(&Self::dir(threads, id).join("thread.json"), bytes, fsync).map(Some)
            }
            Place::Server(s) => s.put_doc(id.as_str(), bytes, fsync).map(|()| None),
        }
    }

    /// [`Records::put_doc`] for a thread.json that exists already (a thread's final one): one
    /// path lookup fewer than trying to create it first.
    pub(crate) fn replace_doc(&self, id: &ThreadId, bytes: &[u8], fsync: bool) -> io::Result<()> {
        match &self.place {
            Place::Files { threads, .. } => {
                replace_doc_file(&Self::dir(threads, id).join("thread.json"), bytes, fsync)
                    .map(|_| ())
            }
            Place::Server(s) => s.put_doc(id.as_str(), bytes, fsync),
        }
    }

    /// `id`'s thread.json bytes (None: it has none).
    pub fn doc(&self, id: &ThreadId) -> io::Result<Option<Vec<u8>>> {
        match &self.place {
            Place::Files { threads, .. } => {
                read_if_there(&Self::dir(threads, id).join("thread.json"))
            }
            Place::Server(s) => s.doc(id.as_str()),
        }
    }

    /// What tells whether `id`'s thread.json changed: its file's mtime and length; on a
    /// server, a number each write of it by this process changes. None: cannot be told (read
    /// it).
    pub(crate) fn doc_stamp(&self, id: &ThreadId) -> Option<DocStamp> {
        match &self.place {
            Place::Files { threads, .. } => {
                let m = std::fs::metadata(Self::dir(threads, id).join("thread.json")).ok()?;
                file_stamp(&m).ok()
            }
            Place::Server(s) => s.doc_stamp(id.as_str()).map(DocStamp::Written),
        }
    }

    /// Moves a torn thread.json (not JSON at all: a crash mid-write) aside to
    /// `thread.json.torn`. Only files are torn.
    pub(crate) fn set_aside_doc(&self, id: &ThreadId) -> io::Result<()> {
        match &self.place {
            Place::Files { threads, .. } => {
                let path = Self::dir(threads, id).join("thread.json");
                std::fs::rename(&path, path.with_extension("json.torn"))
            }
            Place::Server(_) => Ok(()),
        }
    }

    /// Appends the lines `make` builds, each from the hash of the line before it
    /// ([`GENESIS`](crate::core::ids::GENESIS) when the log is empty), to the anchor log at
    /// once, every process's appends taking turns; on the disk (or committed) before it
    /// returns.
    pub(crate) fn append_anchor(&self, make: super::log_file::MakeLines) -> io::Result<()> {
        match &self.place {
            Place::Files { anchors, .. } => super::log_file::append(anchors, make),
            Place::Server(s) => s.append_anchor(make),
        }
    }

    /// The anchor log's bytes (empty when there is none).
    pub(crate) fn anchors(&self) -> io::Result<Vec<u8>> {
        match &self.place {
            Place::Files { anchors, .. } => Ok(read_if_there(anchors)?.unwrap_or_default()),
            Place::Server(s) => s.anchors(),
        }
    }

    /// Removes `id`'s records (`weft delete`, `weft gc`); its folder goes too (file areas are
    /// the store's to remove).
    pub(crate) fn remove(&self, id: &ThreadId) -> io::Result<()> {
        match &self.place {
            Place::Files { threads, .. } => match std::fs::remove_dir_all(Self::dir(threads, id)) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            },
            Place::Server(s) => s.remove(id.as_str()),
        }
    }
}

fn read_if_there(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Where one transcript's lines go: its file, or its rows on the server.
pub(crate) enum Lines {
    /// A file: its descriptor kept open while the process's budget allows (else opened for
    /// each line).
    File { file: Option<Kept>, path: PathBuf },
    /// Rows on the server, queued (see `behind.rs`).
    Server {
        server: Arc<Server>,
        thread: Arc<str>,
    },
}

impl Lines {
    fn file(file: File, path: PathBuf) -> Lines {
        Lines::File {
            // Built only when counted: a `Kept` uncounts itself when it closes.
            file: keep_open().then(|| Kept(file)),
            path,
        }
    }

    /// Writes line `seq` (`line` ends with its newline); `strict`: on the disk before it
    /// returns (on the server, every line is committed; under `strict` it waits for the disk).
    pub(crate) fn write(&mut self, seq: i64, line: &[u8], strict: bool) -> io::Result<()> {
        match self {
            Lines::File { file, path } => {
                let opened;
                let f = match file {
                    Some(f) => &f.0,
                    None => {
                        opened = open_append(path)?;
                        &opened
                    }
                };
                let mut w = f;
                w.write_all(line)?;
                if strict {
                    crate::sql::off_workers(|| f.sync_data())?;
                }
                Ok(())
            }
            Lines::Server { server, thread } => {
                let body = line.strip_suffix(b"\n").unwrap_or(line);
                server.append_line(thread, seq, body, strict)
            }
        }
    }

    /// Every line written so far is stored (in the OS for a file; committed on a server),
    /// failing if this transcript's lines could not be.
    pub(crate) fn settle(&self) -> io::Result<()> {
        match self {
            Lines::File { .. } => Ok(()),
            Lines::Server { server, thread } => server.sync(Some(thread), false),
        }
    }

    /// On the disk now (on the server: every commit so far).
    pub(crate) fn sync(&self) -> io::Result<()> {
        match self {
            Lines::File { file: Some(f), .. } => crate::sql::off_workers(|| f.0.sync_data()),
            Lines::File { file: None, path } => {
                let f = open_append(path)?;
                crate::sql::off_workers(|| f.sync_data())
            }
            Lines::Server { server, thread } => server.sync(Some(thread), true),
        }
    }

    /// [`Self::sync`] to run later on another thread, after the last lines. A descriptor kept
    /// open goes with it (counted as kept until it closes there); else one is opened when it
    /// runs (queued work holds no new descriptor). A later line opens the file by its path.
    pub(crate) fn sync_later(&mut self) -> Box<dyn FnOnce() -> io::Result<()> + Send> {
        match self {
            Lines::File { file, path } => match file.take() {
                Some(kept) => Box::new(move || kept.0.sync_data()),
                None => {
                    let path = path.clone();
                    Box::new(move || open_append(&path)?.sync_data())
                }
            },
            // Its only caller writes the terminal thread.json next, which waits for the disk
            // (and with it every line before it): here, committed is enough.
            Lines::Server { server, thread } => {
                let (server, thread) = (server.clone(), thread.clone());
                Box::new(move || server.sync(Some(&thread), false))
            }
        }
    }
}

/// A transcript descriptor kept open within the budget (see [`keep_open`]): no longer counted
/// once it closes, wherever that is (its `Lines` dropped, or the final fsync it was handed to).
pub(crate) struct Kept(File);

impl Drop for Kept {
    fn drop(&mut self) {
        KEPT_OPEN.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Transcript descriptors held open between appends, process-wide (see [`keep_open`]).
static KEPT_OPEN: AtomicUsize = AtomicUsize::new(0);

/// How many transcripts may keep their descriptor open between appends: a quarter of the
/// process's descriptor limit, so a tree of ten thousand live threads under the common soft limit
/// of 1,024 never meets EMFILE; of a larger limit up to half, as long as 8,192 are left to
/// databases, sockets and tool processes. Past it, a writer opens its file for each append (a
/// few µs).
fn keep_budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| budget_of(open_files_limit()))
}

/// The budget for a descriptor limit of `limit` (see [`keep_budget`]).
fn budget_of(limit: usize) -> usize {
    let leaving_8192 = (limit / 2).min(limit.saturating_sub(8192));
    (limit / 4).max(leaving_8192).clamp(8, 65_536)
}

/// The soft limit on open descriptors: read from `/proc/self/limits` where there is one (no
/// `unsafe` for a syscall), else the common default of 1,024.
fn open_files_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("Max open files"))?;
            let soft = line["Max open files".len()..].split_whitespace().next()?;
            Some(soft.parse().unwrap_or(usize::MAX))
        })
        .unwrap_or(1024)
}

/// Takes a slot to keep a descriptor open, if the budget has one.
fn keep_open() -> bool {
    KEPT_OPEN
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < keep_budget()).then_some(n + 1)
        })
        .is_ok()
}

/// Opens a transcript for appending. Past the descriptor budget a writer opens its file per
/// line; when the process is out of descriptors for a moment (EMFILE/ENFILE: other threads'
/// files, sockets, databases), it waits briefly and tries again (up to ~1 s) rather than lose
/// the line — a lost line ends the thread.
fn open_append(path: &Path) -> io::Result<File> {
    let mut wait = std::time::Duration::from_millis(1);
    for _ in 0..10 {
        match std::fs::OpenOptions::new().append(true).open(path) {
            Err(e) if matches!(e.raw_os_error(), Some(23 | 24)) => {
                std::thread::sleep(wait);
                wait = (wait * 2).min(std::time::Duration::from_millis(200));
            }
            other => return other,
        }
    }
    std::fs::OpenOptions::new().append(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::budget_of;

    #[test]
    fn the_descriptor_budget_leaves_the_rest_of_the_limit_to_everything_else() {
        assert_eq!(budget_of(96), 24);
        assert_eq!(budget_of(1024), 256);
        assert_eq!(budget_of(8192), 2048);
        assert_eq!(budget_of(12_000), 3808);
        assert_eq!(budget_of(20_000), 10_000);
        assert_eq!(budget_of(1 << 20), 65_536);
        assert_eq!(budget_of(0), 8);
    }
}
