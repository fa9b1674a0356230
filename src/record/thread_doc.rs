//! Signed thread state: `thread.json` (SPEC §11).
//!
//! Owns the document's shape, its atomic signed write and its verified read. Only the thread
//! actor that owns a thread writes its thread.json (recovery excepted, for dead owners).

use crate::core::ids::ThreadId;
use crate::core::limits::Limits;
use crate::core::status::Status;
use crate::record::place::{DocStamp, Records};
use crate::record::signing::{canonical_message, SignatureBlock, Signer, Trust, THREAD_DOMAIN};
use crate::record::transcript::Head;
use serde::{Deserialize, Serialize};

/// One entry of the transition history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// The state entered.
    pub status: Status,
    /// When (RFC 3339).
    pub at: String,
}

/// Cost figures of a thread.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cost {
    /// LLM calls made.
    pub turns: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cache-read tokens.
    pub cache_read_tokens: u64,
    /// The thread's own spend, nano-USD.
    pub own_spend_nanos: i64,
    /// The subtree's spend, nano-USD.
    pub spend_nanos: i64,
    /// Wall time so far, ms.
    pub elapsed_ms: u64,
    /// What providers billed beyond the calls' reservations, nano-USD (SPEC §5 overrun).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub overrun_nanos: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The content of thread.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadDoc {
    /// Format version (1).
    pub version: u32,
    /// Thread id.
    pub id: ThreadId,
    /// Directive name.
    pub directive: String,
    /// sha256 of the directive's file(s).
    pub directive_hash: String,
    /// Parent thread.
    pub parent_id: Option<ThreadId>,
    /// Root thread.
    pub root_id: ThreadId,
    /// Current state.
    pub status: Status,
    /// Every transition so far.
    pub history: Vec<Transition>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// Model id.
    pub model: String,
    /// Provider name.
    pub provider: String,
    /// Resolved limits.
    pub limits: Limits,
    /// Attenuated capabilities.
    pub capabilities: Vec<String>,
    /// Tool names and capability patterns whose calls wait for a person: its directive's
    /// `approval:` list and every ancestor's (authority travels whole).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approval: Vec<String>,
    /// Costs.
    pub cost: Cost,
    /// Structured outputs from `directive_return`.
    pub outputs: Option<serde_json::Value>,
    /// Final text.
    pub result: Option<String>,
    /// Error message.
    pub error: Option<String>,
    /// Class of error, e.g. `interrupted` for threads finalized by crash recovery.
    #[serde(default)]
    pub error_kind: Option<String>,
    /// Thread this one continues.
    pub continuation_of: Option<ThreadId>,
    /// The continuation thread that carries this one's work on (`weft resume`).
    #[serde(default)]
    pub continued_by: Option<ThreadId>,
    /// First thread of the chain.
    pub chain_root: Option<ThreadId>,
    /// The transcript's head when this document was signed.
    pub transcript_head: Head,
    /// The thread this one was forked from, and the last seq of its transcript copied
    /// (`weft fork`). Absent from documents of threads that were not forked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
    /// Where an imported thread came from (`weft import`): format, file, original id. An
    /// imported thread is read-only history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported: Option<serde_json::Value>,
    /// The hooks whose `spawn` led to this thread (through its ancestors or its chain): it never
    /// fires them, so no hook causes itself again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caused_by: Vec<String>,
    /// The signature its directive file carries (RyeOS's `<!-- ryeos:signed:… -->`), as
    /// checked when the thread started. Absent when the file is not signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directive_signature: Option<Box<SignatureCheck>>,
}

/// A directive file's signature as checked when a thread of it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignatureCheck {
    /// Whose signature format (`ryeos`).
    pub scheme: String,
    /// The signer's fingerprint (sha256 of its public key, hex).
    pub signer: String,
    /// When it says it was signed.
    pub signed_at: String,
    /// `verified` (a signer trusted in `.weft/trust/ryeos/` signed the file as it is, and
    /// every file it extends), `verified, but a file it extends is not`, `signer not trusted`,
    /// or `signer not trusted, content hash differs` (a trusted signer's file that does not
    /// verify never starts).
    pub status: String,
}

/// The source of a forked thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkedFrom {
    /// The source thread.
    pub thread: ThreadId,
    /// The last seq of the source's transcript the fork's conversation was built from.
    pub seq: i64,
}

/// A thread.json read error.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct StateError {
    /// The file.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl ThreadDoc {
    /// Records a transition.
    pub fn transition(&mut self, status: Status) {
        let at = crate::core::ids::now_ts();
        self.status = status;
        self.updated_at = at.clone();
        self.history.push(Transition { status, at });
    }

    /// Signs and stores this document as its thread's thread.json in `records` (replacing
    /// the one before atomically; `fsync`: on the disk before it returns).
    pub fn write_signed(
        &self,
        records: &Records,
        signer: &Signer,
        fsync: bool,
    ) -> std::io::Result<()> {
        self.write_stamped(records, signer, fsync).map(|_| ())
    }

    /// [`ThreadDoc::write_signed`], returning the stamp of the file written (None on a server).
    pub(crate) fn write_stamped(
        &self,
        records: &Records,
        signer: &Signer,
        fsync: bool,
    ) -> std::io::Result<Option<DocStamp>> {
        let bytes = self.signed_file(signer)?;
        records.put_doc(&self.id, &bytes, fsync)
    }

    /// The bytes of this document's thread.json, signed: what [`ThreadDoc::write_signed`]
    /// stores (`Records::put_doc`).
    pub(crate) fn signed_file(&self, signer: &Signer) -> std::io::Result<Vec<u8>> {
        let (msg, general) =
            canonical_message(THREAD_DOMAIN, self).map_err(std::io::Error::other)?;
        let sig = signer.sign_message(&msg);
        match general {
            None => with_signature(&msg[THREAD_DOMAIN.len()..], &sig),
            Some(v) => with_signature(
                &serde_json::to_vec(&v).map_err(std::io::Error::other)?,
                &sig,
            ),
        }
    }

    /// Reads and verifies `id`'s thread.json in `records` against the project's trust store.
    pub fn read_verified(
        records: &Records,
        id: &ThreadId,
        trust: &Trust,
    ) -> Result<ThreadDoc, StateError> {
        let err = |message: String| StateError {
            path: records.doc_name(id),
            message,
        };
        let bytes = match records.doc(id) {
            Ok(Some(b)) => b,
            Ok(None) => return Err(err("cannot read: there is none".into())),
            Err(e) => return Err(err(format!("cannot read: {e}"))),
        };
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| err(format!("not valid JSON: {e}")))?;
        crate::record::signing::verify_embedded(trust, THREAD_DOMAIN, &v).map_err(err)?;
        let mut body = v;
        if let Some(o) = body.as_object_mut() {
            o.remove("signature");
        }
        serde_json::from_value(body).map_err(|e| err(format!("signed but not a thread.json: {e}")))
    }
}

/// The file's bytes: the document's compact JSON with its `signature` member added last,
/// laid out for people to read.
fn with_signature(compact_doc: &[u8], sig: &SignatureBlock) -> std::io::Result<Vec<u8>> {
    let body = compact_doc
        .strip_suffix(b"}")
        .filter(|b| b.starts_with(b"{"))
        .ok_or_else(|| std::io::Error::other("a thread.json is a JSON object"))?;
    let mut compact = Vec::with_capacity(compact_doc.len() + 200);
    compact.extend_from_slice(body);
    if body.len() > 1 {
        compact.push(b',');
    }
    compact.extend_from_slice(b"\"signature\":");
    serde_json::to_writer(&mut compact, sig).map_err(std::io::Error::other)?;
    compact.push(b'}');
    Ok(crate::record::canon::pretty(&compact))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::Project;

    fn doc(outputs: Option<serde_json::Value>, spend: i64) -> ThreadDoc {
        let id = ThreadId::parse("t-1-a").unwrap();
        ThreadDoc {
            version: 1,
            id: id.clone(),
            directive: "d\u{e9}/x \"quoted\"".into(),
            directive_hash: "ab".into(),
            parent_id: None,
            root_id: id,
            status: Status::Completed,
            history: vec![Transition {
                status: Status::Completed,
                at: "2026-11-28T00:00:00.000Z".into(),
            }],
            created_at: "2026-11-28T00:00:00.000Z".into(),
            updated_at: "2026-11-28T00:00:00.000Z".into(),
            model: "m".into(),
            provider: "p".into(),
            limits: Limits {
                turns: 1,
                tokens: 2,
                spend: crate::core::money::Nanos(spend),
                duration_ms: 3,
                depth: -1,
                spawns: 4,
                concurrency: 5,
            },
            capabilities: vec!["thread.spawn.x".into()],
            approval: vec![],
            cost: Cost::default(),
            outputs,
            result: Some("line\nnext\u{1}".into()),
            error: None,
            error_kind: None,
            continuation_of: None,
            continued_by: None,
            chain_root: None,
            transcript_head: Head::empty(),
            forked_from: None,
            imported: None,
            caused_by: vec!["h".into()],
            directive_signature: None,
        }
    }

    /// Written the direct way and the general way (a float in its outputs; a spend past 2⁵³,
    /// which the file keeps exact): every file verifies and reads back as the document, laid
    /// out for people.
    #[test]
    fn a_written_thread_json_verifies_whichever_way_it_was_canonicalized() {
        let dir = tempfile::tempdir().unwrap();
        let project = Project {
            root: dir.path().to_path_buf(),
        };
        let records = Records::files(&project);
        let signer = Signer::load_or_create(&dir.path().join("key")).unwrap();
        signer.trust_in(&dir.path().join("trust")).unwrap();
        let (trust, _) = Trust::load(&dir.path().join("trust"));
        let cases = [
            (None, 500_000_000, true),
            (Some(serde_json::json!({"score": 0.5, "n": 1})), 5, false),
            (None, i64::MAX, false),
        ];
        for (outputs, spend, direct) in cases {
            let d = doc(outputs, spend);
            let (_, general) = canonical_message(THREAD_DOMAIN, &d).unwrap();
            assert_eq!(general.is_none(), direct, "{:?} / {spend}", d.outputs);
            std::fs::create_dir_all(records.doc_name(&d.id).trim_end_matches("/thread.json"))
                .unwrap();
            d.write_signed(&records, &signer, false).unwrap();
            let back = ThreadDoc::read_verified(&records, &d.id, &trust).unwrap();
            assert_eq!(
                serde_json::to_value(&back).unwrap(),
                serde_json::to_value(&d).unwrap()
            );
            let text = String::from_utf8(records.doc(&d.id).unwrap().unwrap()).unwrap();
            assert!(
                text.contains("\n  \"signature\": {\n    \"alg\": \"ed25519\","),
                "{text}"
            );
        }
    }
}
