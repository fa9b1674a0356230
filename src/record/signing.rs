//! Signing: the ed25519 key of this user, the project's trust store, and signatures over
//! RFC 8785 (JCS) canonical JSON with a domain prefix (SPEC §11).
//!
//! Owns key files and signature checks. Must never sign anything it did not canonicalize
//! itself, and never accept a signature by a key that is not in `.weft/trust/`.

use crate::core::ids::sha256_hex;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Domain prefix for thread.json signatures.
pub const THREAD_DOMAIN: &str = "weft.thread.v1\n";
/// Domain prefix for transcript checkpoint signatures.
pub(crate) const CHECKPOINT_DOMAIN: &str = "weft.checkpoint.v1\n";

/// A signing or trust error.
#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    /// A key file could not be read, written or parsed.
    #[error("signing key {path}: {message}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// What went wrong and what to do.
        message: String,
    },
}

/// The `signature` object embedded in signed documents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignatureBlock {
    /// Always `ed25519`.
    pub alg: String,
    /// First 16 hex digits of sha256(public key bytes).
    pub key_id: String,
    /// Hex of the 64-byte signature.
    pub sig: String,
}

/// This user's signing key.
pub struct Signer {
    /// Its public half (what `.weft/trust/` holds).
    public: VerifyingKey,
    /// The key in AWS-LC, which signs (the same deterministic signatures as ed25519-dalek,
    /// which reads and writes the key file; faster). The only copy of the secret kept.
    signing: aws_lc_rs::signature::Ed25519KeyPair,
    /// Id of the key, as in [`SignatureBlock::key_id`].
    pub key_id: String,
}

fn key_id_of(vk: &VerifyingKey) -> String {
    sha256_hex(vk.as_bytes())[..16].to_string()
}

impl Signer {
    /// Loads `<dir>/signing.pem`, generating it (mode 0600) on first use.
    pub fn load_or_create(dir: &Path) -> Result<Signer, SigningError> {
        let path = dir.join("signing.pem");
        let err = |message: String| SigningError::Key {
            path: path.clone(),
            message,
        };
        if path.exists() {
            // The secret's transient copies are wiped when dropped (the PEM text here, the
            // seed below; dalek's key wipes itself).
            let pem = zeroize::Zeroizing::new(
                std::fs::read_to_string(&path).map_err(|e| err(format!("cannot read: {e}")))?,
            );
            let key = SigningKey::from_pkcs8_pem(&pem).map_err(|e| {
                err(format!(
                    "not an ed25519 PKCS#8 PEM key ({e}); move it away to generate a new one"
                ))
            })?;
            return Signer::of(key).map_err(err);
        }
        let mut secret = zeroize::Zeroizing::new([0u8; 32]);
        getrandom::fill(secret.as_mut()).map_err(|e| err(format!("no OS randomness: {e}")))?;
        let key = SigningKey::from_bytes(&secret);
        let pem = key
            .to_pkcs8_pem(Default::default())
            .map_err(|e| err(format!("cannot encode: {e}")))?;
        std::fs::create_dir_all(dir)
            .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        match write_private(&path, pem.as_bytes()) {
            Ok(()) => {}
            // Another process created the key first (the link is atomic): use that one.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Signer::load_or_create(dir)
            }
            Err(e) => return Err(err(format!("cannot write: {e}"))),
        }
        Signer::of(key).map_err(err)
    }

    fn of(key: SigningKey) -> Result<Signer, String> {
        let public = key.verifying_key();
        let signing = aws_lc_rs::signature::Ed25519KeyPair::from_seed_and_public_key(
            key.as_bytes(),
            public.as_bytes(),
        )
        .map_err(|e| {
            format!("the key is refused for signing ({e}); move it away to generate a new one")
        })?;
        Ok(Signer {
            key_id: key_id_of(&public),
            public,
            signing,
        })
    }

    /// Writes this key's public half to `<trust_dir>/<key_id>.pub` if absent.
    pub fn trust_in(&self, trust_dir: &Path) -> Result<(), SigningError> {
        let path = trust_dir.join(format!("{}.pub", self.key_id));
        if path.exists() {
            return Ok(());
        }
        let err = |message: String| SigningError::Key {
            path: path.clone(),
            message,
        };
        let pem = self
            .public
            .to_public_key_pem(Default::default())
            .map_err(|e| err(format!("cannot encode: {e}")))?;
        std::fs::create_dir_all(trust_dir)
            .map_err(|e| err(format!("cannot create trust dir: {e}")))?;
        // Written aside and renamed in: a process starting at the same moment never reads half
        // a key (it would distrust this user's signatures).
        // Unique per writer (several threads of one process may open stores at once).
        let mut rnd = [0u8; 8];
        let _ = getrandom::fill(&mut rnd);
        let tmp = trust_dir.join(format!(
            ".{}.pub.{}.{}",
            self.key_id,
            std::process::id(),
            crate::core::ids::hex(&rnd)
        ));
        std::fs::write(&tmp, pem).map_err(|e| err(format!("cannot write: {e}")))?;
        std::fs::rename(&tmp, &path).map_err(|e| err(format!("cannot write: {e}")))
    }

    /// Signs `domain ‖ JCS(doc)`; `doc` must not contain its own signature.
    pub fn sign(&self, domain: &str, doc: &serde_json::Value) -> SignatureBlock {
        self.sign_message(&signed_bytes(domain, doc))
    }

    /// Signs `msg`, a domain and a document's canonical bytes ([`canonical_message`]).
    /// (AWS-LC's `sign` panics only if it cannot allocate, where Rust's own allocations abort.)
    pub(crate) fn sign_message(&self, msg: &[u8]) -> SignatureBlock {
        let sig = self.signing.sign(msg);
        SignatureBlock {
            alg: "ed25519".into(),
            key_id: self.key_id.clone(),
            sig: crate::core::ids::hex(sig.as_ref()),
        }
    }
}

/// Writes a complete private file atomically: temp file (0600, fsynced), then a hard link to the
/// final name, which fails with `AlreadyExists` if another process got there first.
#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut rnd = [0u8; 8];
    let _ = getrandom::fill(&mut rnd);
    let tmp = path.with_extension(format!(
        "pem.{}.{}.tmp",
        std::process::id(),
        crate::core::ids::hex(&rnd)
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    linked
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

fn signed_bytes(domain: &str, doc: &serde_json::Value) -> Vec<u8> {
    let mut msg = Vec::with_capacity(domain.len() + 1024);
    msg.extend_from_slice(domain.as_bytes());
    super::jcs::write(doc, &mut msg);
    msg
}

/// `domain ‖ JCS(doc)`, what a signature over `doc` covers, written straight from `doc`, or
/// through a `serde_json::Value` when the direct writer declines; then that value comes back
/// too, for the file to be written from what was signed (JCS writes an integer past 2⁵³ as the
/// double nearest to it: the canonical bytes are not the document's exact form then).
pub(crate) fn canonical_message<T: serde::Serialize>(
    domain: &str,
    doc: &T,
) -> Result<(Vec<u8>, Option<serde_json::Value>), serde_json::Error> {
    let mut msg = Vec::with_capacity(domain.len() + 2048);
    msg.extend_from_slice(domain.as_bytes());
    if super::canon::write(doc, &mut msg) {
        return Ok((msg, None));
    }
    let v = serde_json::to_value(doc)?;
    super::jcs::write(&v, &mut msg);
    Ok((msg, Some(v)))
}

/// The public keys a project accepts, by key id.
#[derive(Default, Clone)]
pub struct Trust {
    keys: HashMap<String, VerifyingKey>,
}

impl Trust {
    /// Reads every `*.pub` in `dir` (a missing dir is an empty store; a bad file is skipped
    /// and named in the returned warnings).
    pub fn load(dir: &Path) -> (Trust, Vec<String>) {
        let mut t = Trust::default();
        let mut warnings = Vec::new();
        let Ok(entries) = std::fs::read_dir(dir) else {
            return (t, warnings);
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("pub") {
                continue;
            }
            match std::fs::read_to_string(&p)
                .ok()
                .and_then(|s| VerifyingKey::from_public_key_pem(&s).ok())
            {
                Some(vk) => {
                    t.keys.insert(key_id_of(&vk), vk);
                }
                None => warnings.push(format!(
                    "{}: not an ed25519 public key PEM; ignored",
                    p.display()
                )),
            }
        }
        (t, warnings)
    }

    /// Whether `signer`'s own key is trusted (its id names this very key).
    pub(crate) fn holds(&self, signer: &Signer) -> bool {
        self.keys
            .get(&signer.key_id)
            .is_some_and(|k| *k == signer.public)
    }

    /// The trusted key whose full fingerprint (sha256 of its bytes, hex: RyeOS's) is `fp`.
    pub(crate) fn by_fingerprint(&self, fp: &str) -> Option<&VerifyingKey> {
        self.keys
            .values()
            .find(|k| sha256_hex(k.as_bytes()).eq_ignore_ascii_case(fp.trim()))
    }

    /// Verifies `block` over `domain ‖ JCS(doc)`.
    pub fn verify(
        &self,
        domain: &str,
        doc: &serde_json::Value,
        block: &SignatureBlock,
    ) -> Result<(), String> {
        if block.alg != "ed25519" {
            return Err(format!("unsupported signature algorithm `{}`", block.alg));
        }
        let vk = self.keys.get(&block.key_id).ok_or_else(|| {
            format!(
                "signed by key {} which is not in .weft/trust/",
                block.key_id
            )
        })?;
        let bytes: [u8; 64] = crate::core::ids::unhex(&block.sig)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| "signature is not 64 bytes of hex".to_string())?;
        vk.verify_strict(&signed_bytes(domain, doc), &Signature::from_bytes(&bytes))
            .map_err(|_| "bad signature: the document was changed after it was signed".to_string())
    }
}

/// Verifies a document that carries its own `signature` field.
pub(crate) fn verify_embedded(
    trust: &Trust,
    domain: &str,
    doc: &serde_json::Value,
) -> Result<(), String> {
    let mut body = doc.clone();
    let block = body
        .as_object_mut()
        .and_then(|o| o.remove("signature"))
        .ok_or_else(|| "no signature".to_string())?;
    let block: SignatureBlock =
        serde_json::from_value(block).map_err(|e| format!("malformed signature: {e}"))?;
    trust.verify(domain, &body, &block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_tamper() {
        let dir = tempfile::tempdir().unwrap();
        let s = Signer::load_or_create(dir.path()).unwrap();
        let again = Signer::load_or_create(dir.path()).unwrap();
        assert_eq!(s.key_id, again.key_id);
        s.trust_in(&dir.path().join("trust")).unwrap();
        let (trust, warnings) = Trust::load(&dir.path().join("trust"));
        assert!(warnings.is_empty());
        let doc = serde_json::json!({"b": 1, "a": [1, 2], "money": 500000000});
        let block = s.sign(THREAD_DOMAIN, &doc);
        trust.verify(THREAD_DOMAIN, &doc, &block).unwrap();
        // Key order does not matter (JCS); content and domain do.
        let reordered: serde_json::Value =
            serde_json::from_str(r#"{"money":500000000,"a":[1,2],"b":1}"#).unwrap();
        trust.verify(THREAD_DOMAIN, &reordered, &block).unwrap();
        assert!(trust.verify(CHECKPOINT_DOMAIN, &doc, &block).is_err());
        let tampered = serde_json::json!({"b": 2, "a": [1, 2], "money": 500000000});
        assert!(trust
            .verify(THREAD_DOMAIN, &tampered, &block)
            .unwrap_err()
            .contains("bad signature"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("signing.pem"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    /// AWS-LC signs exactly what ed25519-dalek would (ed25519 is deterministic): files signed
    /// before the switch and after it are the same, and dalek verifies both.
    #[test]
    fn aws_lc_signs_what_dalek_would() {
        use ed25519_dalek::Signer as _;
        let dir = tempfile::tempdir().unwrap();
        let s = Signer::load_or_create(dir.path()).unwrap();
        let pem = std::fs::read_to_string(dir.path().join("signing.pem")).unwrap();
        let key = SigningKey::from_pkcs8_pem(&pem).unwrap();
        for len in [0, 1, 200, 1100, 70_000] {
            let msg: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let ours = s.sign_message(&msg);
            let dalek = crate::core::ids::hex(&key.sign(&msg).to_bytes());
            assert_eq!(ours.sig, dalek, "{len} bytes");
        }
    }
}
