//! RyeOS's YAML directive dialect (the Rust rewrite, `leolilley/ryeos` v0.5.x): front matter
//! that weft's own does not take, mapped onto it, and the `<!-- ryeos:signed:… -->` line.
//!
//! - `inputs:` as a list of `{name, type, required, description?, default?}` → a map by name;
//! - `limits.spend_usd` (a string or a number) → `spend`;
//! - `requires.capabilities.declared` → `permissions` (`ryeos.execute.tool.a/b` → `tool.a.b`,
//!   `ryeos.execute.directive.a/b` → `thread.spawn.a.b`; others kept as written, granting
//!   nothing in weft);
//! - `model: {provider, name, tier, context_window}` → `{provider, id, tier}`;
//! - `context.system: [knowledge:…]` → layer-1 hooks loading each knowledge item at the
//!   thread's start, resolved like Rye's `load knowledge` (`knowledge/<id>.md`, else
//!   `.ai/knowledge/<id>.md`);
//! - `category` and `continuation` are accepted and not kept (weft's continuation is the
//!   config's `continuation_threshold`).
//!
//! The signature line is checked against its content hash here (nothing else is known yet);
//! whether its signer is trusted, and the signature itself, are checked when a thread starts
//! (`thread/spawn/plan.rs`), and the outcome goes into the thread's signed record.

use serde_json::{json, Map, Value};

/// A `<!-- ryeos:signed:<at>:<sha256>:<sig>:<signer> -->` line, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectiveSignature {
    /// When it was signed (as written).
    pub signed_at: String,
    /// The sha256 (hex) of the file without its signature line, as signed.
    pub content_hash: String,
    /// The Ed25519 signature of `content_hash`'s text, base64.
    pub signature: String,
    /// The signer's fingerprint: sha256 (hex) of its public key.
    pub signer: String,
    /// Whether the file without its signature line still hashes to `content_hash`.
    pub unchanged: bool,
}

const OPEN: &str = "<!--";
const CLOSE: &str = "-->";
const MARK: &str = "ryeos:signed:";

/// The signature fields of `line` if it is a RyeOS markdown signature line.
fn parse_line(line: &str) -> Option<[String; 4]> {
    let t = line.trim();
    let inner = t.strip_prefix(OPEN)?.strip_suffix(CLOSE)?.trim();
    let payload = inner.strip_prefix(MARK)?;
    let mut parts: Vec<&str> = payload.rsplitn(4, ':').collect();
    if parts.len() != 4 {
        return None;
    }
    parts.reverse();
    Some([parts[0], parts[1], parts[2], parts[3]].map(str::to_string))
}

/// The signature of `text`'s first line if it is a RyeOS signature line, and the text after
/// that line: exactly what RyeOS hashes and signs (`content_hash_after_signature`: the bytes
/// after the first line's `\n` or `\r\n`, nothing else removed) and what is parsed.
pub(super) fn split_signature(text: &str) -> (Option<DirectiveSignature>, &str) {
    let (first, body) = match text.find('\n') {
        Some(i) => (&text[..i], &text[i + 1..]),
        None => (text, ""),
    };
    let Some(fields) = parse_line(first.strip_suffix('\r').unwrap_or(first)) else {
        return (None, text);
    };
    let [signed_at, content_hash, signature, signer] = fields;
    let unchanged = crate::core::ids::sha256_hex(body.as_bytes()) == content_hash;
    let sig = DirectiveSignature {
        signed_at,
        content_hash,
        signature,
        signer,
        unchanged,
    };
    (Some(sig), body)
}

/// Keys only RyeOS's dialect has (weft's own front matter never takes them).
const RYE_KEYS: [&str; 4] = ["category", "requires", "context", "continuation"];

/// Whether front matter `v` is written in RyeOS's dialect.
pub(super) fn is_dialect(v: &Value) -> bool {
    RYE_KEYS.iter().any(|k| v.get(k).is_some())
        || v.get("inputs").is_some_and(Value::is_array)
        || v.pointer("/limits/spend_usd").is_some()
        || v.pointer("/model/name").is_some()
        || v.pointer("/model/context_window").is_some()
}

/// RyeOS front matter as weft's; the error names the key that cannot be mapped.
pub(super) fn normalize(v: Value) -> Result<Value, String> {
    let Value::Object(mut m) = v else {
        return Err("front matter must be a mapping".into());
    };
    for k in ["category", "continuation"] {
        m.remove(k);
    }
    if let Some(inputs) = m.remove("inputs") {
        m.insert("inputs".into(), inputs_map(inputs)?);
    }
    if let Some(Value::Object(limits)) = m.get_mut("limits") {
        if let Some(usd) = limits.remove("spend_usd") {
            limits.insert("spend".into(), usd);
        }
    }
    if let Some(model) = m.remove("model") {
        m.insert("model".into(), model_of(model)?);
    }
    if let Some(req) = m.remove("requires") {
        let declared = declared_caps(&req)?;
        let perms = m.entry("permissions").or_insert_with(|| json!([]));
        if let Value::Array(list) = perms {
            list.extend(declared.into_iter().map(Value::String));
        }
    }
    if let Some(context) = m.remove("context") {
        let hooks = context_hooks(&context)?;
        let list = m.entry("hooks").or_insert_with(|| json!([]));
        match list {
            Value::Array(l) => l.splice(0..0, hooks).for_each(drop),
            _ => return Err("hooks: expected a list".into()),
        }
    }
    Ok(Value::Object(m))
}

/// `inputs:` as a list of `{name, type, required, …}` → a map by name.
fn inputs_map(inputs: Value) -> Result<Value, String> {
    let Value::Array(list) = inputs else {
        return Ok(inputs);
    };
    let mut out = Map::new();
    for (i, item) in list.into_iter().enumerate() {
        let Value::Object(mut spec) = item else {
            return Err(format!("inputs[{i}]: expected a mapping with `name`"));
        };
        let name = match spec.remove("name") {
            Some(Value::String(n)) if !n.is_empty() => n,
            _ => return Err(format!("inputs[{i}]: `name` (a string) is required")),
        };
        if out.contains_key(&name) {
            return Err(format!("inputs: `{name}` is declared twice"));
        }
        out.insert(name, Value::Object(spec));
    }
    Ok(Value::Object(out))
}

/// `model: {provider, name, tier, context_window}` → weft's `{provider, id, tier}`.
fn model_of(model: Value) -> Result<Value, String> {
    let Value::Object(mut m) = model else {
        return Err("model: expected a mapping".into());
    };
    m.remove("context_window");
    if let Some(name) = m.remove("name") {
        m.insert("id".into(), name);
    }
    Ok(Value::Object(m))
}

/// `requires.capabilities.declared` as weft capabilities.
fn declared_caps(req: &Value) -> Result<Vec<String>, String> {
    let Some(list) = req.pointer("/capabilities/declared") else {
        return Ok(Vec::new());
    };
    let Some(items) = list.as_array() else {
        return Err("requires.capabilities.declared: expected a list".into());
    };
    items
        .iter()
        .map(|c| {
            c.as_str()
                .map(capability)
                .ok_or_else(|| format!("requires.capabilities.declared: {c} is not a string"))
        })
        .collect()
}

/// One RyeOS capability in weft's terms.
fn capability(c: &str) -> String {
    let dotted = |rest: &str| rest.replace('/', ".");
    if let Some(rest) = c.strip_prefix("ryeos.execute.tool.") {
        format!("tool.{}", dotted(rest))
    } else if let Some(rest) = c.strip_prefix("ryeos.execute.directive.") {
        format!("thread.spawn.{}", dotted(rest))
    } else {
        c.to_string()
    }
}

/// `context.system: ["knowledge:<id>", …]` → hooks that load each at the thread's start.
fn context_hooks(context: &Value) -> Result<Vec<Value>, String> {
    let Some(ctx) = context.as_object() else {
        return Err("context: expected a mapping".into());
    };
    let mut hooks = Vec::new();
    for (section, items) in ctx {
        let Some(items) = items.as_array() else {
            return Err(format!("context.{section}: expected a list"));
        };
        for (i, item) in items.iter().enumerate() {
            let r = item.as_str().unwrap_or_default();
            let Some(id) = r
                .strip_prefix("knowledge:")
                .filter(|id| super::valid_name(id))
            else {
                return Err(format!("context.{section}[{i}]: `{item}` is not a `knowledge:<id>` reference (weft loads knowledge only)"));
            };
            hooks.push(json!({
                "id": format!("context-{section}-{}", i + 1),
                "event": "thread_started",
                "action": { "primary": "load", "item_type": "knowledge", "item_id": id },
            }));
        }
    }
    Ok(hooks)
}

impl DirectiveSignature {
    /// Whether `key` (a trusted public key) signed this file as it is: its content hash
    /// unchanged and the Ed25519 signature of that hash's text valid.
    pub fn verified_by(&self, key: &ed25519_dalek::VerifyingKey) -> bool {
        let Some(bytes) = base64_decode(&self.signature) else {
            return false;
        };
        let Ok(sig) = ed25519_dalek::Signature::from_slice(&bytes) else {
            return false;
        };
        self.unchanged
            && key
                .verify_strict(self.content_hash.as_bytes(), &sig)
                .is_ok()
    }
}

/// Base64, standard or URL-safe alphabet, padding optional (as RyeOS reads signatures).
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32)
    };
    let t = text.trim().trim_end_matches('=');
    let mut out = Vec::with_capacity(t.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in t.bytes() {
        acc = (acc << 6) | digit(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_line_is_the_signature_and_the_rest_is_hashed_as_it_is() {
        let body = "---\r\ndescription: x\r\n---\r\n<!-- ryeos:signed:a:b:c:d -->\r\nHi.\r\n";
        let hash = crate::core::ids::sha256_hex(body.as_bytes());
        let text = format!("<!-- ryeos:signed:2026-01-01T00:00:00Z:{hash}:sig:fp -->\r\n{body}");
        let (sig, rest) = split_signature(&text);
        let sig = sig.unwrap();
        assert_eq!(rest, body, "CRLF kept, a later signature-like line kept");
        assert!(sig.unchanged);
        assert_eq!((sig.signer.as_str(), sig.signature.as_str()), ("fp", "sig"));
        // One more signature-like line anywhere changes the hash.
        let tampered = text.replace("Hi.", "<!-- ryeos:signed:x<metadata>:a:b:c -->\r\nHi.");
        assert!(!split_signature(&tampered).0.unwrap().unchanged);
        // Not on the first line: not a signature.
        let (none, all) = split_signature(body);
        assert!(none.is_none() && all == body);
    }

    #[test]
    fn base64_reads_both_alphabets_with_or_without_padding() {
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(base64_decode("aGk").unwrap(), b"hi");
        assert_eq!(base64_decode("-_8=").unwrap(), [0xfb, 0xff]);
        assert_eq!(base64_decode("+/8=").unwrap(), [0xfb, 0xff]);
        assert!(base64_decode("a*b").is_none());
    }
}
