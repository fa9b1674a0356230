//! Directives: markdown with YAML front matter (SPEC §3) parsed into a validated [`Directive`];
//! Rye OS XML directives (`rye`); lookup and `extends` (`library`); inputs, rendering and
//! outputs (`io`).
//!
//! Owns turning text into a validated [`Directive`]. Must never register a thread: every error
//! here happens before anything is written, and names the file, line and column.

mod io;
mod library;
pub(crate) mod rye;

pub use io::OutputsError;
pub use library::Library;
pub(crate) use library::{valid_name, FileStamp};

use crate::core::limits::LimitSet;
use crate::project::yaml::yaml_message;
use serde::Deserialize;
use std::collections::BTreeMap;

/// A directive error: which file, where, and what was expected.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{file}{}: {message}", line.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
pub struct DirectiveError {
    /// The directive file (or `builtin:<name>`).
    pub file: String,
    /// 1-based line and column in the file, when known.
    pub line: Option<(u64, u64)>,
    /// What is wrong and what to do.
    pub message: String,
}

/// Which model a directive asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// A tier name resolved through the provider's `tiers` (e.g. `fast`).
    #[serde(default)]
    pub tier: Option<String>,
    /// An explicit model id.
    #[serde(default)]
    pub id: Option<String>,
    /// A provider name from config.
    #[serde(default)]
    pub provider: Option<String>,
}

/// A declared input.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    /// string, integer, number, boolean, array, object or any.
    #[serde(rename = "type", default = "any")]
    pub kind: String,
    /// Must be given.
    #[serde(default)]
    pub required: bool,
    /// Used when not given.
    #[serde(default)]
    pub default: Option<serde_json::Value>,
    /// Shown to the model and in errors.
    #[serde(default)]
    pub description: Option<String>,
}

/// A declared output (checked by `directive_return`).
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// Same types as inputs.
    #[serde(rename = "type", default = "any")]
    pub kind: String,
    /// Must be present and not null.
    #[serde(default)]
    pub required: bool,
    /// Shown to the model.
    #[serde(default)]
    pub description: Option<String>,
}

fn any() -> String {
    "any".into()
}

/// What a parent does when a child ends in error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnChildError {
    /// The error comes back as a tool result; siblings keep running (default).
    #[default]
    Continue,
    /// Cancel the remaining children, keep the parent running.
    CancelSiblings,
    /// Fail the parent.
    Fail,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Front {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    model: Option<ModelSpec>,
    #[serde(default)]
    limits: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    permissions: Option<Vec<String>>,
    #[serde(default)]
    approval: Option<Vec<String>>,
    #[serde(default)]
    inputs: Option<BTreeMap<String, InputSpec>>,
    #[serde(default)]
    outputs: Option<BTreeMap<String, OutputSpec>>,
    #[serde(default)]
    hooks: Option<serde_json::Value>,
    #[serde(default)]
    extends: Option<String>,
    #[serde(default)]
    on_child_error: Option<String>,
    /// Rye's `version:` — accepted and not kept: a directive is identified by its name and
    /// its content hash, never by a version it declares.
    #[serde(default, rename = "version")]
    _version: Option<serde::de::IgnoredAny>,
}

/// A loaded, validated directive.
#[derive(Debug, Clone)]
pub struct Directive {
    /// Name, e.g. `research/fanout`.
    pub name: String,
    /// Where it came from (path, or `builtin:<name>`).
    pub source: String,
    /// One-line description.
    pub description: String,
    /// Requested model.
    pub model: ModelSpec,
    /// Limits the directive sets.
    pub limits: LimitSet,
    /// Declared capabilities (empty = inherit the parent's).
    pub permissions: Vec<String>,
    /// Tools whose calls wait for a person's approval: tool names or capability patterns.
    pub approval: Vec<String>,
    /// Declared inputs.
    pub inputs: BTreeMap<String, InputSpec>,
    /// Declared outputs.
    pub outputs: BTreeMap<String, OutputSpec>,
    /// Layer-1 hooks, kept as written until the hooks engine reads them.
    pub hooks: Option<serde_json::Value>,
    /// Policy for children ending in error.
    pub on_child_error: OnChildError,
    /// The prompt template.
    pub body: String,
    /// sha256 of the file's bytes (and of every file it extends), hex.
    pub content_hash: String,
    /// The directive whose metadata this one inherits.
    pub extends: Option<String>,
    /// Which inheritable keys the file itself sets (the rest come from `extends`).
    pub declared: Declared,
}

/// Front-matter keys a directive sets itself, for `extends`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Declared {
    /// `description`.
    pub description: bool,
    /// `model`.
    pub model: bool,
    /// `permissions`.
    pub permissions: bool,
    /// `approval`.
    pub approval: bool,
    /// `hooks`.
    pub hooks: bool,
    /// `on_child_error`.
    pub on_child_error: bool,
}

/// Splits `---\nyaml\n---\nbody`; returns (yaml, body, line number of the yaml's first line).
fn split_front(text: &str) -> Result<(String, String, u64), (u64, String)> {
    let t = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = t.lines();
    match lines.next() {
        Some(first) if first.trim_end() == "---" => {}
        _ => {
            return Err((
                1,
                "expected front matter: the file must start with a line `---`".into(),
            ))
        }
    }
    let mut yaml = String::new();
    let mut n = 1u64;
    for line in lines.by_ref() {
        n += 1;
        if line.trim_end() == "---" {
            let body: Vec<&str> = lines.collect();
            return Ok((yaml, body.join("\n"), 2));
        }
        yaml.push_str(line);
        yaml.push('\n');
    }
    Err((
        n,
        "front matter is not closed: expected a line `---` after the YAML".into(),
    ))
}

/// Parses a directive's text. `source` names it in errors; `default_name` is used when the
/// front matter has no `name`.
pub fn parse(source: &str, text: &str, default_name: &str) -> Result<Directive, DirectiveError> {
    let err = |line: Option<(u64, u64)>, message: String| DirectiveError {
        file: source.into(),
        line,
        message,
    };
    if text.contains("```xml") && !text.trim_start().starts_with("---") {
        return crate::directive::rye::parse(source, text, default_name);
    }
    let (yaml, body, offset) = split_front(text).map_err(|(l, m)| err(Some((l, 1)), m))?;
    let front: Front = if yaml.trim().is_empty() {
        Front::default()
    } else {
        serde_saphyr::from_str(&yaml).map_err(|e| {
            let loc = e.location().map(|l| (l.line() + offset - 1, l.column()));
            err(loc, format!("invalid front matter: {}", yaml_message(&e)))
        })?
    };
    let declared = Declared {
        description: front.description.is_some(),
        model: front.model.is_some(),
        permissions: front.permissions.is_some(),
        approval: front.approval.is_some(),
        hooks: front.hooks.is_some(),
        on_child_error: front.on_child_error.is_some(),
    };
    let at =
        |key: &str| crate::project::yaml::find_line(&yaml, key).map(|(l, c)| (l + offset - 1, c));
    let limits = match &front.limits {
        Some(m) => LimitSet::from_map(m).map_err(|m| err(at("limits"), m.to_string()))?,
        None => LimitSet::default(),
    };
    let name = front
        .name
        .clone()
        .unwrap_or_else(|| default_name.to_string());
    if !valid_name(&name) {
        return Err(err(
            at("name"),
            format!("`{name}` is not a valid directive name"),
        ));
    }
    let inputs = front.inputs.unwrap_or_default();
    for (k, spec) in &inputs {
        check_type_name(&spec.kind).map_err(|m| err(at(k), format!("input `{k}`: {m}")))?;
        if let Some(d) = &spec.default {
            if !type_matches(&spec.kind, d) {
                return Err(err(
                    at(k),
                    format!("input `{k}`: default {d} is not of type {}", spec.kind),
                ));
            }
        }
    }
    let outputs = front.outputs.unwrap_or_default();
    for (k, spec) in &outputs {
        check_type_name(&spec.kind).map_err(|m| err(at(k), format!("output `{k}`: {m}")))?;
    }
    let on_child_error = match front.on_child_error.as_deref() {
        None | Some("continue") => OnChildError::Continue,
        Some("cancel_siblings") => OnChildError::CancelSiblings,
        Some("fail") => OnChildError::Fail,
        Some(other) => {
            return Err(err(
                at("on_child_error"),
                format!("on_child_error: `{other}` (expected continue, cancel_siblings or fail)"),
            ))
        }
    };
    for p in front.permissions.iter().flatten() {
        if p.is_empty() || p.split('.').any(str::is_empty) {
            return Err(err(
                at("permissions"),
                format!("permission `{p}` has an empty segment"),
            ));
        }
    }
    Ok(Directive {
        name,
        source: source.into(),
        description: front.description.unwrap_or_default(),
        model: front.model.unwrap_or_default(),
        limits,
        permissions: front.permissions.unwrap_or_default(),
        approval: front.approval.unwrap_or_default(),
        inputs,
        outputs,
        hooks: front.hooks,
        on_child_error,
        body,
        content_hash: crate::core::ids::sha256_hex(text.as_bytes()),
        extends: front.extends,
        declared,
    })
}

fn check_type_name(kind: &str) -> Result<(), String> {
    match kind {
        "string" | "integer" | "number" | "boolean" | "array" | "object" | "any" => Ok(()),
        other => Err(format!("unknown type `{other}` (expected string, integer, number, boolean, array, object or any)")),
    }
}

/// Does `v` have JSON type `kind`?
pub(crate) fn type_matches(kind: &str, v: &serde_json::Value) -> bool {
    use serde_json::Value as V;
    match kind {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => matches!(v, V::Number(_)),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_declared_version_is_accepted_and_a_misspelt_key_is_not() {
        let d = super::parse(
            "x.md",
            "---\nname: x\nversion: \"1.0.0\"\n---\nDo it.\n",
            "x",
        );
        assert_eq!(d.map(|d| d.name).ok().as_deref(), Some("x"));
        let e = super::parse("x.md", "---\nname: x\nversoin: 1\n---\nDo it.\n", "x").unwrap_err();
        assert!(e.to_string().contains("x.md:3"), "{e}");
    }
}
