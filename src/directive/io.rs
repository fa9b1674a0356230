//! A directive's inputs (validation, CLI coercion), body rendering and output checks.

use super::{type_matches, Directive, DirectiveError};
use crate::core::limits::{nests_deeper, MAX_NESTING};

/// Outputs a `directive_return` gave that the directive's `outputs` refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "directive_return refused: {}; call directive_return again with every required output",
    .problems.join("; ")
)]
pub struct OutputsError {
    /// Each output missing or of the wrong type, e.g. "`summary` is required".
    pub problems: Vec<String>,
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
            if nests_deeper(v, MAX_NESTING - 1) {
                return Err(self.error(format!(
                    "input `{k}` nests deeper than {} levels (weft takes at most that many)",
                    MAX_NESTING - 1
                )));
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
    ) -> Result<(), OutputsError> {
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
            Err(OutputsError { problems })
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
