//! The house stays readable: every top-level room of `src/` imports only rooms below it (so no
//! import circle can form), and no source file grows past the size that asks to be split.
//! Reads the source tree; what it enforces is written in ARCHITECTURE.md.

use crate::support::files_with_ext;
use std::collections::BTreeMap;
use std::path::Path;

/// The layers, lowest first. A room may import rooms of a strictly lower layer only.
const LAYERS: &[&[&str]] = &[
    &["core"],
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
