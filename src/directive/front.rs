//! A directive's markdown form: YAML front matter (checked field by field, errors naming
//! file, line and column) and the body that becomes the prompt. Rye OS's XML form goes to
//! `rye.rs`.

use super::{
    type_matches, valid_name, Declared, Directive, DirectiveError, InputSpec, ModelSpec,
    OnChildError, OutputSpec,
};
use crate::core::limits::LimitSet;
use crate::project::yaml::yaml_message;
use serde::Deserialize;
use std::collections::BTreeMap;

/// A directive's front matter (SPEC §3); `weft schema directive` is derived from it.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct Front {
    /// The directive's name (default: its path under `directives/`, without `.md`).
    #[serde(default)]
    name: Option<String>,
    /// One line saying what it does.
    #[serde(default)]
    description: Option<String>,
    /// The model: a tier (`fast`, `smart`), an id, a provider.
    #[serde(default)]
    model: Option<ModelSpec>,
    /// Limits of its threads (children are capped by their parent's).
    #[serde(default)]
    #[cfg_attr(
        feature = "cli",
        schemars(schema_with = "crate::core::limits::json_schema")
    )]
    limits: Option<serde_json::Map<String, serde_json::Value>>,
    /// Capabilities its threads hold (e.g. `thread.spawn.research.*`, `fs.read`).
    #[serde(default)]
    permissions: Option<Vec<String>>,
    /// Tools (names or capability patterns) whose calls wait for a person's approval.
    #[serde(default)]
    approval: Option<Vec<String>>,
    /// Declared inputs, by name.
    #[serde(default)]
    inputs: Option<BTreeMap<String, InputSpec>>,
    /// Declared outputs, by name (checked by `directive_return`).
    #[serde(default)]
    outputs: Option<BTreeMap<String, OutputSpec>>,
    /// Hooks of this directive's threads (layer 1; the same shape as a hooks file's).
    #[serde(default)]
    #[cfg_attr(
        feature = "cli",
        schemars(with = "Option<Vec<serde_json::Map<String, serde_json::Value>>>")
    )]
    hooks: Option<serde_json::Value>,
    /// A directive whose metadata this one inherits.
    #[serde(default)]
    extends: Option<String>,
    /// What a parent does when a child ends in error.
    #[serde(default)]
    on_child_error: Option<OnChildError>,
    /// Rye's `version:` — accepted and not kept: a directive is identified by its name and
    /// its content hash, never by a version it declares.
    #[serde(default, rename = "version")]
    #[cfg_attr(feature = "cli", schemars(with = "Option<serde_json::Value>"))]
    _version: Option<serde::de::IgnoredAny>,
}

/// JSON Schema of a directive's front matter.
#[cfg(feature = "cli")]
pub(crate) fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Front)).unwrap_or_default()
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
    let (signature, unsigned) = super::ryeos::split_signature(text);
    let mut d = parse_unsigned(source, text, unsigned, default_name)?;
    // The hash is of the whole file, the signature line included; what was parsed is what
    // the signature covers.
    d.content_hash = crate::core::ids::sha256_hex(text.as_bytes());
    d.signature = signature.map(Box::new);
    Ok(d)
}

/// Parses `unsigned` (`text` without a RyeOS signature line; `text` is what is hashed).
fn parse_unsigned(
    source: &str,
    text: &str,
    unsigned: &str,
    default_name: &str,
) -> Result<Directive, DirectiveError> {
    let err = |line: Option<(u64, u64)>, message: String| DirectiveError {
        file: source.into(),
        line,
        message,
    };
    if unsigned.contains("```xml") && !unsigned.trim_start().starts_with("---") {
        return super::rye::parse(source, unsigned, default_name);
    }
    // The signature line, if any, is not part of the front matter; lines are counted without it.
    let shift = u64::from(unsigned.len() != text.len());
    let (yaml, body, offset) =
        split_front(unsigned).map_err(|(l, m)| err(Some((l + shift, 1)), m))?;
    let offset = offset + shift;
    let front = read_front(&yaml, offset).map_err(|(loc, m)| err(loc, m))?;
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
        on_child_error: front.on_child_error.unwrap_or_default(),
        body,
        content_hash: crate::core::ids::sha256_hex(text.as_bytes()),
        extends: front.extends,
        declared,
        signature: None,
        extends_signatures: Vec::new(),
    })
}

/// The front matter in `yaml` (its first line at `offset` of the file): weft's own, read
/// directly (errors at their line), or RyeOS's dialect, mapped onto weft's first.
fn read_front(yaml: &str, offset: u64) -> Result<Front, (Option<(u64, u64)>, String)> {
    if yaml.trim().is_empty() {
        return Ok(Front::default());
    }
    let direct = |yaml: &str| {
        serde_saphyr::from_str::<Front>(yaml).map_err(|e| {
            let loc = e.location().map(|l| (l.line() + offset - 1, l.column()));
            (loc, format!("invalid front matter: {}", yaml_message(&e)))
        })
    };
    let value: serde_json::Value = match serde_saphyr::from_str(yaml) {
        Ok(v) => v,
        Err(_) => return direct(yaml),
    };
    if !super::ryeos::is_dialect(&value) {
        return direct(yaml);
    }
    let mapped = super::ryeos::normalize(value)
        .map_err(|m| (Some((offset, 1)), format!("RyeOS front matter: {m}")))?;
    serde_json::from_value(mapped).map_err(|e| {
        (
            Some((offset, 1)),
            format!("invalid front matter (RyeOS dialect): {e}"),
        )
    })
}

fn check_type_name(kind: &str) -> Result<(), String> {
    match kind {
        "string" | "integer" | "number" | "boolean" | "array" | "object" | "any" => Ok(()),
        other => Err(format!("unknown type `{other}` (expected string, integer, number, boolean, array, object or any)")),
    }
}
