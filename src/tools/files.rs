//! A thread's private file area (SPEC §8, §10): `.weft/threads/<id>/files/` and the built-in
//! tools over it — `file_read`, `file_list`, `file_find`, `file_grep` (capability `fs.read`),
//! `file_write`, `file_delete` (`fs.write`).
//!
//! Owns path confinement and the size limits. Must never read, write, list or delete anything
//! outside the area: a path is relative, has no `..`, and whatever part of it exists must resolve
//! (symlinks followed) inside the area; a regular file with more than one name (a hard link,
//! perhaps to a file outside) is neither read nor written. Every walk of the area is bounded
//! (entries visited, time) and says when it was cut. Every refusal is an error result naming the
//! path.

use super::glob::Glob;
use crate::provider::ToolSpec;
use serde_json::{json, Value};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

pub(crate) use crate::project::config::FileLimits;

/// Lines `file_read` returns when no `limit` is given.
const DEFAULT_READ_LINES: u64 = 2000;
/// Bytes of text any one result carries at most.
const MAX_RESULT_BYTES: usize = 256 * 1024;
/// Paths `file_find` lists, and matches `file_grep` reports, at most.
const MAX_HITS: usize = 500;
/// Files larger than this are not searched by `file_grep`.
const MAX_GREP_FILE: u64 = 10 * 1024 * 1024;
/// Entries (files and folders) one `file_find` or `file_grep` visits at most.
const MAX_WALK_ENTRIES: usize = 10_000;
/// Time one `file_find` or `file_grep` may take (it holds the area's lock).
const MAX_WALK_TIME: Duration = Duration::from_secs(5);
/// Characters a glob may have.
const MAX_GLOB_CHARS: usize = 512;

/// A file tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileTool {
    /// `file_read`.
    Read,
    /// `file_list`.
    List,
    /// `file_find`.
    Find,
    /// `file_grep`.
    Grep,
    /// `file_write`.
    Write,
    /// `file_delete`.
    Delete,
}

impl FileTool {
    /// Every file tool, in the order they are offered.
    pub(crate) const ALL: [FileTool; 6] = [
        FileTool::Read,
        FileTool::List,
        FileTool::Find,
        FileTool::Grep,
        FileTool::Write,
        FileTool::Delete,
    ];

    /// Its name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            FileTool::Read => "file_read",
            FileTool::List => "file_list",
            FileTool::Find => "file_find",
            FileTool::Grep => "file_grep",
            FileTool::Write => "file_write",
            FileTool::Delete => "file_delete",
        }
    }

    /// The capability it needs.
    pub(crate) fn capability(self) -> &'static str {
        match self {
            FileTool::Read | FileTool::List | FileTool::Find | FileTool::Grep => "fs.read",
            FileTool::Write | FileTool::Delete => "fs.write",
        }
    }

    /// The file tool called `name` (`run_code`'s `files` helpers name them).
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    pub(crate) fn parse(name: &str) -> Option<FileTool> {
        FileTool::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Its spec (built once).
    pub(crate) fn spec(self) -> ToolSpec {
        static ALL: std::sync::LazyLock<Vec<ToolSpec>> = std::sync::LazyLock::new(all_specs);
        let i = FileTool::ALL.iter().position(|t| *t == self).unwrap_or(0);
        ALL[i].clone()
    }
}

fn all_specs() -> Vec<ToolSpec> {
    let path = json!({"type":"string","description":"relative to this thread's file area"});
    let all = [
        (
            "file_read",
            "Read a text file of this thread's file area (lines offset.., at most limit).",
            json!({"type":"object","properties":{"path":path,"offset":{"type":"integer","description":"first line, 1-based"},"limit":{"type":"integer","description":"number of lines"}},"required":["path"]}),
        ),
        (
            "file_list",
            "List a folder of this thread's file area.",
            json!({"type":"object","properties":{"path":path}}),
        ),
        (
            "file_find",
            "Find files of this thread's file area by glob (`*`, `?`, `**`).",
            json!({"type":"object","properties":{"glob":{"type":"string"}},"required":["glob"]}),
        ),
        (
            "file_grep",
            "Search the files of this thread's file area for a regular expression.",
            json!({"type":"object","properties":{"pattern":{"type":"string"},"path":path},"required":["pattern"]}),
        ),
        (
            "file_write",
            "Create or replace a text file in this thread's file area.",
            json!({"type":"object","properties":{"path":path,"content":{"type":"string"}},"required":["path","content"]}),
        ),
        (
            "file_delete",
            "Delete a file or folder of this thread's file area.",
            json!({"type":"object","properties":{"path":path},"required":["path"]}),
        ),
    ];
    all.into_iter()
        .map(|(name, description, input_schema)| ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema,
        })
        .collect()
}

/// Runs one file tool on `area`. `Ok` is the JSON result, `Err` the error message.
pub(crate) fn run(
    tool: FileTool,
    input: &Value,
    area: &Path,
    limits: FileLimits,
) -> Result<Value, String> {
    std::fs::create_dir_all(area).map_err(|e| format!("the file area cannot be created: {e}"))?;
    let s = |k: &str| input.get(k).and_then(Value::as_str);
    let need = |k: &str| s(k).ok_or_else(|| format!("{} needs `{k}` (a string)", tool.name()));
    match tool {
        FileTool::Read => read(area, need("path")?, input),
        FileTool::List => list(area, s("path").unwrap_or(".")),
        FileTool::Find => find(area, need("glob")?),
        FileTool::Grep => grep(area, need("pattern")?, s("path").unwrap_or(".")),
        FileTool::Write => write(area, need("path")?, need("content")?, limits),
        FileTool::Delete => delete(area, need("path")?),
    }
}

/// `rel` inside `area`, or why not: relative, no `..`, and the part that exists resolves inside
/// the area (a symlink pointing out is refused).
pub(crate) fn resolve(area: &Path, rel: &str) -> Result<PathBuf, String> {
    let refuse = |why: &str| Err(format!("path `{rel}` refused: {why}"));
    if rel.contains('\0') {
        return refuse("it contains a NUL byte");
    }
    let p = Path::new(rel);
    if p.is_absolute() || rel.starts_with('~') {
        return refuse("paths are relative to the thread's file area");
    }
    if p.components().any(|c| matches!(c, Component::ParentDir)) {
        return refuse("`..` would leave the thread's file area");
    }
    // Areas are made on first use: a thread that never touches files costs no folder.
    std::fs::create_dir_all(area).map_err(|e| format!("the file area cannot be made: {e}"))?;
    let root = area
        .canonicalize()
        .map_err(|e| format!("the file area cannot be read: {e}"))?;
    let full = root.join(p);
    // The longest part of the path that exists, with every symlink in it resolved.
    let mut existing = full.as_path();
    while std::fs::symlink_metadata(existing).is_err() {
        match existing.parent() {
            Some(up) => existing = up,
            None => break,
        }
    }
    let resolved = existing
        .canonicalize()
        .or_else(|_| refuse("it goes through a link whose target is missing"))?;
    if !resolved.starts_with(&root) {
        return refuse("it resolves outside the thread's file area (through a symlink)");
    }
    Ok(full)
}

/// Refuses `p` (`rel` of the area) when it is a regular file with more than one name: a hard
/// link may share its contents with a file outside the area, which no symlink check can see.
fn one_name(p: &Path, rel: &str) -> Result<(), String> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_file() && m.nlink() > 1 => Err(format!(
            "path `{rel}` refused: it is a hard link (one file with {} names), which may be a file outside the thread's file area; delete it and write the file anew",
            m.nlink()
        )),
        _ => Ok(()),
    }
}

/// Writes `bytes` to `rel` of `area` (folders made as needed), confined as [`resolve`] says
/// and never through a hard link: how every file of the area is written.
pub(crate) fn write_confined(area: &Path, rel: &str, bytes: &[u8]) -> Result<PathBuf, String> {
    let p = resolve(area, rel)?;
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("`{rel}`: {e}"))?;
    }
    // Re-checked after the folders exist: nothing in between may have become a way out.
    let p = resolve(area, rel)?;
    one_name(&p, rel)?;
    std::fs::write(&p, bytes).map_err(|e| format!("`{rel}`: {e}"))?;
    Ok(p)
}

fn rel_of(area_root: &Path, p: &Path) -> String {
    p.strip_prefix(area_root)
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

fn read(area: &Path, rel: &str, input: &Value) -> Result<Value, String> {
    let p = resolve(area, rel)?;
    if p.is_dir() {
        return Err(format!("`{rel}` is a folder (use file_list)"));
    }
    one_name(&p, rel)?;
    let bytes = std::fs::read(&p).map_err(|e| format!("`{rel}`: {e}"))?;
    let text = String::from_utf8_lossy(&bytes);
    let offset = input
        .get("offset")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .max(1);
    let limit = input
        .get("limit")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_READ_LINES);
    let total = text.lines().count() as u64;
    let mut out = String::new();
    let mut last = offset.saturating_sub(1);
    let mut cut = false;
    for line in text.lines().skip(offset as usize - 1).take(limit as usize) {
        if out.len() + line.len() + 1 > MAX_RESULT_BYTES {
            cut = true;
            break;
        }
        out.push_str(line);
        out.push('\n');
        last += 1;
    }
    Ok(json!({
        "path": rel, "content": out, "from_line": offset, "to_line": last, "total_lines": total,
        "more": last < total, "cut_at_bytes": cut.then_some(MAX_RESULT_BYTES),
    }))
}

fn list(area: &Path, rel: &str) -> Result<Value, String> {
    let p = resolve(area, rel)?;
    let rd = std::fs::read_dir(&p).map_err(|e| format!("`{rel}`: {e}"))?;
    let mut entries: Vec<Value> = rd
        .flatten()
        .filter_map(|e| {
            let m = std::fs::symlink_metadata(e.path()).ok()?;
            let kind = if m.is_dir() {
                "dir"
            } else if m.file_type().is_symlink() {
                "link"
            } else {
                "file"
            };
            Some(json!({"name": e.file_name().to_string_lossy(), "type": kind, "bytes": m.len()}))
        })
        .collect();
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Ok(json!({ "path": rel, "entries": entries }))
}

/// How much of the area a walk may still visit.
struct Budget {
    /// Entries left.
    entries: usize,
    /// When it stops.
    until: Instant,
    /// It ran out.
    cut: bool,
}

impl Budget {
    /// The budget of one `file_find` or `file_grep`.
    fn tool() -> Budget {
        Budget {
            entries: MAX_WALK_ENTRIES,
            until: Instant::now() + MAX_WALK_TIME,
            cut: false,
        }
    }

    /// No bound (the area's size, which a limit is checked against).
    fn all() -> Budget {
        Budget {
            entries: usize::MAX,
            until: Instant::now() + Duration::from_secs(86_400),
            cut: false,
        }
    }

    /// Takes one entry; false (and `cut`) when none is left.
    fn take(&mut self) -> bool {
        if self.entries == 0 || Instant::now() >= self.until {
            self.cut = true;
            return false;
        }
        self.entries -= 1;
        true
    }

    /// What a result says when the walk was cut.
    fn note(&self) -> Option<String> {
        self.cut.then(|| format!("the walk stopped after {MAX_WALK_ENTRIES} entries or {}s of the file area: the answer is incomplete; narrow it to a folder (e.g. `notes/**/*.md`)", MAX_WALK_TIME.as_secs()))
    }
}

/// The regular files under `dir` (links are not followed) while `budget` lasts, sorted per folder.
fn walk(dir: &Path, out: &mut Vec<PathBuf>, budget: &mut Budget) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut items = Vec::new();
    for e in rd.flatten() {
        if !budget.take() {
            break;
        }
        items.push(e.path());
    }
    items.sort();
    for p in items {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => walk(&p, out, budget),
            Ok(m) if m.is_file() => out.push(p),
            _ => {}
        }
    }
}

/// A result with `note` (why it is incomplete) as `cut`, when there is one.
fn with_cut(mut v: Value, note: Option<String>) -> Value {
    if let (Some(n), Some(o)) = (note, v.as_object_mut()) {
        o.insert("cut".into(), json!(n));
    }
    v
}

fn find(area: &Path, glob: &str) -> Result<Value, String> {
    if glob.chars().count() > MAX_GLOB_CHARS {
        return Err(format!(
            "the glob has more than {MAX_GLOB_CHARS} characters: give a shorter one"
        ));
    }
    let root = resolve(area, ".")?;
    let pattern = Glob::new(glob);
    // Only the folder the glob names can hold a match.
    let start = resolve(area, &pattern.folder())?;
    let mut budget = Budget::tool();
    let mut files = Vec::new();
    walk(&start, &mut files, &mut budget);
    let mut hits = Vec::new();
    for f in &files {
        if Instant::now() >= budget.until {
            budget.cut = true;
            break;
        }
        let r = rel_of(&root, f);
        if pattern.matches(&r) {
            hits.push(r);
        }
    }
    let more = hits.len() > MAX_HITS;
    hits.truncate(MAX_HITS);
    let v = json!({ "glob": glob, "paths": hits, "more": more });
    Ok(with_cut(v, budget.note()))
}

fn grep(area: &Path, pattern: &str, rel: &str) -> Result<Value, String> {
    let re = regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("pattern `{pattern}`: {e}"))?;
    let root = resolve(area, ".")?;
    let start = resolve(area, rel)?;
    let mut files = Vec::new();
    let mut budget = Budget::tool();
    if start.is_file() {
        files.push(start);
    } else {
        walk(&start, &mut files, &mut budget);
    }
    let mut hits = Vec::new();
    let mut more = false;
    'files: for f in files {
        // A file with more names may be one outside the area: not read (see `one_name`).
        let m = std::fs::symlink_metadata(&f);
        if m.map_or(true, |m| m.len() > MAX_GREP_FILE || m.nlink() > 1) {
            continue;
        }
        if Instant::now() >= budget.until {
            budget.cut = true;
            break;
        }
        let Ok(bytes) = std::fs::read(&f) else {
            continue;
        };
        if bytes.contains(&0) {
            continue; // binary
        }
        let text = String::from_utf8_lossy(&bytes);
        for (i, line) in text.lines().enumerate() {
            if re.is_match(line) {
                if hits.len() == MAX_HITS {
                    more = true;
                    break 'files;
                }
                let mut shown: String = line.chars().take(300).collect();
                if shown.len() < line.len() {
                    shown.push('…');
                }
                hits.push(json!({"path": rel_of(&root, &f), "line": i + 1, "text": shown}));
            }
        }
    }
    let v = json!({ "pattern": pattern, "matches": hits, "more": more });
    Ok(with_cut(v, budget.note()))
}

fn area_bytes(root: &Path, except: &Path) -> u64 {
    let mut files = Vec::new();
    walk(root, &mut files, &mut Budget::all());
    files
        .iter()
        .filter(|f| f.as_path() != except)
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum()
}

fn write(area: &Path, rel: &str, content: &str, limits: FileLimits) -> Result<Value, String> {
    let p = resolve(area, rel)?;
    if rel.trim_matches(['.', '/']).is_empty() || p.is_dir() {
        return Err(format!("`{rel}` is a folder: give a file path"));
    }
    let n = content.len() as u64;
    if n > limits.max_file_bytes {
        return Err(format!(
            "`{rel}`: {n} bytes is over the file limit of {} bytes (config files.max_file_bytes)",
            limits.max_file_bytes
        ));
    }
    let root = resolve(area, ".")?;
    let used = area_bytes(&root, &p);
    if used + n > limits.max_area_bytes {
        return Err(format!(
            "`{rel}`: the file area would hold {} bytes, over its limit of {} (config files.max_area_bytes); delete something first",
            used + n,
            limits.max_area_bytes
        ));
    }
    write_confined(area, rel, content.as_bytes())?;
    Ok(json!({ "path": rel, "bytes": n }))
}

fn delete(area: &Path, rel: &str) -> Result<Value, String> {
    let p = resolve(area, rel)?;
    let root = resolve(area, ".")?;
    if p == root || rel.trim_matches(['.', '/']).is_empty() {
        return Err("the file area itself cannot be deleted".into());
    }
    let m = std::fs::symlink_metadata(&p).map_err(|e| format!("`{rel}`: {e}"))?;
    if m.is_dir() {
        std::fs::remove_dir_all(&p)
    } else {
        std::fs::remove_file(&p)
    }
    .map_err(|e| format!("`{rel}`: {e}"))?;
    Ok(json!({ "deleted": rel }))
}

/// Copies `rel` of `from_area` (a file, or a folder with everything in it; links are not
/// followed) to `to_rel` in `to_area`: how attachments cross thread boundaries. Both paths are
/// confined to their areas. Returns the bytes copied.
pub(crate) fn copy_between(
    from_area: &Path,
    rel: &str,
    to_area: &Path,
    to_rel: &str,
) -> Result<u64, String> {
    let src = resolve(from_area, rel)?;
    if rel.trim_matches(['.', '/']).is_empty() {
        return Err("attach files or folders of the area, not the whole area".into());
    }
    std::fs::create_dir_all(to_area).map_err(|e| e.to_string())?;
    let dst = resolve(to_area, to_rel)?;
    fn copy(src: &Path, dst: &Path) -> std::io::Result<u64> {
        let m = std::fs::symlink_metadata(src)?;
        if m.is_dir() {
            std::fs::create_dir_all(dst)?;
            let mut n = 0;
            for e in std::fs::read_dir(src)?.flatten() {
                n += copy(&e.path(), &dst.join(e.file_name()))?;
            }
            Ok(n)
        } else if m.is_file() && m.nlink() > 1 {
            Err(std::io::Error::other(format!(
                "{} is a hard link (one file with {} names), which may be a file outside the area; it is not copied",
                src.display(),
                m.nlink()
            )))
        } else if m.is_file() {
            if let Some(d) = dst.parent() {
                std::fs::create_dir_all(d)?;
            }
            // A name already there (a link planted in the target area) is replaced, never
            // written through.
            let _ = std::fs::remove_file(dst);
            std::fs::copy(src, dst)
        } else {
            Ok(0)
        }
    }
    if std::fs::symlink_metadata(&src).is_err() {
        return Err(format!("`{rel}` does not exist in the file area"));
    }
    copy(&src, &dst).map_err(|e| format!("copying `{rel}`: {e}"))
}
