//! Thread ids: generated, validated newtypes.
//!
//! Every id that arrives from outside (CLI, tool call, file) goes through [`ThreadId::parse`]
//! before it touches a path, so an id can never name a file outside `.weft/threads/`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A thread id: `<directive name with / as .>-<epoch ms>-<suffix>`. Shared text: an id is
/// copied into every message, row and map that names its thread, and a copy is a count, not
/// an allocation. Hashes, compares and serializes as its text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct ThreadId(Arc<str>);

/// Text that is not a thread id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a thread id (expected letters, digits, '.', '_' and '-', e.g. research.fanout-1700000000000-1a2b3c4d0001)")]
pub struct IdError {
    /// The text given.
    pub text: String,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

impl ThreadId {
    /// A new id for a thread of `directive`, unique even for many spawns in one millisecond:
    /// the suffix mixes 32 random bits with a process-wide counter.
    pub fn generate(directive: &str) -> ThreadId {
        let mut stem: String = directive
            .chars()
            .map(|c| if c == '/' { '.' } else { c })
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            .take(80)
            .collect();
        stem = stem.trim_matches('.').to_string();
        if stem.is_empty() {
            stem = "thread".into();
        }
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let mut rnd = [0u8; 4];
        // A failing OS RNG only weakens the suffix; the counter keeps ids unique in-process.
        let _ = getrandom::fill(&mut rnd);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed) & 0xffff;
        ThreadId(format!("{stem}-{ms}-{}{n:04x}", hex(&rnd)).into())
    }

    /// Validates an id that came from outside.
    pub fn parse(text: &str) -> Result<ThreadId, IdError> {
        let ok = !text.is_empty()
            && text.len() <= 160
            && !text.starts_with('.')
            && !text.contains("..")
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if ok {
            Ok(ThreadId(text.into()))
        } else {
            Err(IdError { text: text.into() })
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ThreadId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        ThreadId::parse(&s)
    }
}

impl From<ThreadId> for String {
    fn from(id: ThreadId) -> String {
        id.0.to_string()
    }
}

impl Serialize for ThreadId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl std::ops::Deref for ThreadId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// Hashes and orders as its text, so maps keyed by id can be searched with a `&str`.
impl std::borrow::Borrow<str> for ThreadId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for ThreadId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for ThreadId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for ThreadId {
    fn eq(&self, other: &String) -> bool {
        &*self.0 == other.as_str()
    }
}

impl PartialEq<ThreadId> for String {
    fn eq(&self, other: &ThreadId) -> bool {
        self.as_str() == &*other.0
    }
}

impl PartialEq<ThreadId> for &str {
    fn eq(&self, other: &ThreadId) -> bool {
        *self == &*other.0
    }
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, not `write_str`: `{:<50}` in a table lines the columns up.
        f.pad(&self.0)
    }
}

/// Lower-case hex of bytes.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// The hash a chain's first line names as the one before it (transcripts, the anchor log).
pub(crate) const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// sha256 of bytes, lower-case hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex(&Sha256::digest(bytes))
}

/// Current time as RFC 3339 with milliseconds (the timestamp of every record).
pub(crate) fn now_ts() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// The stored form (as [`now_ts`]) of `ms` milliseconds since the epoch. A time past
/// 9999-12-31 (which RFC 3339 cannot write) is written as that day's last moment.
#[cfg_attr(not(feature = "server"), allow(dead_code))] // only `weft serve` uses it
pub(crate) fn ts_of_ms(ms: u64) -> String {
    const LAST_MS: u64 = 253_402_300_799_999;
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.min(LAST_MS));
    humantime::format_rfc3339_millis(t).to_string()
}

/// Decodes lower- or upper-case hex.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A call reservation's ledger-wide id (`ledger/`). Only the ledger makes one; transcripts record it as a
/// plain number (`"reservation": 12`), which is how recovery reads it back.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct ReservationId(pub(crate) u64);

impl ReservationId {
    /// The number as recorded.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for ReservationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_thread_id_fills_its_column() {
        let id = super::ThreadId::parse("t-1").unwrap();
        assert_eq!(format!("{id:<6}|"), "t-1   |");
    }

    use super::*;

    #[test]
    fn generated_ids_are_unique_and_valid() {
        let ids: std::collections::HashSet<_> = (0..2000)
            .map(|_| ThreadId::generate("research/fanout"))
            .collect();
        assert_eq!(ids.len(), 2000);
        for id in &ids {
            assert!(id.as_str().starts_with("research.fanout-"));
            assert_eq!(ThreadId::parse(id.as_str()).as_ref(), Ok(id));
        }
    }

    #[test]
    fn hostile_ids_are_refused() {
        for bad in ["", "../etc", "a/b", "..", ".hidden", "a b", "x..y"] {
            assert!(ThreadId::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
