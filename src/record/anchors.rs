//! Where a thread's final head is anchored beyond its own files (SPEC §11, #23), so a finished
//! thread cannot be rolled back to an older, validly signed state unseen: a child's final head
//! is in its parent's `child_finished` line (the parent's chained, signed transcript); a root's
//! is in the project's anchor log (`.weft/state/anchors.jsonl`, or its table on the project's
//! database server; see `place`) — one signed line per finished root, each naming the hash of
//! the line before it (a chain), appended with every process taking turns. `weft verify`
//! checks a finished thread's signed head against its anchor.
//!
//! Writes only the anchor log; reads what it is given.

use crate::core::ids::{sha256_hex, ThreadId, GENESIS};
use crate::core::status::Status;
use crate::record::anchor_group::Pending;
use crate::record::place::Records;
use crate::record::signing::{verify_embedded, Signer, Trust};
use crate::record::transcript::Head;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// The signature domain of an anchor line.
const DOMAIN: &str = "weft.anchor.v1\n";

/// Appends root `thread`'s final head to `records`' anchor log, chained to the last line and
/// signed; stored (synced, or committed) before it returns. Roots that end together share one
/// append (see `anchor_group`).
pub(crate) fn anchor_root(
    records: &Records,
    signer: &Arc<Signer>,
    thread: &ThreadId,
    status: Status,
    head: &Head,
) -> std::io::Result<()> {
    let unsigned = json!({
        "thread": thread, "status": status, "head_seq": head.seq, "head": head.hash,
    });
    super::anchor_group::append(
        records,
        Pending {
            line: unsigned,
            signer: signer.clone(),
            domain: DOMAIN,
        },
    )
}

/// The anchor log read and checked.
#[derive(Default)]
pub(crate) struct Log {
    /// The last anchored head of each thread.
    pub heads: HashMap<ThreadId, String>,
    /// When its first line was written: every thread created since must be anchored once it
    /// has finished (None: no log, nothing can be told).
    pub since: Option<String>,
}

/// The anchor log read and checked, and what is wrong with it (a line whose signature or chain
/// link fails, naming the line). A missing log anchors nothing.
pub(crate) fn read_log(records: &Records, trust: &Trust) -> (Log, Vec<String>) {
    let mut log = Log::default();
    let mut problems = Vec::new();
    let name = records.anchors_name();
    let bytes = match records.anchors() {
        Ok(b) => b,
        Err(e) => {
            problems.push(format!("{name}: cannot be read: {e}"));
            return (log, problems);
        }
    };
    let mut prev = GENESIS.to_string();
    for (n, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        if raw.is_empty() {
            continue;
        }
        let at = format!("{name}:{}", n + 1);
        let line: Value = match serde_json::from_slice(raw) {
            Ok(v) => v,
            Err(e) => {
                problems.push(format!("{at}: not a JSON line: {e}"));
                prev = sha256_hex(raw);
                continue;
            }
        };
        if line["prev"].as_str() != Some(prev.as_str()) {
            problems.push(format!(
                "{at}: the chain is broken (a line before it was changed or removed)"
            ));
        }
        if let Err(e) = verify_embedded(trust, DOMAIN, &line) {
            problems.push(format!("{at}: {e}"));
        }
        if log.since.is_none() {
            log.since = line["at"].as_str().map(str::to_string);
        }
        let id = line["thread"]
            .as_str()
            .and_then(|t| ThreadId::parse(t).ok());
        if let (Some(id), Some(head)) = (id, line["head"].as_str()) {
            log.heads.insert(id, head.to_string());
        }
        prev = sha256_hex(raw);
    }
    (log, problems)
}

/// The final head a parent's transcript records for its child `child` (its last
/// `child_finished` line naming one), from the parent's checked lines.
pub(crate) fn child_head(parent_lines: &[Value], child: &ThreadId) -> Option<String> {
    parent_lines
        .iter()
        .rev()
        .filter(|l| l["type"] == "child_finished" && l["id"] == child.as_str())
        .find_map(|l| l["head"].as_str().map(str::to_string))
}
