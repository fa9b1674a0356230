//! Command tools (SPEC §8): `tools/*.yaml` of the project (and of the user's config folder),
//! each a program run as a child process in its own process group (see `process.rs`), with the
//! call's JSON input on stdin and its stdout as the result.
//!
//! Owns loading and checking tool files (errors name file, line and field): names, argv and its
//! `{input.<key>}` placeholders, working folder, timeout, environment allow-list, output bound.
//! Must never accept a placeholder that is not a whole argument (nothing goes through a shell)
//! nor a program that comes from the input.

use super::schema;
use crate::project::yaml::{find_line, yaml_message};
use crate::project::Project;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Output kept when a tool sets no `max_output`.
const DEFAULT_MAX_OUTPUT: u64 = 64 * 1024;
/// Timeout when a tool sets none.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cwd {
    /// The project's root folder.
    Project,
    /// The calling thread's file area.
    Files,
}

/// One command tool, validated.
#[derive(Debug, Clone)]
pub(crate) struct CommandTool {
    /// Name (the model calls it by this; capability `tool.<name>`).
    pub name: String,
    /// For the model.
    pub description: String,
    /// JSON Schema of the input (validated before anything runs).
    pub input_schema: Value,
    /// Program and arguments; `{input.k}` placeholders are whole arguments.
    pub argv: Vec<String>,
    /// Working directory.
    pub cwd: Cwd,
    /// Killed (whole process group) after this long.
    pub timeout: Duration,
    /// Environment variables passed through; nothing else is inherited.
    pub env: Vec<String>,
    /// Result bytes kept; the full output of a larger one goes to the file area.
    pub max_output: u64,
    /// A person must approve each call.
    pub approval: bool,
    /// The file it came from.
    pub source: PathBuf,
}

#[derive(Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    input_schema: Option<Value>,
    argv: Vec<String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    max_output: Option<u64>,
    #[serde(default)]
    approval: Option<String>,
}

/// JSON Schema of a command tool file (`tools/*.yaml`), from the parser's own type.
#[cfg(feature = "cli")]
pub(crate) fn json_schema() -> Value {
    serde_json::to_value(schemars::schema_for!(RawTool)).unwrap_or_default()
}

/// A tool file that cannot be used: the file, the line when known, and what is wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ToolFileError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line.
    pub line: Option<u64>,
    /// What is wrong and what to do.
    pub message: String,
}

/// The command tools of a project: the user's `tools/*.yaml`, then the project's (a project
/// tool replaces a user tool of the same name).
#[derive(Debug, Clone, Default)]
pub(crate) struct CommandTools {
    by_name: BTreeMap<String, CommandTool>,
}

impl CommandTools {
    /// Loads every `*.yaml` of `<user dir>/tools/` and `<project>/tools/`; a tool may not take
    /// one of the `reserved` names (the built-in tools').
    pub(crate) fn load(
        project: &Project,
        reserved: &[&str],
    ) -> Result<CommandTools, ToolFileError> {
        let mut out = CommandTools::default();
        for dir in [
            crate::project::user_dir().join("tools"),
            project.root.join("tools"),
        ] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut files: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
                .collect();
            files.sort();
            for f in files {
                let text = std::fs::read_to_string(&f).map_err(|e| ToolFileError {
                    file: f.clone(),
                    line: None,
                    message: format!("cannot read: {e}"),
                })?;
                let tool = parse(&f, &text, &project.root, reserved)?;
                out.by_name.insert(tool.name.clone(), tool);
            }
        }
        Ok(out)
    }

    /// The tool called `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&CommandTool> {
        self.by_name.get(name)
    }

    /// Every tool, by name.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &CommandTool> {
        self.by_name.values()
    }
}

/// Parses and checks one tool file.
pub(crate) fn parse(
    file: &Path,
    text: &str,
    root: &Path,
    reserved: &[&str],
) -> Result<CommandTool, ToolFileError> {
    let err = |field: &str, message: String| ToolFileError {
        file: file.to_path_buf(),
        line: find_line(text, field).map(|(l, _)| l),
        message,
    };
    let raw: RawTool = serde_saphyr::from_str(text).map_err(|e| ToolFileError {
        file: file.to_path_buf(),
        line: e.location().map(|l| l.line()),
        message: format!(
            "{} (a tool needs `name` and `argv`; optional: description, input_schema, cwd, timeout, env, max_output, approval)",
            yaml_message(&e)
        ),
    })?;
    check_name(&raw.name, reserved).map_err(|m| err("name", m))?;
    check_argv(&raw.argv).map_err(|m| err("argv", m))?;
    let cwd = parse_cwd(raw.cwd.as_deref()).map_err(|m| err("cwd", m))?;
    let timeout = match raw.timeout.as_deref() {
        None => DEFAULT_TIMEOUT,
        Some(t) => humantime::parse_duration(t)
            .map_err(|e| err("timeout", format!("timeout `{t}`: {e} (e.g. 30s, 2m)")))?,
    };
    let approval = parse_approval(raw.approval.as_deref()).map_err(|m| err("approval", m))?;
    check_env(&raw.env).map_err(|m| err("env", m))?;
    let input_schema = raw
        .input_schema
        .unwrap_or_else(|| serde_json::json!({"type": "object"}));
    schema::check_schema(&input_schema).map_err(|m| err("input_schema", m))?;
    let mut argv = raw.argv;
    // A relative program path is the project's (never the file area's: the model writes there).
    if argv[0].contains('/') && !Path::new(&argv[0]).is_absolute() {
        argv[0] = root.join(&argv[0]).to_string_lossy().into_owned();
    }
    Ok(CommandTool {
        name: raw.name,
        description: raw.description.unwrap_or_default(),
        input_schema,
        argv,
        cwd,
        timeout,
        env: raw.env,
        max_output: raw.max_output.unwrap_or(DEFAULT_MAX_OUTPUT),
        approval,
        source: file.to_path_buf(),
    })
}

/// A tool's name: short, lowercase, and not a built-in tool's.
fn check_name(name: &str, reserved: &[&str]) -> Result<(), String> {
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !name_ok {
        return Err(format!(
            "name `{name}`: use lowercase letters, digits, `_` and `-` (it becomes capability `tool.<name>`)"
        ));
    }
    if reserved.contains(&name) || name.starts_with("file_") || name.starts_with("mcp__") {
        return Err(format!(
            "name `{name}` is a built-in tool's (or `file_*` / `mcp__*`); choose another"
        ));
    }
    Ok(())
}

/// A tool's argv: a fixed program, and placeholders only as whole arguments.
fn check_argv(argv: &[String]) -> Result<(), String> {
    if argv.is_empty() || argv[0].is_empty() {
        return Err(
            "argv: give the program and its arguments, e.g. [python3, tools/count.py]".into(),
        );
    }
    for (i, a) in argv.iter().enumerate() {
        if a.contains("{input.") && placeholder(a).is_none() {
            return Err(format!("argv[{i}] `{a}`: a `{{input.<key>}}` placeholder must be a whole argument (nothing goes through a shell)"));
        }
    }
    if placeholder(&argv[0]).is_some() {
        return Err("argv[0]: the program cannot come from the input".into());
    }
    Ok(())
}

/// `cwd:` — `project` (the default) or `files`.
fn parse_cwd(cwd: Option<&str>) -> Result<Cwd, String> {
    match cwd {
        None | Some("project") => Ok(Cwd::Project),
        Some("files") => Ok(Cwd::Files),
        Some(other) => Err(format!(
            "cwd `{other}`: use `project` (default) or `files` (the thread's file area)"
        )),
    }
}

/// `approval:` — `required`, or `none` (the default).
fn parse_approval(approval: Option<&str>) -> Result<bool, String> {
    match approval {
        None | Some("none") => Ok(false),
        Some("required") => Ok(true),
        Some(other) => Err(format!(
            "approval `{other}`: use `required` or leave it out"
        )),
    }
}

/// `env:` — variable names only.
fn check_env(env: &[String]) -> Result<(), String> {
    match env.iter().find(|v| v.is_empty() || v.contains('=')) {
        Some(v) => Err(format!(
            "env `{v}`: list variable names only; their values come from weft's environment"
        )),
        None => Ok(()),
    }
}

impl CommandTool {
    /// A hook's `run` action as a command (no input schema, no placeholders, project folder).
    pub(crate) fn for_hook(id: &str, argv: Vec<String>, timeout: Duration) -> CommandTool {
        CommandTool {
            name: format!("hook:{id}"),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
            argv,
            cwd: Cwd::Project,
            timeout,
            env: Vec::new(),
            max_output: DEFAULT_MAX_OUTPUT,
            approval: false,
            source: PathBuf::from(format!("hook {id}")),
        }
    }
}

/// `{input.key}` → `key`.
pub(super) fn placeholder(arg: &str) -> Option<&str> {
    arg.strip_prefix("{input.")?
        .strip_suffix('}')
        .filter(|k| !k.is_empty() && !k.contains(['{', '}']))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<CommandTool, ToolFileError> {
        parse(
            Path::new("tools/t.yaml"),
            text,
            Path::new("/proj"),
            &["spawn_thread"],
        )
    }

    #[test]
    fn a_tool_file_is_checked_field_by_field() {
        let t = p("name: count\nargv: [python3, tools/count.py, \"{input.path}\"]\ntimeout: 5s\nenv: [PATH]\n").unwrap();
        assert_eq!(t.timeout, Duration::from_secs(5));
        assert_eq!(t.cwd, Cwd::Project);
        let e = p("name: x\nargv: [sh, \"-c\", \"cat {input.f}\"]\n").unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.message.contains("whole argument"), "{e}");
        let e = p("name: x\nargv: [ls]\ncwd: /tmp\n").unwrap_err();
        assert_eq!(e.line, Some(3));
        let e = p("name: Bad.Name\nargv: [ls]\n").unwrap_err();
        assert!(e.to_string().starts_with("tools/t.yaml:1: name"), "{e}");
        let e = p("name: x\nargv: [ls]\ntimeout: soon\n").unwrap_err();
        assert_eq!(e.line, Some(3));
        let e = p("name: x\nargv: [ls]\nshell: true\n").unwrap_err();
        assert!(e.message.contains("shell"), "{e}");
        assert!(p("name: spawn_thread\nargv: [ls]\n").is_err());
        assert!(p("name: x\nargv: [\"{input.prog}\"]\n").is_err());
        assert_eq!(
            p("name: x\nargv: [bin/run]\n").unwrap().argv[0],
            "/proj/bin/run"
        );
    }
}
