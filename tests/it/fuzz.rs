//! Fuzzing the parsers of outside input (#23): directive files (markdown and Rye XML), hook
//! files, command tool files, nova and deepagents imports and SSE `Last-Event-ID`s. Each target
//! takes seeds (the repository's own fixtures), mutates them for `WEFT_FUZZ_SECS` seconds
//! (default 1; `.ci/run` gives each 20) and must answer every input with a value or an error,
//! never a panic. A panicking input is saved under `target/fuzz-crashes/` and fails the test;
//! kept under `tests/fuzz/<target>/`, it is replayed first on every run (a regression test).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A small xorshift generator: fast, seedable, printed so a run can be repeated.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Tokens that tend to matter to these formats.
const TOKENS: &[&str] = &[
    "---\n",
    "\n",
    ":",
    "- ",
    "{",
    "}",
    "[",
    "]",
    "\"",
    "'",
    "\\",
    "<",
    ">",
    "</",
    "{input.",
    "{input:",
    "&",
    "*",
    "!!",
    "%",
    "\u{0}",
    "\u{feff}",
    "é",
    "1e308",
    "-1",
    "99999999999999999999",
    ".",
    "..",
    "/",
    "null",
    "true",
    "\t",
    "  ",
    "#",
    "|",
    ">-",
    "${",
    "\r\n",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(8) {
        let at = rng.below(b.len() + 1);
        match rng.below(6) {
            0 if !b.is_empty() => {
                let end = (at + rng.below(16)).min(b.len());
                b.drain(at.min(end)..end);
            }
            1 => {
                b.splice(at..at, TOKENS[rng.below(TOKENS.len())].bytes());
            }
            2 if at < b.len() => b[at] = rng.next() as u8,
            3 => b.insert(at, rng.next() as u8),
            4 if !b.is_empty() => {
                let from = rng.below(b.len());
                let end = (from + rng.below(64)).min(b.len());
                let chunk: Vec<u8> = b[from..end].to_vec();
                b.splice(at..at, chunk);
            }
            _ => b.truncate(at),
        };
    }
    b
}

/// Files under `dir` (recursively) whose name ends in one of `exts`.
fn seeds(dirs: &[&str], exts: &[&str]) -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        } else if exts.iter().any(|x| p.to_string_lossy().ends_with(x)) {
            out.push(std::fs::read(&p).unwrap());
        }
    }
    assert!(!out.is_empty(), "no seeds in {dirs:?}");
    out
}

/// Runs `target` on the kept regressions, then on mutations of `seeds` for the time budget.
fn fuzz(name: &str, seeds: Vec<Vec<u8>>, target: impl Fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut inputs: Vec<Vec<u8>> = std::fs::read_dir(root.join("tests/fuzz").join(name))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read(e.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    inputs.extend(seeds.iter().cloned());
    let secs = std::env::var("WEFT_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1u64);
    let seed = std::env::var("WEFT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64 * 0x9e37_79b9 + 1);
    let mut rng = Rng(seed | 1);
    let (start, mut runs, mut crashes) = (Instant::now(), 0u64, Vec::new());
    let mut next = inputs.into_iter();
    loop {
        let input = match next.next() {
            Some(i) => i,
            None if start.elapsed() < Duration::from_secs(secs) => {
                let s = &seeds[rng.below(seeds.len())];
                mutate(&mut rng, s)
            }
            None => break,
        };
        runs += 1;
        if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
            let dir = root.join("target/fuzz-crashes").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join(format!("{:016x}", rng.next()));
            std::fs::write(&file, &input).unwrap();
            crashes.push(file);
        }
    }
    eprintln!("fuzz {name}: {runs} inputs in {secs} s (seed {seed})");
    assert!(
        crashes.is_empty(),
        "fuzz {name}: {} input(s) panicked, saved as {crashes:?} (keep them under tests/fuzz/{name}/ once fixed)",
        crashes.len()
    );
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn directive_files_never_panic() {
    let seeds = seeds(
        &["examples", "directives", "tests/fixtures/rye/directives"],
        &[".md", ".xml"],
    );
    fuzz("directive", seeds, |b| {
        let _ = weft::internals::parse_directive("fuzz.md", &text(b), "fuzz");
    });
}

#[test]
fn hook_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let seeds = seeds(
        &["tests/fixtures/rye/config/hooks_examples", "hooks"],
        &[".yaml"],
    );
    fuzz("hooks", seeds, |b| {
        let _ = weft::internals::fuzz::hooks(dir.path(), &text(b));
    });
}

#[test]
fn tool_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let seeds = seeds(&["examples"], &[".yaml"]);
    fuzz("tool", seeds, |b| {
        let _ = weft::internals::fuzz::tool(dir.path(), &text(b));
    });
}

#[test]
fn nova_and_deepagents_imports_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.jsonl");
    let nova = seeds(&["tests/fixtures/formats/nova"], &[".jsonl"]);
    fuzz("nova", nova, |b| {
        std::fs::write(&file, b).unwrap();
        let _ = weft::import_nova(&weft::MemoryStore::new(), &file);
    });
    let deep = seeds(&["tests/fixtures/formats/deepagents"], &[".json"]);
    fuzz("deepagents", deep, |b| {
        std::fs::write(&file, b).unwrap();
        let _ = weft::import_deepagents(&weft::MemoryStore::new(), &file);
    });
}

#[cfg(feature = "server")]
#[test]
fn sse_event_ids_never_panic() {
    let seeds = vec![
        b"1795000000000.1.12".to_vec(),
        b"0.0.0".to_vec(),
        b"1.1.99999999999999999".to_vec(),
    ];
    fuzz("event_id", seeds, |b| {
        let _ = weft::internals::fuzz::event_id(&text(b));
    });
}
