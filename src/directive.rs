//! Directives: markdown with YAML front matter (SPEC §3), lookup, `extends`, input validation and
//! body interpolation.
//!
//! Owns turning text into a validated [`Directive`]. Must never register a thread: every error
//! here happens before anything is written, and names the file, line and column.

use crate::limits::LimitSet;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    inputs: Option<BTreeMap<String, InputSpec>>,
    #[serde(default)]
    outputs: Option<BTreeMap<String, OutputSpec>>,
    #[serde(default)]
    hooks: Option<serde_json::Value>,
    #[serde(default)]
    extends: Option<String>,
    #[serde(default)]
    on_child_error: Option<String>,
    #[serde(default)]
    version: Option<serde_json::Value>,
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
    /// `hooks`.
    pub hooks: bool,
    /// `on_child_error`.
    pub on_child_error: bool,
}

/// Parsed directives by name with the (mtime, length) of their file when parsed.
pub type DirectiveCache =
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, (FileStamp, Directive)>>>;

/// A file's (mtime, length), or None for built-ins.
pub type FileStamp = Option<(std::time::SystemTime, u64)>;

/// Where to look for directives, in order: project → user → built-in.
#[derive(Debug, Clone, Default)]
pub struct Library {
    /// `<project>/directives`.
    pub project_dir: Option<PathBuf>,
    /// `<user config dir>/weft/directives`.
    pub user_dir: Option<PathBuf>,
    /// Parsed directives by name, each with the (mtime, length) of its file when parsed: a
    /// spawn re-reads a directive only when its file changed.
    pub cache: DirectiveCache,
}

/// Built-in directives embedded in the binary: (name, text).
pub const BUILTIN: &[(&str, &str)] = &[("weft/hello", include_str!("../directives/weft/hello.md"))];

impl Library {
    /// Loads a directive by name, or by path when `name_or_path` ends in `.md`.
    pub fn load(&self, name_or_path: &str) -> Result<Directive, DirectiveError> {
        let stamp = self.stamp(name_or_path);
        if let Ok(cache) = self.cache.lock() {
            if let Some((s, d)) = cache.get(name_or_path) {
                if *s == stamp {
                    return Ok(d.clone());
                }
            }
        }
        let d = self.load_chain(name_or_path, &mut Vec::new())?;
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(name_or_path.to_string(), (stamp, d.clone()));
        }
        Ok(d)
    }

    /// The (mtime, length) of the file a name resolves to (None for built-ins and missing files).
    /// `extends` bases are not stamped: edit the directive itself to reload a chain mid-run.
    fn stamp(&self, name_or_path: &str) -> Option<(std::time::SystemTime, u64)> {
        let meta = |p: &Path| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        };
        if name_or_path.ends_with(".md") {
            return meta(Path::new(name_or_path));
        }
        if !valid_name(name_or_path) {
            return None;
        }
        [&self.project_dir, &self.user_dir]
            .into_iter()
            .flatten()
            .find_map(|d| meta(&d.join(format!("{name_or_path}.md"))))
    }

    fn load_chain(
        &self,
        name_or_path: &str,
        seen: &mut Vec<String>,
    ) -> Result<Directive, DirectiveError> {
        let (source, text, default_name) = self.find(name_or_path)?;
        if seen.contains(&source) {
            return Err(DirectiveError {
                file: source,
                line: None,
                message: format!("`extends` forms a cycle: {}", seen.join(" → ")),
            });
        }
        seen.push(source.clone());
        let mut d = parse(&source, &text, &default_name)?;
        if let Some(base_name) = d.extends.clone() {
            let base = self
                .load_chain(&base_name, seen)
                .map_err(|e| DirectiveError {
                    message: format!(
                        "{} (while loading `extends: {base_name}` of {})",
                        e.message, source
                    ),
                    ..e
                })?;
            d = inherit(d, &base);
        }
        Ok(d)
    }

    fn find(&self, name_or_path: &str) -> Result<(String, String, String), DirectiveError> {
        let missing = |what: String| DirectiveError {
            file: name_or_path.into(),
            line: None,
            message: what,
        };
        if name_or_path.ends_with(".md") {
            let p = Path::new(name_or_path);
            let text = std::fs::read_to_string(p)
                .map_err(|e| missing(format!("cannot read directive file: {e}")))?;
            let stem = self
                .project_dir
                .as_ref()
                .and_then(|d| {
                    p.canonicalize()
                        .ok()?
                        .strip_prefix(d.canonicalize().ok()?)
                        .ok()
                        .map(Path::to_path_buf)
                })
                .unwrap_or_else(|| PathBuf::from(p.file_name().unwrap_or_default()));
            let name = stem.with_extension("").to_string_lossy().replace('\\', "/");
            return Ok((p.display().to_string(), text, name));
        }
        if !valid_name(name_or_path) {
            return Err(missing(format!(
                "`{name_or_path}` is not a directive name (expected segments of letters, digits, '_', '-' separated by '/', or a path to a .md file)"
            )));
        }
        for dir in [&self.project_dir, &self.user_dir].into_iter().flatten() {
            let p = dir.join(format!("{name_or_path}.md"));
            if p.is_file() {
                let text = std::fs::read_to_string(&p)
                    .map_err(|e| missing(format!("cannot read {}: {e}", p.display())))?;
                return Ok((p.display().to_string(), text, name_or_path.into()));
            }
        }
        if let Some((n, t)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return Ok((format!("builtin:{n}"), t.to_string(), n.to_string()));
        }
        let mut looked: Vec<String> = [&self.project_dir, &self.user_dir]
            .into_iter()
            .flatten()
            .map(|d| d.join(format!("{name_or_path}.md")).display().to_string())
            .collect();
        looked.push("built-in directives".into());
        Err(missing(format!(
            "no directive named `{name_or_path}` (looked in {})",
            looked.join(", ")
        )))
    }
}

/// Is `name` a safe directive name (no `..`, no absolute paths)?
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        })
}

/// Metadata (not body) comes from `base` where `d`'s own front matter does not set it.
fn inherit(mut d: Directive, base: &Directive) -> Directive {
    let own = d.declared;
    if !own.description {
        d.description = base.description.clone();
    }
    if !own.model {
        d.model = base.model.clone();
    }
    d.limits = base.limits.overlay(&d.limits);
    if !own.permissions {
        d.permissions = base.permissions.clone();
    }
    for (k, v) in &base.inputs {
        d.inputs.entry(k.clone()).or_insert_with(|| v.clone());
    }
    for (k, v) in &base.outputs {
        d.outputs.entry(k.clone()).or_insert_with(|| v.clone());
    }
    if !own.hooks {
        d.hooks = base.hooks.clone();
    }
    if !own.on_child_error {
        d.on_child_error = base.on_child_error;
    }
    d.content_hash =
        crate::signing::sha256_hex(format!("{}{}", d.content_hash, base.content_hash).as_bytes());
    d
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

/// The message of a YAML error without its rendered snippet.
pub fn yaml_message(e: &serde_saphyr::Error) -> String {
    let full = e.to_string();
    let first = full.lines().next().unwrap_or("invalid YAML").trim();
    let first = first.trim_start_matches("error: ");
    // The location is reported separately (shifted to the file's own lines): drop the parser's.
    match first.strip_prefix("line ").and_then(|r| r.split_once(": ")) {
        Some((pos, rest))
            if pos
                .split(' ')
                .next()
                .is_some_and(|n| n.parse::<u64>().is_ok()) =>
        {
            rest.to_string()
        }
        _ => first.to_string(),
    }
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
        return crate::directive_rye::parse(source, text, default_name);
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
        hooks: front.hooks.is_some(),
        on_child_error: front.on_child_error.is_some(),
    };
    let at = |key: &str| crate::config::find_line(&yaml, key).map(|(l, c)| (l + offset - 1, c));
    let limits = match &front.limits {
        Some(m) => LimitSet::from_map(m).map_err(|m| err(at("limits"), m))?,
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
    let _ = front.version;
    Ok(Directive {
        name,
        source: source.into(),
        description: front.description.unwrap_or_default(),
        model: front.model.unwrap_or_default(),
        limits,
        permissions: front.permissions.unwrap_or_default(),
        inputs,
        outputs,
        hooks: front.hooks,
        on_child_error,
        body,
        content_hash: crate::signing::sha256_hex(text.as_bytes()),
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
pub fn type_matches(kind: &str, v: &serde_json::Value) -> bool {
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

impl Directive {
    /// Coerces `-i k=v` text to the declared type of input `k`.
    pub fn coerce_cli_input(
        &self,
        key: &str,
        text: &str,
    ) -> Result<serde_json::Value, DirectiveError> {
        let kind = self
            .inputs
            .get(key)
            .map(|s| s.kind.as_str())
            .unwrap_or("any");
        let v = match kind {
            "string" => Some(serde_json::Value::String(text.into())),
            "any" => Some(
                serde_json::from_str(text)
                    .unwrap_or_else(|_| serde_json::Value::String(text.into())),
            ),
            _ => serde_json::from_str(text).ok(),
        };
        v.filter(|v| type_matches(kind, v))
            .ok_or_else(|| self.error(format!("input `{key}`: `{text}` is not of type {kind}")))
    }

    /// Validates inputs (unknown, missing required, type) and fills defaults.
    pub fn validate_inputs(
        &self,
        given: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<serde_json::Map<String, serde_json::Value>, DirectiveError> {
        let mut out = serde_json::Map::new();
        for (k, v) in given {
            let Some(spec) = self.inputs.get(k) else {
                let known: Vec<&str> = self.inputs.keys().map(String::as_str).collect();
                return Err(self.error(format!(
                    "unknown input `{k}` (this directive takes: {})",
                    if known.is_empty() {
                        "no inputs".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            };
            if !type_matches(&spec.kind, v) {
                return Err(self.error(format!("input `{k}`: {v} is not of type {}", spec.kind)));
            }
            out.insert(k.clone(), v.clone());
        }
        for (k, spec) in &self.inputs {
            if out.contains_key(k) {
                continue;
            }
            match (&spec.default, spec.required) {
                (Some(d), _) => {
                    out.insert(k.clone(), d.clone());
                }
                (None, true) => {
                    return Err(self.error(format!(
                        "missing required input `{k}`{} (pass -i {k}=...)",
                        spec.description
                            .as_ref()
                            .map(|d| format!(" ({d})"))
                            .unwrap_or_default()
                    )))
                }
                (None, false) => {}
            }
        }
        Ok(out)
    }

    /// The body with `{input:k}`, `{input:k?}` and `{input:k|default}` replaced.
    pub fn render(
        &self,
        inputs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, DirectiveError> {
        let mut out = String::with_capacity(self.body.len());
        let mut rest = self.body.as_str();
        while let Some(start) = rest.find("{input:") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 7..];
            let Some(end) = after.find('}') else {
                out.push_str(&rest[start..]);
                rest = "";
                break;
            };
            let spec = &after[..end];
            let (key, fallback, optional) = if let Some((k, d)) = spec.split_once('|') {
                (k, Some(d), true)
            } else if let Some(k) = spec.strip_suffix('?') {
                (k, None, true)
            } else {
                (spec, None, false)
            };
            match inputs.get(key) {
                Some(serde_json::Value::String(s)) => out.push_str(s),
                Some(v) if !v.is_null() => out.push_str(&v.to_string()),
                _ if optional => out.push_str(fallback.unwrap_or("")),
                _ => {
                    return Err(self.error(format!(
                        "the body uses {{input:{key}}} but input `{key}` was not given"
                    )))
                }
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out.trim().to_string())
    }

    /// Checks `directive_return` outputs: required ones present and not null, types right.
    /// Falsy values (0, false, "") count as present.
    pub fn check_outputs(
        &self,
        given: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), String> {
        let mut problems = Vec::new();
        for (k, spec) in &self.outputs {
            match given.get(k) {
                None | Some(serde_json::Value::Null) if spec.required => {
                    problems.push(format!("`{k}` is required"))
                }
                Some(v) if !v.is_null() && !type_matches(&spec.kind, v) => {
                    problems.push(format!("`{k}` must be of type {}, got {v}", spec.kind))
                }
                _ => {}
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!("directive_return refused: {}; call directive_return again with every required output", problems.join("; ")))
        }
    }

    fn error(&self, message: String) -> DirectiveError {
        DirectiveError {
            file: self.source.clone(),
            line: None,
            message: format!("directive `{}`: {message}", self.name),
        }
    }
}
