//! Transcripts: the append-only, hash-chained event log of one thread (`transcript.jsonl`).
//!
//! Each line is one JSON object with `seq`, `ts`, `type`, the event's payload and `prev`, the
//! sha256 of the previous line's bytes (64 zeros for the first). Key order is not part of the
//! format: a line is hashed as written, and a reader parses it (a thread's own lines lead with
//! `type` and end with `seq`, `ts`, `prev`; lines built as values are in key order). Signed
//! `checkpoint` lines are written every N lines and at the end. Only the owning thread actor appends; readers tolerate
//! a torn last line (a crash mid-append) and report it instead of failing.

use super::line::Line;
use super::place::{Lines, Records};
use crate::core::ids::{now_ts, ThreadId};
use crate::core::redact::Redactor;
use crate::project::config::Durability;
use crate::record::signing::{canonical_message, SignatureBlock, Signer, Trust, CHECKPOINT_DOMAIN};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The `prev` of the first line.
pub(crate) use crate::core::ids::GENESIS;

/// The chain head: the last line's seq and hash.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Head {
    /// seq of the last line (−1 = empty transcript).
    pub seq: i64,
    /// sha256 of the last line (GENESIS when empty).
    pub hash: String,
}

impl Head {
    /// The head of an empty transcript.
    pub(crate) fn empty() -> Head {
        Head {
            seq: -1,
            hash: GENESIS.into(),
        }
    }
}

/// Appends events to one thread's transcript.
pub struct TranscriptWriter {
    /// Where the lines go (see `place`).
    lines: Lines,
    thread_id: String,
    head: Head,
    since_checkpoint: u64,
    checkpoint_every: u64,
    durability: Durability,
    signer: Arc<Signer>,
}

impl TranscriptWriter {
    /// Creates `id`'s new, empty transcript in `records` (fails if it exists: transcripts are
    /// never rewritten).
    pub fn create(
        records: &Records,
        id: &ThreadId,
        signer: Arc<Signer>,
        durability: Durability,
        checkpoint_every: u64,
    ) -> std::io::Result<TranscriptWriter> {
        let lines = records.create_transcript(id, durability == Durability::Strict)?;
        Ok(TranscriptWriter::over(
            lines,
            id,
            Head::empty(),
            signer,
            durability,
            checkpoint_every,
        ))
    }

    /// Opens `id`'s existing transcript for appending after `head` (see [`repair`]).
    pub fn open_append(
        records: &Records,
        id: &ThreadId,
        head: Head,
        signer: Arc<Signer>,
        durability: Durability,
        checkpoint_every: u64,
    ) -> std::io::Result<TranscriptWriter> {
        let lines = records.append_to(id)?;
        Ok(TranscriptWriter::over(
            lines,
            id,
            head,
            signer,
            durability,
            checkpoint_every,
        ))
    }

    fn over(
        lines: Lines,
        id: &ThreadId,
        head: Head,
        signer: Arc<Signer>,
        durability: Durability,
        checkpoint_every: u64,
    ) -> TranscriptWriter {
        TranscriptWriter {
            lines,
            thread_id: id.to_string(),
            head,
            since_checkpoint: 0,
            checkpoint_every: checkpoint_every.max(1),
            durability,
            signer,
        }
    }

    /// The current chain head.
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// Appends one event; `payload` must be an object (other values go under `value`).
    /// The line reaches the OS before this returns (and the disk, under `durability: strict`).
    pub fn append(&mut self, kind: &str, payload: Value) -> std::io::Result<()> {
        refused()?;
        self.write_line(kind, payload)?;
        self.counted()
    }

    /// Appends one typed line as it serializes, with no `serde_json::Value` built between (the
    /// hot path of a thread's own lines when there is no secret to redact). The line's own
    /// fields come first (`type` leading), then `seq`, `ts` and `prev`; a reader parses it
    /// like any other line, and the chain hashes its bytes as written.
    pub(crate) fn append_typed(&mut self, line: &Line) -> std::io::Result<()> {
        // A line kept whole from elsewhere may carry its own `seq` or `prev`: the general path.
        if let Line::Other(_) = line {
            let (kind, payload) = line.clone().into_parts();
            return self.append(&kind, payload);
        }
        refused()?;
        self.seal(open_object(line)?)?;
        self.counted()
    }

    /// One more line since the last checkpoint; a checkpoint when it is due.
    fn counted(&mut self) -> std::io::Result<()> {
        self.since_checkpoint += 1;
        if self.since_checkpoint >= self.checkpoint_every {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Appends one typed line (see [`Self::append`]) with every secret in it redacted: the
    /// writers outside a thread's own `log` (its first line, the end of a dead thread).
    pub(crate) fn append_line(&mut self, line: Line, redactor: &Redactor) -> std::io::Result<()> {
        // Nothing to redact: the line goes out as it serializes (a line kept whole from
        // elsewhere takes the general path below, without a copy).
        if redactor.is_empty() && !matches!(line, Line::Other(_)) {
            return self.append_typed(&line);
        }
        let (kind, mut payload) = line.into_parts();
        redactor.redact_value(&mut payload);
        self.append(&kind, payload)
    }

    /// Writes a signed checkpoint line over the current head and fsyncs.
    pub fn checkpoint(&mut self) -> std::io::Result<()> {
        self.checkpoint_line()?;
        self.lines.sync()
    }

    /// Writes a signed checkpoint line without fsyncing (the caller syncs, see [`Self::sync_later`]).
    pub fn checkpoint_line(&mut self) -> std::io::Result<()> {
        #[derive(serde::Serialize)]
        struct Body<'a> {
            thread: &'a str,
            seq: i64,
            prev: &'a str,
        }
        let body = Body {
            thread: self.thread_id.as_str(),
            seq: self.head.seq + 1,
            prev: &self.head.hash,
        };
        let (msg, _) =
            canonical_message(CHECKPOINT_DOMAIN, &body).map_err(std::io::Error::other)?;
        let sig = self.signer.sign_message(&msg);
        self.seal(open_object(&Line::Checkpoint { sig: Some(sig) })?)?;
        self.since_checkpoint = 0;
        Ok(())
    }

    /// Waits until every line written so far is stored (see `place::Lines::settle`).
    pub(crate) fn settle(&self) -> std::io::Result<()> {
        self.lines.settle()
    }

    /// Fsyncs the transcript later, on another thread (see `place::Lines::sync_later`).
    pub fn sync_later(&mut self) -> impl FnOnce() -> std::io::Result<()> + Send + 'static {
        self.lines.sync_later()
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
        let line = serde_json::to_vec(&Value::Object(obj)).map_err(std::io::Error::other)?;
        self.chain(seq, line)
    }

    /// Closes an object's bytes (all but its final `}`) with `seq`, `ts` and `prev`, and
    /// writes it as the next line.
    fn seal(&mut self, mut line: Vec<u8>) -> std::io::Result<()> {
        use std::io::Write;
        let seq = self.head.seq + 1;
        let sep = if line.len() > 1 { "," } else { "" };
        // A timestamp and a hex hash need no escaping.
        write!(
            line,
            "{sep}\"seq\":{seq},\"ts\":\"{}\",\"prev\":\"{}\"}}",
            now_ts(),
            self.head.hash
        )?;
        self.chain(seq, line)
    }

    /// Hashes a complete line, writes it with its newline, and moves the head to it.
    fn chain(&mut self, seq: i64, mut line: Vec<u8>) -> std::io::Result<()> {
        let hash = crate::core::ids::sha256_hex(&line);
        line.push(b'\n');
        self.lines
            .write(seq, &line, self.durability == Durability::Strict)?;
        self.head = Head { seq, hash };
        Ok(())
    }
}

/// A typed line's JSON object without its closing `}` (see [`TranscriptWriter::append_typed`]).
fn open_object(line: &Line) -> std::io::Result<Vec<u8>> {
    // Room for most lines and their `seq`, `ts` and `prev` (no regrowth on the way).
    let mut bytes = Vec::with_capacity(512);
    serde_json::to_writer(&mut bytes, line).map_err(std::io::Error::other)?;
    if bytes.first() != Some(&b'{') || bytes.pop() != Some(b'}') {
        return Err(std::io::Error::other(
            "a transcript line must be a JSON object",
        ));
    }
    Ok(bytes)
}

/// The `transcript.append` failpoint (crash tests): an append refused before it writes.
fn refused() -> std::io::Result<()> {
    match crate::core::failpoint::fails("transcript.append") {
        true => Err(std::io::Error::other("failpoint transcript.append")),
        false => Ok(()),
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

/// Reads and checks `id`'s transcript in `records`: chain, seq, checkpoint signatures (when
/// `trust` is given). Fails only when it cannot be read (NotFound: there is none); malformed
/// content is reported in the result.
pub fn read(
    records: &Records,
    id: &ThreadId,
    trust: Option<&Trust>,
) -> std::io::Result<ReadReport> {
    let bytes = records
        .transcript(id)?
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no transcript"))?;
    Ok(check(&bytes, id.as_str(), trust))
}

/// Checks a transcript's bytes (see [`read`]).
pub fn check(bytes: &[u8], thread_id: &str, trust: Option<&Trust>) -> ReadReport {
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
    rep
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

/// Makes `id`'s transcript appendable after a crash: a torn last line (bytes after the last
/// newline) is moved, not dropped, to `transcript.torn` beside it, and the file is cut back to
/// its last complete line. Returns the head after the last complete line and whether a torn
/// line was kept; None when there is no transcript.
pub(crate) fn repair(records: &Records, id: &ThreadId) -> std::io::Result<Option<(Head, bool)>> {
    let Some(bytes) = records.transcript(id)? else {
        return Ok(None);
    };
    let good_len = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let torn = good_len < bytes.len();
    if torn {
        records.set_aside_torn(id, good_len)?;
    }
    let mut head = Head::empty();
    for line in bytes[..good_len]
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
    {
        head = Head {
            seq: head.seq + 1,
            hash: crate::core::ids::sha256_hex(line),
        };
    }
    Ok(Some((head, torn)))
}
