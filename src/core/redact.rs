//! Secret redaction: every occurrence of a secret value becomes `[secret:NAME]`. A plain value
//! (no I/O); the runtime holds the current one and applies it before anything is written or
//! sent — transcript lines, live events, tool results, streamed text, thread.json.

use serde_json::Value;
use std::borrow::Cow;

/// The shortest value accepted as a secret: shorter ones would redact ordinary text.
pub(crate) const MIN_SECRET_LEN: usize = 6;

/// The secrets to hide, longest value first (so a secret containing another is hidden whole).
#[derive(Debug, Clone, Default)]
pub(crate) struct Redactor {
    pairs: Vec<(String, String)>,
}

impl Redactor {
    /// A redactor for `(name, value)` pairs (values shorter than [`MIN_SECRET_LEN`] skipped).
    pub(crate) fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Redactor {
        let mut pairs: Vec<(String, String)> = pairs
            .into_iter()
            .filter(|(_, v)| v.len() >= MIN_SECRET_LEN)
            .collect();
        pairs.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        pairs.dedup_by(|a, b| a.1 == b.1);
        Redactor { pairs }
    }

    /// No secrets: nothing to do (the common case, one branch).
    pub(crate) fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The longest secret's length in bytes.
    pub(crate) fn longest(&self) -> usize {
        self.pairs.first().map_or(0, |p| p.1.len())
    }

    /// `text` with every secret replaced by `[secret:NAME]`.
    pub(crate) fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (name, value) in &self.pairs {
            if out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), &format!("[secret:{name}]")));
            }
        }
        out
    }

    /// Redacts every string (and object key) inside `v`.
    pub(crate) fn redact_value(&self, v: &mut Value) {
        if self.is_empty() {
            return;
        }
        match v {
            Value::String(s) => {
                if let Cow::Owned(r) = self.redact(s) {
                    *s = r;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|i| self.redact_value(i)),
            Value::Object(map) => {
                let keys: Vec<String> = map
                    .keys()
                    .filter(|k| self.redact(k) != k.as_str())
                    .cloned()
                    .collect();
                for k in keys {
                    if let Some(val) = map.remove(&k) {
                        map.insert(self.redact(&k).into_owned(), val);
                    }
                }
                map.values_mut().for_each(|i| self.redact_value(i));
            }
            _ => {}
        }
    }
}

/// Redacts a stream of text pieces (streamed model output): a secret split across two pieces
/// is still caught, because the last `longest − 1` bytes are held back until the next piece
/// or [`StreamRedactor::finish`].
#[derive(Debug, Default)]
pub(crate) struct StreamRedactor {
    held: String,
}

impl StreamRedactor {
    /// The text that can be released after `piece`.
    pub(crate) fn push(&mut self, r: &Redactor, piece: &str) -> String {
        if r.is_empty() {
            return std::mem::take(&mut self.held) + piece;
        }
        self.held.push_str(piece);
        let text = r.redact(&self.held).into_owned();
        let mut cut = text.len().saturating_sub(r.longest().saturating_sub(1));
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        // Never hold back part of a marker that is already there.
        if let Some(open) = text[..cut].rfind("[secret:") {
            if !text[open..].contains(']') {
                cut = open;
            }
        }
        self.held = text[cut..].to_string();
        text[..cut].to_string()
    }

    /// The rest, at the end of the stream.
    pub(crate) fn finish(&mut self, r: &Redactor) -> String {
        r.redact(&std::mem::take(&mut self.held)).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_replaced_wherever_they_are() {
        let r = Redactor::new([
            ("TOKEN".to_string(), "sk-abcdef123".to_string()),
            ("PIN".into(), "12".into()),
        ]);
        assert_eq!(r.redact("use sk-abcdef123 now"), "use [secret:TOKEN] now");
        assert_eq!(
            r.redact("12 stays: too short to be a secret"),
            "12 stays: too short to be a secret"
        );
        let mut v = serde_json::json!({ "a": ["x sk-abcdef123"], "sk-abcdef123": 1 });
        r.redact_value(&mut v);
        assert_eq!(
            v,
            serde_json::json!({ "a": ["x [secret:TOKEN]"], "[secret:TOKEN]": 1 })
        );
    }

    #[test]
    fn a_secret_split_across_streamed_pieces_is_caught() {
        let r = Redactor::new([("TOKEN".to_string(), "sk-abcdef123".to_string())]);
        let mut s = StreamRedactor::default();
        let mut out = String::new();
        for piece in ["the key is sk-ab", "cdef", "123 and é", "nd"] {
            out.push_str(&s.push(&r, piece));
        }
        out.push_str(&s.finish(&r));
        assert_eq!(out, "the key is [secret:TOKEN] and énd");
    }
}
