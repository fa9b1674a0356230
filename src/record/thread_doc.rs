//! Signed thread state: `thread.json` (SPEC §11).
//!
//! Owns the document's shape, its atomic signed write and its verified read. Only the thread
//! actor that owns a thread writes its thread.json (recovery excepted, for dead owners).

use crate::core::ids::ThreadId;
use crate::core::limits::Limits;
use crate::core::status::Status;
use crate::record::place::{DocStamp, Records};
use crate::record::signing::{Signer, Trust, THREAD_DOMAIN};
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
        let mut v = serde_json::to_value(self).map_err(std::io::Error::other)?;
        let sig = signer.sign(THREAD_DOMAIN, &v);
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "signature".into(),
                serde_json::to_value(sig).map_err(std::io::Error::other)?,
            );
        }
        let bytes = serde_json::to_vec_pretty(&v).map_err(std::io::Error::other)?;
        records.put_doc(&self.id, &bytes, fsync)
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
