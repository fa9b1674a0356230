//! `weft schema directive|config|tool|hooks`: every example and fixture of the repository
//! validates against its kind's schema, checked by `jsonschema` from PyPI (in
//! `$WEFT_MCP_DIR/venv`), and files the parsers refuse are refused by the schemas too.

use crate::support::weft_cmd;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const KINDS: [&str; 4] = ["directive", "config", "tool", "hooks"];

/// The repository's root.
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file under `dir` (recursively, `target` and `node_modules` aside) named by `keep`.
fn files(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if p.is_dir() && !["target", "node_modules", ".git"].contains(&name.as_str()) {
            files(&p, keep, out);
        } else if p.is_file() && keep(&p) {
            out.push(p);
        }
    }
}

/// A YAML text as JSON (what an editor's language server checks).
fn yaml(text: &str, what: &Path) -> Value {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{}: {e}", what.display()))
}

/// The front matter of a markdown directive, if it has one.
fn front(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    let rest = text.strip_prefix("---\n")?;
    let end = rest.find("\n---")?;
    Some(yaml(&rest[..end + 1], path))
}

/// Every instance of the repository, by kind: (kind, name, JSON).
fn instances() -> Vec<(&'static str, PathBuf, Value)> {
    let mut out = Vec::new();
    let mut md = Vec::new();
    for d in ["examples", "directives", "tests/fixtures"] {
        files(
            &repo().join(d),
            &|p| p.extension().is_some_and(|e| e == "md"),
            &mut md,
        );
    }
    // RyeOS's own files (tests/fixtures/ryeos) are written in RyeOS's dialect, which weft maps
    // onto its front matter when it reads them (tests/it/ryeos.rs): weft's schema is not theirs.
    let ryeos = repo().join("tests/fixtures/ryeos");
    md.retain(|p| !p.starts_with(&ryeos));
    out.extend(
        md.into_iter()
            .filter_map(|p| Some(("directive", p.clone(), front(&p)?))),
    );
    let mut cfg = vec![repo().join("src/project/default_config.yaml")];
    files(
        &repo().join("examples"),
        &|p| p.ends_with(".weft/config.yaml"),
        &mut cfg,
    );
    let mut tools = Vec::new();
    // A project's `tools/` folder: `directives/` beside it.
    let tool_file = |p: &Path| {
        let dir = p.parent();
        dir.is_some_and(|d| d.file_name().is_some_and(|n| n == "tools"))
            && dir
                .and_then(Path::parent)
                .is_some_and(|proj| proj.join("directives").is_dir())
            && p.extension().is_some_and(|e| e == "yaml")
    };
    files(&repo().join("examples"), &tool_file, &mut tools);
    let mut hooks = vec![repo().join("tests/fixtures/hooks/weft.yaml")];
    files(
        &repo().join("tests/fixtures/rye/config"),
        &|p| p.extension().is_some_and(|e| e == "yaml"),
        &mut hooks,
    );
    for (kind, list) in [("config", cfg), ("tool", tools), ("hooks", hooks)] {
        for p in list {
            let v = yaml(&std::fs::read_to_string(&p).unwrap(), &p);
            out.push((kind, p, v));
        }
    }
    out
}

/// Files each parser refuses, one per kind at least: (kind, what is wrong, JSON).
fn refused() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        (
            "directive",
            "an unknown key",
            json!({"description": "x", "limitz": {"turns": 3}}),
        ),
        (
            "directive",
            "turns not a number",
            json!({"limits": {"turns": "many"}}),
        ),
        (
            "directive",
            "an unknown limit",
            json!({"limits": {"turnz": 3}}),
        ),
        (
            "directive",
            "a hook without an event",
            json!({"hooks": [{"id": "a", "action": {"run": {"argv": ["true"]}}}]}),
        ),
        (
            "config",
            "an unknown durability",
            json!({"durability": "sometimes"}),
        ),
        (
            "config",
            "an unknown provider kind",
            json!({"providers": {"p": {"kind": "gemini"}}}),
        ),
        ("config", "an unknown top-level key", json!({"retrys": 3})),
        ("tool", "no argv", json!({"name": "t", "description": "x"})),
        (
            "hooks",
            "an unknown event",
            json!({"hooks": [{"id": "a", "event": "whenever", "action": {"control": "fail"}}]}),
        ),
        (
            "hooks",
            "an unknown condition op",
            json!({"hooks": [{"id": "a", "event": "error", "condition": {"path": "x", "op": "like"}, "action": {"control": "fail"}}]}),
        ),
    ]
}

/// Whether weft's own parser of `kind` takes `v` (as YAML: JSON is YAML), in `dir`.
fn parses(kind: &str, v: &Value, dir: &Path) -> Result<(), String> {
    let text = v.to_string();
    let r = match kind {
        // A directive's hooks are read when its thread starts, by the hooks file's parser.
        "directive" => {
            weft::internals::parse_directive("t.md", &format!("---\n{text}\n---\nBody.\n"), "t")
                .map_err(|e| e.to_string())
                .and_then(|_| match v.get("hooks") {
                    Some(h) => {
                        weft::internals::fuzz::hooks(dir, &json!({ "hooks": h }).to_string())
                    }
                    None => Ok(()),
                })
        }
        "config" => weft::Config::default()
            .overlay_text(Path::new("config.yaml"), &text)
            .map_err(|e| e.to_string()),
        "tool" => weft::internals::fuzz::tool(dir, &text),
        _ => weft::internals::fuzz::hooks(dir, &text),
    };
    let _ = std::fs::remove_file(dir.join("hooks.yaml"));
    r
}

/// Validates every (kind, JSON) with `jsonschema`: the errors of each, in order.
fn validate(py: &Path, dir: &Path, items: &[(&str, Value)]) -> Vec<Vec<String>> {
    let mut pairs = Vec::new();
    for (i, (kind, v)) in items.iter().enumerate() {
        let inst = dir.join(format!("instance-{i}.json"));
        std::fs::write(&inst, v.to_string()).unwrap();
        pairs.push(json!({"schema": dir.join(format!("{kind}.json")), "instance": inst}));
    }
    let script = repo().join("tests/fixtures/schema/validate.py");
    let input = Value::Array(pairs).to_string();
    let mut cmd = std::process::Command::new(py);
    cmd.arg(script);
    let out = crate::support::fed(&mut cmd, input.as_bytes(), 60, "the jsonschema validator");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["errors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn every_example_and_fixture_validates_against_its_schema_and_bad_files_do_not() {
    let Some(py) = crate::support::venv_python("jsonschema", "schema") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for kind in KINDS {
        let out = weft_cmd(dir.path())
            .args(["schema", kind])
            .output()
            .unwrap();
        assert!(out.status.success(), "weft schema {kind}");
        let schema: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            schema["title"].as_str().unwrap().starts_with("weft"),
            "{kind}"
        );
        std::fs::write(dir.path().join(format!("{kind}.json")), &out.stdout).unwrap();
    }
    let good = instances();
    for kind in KINDS {
        let n = good.iter().filter(|(k, ..)| *k == kind).count();
        assert!(n > 0, "no {kind} file found to validate");
    }
    // Counted, so a file that stops being found is noticed.
    let count = |kind: &str| good.iter().filter(|(k, ..)| *k == kind).count();
    let counts = KINDS.map(count);
    eprintln!("schema: validating {counts:?} files of kinds {KINDS:?}");
    assert!(
        counts[0] >= 6 && counts[1] >= 3 && counts[2] >= 1 && counts[3] >= 5,
        "{counts:?}"
    );
    let items: Vec<(&str, Value)> = good.iter().map(|(k, _, v)| (*k, v.clone())).collect();
    let verdicts = validate(&py, dir.path(), &items);
    assert_eq!(verdicts.len(), items.len(), "one verdict per file");
    let scratch = tempfile::tempdir().unwrap();
    for ((kind, path, v), errors) in good.iter().zip(verdicts) {
        if let Err(e) = parses(kind, v, scratch.path()) {
            panic!("{}: weft's own parser refuses it: {e}", path.display());
        }
        assert!(
            errors.is_empty(),
            "{} does not validate: {errors:?}",
            path.display()
        );
    }
    // Files the parser refuses are refused by the schema too.
    let bad = refused();
    let items: Vec<(&str, Value)> = bad.iter().map(|(k, _, v)| (*k, v.clone())).collect();
    let verdicts = validate(&py, dir.path(), &items);
    assert_eq!(verdicts.len(), items.len(), "one verdict per file");
    for ((kind, what, v), errors) in bad.iter().zip(verdicts) {
        assert!(
            parses(kind, v, scratch.path()).is_err(),
            "the {kind} parser takes a file with {what}"
        );
        assert!(
            !errors.is_empty(),
            "the {kind} schema takes a file with {what}"
        );
    }
}

#[test]
fn weft_init_writes_the_schemas_and_points_the_config_at_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let out = weft_cmd(dir.path()).arg("init").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg = std::fs::read_to_string(dir.path().join(".weft/config.yaml")).unwrap();
    assert!(
        cfg.starts_with("# yaml-language-server: $schema=./schemas/config.json\n"),
        "{cfg}"
    );
    for kind in KINDS {
        let written = std::fs::read(dir.path().join(format!(".weft/schemas/{kind}.json"))).unwrap();
        let printed = weft_cmd(dir.path())
            .args(["schema", kind])
            .output()
            .unwrap()
            .stdout;
        let (a, b): (Value, Value) = (
            serde_json::from_slice(&written).unwrap(),
            serde_json::from_slice(&printed).unwrap(),
        );
        assert_eq!(a, b, "{kind}");
    }
    // The config it wrote still loads.
    let threads = weft_cmd(dir.path())
        .args(["threads", "--json"])
        .output()
        .unwrap();
    assert!(
        threads.status.success(),
        "{}",
        String::from_utf8_lossy(&threads.stderr)
    );
}
