//! Verification of signed state: thread.json signatures, transcript chains and checkpoints,
//! and that thread.json's recorded head matches the transcript (SPEC §11).
//!
//! Read-only: it never repairs anything, it names the file and the first broken place.

use crate::core::ids::ThreadId;
use crate::record::anchors;
use crate::record::place::Records;
use crate::record::signing::Trust;
use crate::record::thread_doc::ThreadDoc;
use serde::Serialize;

/// The result of verifying one thread.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// Thread id.
    pub id: String,
    /// Everything checks.
    pub ok: bool,
    /// What is wrong, each naming the file (and line).
    pub problems: Vec<String>,
    /// The transcript ends in a torn line (a crash mid-append); reported, not fatal.
    pub torn_last_line: bool,
}

/// What, beyond a thread's own files, says where it should be: the project's anchor log, and
/// (from the CLI, which reads them) the registry and the store's tombstones.
pub(crate) struct Witnesses<'a> {
    /// The anchor log.
    pub log: &'a anchors::Log,
    /// The registry says this thread finished.
    pub finished: &'a dyn Fn(&ThreadId) -> bool,
    /// The thread was deleted (`weft delete`): its records are meant to be gone.
    pub deleted: &'a dyn Fn(&ThreadId) -> bool,
}

/// Verifies one thread's files and its anchor.
pub fn verify_thread(records: &Records, trust: &Trust, id: &ThreadId) -> Verdict {
    let (log, _) = anchors::read_log(records, trust);
    let no = |_: &ThreadId| false;
    let w = Witnesses {
        log: &log,
        finished: &no,
        deleted: &no,
    };
    verify_anchored(records, trust, id, &w)
}

/// Verifies one thread's files, and that its final head is where its anchor says (a parent's
/// `child_finished` line; `roots`, the project's anchor log, for a root): a finished thread
/// rolled back to an older signed state, its transcript truncated to match, fails here.
pub(crate) fn verify_anchored(
    records: &Records,
    trust: &Trust,
    id: &ThreadId,
    w: &Witnesses<'_>,
) -> Verdict {
    if !records.has(id).unwrap_or(true) {
        return Verdict {
            id: id.to_string(),
            ok: false,
            problems: vec![format!(
                "{}: missing: the thread's records are gone",
                records.thread_name(id)
            )],
            torn_last_line: false,
        };
    }
    let doc_path = records.doc_name(id);
    let tr_path = records.transcript_name(id);
    let mut problems = Vec::new();
    let doc = match ThreadDoc::read_verified(records, id, trust) {
        Ok(d) => Some(d),
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    };
    let mut torn = false;
    let mut chain: Vec<String> = Vec::new();
    match crate::record::transcript::read(records, id, Some(trust)) {
        Err(e) => problems.push(format!("{tr_path}: cannot read: {e}")),
        Ok(rep) => {
            torn = rep.torn_last_line;
            chain.clone_from(&rep.hashes);
            if let Some((line, msg)) = &rep.broken {
                problems.push(format!("{tr_path}:{line}: {msg}"));
            } else if let Some(doc) = &doc {
                let want = &doc.transcript_head;
                let hash_at = usize::try_from(want.seq)
                    .ok()
                    .and_then(|i| rep.hashes.get(i));
                let matches = want.seq < 0 && rep.events.is_empty() || hash_at == Some(&want.hash);
                if !matches {
                    problems.push(format!(
                        "{}: head mismatch: thread.json records line {} with hash {}, which the transcript does not have",
                        doc_path,
                        want.seq + 1,
                        short(&want.hash)
                    ));
                } else if doc.status.is_terminal() {
                    let last = rep.head.as_ref().map_or(-1, |h| h.seq);
                    if last != want.seq {
                        problems.push(format!(
                            "{}: {} line(s) after the head that the final thread.json signed (line {})",
                            tr_path,
                            last - want.seq,
                            want.seq + 1
                        ));
                    }
                }
            }
        }
    }
    if let Some(doc) = &doc {
        if doc.id != *id {
            problems.push(format!(
                "{}: names thread {}, but sits in the folder of {id} (moved or swapped)",
                doc_path, doc.id
            ));
        }
        check_links(records, trust, doc, &doc_path, w, &mut problems);
        check_anchor(records, trust, doc, &chain, w, &mut problems);
    }
    Verdict {
        id: id.to_string(),
        ok: problems.is_empty(),
        problems,
        torn_last_line: torn,
    }
}

/// The start of a hash, as shown (a hash from an unchecked source may hold any text: never
/// cut inside a character).
fn short(hash: &str) -> &str {
    hash.char_indices()
        .nth(12)
        .map_or(hash, |(i, _)| &hash[..i])
}

/// A finished thread's anchored final head is still in its transcript's chain, at or before
/// the head its thread.json signs (a message edit appends after it), and thread.json is
/// terminal: a rollback to an older signed state cannot keep both.
fn check_anchor(
    records: &Records,
    trust: &Trust,
    doc: &ThreadDoc,
    chain: &[String],
    w: &Witnesses<'_>,
    problems: &mut Vec<String>,
) {
    // The log's line is the latest (a message edit re-anchors there); else the parent's.
    let from_parent = || {
        let p = doc.parent_id.as_ref()?;
        let lines = crate::record::transcript::read(records, p, Some(trust))
            .ok()?
            .events;
        Some((
            anchors::child_head(&lines, &doc.id)?,
            format!("its parent {p}"),
        ))
    };
    let anchored = w
        .log
        .heads
        .get(&doc.id)
        .map(|h| (h.clone(), "the project's anchor log".to_string()))
        .or_else(from_parent);
    let Some((head, by)) = anchored else {
        // A thread created since the log began must be in it (or its parent's line) once
        // finished: the registry says it has.
        let since = w
            .log
            .since
            .as_deref()
            .is_some_and(|s| doc.created_at.as_str() >= s);
        if since && (w.finished)(&doc.id) {
            problems.push(format!(
                "{}: anchored nowhere, though the registry says it finished (the anchor log was cut, or its parent's records were changed)",
                records.thread_name(&doc.id)
            ));
        }
        return;
    };
    let at = chain.iter().position(|h| *h == head);
    let signed = usize::try_from(doc.transcript_head.seq).ok();
    let holds = doc.status.is_terminal() && at.is_some() && at <= signed;
    if !holds {
        problems.push(format!(
            "{}: rolled back: {by} records it finished at line hash {}, which its records no longer end at or after (thread.json is {} at line {})",
            records.thread_name(&doc.id),
            short(&head),
            doc.status.as_str(),
            doc.transcript_head.seq + 1
        ));
    }
}

/// A continuation chain's links hold both ways: the thread a document continues names it as its
/// continuation, and the thread it names as its continuation continues it (both signed).
fn check_links(
    records: &Records,
    trust: &Trust,
    doc: &ThreadDoc,
    doc_path: &str,
    w: &Witnesses<'_>,
    problems: &mut Vec<String>,
) {
    let other = |id: &ThreadId| ThreadDoc::read_verified(records, id, trust);
    if let Some(prev) = doc.continuation_of.as_ref().filter(|p| !(w.deleted)(p)) {
        match other(prev) {
            Ok(p) if p.continued_by.as_ref() == Some(&doc.id) => {}
            Ok(p) => problems.push(format!(
                "{}: continues {prev}, whose thread.json names {} as its continuation",
                doc_path,
                p.continued_by
                    .as_ref()
                    .map_or("no thread".to_string(), ToString::to_string)
            )),
            Err(e) => problems.push(format!(
                "{}: continues {prev}, whose thread.json does not verify: {e}",
                doc_path
            )),
        }
    }
    if let Some(next) = doc.continued_by.as_ref().filter(|n| !(w.deleted)(n)) {
        match other(next) {
            Ok(n) if n.continuation_of.as_ref() == Some(&doc.id) => {}
            Ok(_) => problems.push(format!(
                "{}: names {next} as its continuation, which does not continue it",
                doc_path
            )),
            Err(e) => problems.push(format!(
                "{}: names {next} as its continuation, whose thread.json does not verify: {e}",
                doc_path
            )),
        }
    }
}
