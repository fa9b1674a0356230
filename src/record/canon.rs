//! RFC 8785 (JCS) canonical bytes straight from a `Serialize` value, without building a
//! `serde_json::Value` first: what a thread.json's signature covers, written at every
//! transition. It produces [`super::jcs::write`]'s bytes for the value's JSON form, or declines
//! (a float, an integer past 2⁵³ or a map key that is not a string: the general path renders
//! those); a test holds both to the same bytes over random documents.
//!
//! Also [`pretty`]: the canonical bytes laid out as `serde_json::to_vec_pretty` lays out a
//! document, for the file people read.

use super::jcs::{integer, plain, string, utf16_order};
use serde::ser::{self, Serialize};

/// The canonical bytes of `v` appended to `out`; false (and `out` as it was) when `v` holds
/// something only the general path renders.
pub(crate) fn write<T: Serialize + ?Sized>(v: &T, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    let ok = v.serialize(Canon { out: &mut *out }).is_ok();
    if !ok {
        out.truncate(start);
    }
    ok
}

/// Why the direct path declined (the value needs the general canonicalizer).
#[derive(Debug)]
pub(crate) struct Declined;

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("declined: not a value the direct canonical writer renders")
    }
}

impl std::error::Error for Declined {}

impl ser::Error for Declined {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Declined
    }
}

type Res = Result<(), Declined>;

/// Writes one value's canonical bytes.
struct Canon<'a> {
    out: &'a mut Vec<u8>,
}

/// A key of an object being written: a struct field's name or a map's string key.
enum Key {
    Field(&'static str),
    Owned(String),
}

impl Key {
    fn as_str(&self) -> &str {
        match self {
            Key::Field(k) => k,
            Key::Owned(k) => k,
        }
    }
}

/// One member of an object being written.
struct Member {
    key: Key,
    /// Where its value's bytes are in the object's `values`.
    start: usize,
    end: usize,
    /// Its key is printable ASCII needing no escape: compared byte by byte (UTF-16 order is
    /// byte order there), written as it is.
    ascii: bool,
}

impl Member {
    fn order(&self, other: &Member) -> std::cmp::Ordering {
        match self.ascii && other.ascii {
            true => self
                .key
                .as_str()
                .as_bytes()
                .cmp(other.key.as_str().as_bytes()),
            false => utf16_order(self.key.as_str(), other.key.as_str()),
        }
    }
}

/// An object: its members' values written aside, then all in key order at the end.
struct Object<'a> {
    out: &'a mut Vec<u8>,
    /// Each member's key, where its value's bytes are in `values`, and whether its key is
    /// plain ASCII (compared byte by byte, written as it is).
    members: Vec<Member>,
    values: Vec<u8>,
    /// A map's key waiting for its value.
    key: Option<String>,
    /// Closed in `}` twice: a variant's `{"name":{…}}`.
    variant: bool,
}

impl<'a> Object<'a> {
    fn new(out: &'a mut Vec<u8>, variant: Option<&'static str>) -> Object<'a> {
        let variant = open_variant(out, variant);
        Object {
            out,
            members: Vec::new(),
            values: Vec::with_capacity(256),
            key: None,
            variant,
        }
    }

    fn member<T: Serialize + ?Sized>(&mut self, key: Key, v: &T) -> Res {
        let start = self.values.len();
        v.serialize(Canon {
            out: &mut self.values,
        })?;
        let ascii = key.as_str().is_ascii() && plain(key.as_str());
        self.members.push(Member {
            key,
            start,
            end: self.values.len(),
            ascii,
        });
        Ok(())
    }

    fn finish(mut self) -> Res {
        self.members.sort_unstable_by(Member::order);
        if self
            .members
            .windows(2)
            .any(|w| w[0].key.as_str() == w[1].key.as_str())
        {
            // Two members of one name: what JSON would keep is not this writer's to decide.
            return Err(Declined);
        }
        self.out.push(b'{');
        for (i, m) in self.members.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            match m.ascii {
                true => {
                    self.out.push(b'"');
                    self.out.extend_from_slice(m.key.as_str().as_bytes());
                    self.out.extend_from_slice(b"\":");
                }
                false => {
                    string(m.key.as_str(), self.out);
                    self.out.push(b':');
                }
            }
            self.out.extend_from_slice(&self.values[m.start..m.end]);
        }
        self.out.push(b'}');
        if self.variant {
            self.out.push(b'}');
        }
        Ok(())
    }
}

/// A variant's `{"name":` before its value (closed by its compound's `finish`); whether written.
fn open_variant(out: &mut Vec<u8>, variant: Option<&'static str>) -> bool {
    if let Some(name) = variant {
        out.push(b'{');
        string(name, out);
        out.push(b':');
    }
    variant.is_some()
}

/// An array (or tuple) being written.
struct Array<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
    variant: bool,
}

impl<'a> Array<'a> {
    fn new(out: &'a mut Vec<u8>, variant: Option<&'static str>) -> Array<'a> {
        let variant = open_variant(out, variant);
        out.push(b'[');
        Array {
            out,
            first: true,
            variant,
        }
    }

    fn item<T: Serialize + ?Sized>(&mut self, v: &T) -> Res {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        v.serialize(Canon { out: self.out })
    }

    fn finish(self) -> Res {
        self.out.push(b']');
        if self.variant {
            self.out.push(b'}');
        }
        Ok(())
    }
}

impl Canon<'_> {
    fn int(self, n: impl Into<serde_json::Number>) -> Res {
        match integer(&n.into(), self.out) {
            true => Ok(()),
            false => Err(Declined),
        }
    }

    fn raw(self, b: &[u8]) -> Res {
        self.out.extend_from_slice(b);
        Ok(())
    }
}

/// serde's integer methods, each written as the integer it is (past 2⁵³: declined).
macro_rules! integers {
    ($($method:ident: $t:ty),*) => {
        $(fn $method(self, v: $t) -> Res {
            self.int(v)
        })*
    };
}

impl<'a> ser::Serializer for Canon<'a> {
    type Ok = ();
    type Error = Declined;
    type SerializeSeq = Array<'a>;
    type SerializeTuple = Array<'a>;
    type SerializeTupleStruct = Array<'a>;
    type SerializeTupleVariant = Array<'a>;
    type SerializeMap = Object<'a>;
    type SerializeStruct = Object<'a>;
    type SerializeStructVariant = Object<'a>;

    fn serialize_bool(self, v: bool) -> Res {
        self.raw(if v { b"true" } else { b"false" })
    }
    integers!(serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64);
    integers!(serialize_u8: u8, serialize_u16: u16, serialize_u32: u32, serialize_u64: u64);
    fn serialize_f32(self, _: f32) -> Res {
        Err(Declined)
    }
    fn serialize_f64(self, _: f64) -> Res {
        Err(Declined)
    }
    fn serialize_char(self, v: char) -> Res {
        string(v.encode_utf8(&mut [0; 4]), self.out);
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Res {
        string(v, self.out);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Res {
        let mut a = Array::new(self.out, None);
        for b in v {
            ser::SerializeSeq::serialize_element(&mut a, b)?;
        }
        a.finish()
    }
    fn serialize_none(self) -> Res {
        self.raw(b"null")
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Res {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Res {
        self.raw(b"null")
    }
    fn serialize_unit_struct(self, _: &'static str) -> Res {
        self.raw(b"null")
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Res {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, name: &'static str, v: &T) -> Res {
        private(name)?;
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        v: &T,
    ) -> Res {
        let mut o = Object::new(self.out, None);
        o.member(Key::Field(variant), v)?;
        o.finish()
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Array<'a>, Declined> {
        Ok(Array::new(self.out, None))
    }
    fn serialize_tuple(self, _: usize) -> Result<Array<'a>, Declined> {
        Ok(Array::new(self.out, None))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Array<'a>, Declined> {
        Ok(Array::new(self.out, None))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Array<'a>, Declined> {
        Ok(Array::new(self.out, Some(variant)))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Object<'a>, Declined> {
        Ok(Object::new(self.out, None))
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<Object<'a>, Declined> {
        private(name)?;
        Ok(Object::new(self.out, None))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Object<'a>, Declined> {
        Ok(Object::new(self.out, Some(variant)))
    }
}

/// serde_json's own markers (a number under `arbitrary_precision`, a raw value) are a JSON
/// value its parser reads back as something else: the general path renders them.
fn private(name: &str) -> Res {
    match name.starts_with("$serde_json::private::") {
        true => Err(Declined),
        false => Ok(()),
    }
}

/// An `Array` or `Object` is each of serde's sequence (or struct) shapes alike.
macro_rules! compound {
    ($trait:ident for $ty:ident, $method:ident($($key:ident: $k:ty)?) => $add:ident) => {
        impl ser::$trait for $ty<'_> {
            type Ok = ();
            type Error = Declined;
            fn $method<T: Serialize + ?Sized>(&mut self, $($key: $k,)? v: &T) -> Res {
                self.$add($(Key::Field($key),)? v)
            }
            fn end(self) -> Res {
                self.finish()
            }
        }
    };
}

compound!(SerializeSeq for Array, serialize_element() => item);
compound!(SerializeTuple for Array, serialize_element() => item);
compound!(SerializeTupleStruct for Array, serialize_field() => item);
compound!(SerializeTupleVariant for Array, serialize_field() => item);
compound!(SerializeStruct for Object, serialize_field(k: &'static str) => member);
compound!(SerializeStructVariant for Object, serialize_field(k: &'static str) => member);

impl ser::SerializeMap for Object<'_> {
    type Ok = ();
    type Error = Declined;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Res {
        // JSON keys are strings: anything else (which serde_json would quote) declines.
        let key = serde_json::to_value(k).map_err(|_| Declined)?;
        match key {
            serde_json::Value::String(s) => {
                self.key = Some(s);
                Ok(())
            }
            _ => Err(Declined),
        }
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Res {
        let k = self.key.take().ok_or(Declined)?;
        self.member(Key::Owned(k), v)
    }
    fn end(self) -> Res {
        self.finish()
    }
}

/// Compact JSON `json` (as this module and `serde_json::to_vec` write it) laid out as
/// `serde_json::to_vec_pretty` lays it out: two-space indents, `": "` after keys, `{}` and `[]`
/// for empty ones.
pub(crate) fn pretty(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() * 3 / 2);
    let mut depth = 0usize;
    let indent = |out: &mut Vec<u8>, depth: usize| {
        out.push(b'\n');
        out.resize(out.len() + 2 * depth, b' ');
    };
    let mut i = 0;
    while i < json.len() {
        let c = json[i];
        match c {
            b'"' => {
                // A string is copied whole.
                let end = string_end(json, i);
                out.extend_from_slice(&json[i..end]);
                i = end;
                continue;
            }
            b'{' | b'[' => {
                out.push(c);
                if !matches!(json.get(i + 1), Some(b'}' | b']')) {
                    depth += 1;
                    indent(&mut out, depth);
                }
            }
            b'}' | b']' => {
                if i == 0 || !matches!(json[i - 1], b'{' | b'[') {
                    depth = depth.saturating_sub(1);
                    indent(&mut out, depth);
                }
                out.push(c);
            }
            b',' => {
                out.push(c);
                indent(&mut out, depth);
            }
            b':' => out.extend_from_slice(b": "),
            _ => out.push(c),
        }
        i += 1;
    }
    out
}

/// The index just past the string starting at `json[start]` (a quote), or the end of `json`.
fn string_end(json: &[u8], start: usize) -> usize {
    let mut j = start + 1;
    while let Some(k) = json[j.min(json.len())..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\')
    {
        match json[j + k] {
            b'"' => return j + k + 1,
            _ => j += k + 2,
        }
    }
    json.len()
}

#[cfg(test)]
mod tests {
    use super::super::jcs::tests::doc;
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn general(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        super::super::jcs::write(v, &mut out);
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn the_direct_writer_gives_the_general_bytes_or_declines(v in doc()) {
            let mut mine = Vec::new();
            if write(&v, &mut mine) {
                let theirs = general(&v);
                prop_assert_eq!(String::from_utf8_lossy(&mine), String::from_utf8_lossy(&theirs));
            } else {
                prop_assert!(mine.is_empty());
            }
        }

        #[test]
        fn pretty_lays_out_as_serde_json_does(v in doc()) {
            let compact = serde_json::to_vec(&v).unwrap();
            let (mine, theirs) = (pretty(&compact), serde_json::to_vec_pretty(&v).unwrap());
            prop_assert_eq!(String::from_utf8_lossy(&mine), String::from_utf8_lossy(&theirs));
        }
    }

    #[derive(serde::Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Shape {
        Unit,
        New(u8),
        Tuple(u8, String),
        Fields { b: i64, a: Option<String> },
    }

    #[derive(serde::Serialize)]
    struct Typed {
        zeta: Vec<Shape>,
        alpha: std::collections::BTreeMap<String, u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<u8>,
        mid: (bool, char),
        bytes: serde_bytes_like::Bytes,
    }

    mod serde_bytes_like {
        pub(super) struct Bytes(pub(super) Vec<u8>);
        impl serde::Serialize for Bytes {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.0)
            }
        }
    }

    #[test]
    fn a_typed_value_writes_what_its_json_value_canonicalizes_to() {
        let t = Typed {
            zeta: vec![
                Shape::Unit,
                Shape::New(7),
                Shape::Tuple(1, "x\n".into()),
                Shape::Fields {
                    b: -(1 << 53),
                    a: None,
                },
            ],
            alpha: [("é".to_string(), 1), ("b".to_string(), 2)].into(),
            skipped: None,
            mid: (true, '\u{1f600}'),
            bytes: serde_bytes_like::Bytes(vec![0, 255]),
        };
        let mut mine = Vec::new();
        assert!(write(&t, &mut mine));
        assert_eq!(mine, general(&serde_json::to_value(&t).unwrap()));
    }

    /// What serde_json writes for a number under `arbitrary_precision` (a feature a library
    /// user's build may turn on): its parser reads it back as a number, not as this object.
    #[test]
    fn serde_jsons_private_markers_decline() {
        #[derive(serde::Serialize)]
        #[serde(rename = "$serde_json::private::Number")]
        struct Marked {
            #[serde(rename = "$serde_json::private::Number")]
            n: String,
        }
        let mut out = Vec::new();
        assert!(!write(&Marked { n: "1".into() }, &mut out));
        assert!(out.is_empty());
    }

    #[test]
    fn floats_big_integers_and_non_string_keys_decline() {
        let mut out = b"kept".to_vec();
        assert!(!write(&serde_json::json!({"a": [1, 2.5]}), &mut out));
        assert!(!write(&serde_json::json!({"a": u64::MAX}), &mut out));
        let keyed: std::collections::BTreeMap<u8, u8> = [(1, 2)].into();
        assert!(!write(&keyed, &mut out));
        assert_eq!(out, b"kept");
    }
}
