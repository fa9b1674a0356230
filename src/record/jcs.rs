//! RFC 8785 (JCS) canonical JSON, the form every signature covers (SPEC §11): a direct writer
//! for the documents weft signs (objects, strings, booleans and integers), and the general
//! canonicalizer for anything else.
//!
//! The direct writer produces the same bytes as `serde_json_canonicalizer` or declines: keys in
//! UTF-16 code-unit order, strings escaped as ECMAScript's `JSON.stringify` does (which is
//! serde_json's compact escaping: `\"`, `\\`, `\b \t \n \f \r`, other controls as lower-case
//! `\u00xx`, everything else as is), integers of at most 2⁵³ in magnitude in decimal. A float
//! or a larger integer (whose JCS form goes through a double) sends the whole document to the
//! general canonicalizer. A test holds both to the same bytes over random documents.

use serde_json::Value;

/// 2⁵³: integers up to this magnitude are exact doubles, printed as themselves.
const SAFE: u64 = 1 << 53;

/// The canonical bytes of `doc`, appended to `out`.
pub(crate) fn write(doc: &Value, out: &mut Vec<u8>) {
    let start = out.len();
    if !direct(doc, out) {
        out.truncate(start);
        // JCS of a serde_json::Value cannot fail (no non-string keys, no NaN); should it ever,
        // the compact form is signed, never an empty body every such document would share.
        out.extend(
            serde_json_canonicalizer::to_vec(doc)
                .or_else(|_| serde_json::to_vec(doc))
                .unwrap_or_default(),
        );
    }
}

/// Writes `v` directly; false when it holds a number only the general path renders.
fn direct(v: &Value, out: &mut Vec<u8>) -> bool {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => return integer(n, out),
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                if !direct(item, out) {
                    return false;
                }
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| utf16_order(a, b));
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(k, out);
                out.push(b':');
                if !direct(&map[k.as_str()], out) {
                    return false;
                }
            }
            out.push(b'}');
        }
    }
    true
}

pub(super) fn integer(n: &serde_json::Number, out: &mut Vec<u8>) -> bool {
    use std::io::Write;
    // Written in place (a Vec's `write!` cannot fail).
    if let Some(u) = n.as_u64().filter(|u| *u <= SAFE) {
        return write!(out, "{u}").is_ok();
    }
    if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= SAFE) {
        return write!(out, "{i}").is_ok();
    }
    false
}

pub(super) fn string(s: &str, out: &mut Vec<u8>) {
    if plain(s) {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    // serde_json's compact escaping is ECMAScript's (see the module comment).
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Whether `s` is written as itself between quotes: nothing in it is escaped.
pub(super) fn plain(s: &str) -> bool {
    s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\')
}

/// Keys compare by UTF-16 code units; for ASCII keys that is byte order.
pub(super) fn utf16_order(a: &str, b: &str) -> std::cmp::Ordering {
    if a.is_ascii() && b.is_ascii() {
        return a.cmp(b);
    }
    a.encode_utf16().cmp(b.encode_utf16())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canonical(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        write(v, &mut out);
        out
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (0u64..=(1 << 54)).prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e20f64..1e20).prop_map(Value::from),
            "\\PC{0,12}".prop_map(Value::from),
            "[\\x00-\\x1f\\x7f\"\\\\a\u{e9}\u{ffff}\u{10000}\u{1f600}]{0,8}".prop_map(Value::from),
        ]
    }

    /// Random JSON documents: every kind of value, keys across UTF-16's order traps.
    pub(in crate::record) fn doc() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z\u{e9}\u{ff5e}\u{1f600}_]{0,5}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn the_direct_writer_gives_the_canonicalizers_bytes(v in doc()) {
            let general = serde_json_canonicalizer::to_vec(&v).unwrap();
            let mine = canonical(&v);
            prop_assert_eq!(String::from_utf8_lossy(&mine), String::from_utf8_lossy(&general));
        }
    }

    #[test]
    fn a_thread_doc_goes_the_direct_way() {
        let v = serde_json::json!({"b": 1, "a": [true, null, "x\u{1}\n\u{7f}"], "é": -(1i64 << 53), "\u{1f600}": {}, "\u{ff5e}": 2});
        let mut out = Vec::new();
        assert!(direct(&v, &mut out));
        assert_eq!(out, serde_json_canonicalizer::to_vec(&v).unwrap());
    }
}
