//! Verification of signed state: thread.json signatures, transcript chains and checkpoints,
//! and that thread.json's recorded head matches the transcript (SPEC §11).
//!
//! Read-only: it never repairs anything, it names the file and the first broken place.

use crate::core::ids::ThreadId;
use crate::project::Project;
use crate::record::anchors;
use crate::record::signing::Trust;
use crate::record::thread_doc::ThreadDoc;
use serde::Serialize;
use std::collections::HashMap;

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

/// Verifies one thread's files and its anchor.
pub fn verify_thread(project: &Project, trust: &Trust, id: &ThreadId) -> Verdict {
    let (roots, _) = anchors::read_log(&project.anchors_log(), trust);
    verify_anchored(project, trust, id, &roots)
}

/// Verifies one thread's files, and that its final head is where its anchor says (a parent's
/// `child_finished` line; `roots`, the project's anchor log, for a root): a finished thread
/// rolled back to an older signed state, its transcript truncated to match, fails here.
pub(crate) fn verify_anchored(
    project: &Project,
    trust: &Trust,
    id: &ThreadId,
    roots: &HashMap<ThreadId, String>,
) -> Verdict {
    let dir = project.thread_dir(id);
    if !dir.exists() {
        return Verdict {
            id: id.to_string(),
            ok: false,
            problems: vec![format!(
                "{}: missing: the thread's records are gone",
                dir.display()
            )],
            torn_last_line: false,
        };
    }
    let doc_path = dir.join("thread.json");
    let tr_path = dir.join("transcript.jsonl");
    let mut problems = Vec::new();
    let doc = match ThreadDoc::read_verified(&doc_path, trust) {
        Ok(d) => Some(d),
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    };
    let mut torn = false;
    let mut chain: Vec<String> = Vec::new();
    match crate::record::transcript::read(&tr_path, id.as_str(), Some(trust)) {
        Err(e) => problems.push(format!("{}: cannot read: {e}", tr_path.display())),
        Ok(rep) => {
            torn = rep.torn_last_line;
            chain.clone_from(&rep.hashes);
            if let Some((line, msg)) = &rep.broken {
                problems.push(format!("{}:{line}: {msg}", tr_path.display()));
            } else if let Some(doc) = &doc {
                let want = &doc.transcript_head;
                let hash_at = usize::try_from(want.seq)
                    .ok()
                    .and_then(|i| rep.hashes.get(i));
                let matches = want.seq < 0 && rep.events.is_empty() || hash_at == Some(&want.hash);
                if !matches {
                    problems.push(format!(
                        "{}: head mismatch: thread.json records line {} with hash {}, which the transcript does not have",
                        doc_path.display(),
                        want.seq + 1,
                        &want.hash[..12.min(want.hash.len())]
                    ));
                } else if doc.status.is_terminal() {
                    let last = rep.head.as_ref().map_or(-1, |h| h.seq);
                    if last != want.seq {
                        problems.push(format!(
                            "{}: {} line(s) after the head that the final thread.json signed (line {})",
                            tr_path.display(),
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
                doc_path.display(),
                doc.id
            ));
        }
        check_links(project, trust, doc, &doc_path, &mut problems);
        check_anchor(project, trust, doc, &chain, roots, &mut problems);
    }
    Verdict {
        id: id.to_string(),
        ok: problems.is_empty(),
        problems,
        torn_last_line: torn,
    }
}

/// A finished thread's anchored final head is still in its transcript's chain, at or before
/// the head its thread.json signs (a message edit appends after it), and thread.json is
/// terminal: a rollback to an older signed state cannot keep both.
fn check_anchor(
    project: &Project,
    trust: &Trust,
    doc: &ThreadDoc,
    chain: &[String],
    roots: &HashMap<ThreadId, String>,
    problems: &mut Vec<String>,
) {
    let (anchored, by) = match &doc.parent_id {
        None => (
            roots.get(&doc.id).cloned(),
            "the project's anchor log".to_string(),
        ),
        Some(p) => {
            let path = project.thread_dir(p).join("transcript.jsonl");
            let lines = crate::record::transcript::read(&path, p.as_str(), Some(trust))
                .map(|r| r.events)
                .unwrap_or_default();
            (
                anchors::child_head(&lines, &doc.id),
                format!("its parent {p}"),
            )
        }
    };
    let Some(head) = anchored else {
        return;
    };
    let at = chain.iter().position(|h| *h == head);
    let signed = usize::try_from(doc.transcript_head.seq).ok();
    let holds = doc.status.is_terminal() && at.is_some() && at <= signed;
    if !holds {
        problems.push(format!(
            "{}: rolled back: {by} records it finished at line hash {}, which its records no longer end at or after (thread.json is {} at line {})",
            project.thread_dir(&doc.id).display(),
            &head[..12.min(head.len())],
            doc.status.as_str(),
            doc.transcript_head.seq + 1
        ));
    }
}

/// A continuation chain's links hold both ways: the thread a document continues names it as its
/// continuation, and the thread it names as its continuation continues it (both signed).
fn check_links(
    project: &Project,
    trust: &Trust,
    doc: &ThreadDoc,
    doc_path: &std::path::Path,
    problems: &mut Vec<String>,
) {
    let other = |id: &ThreadId| {
        ThreadDoc::read_verified(&project.thread_dir(id).join("thread.json"), trust)
    };
    if let Some(prev) = &doc.continuation_of {
        match other(prev) {
            Ok(p) if p.continued_by.as_ref() == Some(&doc.id) => {}
            Ok(p) => problems.push(format!(
                "{}: continues {prev}, whose thread.json names {} as its continuation",
                doc_path.display(),
                p.continued_by
                    .as_ref()
                    .map_or("no thread".to_string(), ToString::to_string)
            )),
            Err(e) => problems.push(format!(
                "{}: continues {prev}, whose thread.json does not verify: {e}",
                doc_path.display()
            )),
        }
    }
    if let Some(next) = &doc.continued_by {
        match other(next) {
            Ok(n) if n.continuation_of.as_ref() == Some(&doc.id) => {}
            Ok(_) => problems.push(format!(
                "{}: names {next} as its continuation, which does not continue it",
                doc_path.display()
            )),
            Err(e) => problems.push(format!(
                "{}: names {next} as its continuation, whose thread.json does not verify: {e}",
                doc_path.display()
            )),
        }
    }
}
