//! A thread's private file area (SPEC §8, §10): `.weft/threads/<id>/files/` and the built-in
//! tools over it — `file_read`, `file_list`, `file_find`, `file_grep` (capability `fs.read`),
//! `file_write`, `file_delete` (`fs.write`).
//!
//! Owns path confinement and the size limits. Must never read, write, list or delete anything
//! outside the area: a path is relative, has no `..`, and whatever part of it exists must resolve
//! (symlinks followed) inside the area. Every refusal is an error result naming the path.

use crate::provider::ToolSpec;
use serde_json::{json, Value};
use std::path::{Component, Path, PathBuf};

pub(crate) use crate::project::config::FileLimits;

/// Lines `file_read` returns when no `limit` is given.
const DEFAULT_READ_LINES: u64 = 2000;
/// Bytes of text any one result carries at most.
const MAX_RESULT_BYTES: usize = 256 * 1024;
/// Paths `file_find` lists, and matches `file_grep` reports, at most.
const MAX_HITS: usize = 500;
/// Files larger than this are not searched by `file_grep`.
const MAX_GREP_FILE: u64 = 10 * 1024 * 1024;

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

/// Every regular file under `dir` (links are not followed), relative paths sorted.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut items: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    items.sort();
    for p in items {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => walk(&p, out),
            Ok(m) if m.is_file() => out.push(p),
            _ => {}
        }
    }
}

fn find(area: &Path, glob: &str) -> Result<Value, String> {
    let root = resolve(area, ".")?;
    let mut files = Vec::new();
    walk(&root, &mut files);
    let pattern: Vec<&str> = glob.trim_start_matches("./").split('/').collect();
    let hits: Vec<String> = files
        .iter()
        .map(|f| rel_of(&root, f))
        .filter(|r| glob_match(&pattern, &r.split('/').collect::<Vec<_>>()))
        .collect();
    let more = hits.len() > MAX_HITS;
    Ok(
        json!({ "glob": glob, "paths": hits.into_iter().take(MAX_HITS).collect::<Vec<_>>(), "more": more }),
    )
}

/// Glob over path segments: `**` any number of segments, `*` any run within one, `?` one char.
fn glob_match(pat: &[&str], path: &[&str]) -> bool {
    match pat.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|i| glob_match(rest, &path[i..])),
        Some((seg, rest)) => {
            !path.is_empty()
                && segment_match(seg.as_bytes(), path[0].as_bytes())
                && glob_match(rest, &path[1..])
        }
    }
}

fn segment_match(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| segment_match(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && segment_match(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && segment_match(rest, &s[1..]),
    }
}

fn grep(area: &Path, pattern: &str, rel: &str) -> Result<Value, String> {
    let re = regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("pattern `{pattern}`: {e}"))?;
    let root = resolve(area, ".")?;
    let start = resolve(area, rel)?;
    let mut files = Vec::new();
    if start.is_file() {
        files.push(start);
    } else {
        walk(&start, &mut files);
    }
    let mut hits = Vec::new();
    let mut more = false;
    'files: for f in files {
        if std::fs::metadata(&f).map_or(true, |m| m.len() > MAX_GREP_FILE) {
            continue;
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
    Ok(json!({ "pattern": pattern, "matches": hits, "more": more }))
}

fn area_bytes(root: &Path, except: &Path) -> u64 {
    let mut files = Vec::new();
    walk(root, &mut files);
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
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("`{rel}`: {e}"))?;
    }
    // Re-checked after the folders exist: nothing in between may have become a way out.
    let p = resolve(area, rel)?;
    std::fs::write(&p, content).map_err(|e| format!("`{rel}`: {e}"))?;
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
        } else if m.is_file() {
            if let Some(d) = dst.parent() {
                std::fs::create_dir_all(d)?;
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_by_segment() {
        let m = |p: &str, s: &str| {
            glob_match(
                &p.split('/').collect::<Vec<_>>(),
                &s.split('/').collect::<Vec<_>>(),
            )
        };
        assert!(m("*.md", "a.md"));
        assert!(!m("*.md", "d/a.md"));
        assert!(m("**/*.md", "d/e/a.md"));
        assert!(m("**/*.md", "a.md"));
        assert!(m("d/?.txt", "d/x.txt"));
        assert!(!m("d/?.txt", "d/xy.txt"));
    }
}
