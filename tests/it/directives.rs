//! Directive loading: front matter, interpolation, lookup order, extends and Rye compatibility.

use crate::support::{directive, Fixture};
use serde_json::{json, Map, Value};
use std::path::Path;
use weft::Library;

fn lib(fx: &Fixture) -> Library {
    Library::for_project(&fx.project())
}

#[test]
fn interpolation_forms() {
    let fx = Fixture::new(
        &[("t", &directive("inputs:\n  a: { type: string, required: true }\n  b: { type: string }\n  c: { type: integer, default: 3 }", "{input:a}|{input:b?}|{input:b|none}|{input:c}"))],
        "",
        "",
    );
    let d = lib(&fx).load("t").unwrap();
    let inputs = d
        .validate_inputs(json!({ "a": "x" }).as_object().unwrap())
        .unwrap();
    assert_eq!(d.render(&inputs).unwrap(), "x||none|3");
}

#[test]
fn project_directives_shadow_builtins_and_extends_inherits_metadata() {
    let fx = Fixture::new(
        &[
            ("weft/hello", &directive("description: mine", "Project hello.")),
            ("base", &directive("description: base one\nlimits: { turns: 7, spend: 0.02 }\npermissions: [\"tool.x\"]\noutputs:\n  r: { type: string, required: true }", "Base body.")),
            ("derived", &directive("extends: base\nlimits: { turns: 3 }", "Derived body.")),
        ],
        "",
        "",
    );
    assert_eq!(lib(&fx).load("weft/hello").unwrap().description, "mine");
    assert!(Library::default()
        .load("weft/hello")
        .unwrap()
        .source
        .starts_with("builtin:"));
    let d = lib(&fx).load("derived").unwrap();
    assert_eq!(d.body, "Derived body.");
    assert_eq!(d.description, "base one");
    assert_eq!(
        (d.limits.turns, d.limits.spend.map(|s| s.0)),
        (Some(3), Some(20_000_000))
    );
    assert_eq!(d.permissions, vec!["tool.x".to_string()]);
    assert!(d.outputs.contains_key("r"));
    let e = lib(&fx).load("nothing/here").unwrap_err().to_string();
    assert!(e.contains("no directive named `nothing/here`"), "{e}");
    assert!(lib(&fx).load("../etc/passwd").is_err());
}

#[test]
fn an_extends_cycle_is_refused_with_the_chain() {
    let fx = Fixture::new(
        &[
            ("a", &directive("extends: b", "A.")),
            ("b", &directive("extends: a", "B.")),
        ],
        "",
        "",
    );
    let e = lib(&fx).load("a").unwrap_err().to_string();
    assert!(e.contains("`extends` forms a cycle"), "{e}");
    assert!(
        e.contains("a.md") && e.contains("b.md"),
        "names the files: {e}"
    );
}

#[test]
fn rye_directives_map_onto_the_same_model() {
    // Copies of Rye OS's own directives (tests/fixtures/rye/SOURCES.txt says where each is from).
    let rye = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rye/directives");
    let l = Library {
        project_dir: Some(rye.clone()),
        user_dir: None,
        cache: Default::default(),
    };
    let d = l.load("test/limits/limit_inheritance_test").unwrap();
    assert_eq!(d.name, "test/limits/limit_inheritance_test");
    assert_eq!(d.model.tier.as_deref(), Some("fast"));
    assert_eq!(
        (d.limits.turns, d.limits.tokens, d.limits.spend.map(|s| s.0)),
        (Some(3), Some(4096), Some(200_000_000))
    );
    assert!(
        d.permissions.contains(&"thread.spawn.**".to_string()),
        "{:?}",
        d.permissions
    );
    assert!(
        d.permissions
            .contains(&"tool.rye.file-system.*".to_string()),
        "{:?}",
        d.permissions
    );
    // Upstream ignores <permissions> outside <metadata>; so do we.
    let s = l.load("test/limits/spawn_limit_test").unwrap();
    assert!(s.permissions.is_empty());
    assert_eq!(s.limits.spawns, Some(2));
    // Inputs with types and required flags.
    let o = l.load("rye/agent/threads/orchestrator").unwrap();
    assert!(o.inputs["operation"].required);
    assert_eq!(o.inputs["thread_ids"].kind, "array");
    let mut given = Map::new();
    given.insert("operation".into(), Value::String("wait_threads".into()));
    assert!(o.validate_inputs(&given).is_ok());
    assert!(o
        .validate_inputs(&Map::new())
        .unwrap_err()
        .to_string()
        .contains("missing required input `operation`"));
    // Every fixture parses.
    let mut n = 0;
    for e in crate::support::files_with_ext(&rye, "md") {
        let rel = e.strip_prefix(&rye).unwrap().with_extension("");
        l.load(rel.to_str().unwrap())
            .unwrap_or_else(|err| panic!("{}: {err}", e.display()));
        n += 1;
    }
    assert!(n >= 15, "{n} fixtures");
}
