//! Directives: markdown with YAML front matter (SPEC §3) parsed into a validated [`Directive`];
//! Rye OS XML directives (`rye`); RyeOS's YAML dialect and signature line (`ryeos`); lookup
//! and `extends` (`library`); inputs, rendering and outputs (`io`).
//!
//! Owns turning text into a validated [`Directive`]. Must never register a thread: every error
//! here happens before anything is written, and names the file, line and column.

mod front;
mod io;
mod library;
pub(crate) mod rye;
mod ryeos;

#[cfg(feature = "cli")]
pub(crate) use front::json_schema;
pub use front::parse;
pub use io::OutputsError;
pub use library::Library;
pub use ryeos::DirectiveSignature;

use crate::core::limits::LimitSet;
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
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
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
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
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
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
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

/// What a parent does when a child ends in error (front matter `on_child_error:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnChildError {
    /// The error comes back as a tool result; siblings keep running (default).
    #[default]
    Continue,
    /// Cancel the remaining children, keep the parent running.
    CancelSiblings,
    /// Fail the parent.
    Fail,
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
    /// A RyeOS signature line the file starts with (checked against a trusted key when a
    /// thread starts; see `ryeos.rs`).
    pub signature: Option<Box<DirectiveSignature>>,
    /// The files it `extends` (nearest first), each with its RyeOS signature if it has one:
    /// their metadata is part of the directive, so their signatures are checked too.
    pub extends_signatures: Vec<(String, Option<Box<DirectiveSignature>>)>,
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

/// Is `name` a safe directive name (no `..`, no absolute paths)?
pub(crate) fn valid_name(name: &str) -> bool {
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

    #[test]
    fn on_child_error_reads_its_three_policies_and_names_a_fourth_at_its_line() {
        let d = |v: &str| {
            super::parse(
                "x.md",
                &format!("---\non_child_error: {v}\n---\nGo.\n"),
                "x",
            )
        };
        assert_eq!(
            d("cancel_siblings").unwrap().on_child_error,
            super::OnChildError::CancelSiblings
        );
        assert_eq!(d("fail").unwrap().on_child_error, super::OnChildError::Fail);
        let e = d("explode").unwrap_err().to_string();
        assert!(e.contains("x.md:2") && e.contains("cancel_siblings"), "{e}");
    }
}
