//! Compatibility reader for Rye OS directives: markdown with one ```xml fence holding
//! `<directive><metadata>…</metadata><inputs/><outputs/></directive>` (SPEC §3).
//!
//! Maps Rye's limits, permissions, model tier, inputs and outputs onto [`Directive`]. Follows the
//! upstream parser where it is lenient: `<permissions>` outside `<metadata>` and non-`<output>`
//! children of `<outputs>` are ignored. A `<!-- ryeos:signed:… -->` first line is read by
//! `ryeos.rs` (checked at a thread's start); older `rye:signed` comments are skipped unchecked.

use crate::core::limits::LimitSet;
use crate::directive::{Directive, DirectiveError, InputSpec, ModelSpec, OnChildError, OutputSpec};
use std::collections::BTreeMap;

/// Parses a Rye directive.
pub(crate) fn parse(
    source: &str,
    text: &str,
    default_name: &str,
) -> Result<Directive, DirectiveError> {
    let err = |line: u64, message: String| DirectiveError {
        file: source.into(),
        line: Some((line, 1)),
        message,
    };
    let (xml, fence_line) = xml_fence(text).map_err(|(line, m)| err(line, m))?;
    let line_of = |needle: &str| {
        xml.find(needle)
            .map_or(fence_line, |i| fence_line + xml[..i].lines().count() as u64)
    };
    let (dir_attrs, _) = tag(xml, "directive").ok_or_else(|| {
        err(
            fence_line,
            "expected a <directive> element in the xml fence".into(),
        )
    })?;
    let meta = tag(xml, "metadata")
        .map(|(_, inner)| inner)
        .unwrap_or_default();
    let description = tag(&meta, "description")
        .map(|(_, t)| unescape(t.trim()))
        .unwrap_or_default();
    let limits = rye_limits(&meta).map_err(|m| err(line_of("<limits"), m))?;
    let permissions = tag(&meta, "permissions")
        .map(|(_, inner)| rye_permissions(&inner))
        .unwrap_or_default();
    let inputs = rye_inputs(xml).map_err(|m| err(line_of("<input"), m))?;
    // The lookup name (path under directives/) wins; the XML name only when there is none.
    let name = if crate::directive::valid_name(default_name) {
        default_name.to_string()
    } else {
        attr(&dir_attrs, "name").unwrap_or_else(|| "rye".into())
    };
    Ok(Directive {
        name,
        source: source.into(),
        description,
        model: rye_model(&meta),
        limits,
        permissions,
        approval: Vec::new(),
        inputs,
        outputs: rye_outputs(xml),
        hooks: None,
        on_child_error: OnChildError::Continue,
        body: without_signatures(text),
        content_hash: crate::core::ids::sha256_hex(text.as_bytes()),
        extends: None,
        declared: Default::default(),
        signature: None,
        extends_signatures: Vec::new(),
    })
}

/// The text of the ```xml fence and the fence's line; an error is (line, message).
fn xml_fence(text: &str) -> Result<(&str, u64), (u64, String)> {
    let start = text
        .find("```xml")
        .ok_or_else(|| (1, "expected a ```xml fence".to_string()))?;
    let fence_line = text[..start].lines().count() as u64 + 1;
    let xml_start = start + 6;
    let xml_len = text[xml_start..]
        .find("```")
        .ok_or_else(|| (fence_line, "the ```xml fence is not closed".to_string()))?;
    Ok((&text[xml_start..xml_start + xml_len], fence_line))
}

/// `<model tier=… id=… provider=…/>` of the metadata.
fn rye_model(meta: &str) -> ModelSpec {
    tag(meta, "model")
        .map(|(a, _)| ModelSpec {
            tier: attr(&a, "tier"),
            id: attr(&a, "id"),
            provider: attr(&a, "provider"),
        })
        .unwrap_or_default()
}

/// `<limits …/>` of the metadata: one attribute per limit name.
fn rye_limits(meta: &str) -> Result<LimitSet, String> {
    let mut limits = LimitSet::default();
    if let Some((a, _)) = tag(meta, "limits") {
        for name in crate::core::limits::LIMIT_NAMES {
            if let Some(v) = attr(&a, name) {
                limits
                    .set(name, &serde_json::Value::String(v))
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(limits)
}

/// `<inputs><input name=… type=… required=…>description</input></inputs>` (`float` is a
/// `number`); an input without a name is an error.
fn rye_inputs(xml: &str) -> Result<BTreeMap<String, InputSpec>, String> {
    let mut inputs = BTreeMap::new();
    let Some((_, inner)) = tag(xml, "inputs") else {
        return Ok(inputs);
    };
    for (a, body) in all_tags(&inner, "input") {
        let Some(name) = attr(&a, "name") else {
            return Err("<input> without name".into());
        };
        let kind = attr(&a, "type").unwrap_or_else(|| "any".into());
        let kind = if kind == "float" {
            "number".into()
        } else {
            kind
        };
        inputs.insert(
            name,
            InputSpec {
                kind,
                required: attr(&a, "required").as_deref() == Some("true"),
                default: None,
                description: Some(unescape(body.trim())).filter(|d| !d.is_empty()),
            },
        );
    }
    Ok(inputs)
}

/// `<outputs><output name=… type=… required=…>description</output></outputs>`; an output
/// without a name is skipped, as upstream does.
fn rye_outputs(xml: &str) -> BTreeMap<String, OutputSpec> {
    let mut outputs = BTreeMap::new();
    let Some((_, inner)) = tag(xml, "outputs") else {
        return outputs;
    };
    for (a, body) in all_tags(&inner, "output") {
        if let Some(name) = attr(&a, "name") {
            outputs.insert(
                name,
                OutputSpec {
                    kind: attr(&a, "type").unwrap_or_else(|| "any".into()),
                    required: attr(&a, "required").as_deref() == Some("true"),
                    description: Some(unescape(body.trim())).filter(|d| !d.is_empty()),
                },
            );
        }
    }
    outputs
}

/// The directive's text without upstream signature comments.
fn without_signatures(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with("<!-- rye:signed:") && !l.starts_with("# rye:signed:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `<execute><tool>X</tool></execute>` → `tool.X` (with `/` as `.`); Rye's thread spawner tool
/// → `thread.spawn.**`; a bare `*` → `**`.
fn rye_permissions(inner: &str) -> Vec<String> {
    if inner.trim() == "*" {
        return vec!["**".into()];
    }
    let mut caps = Vec::new();
    for (_, exec) in all_tags(inner, "execute") {
        for (_, tool) in all_tags(&exec, "tool") {
            let t = tool.trim();
            let cap = if t == "rye/agent/threads/thread_directive" {
                "thread.spawn.**".to_string()
            } else {
                format!("tool.{}", t.replace('/', "."))
            };
            if !caps.contains(&cap) {
                caps.push(cap);
            }
        }
    }
    caps
}

/// The first `<name ...>inner</name>` or `<name .../>`: (attribute text, inner text).
fn tag(xml: &str, name: &str) -> Option<(String, String)> {
    all_tags(xml, name).into_iter().next()
}

fn all_tags(xml: &str, name: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let open = format!("<{name}");
    let close = format!("</{name}>");
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        if !after.starts_with(|c: char| c.is_whitespace() || c == '>' || c == '/') {
            rest = after;
            continue;
        }
        let Some(gt) = after.find('>') else { break };
        let attrs = after[..gt].trim_end_matches('/').to_string();
        if after[..gt].ends_with('/') {
            out.push((attrs, String::new()));
            rest = &after[gt + 1..];
            continue;
        }
        let inner_all = &after[gt + 1..];
        let Some(end) = inner_all.find(&close) else {
            break;
        };
        out.push((attrs, inner_all[..end].to_string()));
        rest = &inner_all[end + close.len()..];
    }
    out
}

fn attr(attrs: &str, name: &str) -> Option<String> {
    let mut rest = attrs;
    let pat = format!("{name}=");
    while let Some(i) = rest.find(&pat) {
        let before_ok = i == 0 || rest[..i].ends_with(char::is_whitespace);
        let after = &rest[i + pat.len()..];
        if before_ok {
            let q = after.chars().next()?;
            if q == '"' || q == '\'' {
                let end = after[1..].find(q)?;
                return Some(unescape(&after[1..1 + end]));
            }
        }
        rest = after;
    }
    None
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}
