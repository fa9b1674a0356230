//! `weft schema directive|config|tool|hooks`: JSON Schema of the files weft reads, derived from
//! the parser's own types (the hooks file's is written beside its hand parser), and the copies
//! `weft init` writes under `.weft/schemas/` for editors' YAML language servers.

use super::args::SchemaKind;
use super::Exit;
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;

/// Every kind, with the file name its schema is kept under.
const ALL: [(SchemaKind, &str); 4] = [
    (SchemaKind::Directive, "directive.json"),
    (SchemaKind::Config, "config.json"),
    (SchemaKind::Tool, "tool.json"),
    (SchemaKind::Hooks, "hooks.json"),
];

/// The schema of `kind`.
pub(super) fn of(kind: SchemaKind) -> Value {
    let (mut s, title) = match kind {
        SchemaKind::Directive => (directive(), "weft directive front matter"),
        SchemaKind::Config => (crate::project::config::json_schema(), "weft config"),
        SchemaKind::Tool => (crate::tools::tool_schema(), "weft command tool"),
        SchemaKind::Hooks => (crate::hooks::schema::json_schema(), "weft hooks file"),
    };
    s["title"] = json!(title);
    s
}

/// The front matter's schema, its `hooks:` described like a hooks file's list.
fn directive() -> Value {
    let mut s = crate::directive::json_schema();
    s["properties"]["hooks"] = json!({
        "type": ["array", "null"], "items": { "$ref": "#/$defs/hook" },
        "description": "hooks of this directive's threads (layer 1)"
    });
    if let (Some(defs), Value::Object(hooks)) = (
        s.get_mut("$defs").and_then(Value::as_object_mut),
        crate::hooks::schema::defs(),
    ) {
        defs.extend(hooks);
    } else {
        s["$defs"] = crate::hooks::schema::defs();
    }
    s
}

/// `weft schema KIND`: the schema, pretty-printed.
pub(super) fn print(kind: SchemaKind) -> Result<i32, Exit> {
    out!(
        "{}",
        serde_json::to_string_pretty(&of(kind)).unwrap_or_default()
    );
    Ok(0)
}

/// Writes every schema into `dir` (`weft init`: `.weft/schemas/`).
pub(super) fn write_all(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (kind, file) in ALL {
        let text = serde_json::to_string_pretty(&of(kind)).unwrap_or_default();
        std::fs::write(dir.join(file), text + "\n")?;
    }
    Ok(())
}
