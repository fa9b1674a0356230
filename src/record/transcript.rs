//! Transcripts: the append-only, hash-chained event log of one thread (`transcript.jsonl`).
//!
//! Each line is one JSON object with `seq`, `ts`, `type`, the event's payload and `prev`, the
//! sha256 of the previous line's bytes (64 zeros for the first). Signed `checkpoint` lines are
//! written every N lines and at the end. Only the owning thread actor appends; readers tolerate
//! a torn last line (a crash mid-append) and report it instead of failing.

use super::line::Line;
use crate::core::ids::now_ts;
use crate::core::redact::Redactor;
use crate::project::config::Durability;
use crate::record::signing::{SignatureBlock, Signer, Trust, CHECKPOINT_DOMAIN};
use serde_json::{json, Map, Value};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The `prev` of the first line.
pub(crate) const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The chain head: the last line's seq and hash.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Head {
    /// seq of the last line (−1 = empty transcript).
    pub seq: i64,
    /// sha256 of the last line (GENESIS when empty).
    pub hash: String,
}

/// Transcript descriptors held open between appends, process-wide (see [`keep_open`]).
static KEPT_OPEN: AtomicUsize = AtomicUsize::new(0);

/// How many transcripts may keep their descriptor open between appends: a quarter of the
/// process's descriptor limit, so a tree of ten thousand live threads under the common soft limit
/// of 1,024 never meets EMFILE; past that, a writer opens its file for each append (a few µs).
fn keep_budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| (open_files_limit() / 4).clamp(8, 4096))
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

/// Appends events to one thread's transcript.
pub struct TranscriptWriter {
    /// The open file while this writer holds a slot of the budget; `None`: opened per append.
    file: Option<File>,
    path: PathBuf,
    thread_id: String,
    head: Head,
    since_checkpoint: u64,
    checkpoint_every: u64,
    durability: Durability,
    signer: Arc<Signer>,
}

impl TranscriptWriter {
    /// Creates a new, empty transcript (fails if it exists: transcripts are never rewritten).
    pub fn create(
        path: &Path,
        thread_id: &str,
        signer: Arc<Signer>,
        durability: Durability,
        checkpoint_every: u64,
    ) -> std::io::Result<TranscriptWriter> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(path)?;
        if durability == Durability::Strict {
            // The new file, and the thread's folder holding it, survive a power loss.
            crate::record::disk::sync_parent(path)?;
            if let Some(dir) = path.parent() {
                crate::record::disk::sync_parent(dir)?;
            }
        }
        Ok(TranscriptWriter {
            file: keep_open().then_some(file),
            path: path.to_path_buf(),
            thread_id: thread_id.into(),
            head: Head {
                seq: -1,
                hash: GENESIS.into(),
            },
            since_checkpoint: 0,
            checkpoint_every: checkpoint_every.max(1),
            durability,
            signer,
        })
    }

    /// Opens an existing transcript for appending after `head` (see [`repair`]).
    pub fn open_append(
        path: &Path,
        thread_id: &str,
        head: Head,
        signer: Arc<Signer>,
        durability: Durability,
        checkpoint_every: u64,
    ) -> std::io::Result<TranscriptWriter> {
        let file = std::fs::OpenOptions::new().append(true).open(path)?;
        Ok(TranscriptWriter {
            file: keep_open().then_some(file),
            path: path.to_path_buf(),
            thread_id: thread_id.into(),
            head,
            since_checkpoint: 0,
            checkpoint_every: checkpoint_every.max(1),
            durability,
            signer,
        })
    }

    /// The current chain head.
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// Appends one event; `payload` must be an object (other values go under `value`).
    /// The line reaches the OS before this returns (and the disk, under `durability: strict`).
    pub fn append(&mut self, kind: &str, payload: Value) -> std::io::Result<()> {
        if crate::core::failpoint::fails("transcript.append") {
            return Err(std::io::Error::other("failpoint transcript.append"));
        }
        self.write_line(kind, payload)?;
        self.since_checkpoint += 1;
        if self.since_checkpoint >= self.checkpoint_every {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Appends one typed line (see [`Self::append`]) with every secret in it redacted: the
    /// writers outside a thread's own `log` (its first line, the end of a dead thread).
    pub(crate) fn append_line(&mut self, line: Line, redactor: &Redactor) -> std::io::Result<()> {
        let (kind, mut payload) = line.into_parts();
        redactor.redact_value(&mut payload);
        self.append(&kind, payload)
    }

    /// Writes a signed checkpoint line over the current head and fsyncs.
    pub fn checkpoint(&mut self) -> std::io::Result<()> {
        self.checkpoint_line()?;
        let file = self.file_handle()?;
        crate::sql::off_workers(|| file.sync_data())
    }

    /// Writes a signed checkpoint line without fsyncing (the caller syncs, see [`Self::file_handle`]).
    pub fn checkpoint_line(&mut self) -> std::io::Result<()> {
        let body =
            json!({"thread": self.thread_id, "seq": self.head.seq + 1, "prev": self.head.hash});
        let sig = self.signer.sign(CHECKPOINT_DOMAIN, &body);
        let (kind, payload) = Line::Checkpoint { sig: Some(sig) }.into_parts();
        self.write_line(&kind, payload)?;
        self.since_checkpoint = 0;
        Ok(())
    }

    /// Fsyncs the transcript through a descriptor of its own, opened when this runs: work
    /// queued off the actor's thread holds no descriptor while it waits (a queue of them ran a
    /// process with a low descriptor limit out of them).
    pub fn sync_later(&self) -> impl FnOnce() -> std::io::Result<()> + Send + 'static {
        let path = self.path.clone();
        move || open_append(&path)?.sync_data()
    }

    /// A handle on the file, to fsync it off the actor's thread.
    pub fn file_handle(&self) -> std::io::Result<File> {
        match &self.file {
            Some(f) => f.try_clone(),
            None => open_append(&self.path),
        }
    }

    fn write_line(&mut self, kind: &str, payload: Value) -> std::io::Result<()> {
        let mut obj = match payload {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            other => {
                let mut m = Map::new();
                m.insert("value".into(), other);
                m
            }
        };
        let seq = self.head.seq + 1;
        obj.insert("seq".into(), json!(seq));
        obj.insert("ts".into(), json!(now_ts()));
        obj.insert("type".into(), json!(kind));
        obj.insert("prev".into(), json!(self.head.hash));
        let mut line = serde_json::to_vec(&Value::Object(obj)).map_err(std::io::Error::other)?;
        let hash = crate::core::ids::sha256_hex(&line);
        line.push(b'\n');
        let opened;
        let file = match &mut self.file {
            Some(f) => f,
            None => {
                opened = open_append(&self.path)?;
                &opened
            }
        };
        (&*file).write_all(&line)?;
        if self.durability == Durability::Strict {
            crate::sql::off_workers(|| file.sync_data())?;
        }
        self.head = Head { seq, hash };
        Ok(())
    }
}

impl Drop for TranscriptWriter {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            KEPT_OPEN.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// What reading a transcript found.
#[derive(Debug, Default)]
pub struct ReadReport {
    /// Every complete, parseable event in order.
    pub events: Vec<Value>,
    /// The sha256 of each of those lines, in the same order.
    pub hashes: Vec<String>,
    /// Head after the last good line.
    pub head: Option<Head>,
    /// A torn (incomplete, unparseable) last line was found and left out.
    pub torn_last_line: bool,
    /// The first broken place: (1-based line, what is wrong).
    pub broken: Option<(usize, String)>,
}

/// Reads and checks a transcript: chain, seq, checkpoint signatures (when `trust` is given).
/// Never fails on malformed content: problems are reported in the result.
pub fn read(path: &Path, thread_id: &str, trust: Option<&Trust>) -> std::io::Result<ReadReport> {
    let bytes = std::fs::read(path)?;
    let mut rep = ReadReport {
        head: Some(Head {
            seq: -1,
            hash: GENESIS.into(),
        }),
        ..Default::default()
    };
    let ends_clean = bytes.is_empty() || bytes.ends_with(b"\n");
    let lines: Vec<&[u8]> = bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let mut prev = GENESIS.to_string();
    for (i, raw) in lines.iter().enumerate() {
        let last = i + 1 == lines.len();
        let v: Value = match serde_json::from_slice(raw) {
            Ok(v) => v,
            Err(_) if last && !ends_clean => {
                rep.torn_last_line = true;
                break;
            }
            Err(e) => {
                rep.broken = Some((i + 1, format!("not valid JSON: {e}")));
                break;
            }
        };
        if let Err(m) = check_line(&v, i, &prev, thread_id, trust) {
            rep.broken = Some((i + 1, m));
            break;
        }
        prev = crate::core::ids::sha256_hex(raw);
        rep.hashes.push(prev.clone());
        rep.head = Some(Head {
            seq: i as i64,
            hash: prev.clone(),
        });
        rep.events.push(v);
    }
    Ok(rep)
}

fn check_line(
    v: &Value,
    i: usize,
    prev: &str,
    thread_id: &str,
    trust: Option<&Trust>,
) -> Result<(), String> {
    if v.get("seq").and_then(Value::as_i64) != Some(i as i64) {
        return Err(format!(
            "seq is {} where {i} was expected",
            v.get("seq").unwrap_or(&Value::Null)
        ));
    }
    if v.get("prev").and_then(Value::as_str) != Some(prev) {
        return Err("broken chain: `prev` does not match the hash of the line before (a line was edited, removed or inserted)".into());
    }
    if v.get("type").and_then(Value::as_str) == Some("checkpoint") {
        if let Some(trust) = trust {
            let sig: SignatureBlock =
                serde_json::from_value(v.get("sig").cloned().unwrap_or(Value::Null))
                    .map_err(|_| "checkpoint without a valid `sig`".to_string())?;
            let body = json!({"thread": thread_id, "seq": i, "prev": prev});
            trust
                .verify(CHECKPOINT_DOMAIN, &body, &sig)
                .map_err(|m| format!("checkpoint: {m}"))?;
        }
    }
    Ok(())
}

/// Makes a transcript appendable after a crash: a torn last line (bytes after the last newline)
/// is moved, not dropped, to `transcript.torn` beside it, and the file is cut back to its last
/// complete line. Returns the head after the last complete line and whether a torn line was kept.
pub(crate) fn repair(path: &Path) -> std::io::Result<(Head, bool)> {
    let bytes = std::fs::read(path)?;
    let good_len = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let torn = good_len < bytes.len();
    if torn {
        let aside = path.with_extension("torn");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&aside)?;
        f.write_all(&bytes[good_len..])?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        let t = std::fs::OpenOptions::new().write(true).open(path)?;
        t.set_len(good_len as u64)?;
        t.sync_all()?;
    }
    let mut head = Head {
        seq: -1,
        hash: GENESIS.into(),
    };
    for line in bytes[..good_len]
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
    {
        head = Head {
            seq: head.seq + 1,
            hash: crate::core::ids::sha256_hex(line),
        };
    }
    Ok((head, torn))
}

/// Opens a transcript for appending. Past the descriptor budget a writer opens its file per
/// line; when the process is out of descriptors for a moment (EMFILE/ENFILE: other threads'
/// files, sockets, databases), it waits briefly and tries again (up to ~1 s) rather than lose
/// the line — a lost line ends the thread.
fn open_append(path: &Path) -> std::io::Result<File> {
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
