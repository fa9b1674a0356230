//! The forms a secret commonly takes when a tool prints it, as the redactor searches for them:
//! JSON string escapes, base64 (standard and URL-safe, at each of the three alignments it can
//! have inside a longer encoded string such as HTTP Basic's `user:secret`) and
//! percent-encoding. Fixed forms are computed once, when the secrets load; percent-encoding has
//! too many variants to list (either hex case, `+` for a space, any subset of bytes escaped),
//! so it has a matcher of its own. Pure functions: no I/O.

/// The shortest base64 run of a secret worth searching for: the characters that depend on the
/// secret alone when it sits at some offset of a longer string. A shorter run (a 6-byte secret
/// at offset 1 or 2 leaves 7) could turn up in unrelated base64.
pub(super) const MIN_BASE64_RUN: usize = 8;

pub(super) const STANDARD: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
pub(super) const URL_SAFE: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Every fixed string `value` may be printed as, `value` itself included, deduplicated.
pub(super) fn fixed_forms(value: &str) -> Vec<String> {
    let mut out = vec![value.to_string()];
    out.extend(json_forms(value));
    for alphabet in [STANDARD, URL_SAFE] {
        out.push(padded(value.as_bytes(), alphabet));
        out.extend((0..3).filter_map(|offset| base64_run(value.as_bytes(), offset, alphabet)));
    }
    // Hex, as `xxd -p` / `od` / a hash tool's encoder print bytes (either case).
    let hex: String = value.bytes().map(|b| format!("{b:02x}")).collect();
    out.push(hex.to_uppercase());
    out.push(hex);
    out.sort();
    out.dedup();
    out
}

/// `value` inside a JSON string: as serde_json and JavaScript write it, with `/` escaped too
/// (PHP), with non-ASCII as `\uXXXX` (Python's default, PHP), and escaped twice (a JSON
/// document carried in a JSON string).
fn json_forms(value: &str) -> [String; 5] {
    let once = json_escape(value, false, false);
    let twice = json_escape(&once, false, false);
    [
        json_escape(value, true, false),
        json_escape(value, false, true),
        json_escape(value, true, true),
        once,
        twice,
    ]
}

/// `s` escaped as the inside of a JSON string (control characters as serde_json writes them).
pub(super) fn json_escape(s: &str, slash: bool, ascii: bool) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if slash => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// `bytes` in base64 without padding.
pub(super) fn base64(bytes: &[u8], alphabet: &[u8; 64]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(alphabet[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// `bytes` in base64 with its `=` padding (the whole string a tool prints for the secret alone).
fn padded(bytes: &[u8], alphabet: &[u8; 64]) -> String {
    let mut out = base64(bytes, alphabet);
    out.push_str(&"=="[..(3 - bytes.len() % 3) % 3]);
    out
}

/// The base64 characters that depend on `bytes` alone when they start `offset` (0–2) bytes
/// into a 3-byte group of a longer string: the whole characters inside their bits. None if
/// fewer than [`MIN_BASE64_RUN`].
pub(super) fn base64_run(bytes: &[u8], offset: usize, alphabet: &[u8; 64]) -> Option<String> {
    let mut shifted = vec![0u8; offset];
    shifted.extend_from_slice(bytes);
    let encoded = base64(&shifted, alphabet);
    let (start, end) = ((8 * offset).div_ceil(6), 8 * shifted.len() / 6);
    let run = encoded.get(start..end)?;
    (run.len() >= MIN_BASE64_RUN).then(|| run.to_string())
}

/// `text` with every percent-encoded form of `secret` replaced by `marker` (None if there is
/// none). Each byte of the secret may appear as itself, as `%XX` in either hex case, or — a
/// space — as `+`.
pub(super) fn replace_percent(text: &str, secret: &str, marker: &str) -> Option<String> {
    let (t, s) = (text.as_bytes(), secret.as_bytes());
    let (mut out, mut copied, mut i) = (String::new(), 0, 0);
    while i < t.len() {
        match percent_end(t, i, s) {
            Some(end) if text.is_char_boundary(i) && text.is_char_boundary(end) => {
                out.push_str(&text[copied..i]);
                out.push_str(marker);
                (copied, i) = (end, end);
            }
            _ => i += 1,
        }
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

/// Where a percent-encoded form of `secret` starting at `at` of `text` ends, if there is one.
fn percent_end(text: &[u8], at: usize, secret: &[u8]) -> Option<usize> {
    let mut i = at;
    for &b in secret {
        let escaped = text.get(i) == Some(&b'%') && text.get(i + 1..i + 3).and_then(hex) == Some(b);
        match text.get(i) {
            _ if escaped => i += 3,
            Some(&c) if c == b || (b == b' ' && c == b'+') => i += 1,
            _ => return None,
        }
    }
    Some(i)
}

/// Whether `tail` (the end of a text so far) could be the start of a percent-encoded form of
/// `secret`: every byte of it matches, and an escape cut short by the end matches so far.
pub(super) fn percent_prefix(tail: &[u8], secret: &[u8]) -> bool {
    let (mut i, mut k) = (0, 0);
    while i < tail.len() {
        let Some(&b) = secret.get(k) else {
            return false;
        };
        if tail[i] == b'%' {
            let rest = &tail[i + 1..(i + 3).min(tail.len())];
            let whole = rest.len() == 2 && hex(rest) == Some(b);
            let cut = rest.len() < 2 && rest.iter().all(u8::is_ascii_hexdigit);
            if !(whole || cut) && b != b'%' {
                return false;
            }
            i += if whole {
                3
            } else if cut {
                tail.len()
            } else {
                1
            };
        } else if tail[i] == b || (b == b' ' && tail[i] == b'+') {
            i += 1;
        } else {
            return false;
        }
        k += 1;
    }
    true
}

/// The byte two hex digits (either case) stand for.
fn hex(pair: &[u8]) -> Option<u8> {
    let digit = |c: u8| char::from(c).to_digit(16);
    Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_known_vectors() {
        assert_eq!(padded(b"foobar", STANDARD), "Zm9vYmFy");
        assert_eq!(padded(b"fooba", STANDARD), "Zm9vYmE=");
        assert_eq!(padded(b"\xfb\xff", URL_SAFE), "-_8=");
        assert_eq!(padded(b"\xfb\xff", STANDARD), "+/8=");
        let s = "pa\"ss\\wörd/9\n";
        let serde = serde_json::to_string(s).unwrap();
        assert_eq!(json_escape(s, false, false), serde[1..serde.len() - 1]);
        assert_eq!(json_escape(s, true, true), "pa\\\"ss\\\\w\\u00f6rd\\/9\\n");
        // `user:` is 5 bytes: the secret starts 2 bytes into a group.
        let basic = base64(b"user:secret99", STANDARD);
        assert!(basic.contains(&base64_run(b"secret99", 2, STANDARD).unwrap()));
        assert_eq!(base64_run(b"abcdef", 1, STANDARD), None, "7 characters");
    }

    #[test]
    fn percent_forms_in_any_case_are_replaced() {
        let r = |t: &str| replace_percent(t, "a b/é%", "[x]");
        assert_eq!(r("u=a+b%2F%C3%A9%25&").as_deref(), Some("u=[x]&"));
        assert_eq!(r("a%20b%2f%c3%a9%25 a b/é%").as_deref(), Some("[x] [x]"));
        assert_eq!(r("a%20b%2f%c3%a9"), None);
    }
}
