//! The anchor log as a file (`.weft/state/anchors.jsonl`): lines appended under a file lock so
//! processes never interleave, a torn last line set aside, the tail this process wrote
//! remembered so it need not be read again. The lines' format is `anchors`'.

use crate::core::ids::{sha256_hex, GENESIS};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// Builds the `i`-th line of a batch from the hash of the line before it; None past the last.
pub(crate) type MakeLines<'a> = &'a mut dyn FnMut(usize, &str) -> Option<Vec<u8>>;

/// Appends the lines `make` builds, each from the hash of the line before it (GENESIS for the
/// log's first), to the log at `path` (created on first use), under its lock, in one write;
/// synced once before it returns.
pub(crate) fn append(path: &Path, make: MakeLines) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)?;
    f.lock()?;
    let len = f.seek(SeekFrom::End(0))?;
    let file = identity(&f)?;
    let prev = match known_tail(path, file, len) {
        Some(hash) => hash,
        None => {
            set_aside_torn(&mut f, path)?;
            last_line(&mut f)?.map_or_else(|| GENESIS.to_string(), |l| sha256_hex(&l))
        }
    };
    let (bytes, hash) = chained(make, prev);
    let written = f.write_all(&bytes).and_then(|_| f.sync_data());
    remember_tail(
        path,
        written
            .is_ok()
            .then(|| (file, len + bytes.len() as u64, hash)),
    );
    written?;
    f.unlock()
}

/// The lines `make` builds after the line hashed `prev`, each ending in a newline, and the
/// hash of the last (`prev` when there is none).
fn chained(make: MakeLines, mut prev: String) -> (Vec<u8>, String) {
    let mut bytes = Vec::new();
    for i in 0.. {
        let Some(line) = make(i, &prev) else { break };
        prev = sha256_hex(&line);
        bytes.extend_from_slice(&line);
        bytes.push(b'\n');
    }
    (bytes, prev)
}

/// The log this process appended to last: its length after that line and the line's hash.
static TAIL: std::sync::Mutex<Option<Tail>> = std::sync::Mutex::new(None);

/// The log's path, its file (device, inode), its length after the line, the line's hash.
type Tail = (std::path::PathBuf, (u64, u64), u64, String);

/// The file behind an open log (device, inode): a log replaced or restored under the same name
/// is another file, even at the same length.
fn identity(f: &std::fs::File) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = f.metadata()?;
    Ok((m.dev(), m.ino()))
}

/// The hash of the last line of the log at `path`, if this process wrote it and the log is
/// still the same file (`file`) and `len` long. Lines are only ever appended, or a torn tail cut off, so an unchanged length
/// means an unchanged last line: the tail need not be read again (it was, for every root, a
/// 64 KiB read under the lock when 10⁴ roots ended together).
fn known_tail(path: &Path, file: (u64, u64), len: u64) -> Option<String> {
    let tail = TAIL.lock().ok()?;
    let (p, f, l, hash) = tail.as_ref()?;
    (p == path && *f == file && *l == len).then(|| hash.clone())
}

/// Remembers the tail this process just wrote (None: forget, the append failed).
fn remember_tail(path: &Path, tail: Option<((u64, u64), u64, String)>) {
    if let Ok(mut t) = TAIL.lock() {
        *t = tail.map(|(file, len, hash)| (path.to_path_buf(), file, len, hash));
    }
}

/// A last line cut short (a crash mid-append) is moved to `anchors.jsonl.torn`, so the next
/// line starts clean and the chain goes on from the last whole line.
fn set_aside_torn(f: &mut std::fs::File, path: &Path) -> std::io::Result<()> {
    let len = f.seek(SeekFrom::End(0))?;
    if len == 0 || read_range(f, len - 1, len)? == b"\n" {
        return Ok(());
    }
    let cut = line_start(f, len)?;
    let torn = read_range(f, cut, len)?;
    let mut aside = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path.with_extension("jsonl.torn"))?;
    aside.write_all(&torn)?;
    aside.write_all(b"\n")?;
    f.set_len(cut)
}

/// The last line of the log (without its newline; the log ends in one, see
/// [`set_aside_torn`]), reading only its tail.
fn last_line(f: &mut std::fs::File) -> std::io::Result<Option<Vec<u8>>> {
    let len = f.seek(SeekFrom::End(0))?;
    if len == 0 {
        return Ok(None);
    }
    let start = line_start(f, len - 1)?;
    read_range(f, start, len - 1).map(Some)
}

/// Where the line holding the byte before `end` starts: just after the last newline before
/// `end`, or 0. Reads backwards in steps from 1 KiB (a line's usual size) doubling to 64 KiB.
fn line_start(f: &mut std::fs::File, end: u64) -> std::io::Result<u64> {
    let (mut from, mut step) = (end, 1024);
    while from > 0 {
        let at = from.saturating_sub(step);
        step = (step * 2).min(65_536);
        let chunk = read_range(f, at, from)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(at + i as u64 + 1);
        }
        from = at;
    }
    Ok(0)
}

/// Bytes `from..to` of `f`.
fn read_range(f: &mut std::fs::File, from: u64, to: u64) -> std::io::Result<Vec<u8>> {
    f.seek(SeekFrom::Start(from))?;
    let mut out = vec![0u8; usize::try_from(to - from).unwrap_or(0)];
    f.read_exact(&mut out)?;
    Ok(out)
}
