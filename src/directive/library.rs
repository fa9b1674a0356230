//! Directive lookup (project → user → built-in), the parse cache, and `extends`.

use super::{parse, valid_name, Directive, DirectiveError};
use crate::project::Project;
use std::path::{Path, PathBuf};

/// Parsed directives by name with the (mtime, length) of their file when parsed.
pub(crate) type DirectiveCache =
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, (FileStamp, Directive)>>>;

/// A file's (mtime, length), or None for built-ins.
pub(crate) type FileStamp = Option<(std::time::SystemTime, u64)>;

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
pub(crate) const BUILTIN: &[(&str, &str)] =
    &[("weft/hello", include_str!("../../directives/weft/hello.md"))];

impl Library {
    /// The library of `project`: its `directives/`, then the user's, then the built-ins.
    pub fn for_project(project: &Project) -> Library {
        Library {
            project_dir: Some(project.directives_dir()),
            user_dir: Some(crate::project::user_dir().join("directives")),
            cache: Default::default(),
        }
    }

    /// Loads a directive by library name only (`research/answer`): what a model may ask for.
    /// A path, `..`, an empty segment or an absolute name is refused before any file is read.
    pub fn load_name(&self, name: &str) -> Result<Directive, DirectiveError> {
        if !valid_name(name) || name.ends_with(".md") {
            return Err(DirectiveError {
                file: name.into(),
                line: None,
                message: format!("`{name}` is not a directive name: expected a library name such as `research/answer` (segments of letters, digits, '_', '-', '.'; no `..`, no empty segment, no absolute or file path)"),
            });
        }
        self.load(name)
    }

    /// Loads a directive by name, or by path when `name_or_path` ends in `.md` (for the user:
    /// the command line and `extends`; never for a model's request, see [`Library::load_name`]).
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

    /// Every directive name the library resolves (project, user, built-in; `.md` files up to
    /// 8 folders deep, names that are valid only), sorted, each once.
    pub fn names(&self) -> Vec<String> {
        let mut out: Vec<String> = BUILTIN.iter().map(|(n, _)| n.to_string()).collect();
        for dir in [&self.project_dir, &self.user_dir].into_iter().flatten() {
            walk_names(dir, "", 0, &mut out);
        }
        out.sort();
        out.dedup();
        out
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

/// The `.md` files under `dir` (as `prefix`), as directive names, into `out`.
fn walk_names(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let path = e.path();
        let kind = e.file_type().ok();
        if kind.is_some_and(|k| k.is_dir()) && depth < 8 && !name.starts_with('.') {
            walk_names(&path, &format!("{prefix}{name}/"), depth + 1, out);
        } else if let Some(stem) = name.strip_suffix(".md") {
            let full = format!("{prefix}{stem}");
            if valid_name(&full) {
                out.push(full);
            }
        }
    }
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
    if !own.approval {
        d.approval = base.approval.clone();
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
        crate::core::ids::sha256_hex(format!("{}{}", d.content_hash, base.content_hash).as_bytes());
    d.extends_signatures
        .push((base.source.clone(), base.signature.clone()));
    d.extends_signatures
        .extend(base.extends_signatures.iter().cloned());
    d
}
