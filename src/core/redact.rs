//! Secret redaction: every occurrence of a secret value becomes `[secret:NAME]` — in clear and
//! in the forms a tool commonly prints it in (JSON-escaped, base64, percent-encoded: see
//! `forms`). A plain value (no I/O); the runtime holds the current one and applies it before
//! anything is written or sent — transcript lines, live events, tool results, streamed text,
//! thread.json.

use serde_json::Value;
use std::borrow::Cow;

mod forms;

/// The shortest value accepted as a secret: shorter ones would redact ordinary text.
pub(crate) const MIN_SECRET_LEN: usize = 6;

/// The secrets to hide, each in every form it is searched for. Built once when the secrets
/// load, so redacting a line is a few substring searches per secret.
#[derive(Debug, Clone, Default)]
pub(crate) struct Redactor {
    /// Every fixed form of every secret with the marker that replaces it, longest first (so a
    /// form containing another is hidden whole).
    forms: Vec<(String, String)>,
    /// The secrets whose percent-encoded forms are searched for, with their markers.
    secrets: Vec<(String, String)>,
    /// The longest form in bytes: a percent-encoded one, three bytes per byte, at most.
    longest: usize,
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
        let secrets: Vec<(String, String)> = pairs
            .into_iter()
            .map(|(name, value)| (value, format!("[secret:{name}]")))
            .collect();
        let mut forms: Vec<(String, String)> = secrets
            .iter()
            .flat_map(|(v, m)| forms::fixed_forms(v).into_iter().map(|f| (f, m.clone())))
            .collect();
        forms.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        forms.dedup_by(|a, b| a.0 == b.0);
        let longest = secrets.first().map_or(0, |s| 3 * s.0.len());
        let longest = forms.iter().map(|f| f.0.len()).fold(longest, usize::max);
        Redactor {
            forms,
            secrets,
            longest,
        }
    }

    /// Whether `tail` could be the start of a secret in one of its forms (a stream holds it
    /// back until it knows).
    fn could_start(&self, tail: &str) -> bool {
        self.forms.iter().any(|(f, _)| f.starts_with(tail))
            || self
                .secrets
                .iter()
                .any(|(v, _)| forms::percent_prefix(tail.as_bytes(), v.as_bytes()))
    }

    /// No secrets: nothing to do (the common case, one branch).
    pub(crate) fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// The longest form of a secret in bytes (what a stream must hold back, less one).
    pub(crate) fn longest(&self) -> usize {
        self.longest
    }

    /// `text` with every secret, in every form, replaced by `[secret:NAME]`.
    pub(crate) fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (form, marker) in &self.forms {
            if out.contains(form.as_str()) {
                out = Cow::Owned(out.replace(form.as_str(), marker));
            }
        }
        for (value, marker) in &self.secrets {
            // Without a `%` (or a `+` for a space) a percent-encoded form is the clear one.
            let escaped = out.contains('%') || (value.contains(' ') && out.contains('+'));
            if !escaped {
                continue;
            }
            if let Some(clean) = forms::replace_percent(&out, value, marker) {
                out = Cow::Owned(clean);
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
/// is still caught, in any of its forms, because the last `longest − 1` bytes (the longest
/// form, [`Redactor::longest`]) are held back until the next piece or [`StreamRedactor::finish`].
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
        // Only what could still become a secret's form is held back (the earliest such tail).
        while cut < text.len() && !r.could_start(&text[cut..]) {
            cut += 1;
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
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
    #[test]
    fn a_secret_printed_as_hex_is_hidden() {
        let r = Redactor::new([("K".to_string(), "s3cr3t-value".to_string())]);
        let hex: String = "s3cr3t-value".bytes().map(|b| format!("{b:02x}")).collect();
        for text in [hex.clone(), hex.to_uppercase()] {
            let line = format!("dump: {text} end");
            assert_eq!(r.redact(&line), "dump: [secret:K] end");
        }
    }

    use super::*;
    use proptest::prelude::*;

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

    #[test]
    fn a_secret_is_caught_in_the_forms_a_tool_prints_it_in() {
        let secret = "pa\"ss\\word9é?>~";
        let r = Redactor::new([("T".to_string(), secret.to_string())]);
        for printed in [
            r#"{"t":"pa\"ss\\word9é?>~"}"#,
            r#"{"t":"pa\"ss\\word9\u00e9?>~"}"#,
            "cGEic3Ncd29yZDnDqT8+fg==",
            "cGEic3Ncd29yZDnDqT8-fg",
            "Authorization: Basic dXNlcjpwYSJzc1x3b3JkOcOpPz5+",
            "q=pa%22ss%5Cword9%C3%A9%3F%3E~",
            "q=pa%22ss%5cword9%c3%a9%3f%3e%7e",
        ] {
            let out = r.redact(printed);
            assert!(out.contains("[secret:T]"), "{printed} → {out}");
        }
        assert_eq!(
            r.redact("Authorization: Basic dXNlcjpwYSJzc1x3b3JkOcOpPz5+"),
            "Authorization: Basic dXNlcjp[secret:T]"
        );
        assert_eq!(r.redact("cGEic3Ncd29yZDnDqT8+fg== ok"), "[secret:T] ok");
        let plain = "an ordinary line: 100% of pa\"ss and cGEic3Nc";
        assert_eq!(r.redact(plain), plain);
        assert!(r.longest() >= 3 * secret.len());
    }

    fn any_char() -> impl Strategy<Value = char> {
        prop_oneof![
            4 => proptest::char::range(' ', '~'),
            1 => proptest::sample::select(vec!['"', '\\', '/', '+', '%', ' ', 'é', '中', '😀', '\n']),
        ]
    }

    fn text(len: std::ops::Range<usize>) -> impl Strategy<Value = String> {
        proptest::collection::vec(any_char(), len).prop_map(|c| c.into_iter().collect())
    }

    /// `s` percent-encoded: every byte outside the unreserved set (or every byte) as `%XX`.
    fn percent(s: &str, upper: bool, all: bool, plus: bool) -> String {
        let mut out = String::new();
        for b in s.bytes() {
            match b {
                b' ' if plus => out.push('+'),
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' if !all => {
                    out.push(char::from(b))
                }
                b if upper => out.push_str(&format!("%{b:02X}")),
                b => out.push_str(&format!("%{b:02x}")),
            }
        }
        out
    }

    /// Redacts `text` whole and in `cuts` streamed pieces; checks neither output holds `form`.
    fn hidden(r: &Redactor, text: &str, form: &str, cuts: &[usize]) -> Result<(), TestCaseError> {
        let out = r.redact(text);
        prop_assert!(out.contains("[secret:S]"), "{text:?} → {out:?}");
        prop_assert!(!out.contains(form), "{form:?} left in {out:?}");
        let (mut s, mut streamed, mut at) = (StreamRedactor::default(), String::new(), 0);
        for &c in cuts {
            let mut c = (at + c).min(text.len());
            while !text.is_char_boundary(c) {
                c += 1;
            }
            streamed.push_str(&s.push(r, &text[at..c]));
            at = c;
        }
        streamed.push_str(&s.push(r, &text[at..]));
        streamed.push_str(&s.finish(r));
        prop_assert!(
            !streamed.contains(form),
            "{form:?} streamed in {streamed:?}"
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn every_form_of_a_random_secret_is_redacted(
            secret in text(6..20), pre in text(0..10), post in text(0..10),
            pre_bytes in proptest::collection::vec(any::<u8>(), 0..6),
            post_bytes in proptest::collection::vec(any::<u8>(), 0..6),
            upper: bool, all: bool, plus: bool,
            cuts in proptest::collection::vec(0usize..40, 0..6),
        ) {
            let r = Redactor::new([("S".to_string(), secret.clone())]);
            hidden(&r, &format!("{pre}{secret}{post}"), &secret, &cuts)?;
            let json = serde_json::to_string(&format!("{pre}{secret}{post}")).unwrap();
            let escaped = serde_json::to_string(&secret).unwrap();
            hidden(&r, &json, &escaped[1..escaped.len() - 1], &cuts)?;
            let encoded = percent(&secret, upper, all, plus);
            hidden(&r, &format!("{pre}{encoded}{post}"), &encoded, &cuts)?;
            let whole = [&pre_bytes[..], secret.as_bytes(), &post_bytes[..]].concat();
            let (from, to) = ((8 * pre_bytes.len()).div_ceil(6), 8 * (pre_bytes.len() + secret.len()) / 6);
            for alphabet in [forms::STANDARD, forms::URL_SAFE] {
                let b64 = forms::base64(&whole, alphabet);
                if to - from >= forms::MIN_BASE64_RUN {
                    hidden(&r, &format!("{pre}{b64}=={post}"), &b64[from..to], &cuts)?;
                }
            }
        }
    }
}
