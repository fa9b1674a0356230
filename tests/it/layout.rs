//! The house stays readable: every top-level room of `src/` imports only rooms below it (so no
//! import circle can form), and no source file grows past the size that asks to be split.
//! Reads the source tree; what it enforces is written in ARCHITECTURE.md.

use crate::support::files_with_ext;
use std::collections::BTreeMap;
use std::path::Path;

/// The layers, lowest first. A room may import rooms of a strictly lower layer only.
const LAYERS: &[&[&str]] = &[
    &["core"],
    &["sql"],
    &["project"],
    &["directive", "record"],
    &["ledger", "registry", "provider"],
    &["store"],
    &["tools", "hooks"],
    &["thread"],
    &["runtime"],
    &["server"],
    &["cli"],
];

const MAX_LINES: usize = 650;

fn layer_of(room: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&room))
}

/// `crate::<room>` references of one file (comments included: a doc link is a dependency too).
fn rooms_used(text: &str) -> Vec<String> {
    text.match_indices("crate::")
        .map(|(i, _)| {
            text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

#[test]
fn rooms_import_only_lower_layers_and_files_stay_small() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut big = Vec::new();
    let mut rooms_seen = 0;
    for file in files_with_ext(&src, "rs") {
        let rel = file.strip_prefix(&src).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        let lines = text.lines().count();
        if lines > MAX_LINES {
            big.push(format!("{} ({lines} lines)", rel.display()));
        }
        let Some(first) = rel.components().next() else {
            continue;
        };
        let room = first.as_os_str().to_string_lossy().replace(".rs", "");
        let Some(own) = layer_of(&room) else {
            // lib.rs and main.rs sit above every room.
            assert!(
                ["lib", "main"].contains(&room.as_str()),
                "{}: room `{room}` is in no layer; add it to LAYERS and ARCHITECTURE.md",
                rel.display()
            );
            continue;
        };
        rooms_seen += 1;
        assert!(
            !text.contains("crate::{"),
            "{}: import rooms one per `use` line so the layering stays checkable",
            rel.display()
        );
        for used in rooms_used(&text) {
            if used == room {
                continue;
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                _ => wrong
                    .entry(format!("{} ({room})", rel.display()))
                    .or_default()
                    .push(used),
            }
        }
    }
    assert!(rooms_seen > 30, "read only {rooms_seen} files of src/");
    assert!(
        wrong.is_empty(),
        "imports that point up or sideways (a circle in the making): {wrong:#?}"
    );
    assert!(big.is_empty(), "files to split by concern: {big:?}");
}

/// Longest function body the house allows (lines from `fn` to its closing brace).
const MAX_FN_LINES: usize = 100;

/// A module path inside `src/`: `thread/turn.rs` → `["thread", "turn"]`, `thread/mod.rs` →
/// `["thread"]`, `lib.rs` → `[]`.
type ModPath = Vec<String>;

struct Module {
    file: String,
    text: String,
    /// A folder's front door (`mod.rs`, `lib.rs`, or `x.rs` beside a folder `x/`): its
    /// re-exports and its docs describe the rooms below it rather than depend on them.
    folder: bool,
}

fn modules(src: &Path) -> BTreeMap<ModPath, Module> {
    let mut out = BTreeMap::new();
    for file in files_with_ext(src, "rs") {
        let rel = file
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let mut parts: ModPath = rel
            .trim_end_matches(".rs")
            .split('/')
            .map(String::from)
            .collect();
        if rel == "main.rs" {
            continue; // the binary: a crate of its own
        }
        if parts.last().is_some_and(|p| p == "mod" || rel == "lib.rs") {
            parts.pop();
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // A file's unit tests (`#[cfg(test)] mod tests` at its end) are not its architecture.
        let text = match text.find("#[cfg(test)]\nmod ") {
            Some(at) => text[..at].to_string(),
            None => text,
        };
        // Plain comments are not dependencies; doc comments (a doc link) are.
        let text = text
            .lines()
            .filter(|l| {
                let t = l.trim_start();
                !t.starts_with("//") || t.starts_with("///") || t.starts_with("//!")
            })
            .collect::<Vec<_>>()
            .join("\n");
        let folder = rel.ends_with("mod.rs")
            || rel == "lib.rs"
            || src.join(rel.trim_end_matches(".rs")).is_dir();
        out.insert(
            parts,
            Module {
                file: rel,
                text,
                folder,
            },
        );
    }
    out
}

/// Expands the tree of one `use` (`super::{a, b::{C, D as E}}`) into (path, name bound).
fn expand_use(body: &str) -> Vec<(Vec<String>, String)> {
    fn split_top(s: &str) -> Vec<&str> {
        let (mut depth, mut start, mut out) = (0, 0, Vec::new());
        for (i, c) in s.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        out.push(&s[start..]);
        out
    }
    fn walk(prefix: &[String], s: &str, out: &mut Vec<(Vec<String>, String)>) {
        for item in split_top(s)
            .into_iter()
            .map(str::trim)
            .filter(|i| !i.is_empty())
        {
            if let Some(open) = item.find('{') {
                let mut p = prefix.to_vec();
                p.extend(
                    item[..open]
                        .split("::")
                        .map(str::trim)
                        .filter(|x| !x.is_empty())
                        .map(String::from),
                );
                walk(&p, &item[open + 1..item.len() - 1], out);
                continue;
            }
            let (path, alias) = match item.split_once(" as ") {
                Some((p, a)) => (p.trim(), Some(a.trim())),
                None => (item, None),
            };
            let mut p = prefix.to_vec();
            p.extend(
                path.split("::")
                    .map(str::trim)
                    .filter(|x| !x.is_empty())
                    .map(String::from),
            );
            let bound = alias
                .map(String::from)
                .or_else(|| p.last().cloned())
                .unwrap_or_default();
            out.push((p, bound));
        }
    }
    let flat: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    walk(&[], &flat, &mut out);
    out
}

/// A path as written in module `at` made absolute (None: not a path into this crate).
fn absolute(mods: &BTreeMap<ModPath, Module>, at: &ModPath, segs: &[String]) -> Option<ModPath> {
    let first = segs.first()?;
    match first.as_str() {
        "crate" => Some(segs[1..].to_vec()),
        "self" => Some(at.iter().chain(&segs[1..]).cloned().collect()),
        "super" => {
            let mut base = at.clone();
            let mut rest = segs;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            Some(base.into_iter().chain(rest.iter().cloned()).collect())
        }
        child => {
            let mut p = at.clone();
            p.push(child.to_string());
            mods.contains_key(&p)
                .then(|| at.iter().chain(segs).cloned().collect())
        }
    }
}

fn is_use_line(line: &str) -> Option<(bool, &str)> {
    let t = line.trim_start();
    let (public, rest) = match t.strip_prefix("pub") {
        Some(r) => (true, r.trim_start_matches(|c: char| c != ' ').trim_start()),
        None => (false, t),
    };
    rest.strip_prefix("use ").map(|r| (public, r))
}

/// Every `use` statement of a text, whole (they may span lines), with whether it is `pub`.
fn use_statements(text: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some((public, first)) = is_use_line(line) else {
            continue;
        };
        let mut stmt = first.to_string();
        while !stmt.contains(';') {
            match lines.next() {
                Some(l) => stmt.push_str(l),
                None => break,
            }
        }
        out.push((
            public,
            stmt.split(';').next().unwrap_or_default().to_string(),
        ));
    }
    out
}

/// `a::b::c` paths written outside `use` lines.
fn inline_paths(text: &str) -> Vec<Vec<String>> {
    let body: Vec<&str> = text.lines().filter(|l| is_use_line(l).is_none()).collect();
    let body = body.join("\n");
    let bytes = body.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let s = j;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            segs.push(body[s..j].to_string());
            if body[j..].starts_with("::")
                && body[j + 2..].starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            {
                j += 2;
            } else {
                break;
            }
        }
        if segs.len() > 1 {
            out.push(segs);
        }
        i = j.max(i + 1);
    }
    out
}

/// The file a path lands in: its longest module prefix, following `pub use` re-exports.
fn resolve(
    mods: &BTreeMap<ModPath, Module>,
    reexports: &BTreeMap<ModPath, BTreeMap<String, ModPath>>,
    path: &[String],
    hops: usize,
) -> Option<ModPath> {
    (0..=path.len()).rev().find_map(|k| {
        let prefix = path[..k].to_vec();
        mods.contains_key(&prefix).then(|| {
            let next = path.get(k).and_then(|n| reexports.get(&prefix)?.get(n));
            match next {
                Some(target) if hops < 8 => {
                    let mut t = target.clone();
                    t.extend(path[k + 1..].iter().cloned());
                    resolve(mods, reexports, &t, hops + 1).unwrap_or(prefix)
                }
                _ => prefix,
            }
        })
    })
}

/// File-level imports: module → modules whose items it names (a `pub use` re-export is a door,
/// not a dependency; following it finds the file the item lives in).
fn file_imports(
    mods: &BTreeMap<ModPath, Module>,
) -> BTreeMap<ModPath, std::collections::BTreeSet<ModPath>> {
    let mut reexports: BTreeMap<ModPath, BTreeMap<String, ModPath>> = BTreeMap::new();
    let mut used: BTreeMap<ModPath, Vec<ModPath>> = BTreeMap::new();
    for (at, m) in mods {
        let folder = m.folder;
        // Names bound by this file's `use` lines: an inline `parts::Kids` after `use
        // super::parts;` is followed to the file `Kids` lives in.
        let mut bound: BTreeMap<String, ModPath> = BTreeMap::new();
        for (public, stmt) in use_statements(&m.text) {
            for (path, name) in expand_use(&stmt) {
                let Some(abs) = absolute(mods, at, &path) else {
                    continue;
                };
                if public {
                    reexports
                        .entry(at.clone())
                        .or_default()
                        .insert(name.clone(), abs.clone());
                }
                bound.insert(name, abs.clone());
                // A folder's re-exports are its front door; any other file depends on what it
                // names, `pub` or not.
                if !public || !folder {
                    used.entry(at.clone()).or_default().push(abs);
                }
            }
        }
        let code: String = match folder {
            true => m
                .text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n"),
            false => m.text.clone(),
        };
        for path in inline_paths(&code) {
            let abs = match bound.get(&path[0]) {
                Some(b) => Some(b.iter().chain(&path[1..]).cloned().collect()),
                None => absolute(mods, at, &path),
            };
            if let Some(abs) = abs {
                used.entry(at.clone()).or_default().push(abs);
            }
        }
    }
    let mut edges: BTreeMap<ModPath, std::collections::BTreeSet<ModPath>> = BTreeMap::new();
    for (at, paths) in used {
        for p in paths {
            if let Some(to) = resolve(mods, &reexports, &p, 0) {
                if to != at && !to.is_empty() {
                    edges.entry(at.clone()).or_default().insert(to);
                }
            }
        }
    }
    edges
}

/// The strongly connected groups of more than one file (Tarjan).
fn circles(edges: &BTreeMap<ModPath, std::collections::BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct T<'a> {
        edges: &'a BTreeMap<ModPath, std::collections::BTreeSet<ModPath>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    fn visit(t: &mut T, v: &ModPath) {
        let n = t.index.len();
        t.index.insert(v.clone(), n);
        t.low.insert(v.clone(), n);
        t.stack.push(v.clone());
        for w in t.edges.get(v).into_iter().flatten() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.stack.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut group = Vec::new();
            while let Some(w) = t.stack.pop() {
                let done = &w == v;
                group.push(w);
                if done {
                    break;
                }
            }
            if group.len() > 1 {
                t.out.push(group);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_file_imports_another_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    let edges = file_imports(&mods);
    assert!(
        edges.len() > 50,
        "read imports of only {} files",
        edges.len()
    );
    let mods = &mods;
    let groups: Vec<String> = circles(&edges)
        .into_iter()
        .map(|g| {
            let names: Vec<String> = g.iter().map(|m| mods[m].file.clone()).collect();
            let arrows: Vec<String> = g
                .iter()
                .flat_map(|a| {
                    let g = &g;
                    edges[a]
                        .iter()
                        .filter(move |b| g.contains(b))
                        .map(move |b| format!("{} → {}", mods[a].file, mods[b].file))
                })
                .collect();
            format!(
                "{} files: {}\n    {}",
                g.len(),
                names.join(", "),
                arrows.join("\n    ")
            )
        })
        .collect();
    assert!(
        groups.is_empty(),
        "file-level import circles (move what both sides need into a file below both):\n{}",
        groups.join("\n")
    );
}

#[test]
fn the_import_reader_sees_imports_through_groups_and_re_exports() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    let edges = file_imports(&mods);
    let of = |f: &str| -> ModPath { f.split('/').map(String::from).collect() };
    // `use crate::ledger::LedgerMsg` names the ledger's actor file through its re-export.
    let runtime = edges.get(&of("runtime")).expect("runtime/mod.rs imports");
    assert!(
        runtime
            .iter()
            .any(|m| m.first().is_some_and(|r| r == "ledger")),
        "{runtime:?}"
    );
    assert_eq!(
        expand_use("super::{a, b::{C, D as E}}"),
        vec![
            (of("super/a"), "a".to_string()),
            (of("super/b/C"), "C".to_string()),
            (of("super/b/D"), "E".to_string()),
        ]
    );
}

/// Functions longer than [`MAX_FN_LINES`]: a line opening `fn` and the first line after it
/// closing a brace at the same indentation.
fn long_functions(rel: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        let Some(name) = fn_name(t) else {
            continue;
        };
        // A declaration (a trait's method without a body) ends its signature with `;`.
        let opens = lines[i..]
            .iter()
            .map(|l| l.trim_end())
            .find(|l| l.ends_with('{') || l.ends_with(';'));
        if opens.is_none_or(|l| l.ends_with(';')) {
            continue;
        }
        let end = lines[i + 1..].iter().position(|l| {
            let lt = l.trim_start();
            l.len() - lt.len() == indent && lt.starts_with('}')
        });
        if let Some(len) = end.map(|e| e + 2).filter(|n| *n > MAX_FN_LINES) {
            out.push(format!("{rel}:{} `{name}` ({len} lines)", i + 1));
        }
    }
    out
}

/// The name of the function a line opens (after any of `pub(..)`, `const`, `async`, `unsafe`,
/// `extern "C"`), or None.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line;
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("fn ") {
            let name: String = r
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            return (!name.is_empty()).then_some(name);
        }
        let word_end = match rest.strip_prefix("pub(") {
            Some(r) => r.find(')').map(|i| i + 5)?,
            None => rest.find(' ')?,
        };
        let word = &rest[..word_end];
        let qualifier = word.starts_with("pub")
            || ["const", "async", "unsafe", "extern", "\"C\""].contains(&word);
        if !qualifier {
            return None;
        }
        rest = &rest[word_end..];
    }
}

#[test]
fn no_function_passes_a_hundred_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let long: Vec<String> = modules(&src)
        .values()
        .flat_map(|m| {
            long_functions(
                &m.file,
                &std::fs::read_to_string(src.join(&m.file)).unwrap(),
            )
        })
        .collect();
    for head in [
        "fn f() {",
        "pub(crate) const fn f() {",
        "pub(in crate::a) async unsafe fn f() {",
    ] {
        let sample = format!("{head}\n{}}}\n", "    x();\n".repeat(MAX_FN_LINES));
        assert_eq!(long_functions("x.rs", &sample).len(), 1, "missed: {head}");
    }
    let declaration = format!(
        "    fn f(\n        a: u8,\n    ) -> u8;\n    fn g() {{\n{}    }}\n",
        "        x();\n".repeat(10)
    );
    assert!(
        long_functions("x.rs", &declaration).is_empty(),
        "a declaration taken for a body"
    );
    assert!(
        long.is_empty(),
        "functions to split (over {MAX_FN_LINES} lines):\n{}",
        long.join("\n")
    );
}
