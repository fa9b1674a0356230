//! Command tools (SPEC §8): `tools/*.yaml` of the project (and of the user's config folder),
//! each a program run as a child process in its own process group, with the call's JSON input on
//! stdin and its stdout as the result.
//!
//! Owns loading (errors name file, line and field), input validation, argv placeholders, the
//! environment allow-list, output bounds and the kill of the whole process group on timeout or
//! cancel. Must never run anything through a shell it did not name, pass a variable that is not
//! listed, or leave a process of a call behind.

use super::schema;
use crate::project::yaml::{find_line, yaml_message};
use crate::project::Project;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// Output kept when a tool sets no `max_output`.
const DEFAULT_MAX_OUTPUT: u64 = 64 * 1024;
/// Timeout when a tool sets none.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Never read more than this of a tool's stdout into memory, whatever it prints.
const HARD_OUTPUT_CAP: u64 = 64 * 1024 * 1024;
/// The tail of stderr an error result carries.
const STDERR_TAIL: usize = 2048;

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
    let err = |field: Option<&str>, message: String| ToolFileError {
        file: file.to_path_buf(),
        line: field.and_then(|f| find_line(text, f)).map(|(l, _)| l),
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
    let name_ok = !raw.name.is_empty()
        && raw.name.len() <= 64
        && raw
            .name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !name_ok {
        return Err(err(
            Some("name"),
            format!(
                "name `{}`: use lowercase letters, digits, `_` and `-` (it becomes capability `tool.<name>`)",
                raw.name
            ),
        ));
    }
    if reserved.contains(&raw.name.as_str())
        || raw.name.starts_with("file_")
        || raw.name.starts_with("mcp__")
    {
        return Err(err(
            Some("name"),
            format!(
                "name `{}` is a built-in tool's (or `file_*` / `mcp__*`); choose another",
                raw.name
            ),
        ));
    }
    if raw.argv.is_empty() || raw.argv[0].is_empty() {
        return Err(err(
            Some("argv"),
            "argv: give the program and its arguments, e.g. [python3, tools/count.py]".into(),
        ));
    }
    for (i, a) in raw.argv.iter().enumerate() {
        if a.contains("{input.") && placeholder(a).is_none() {
            return Err(err(
                Some("argv"),
                format!("argv[{i}] `{a}`: a `{{input.<key>}}` placeholder must be a whole argument (nothing goes through a shell)"),
            ));
        }
    }
    if placeholder(&raw.argv[0]).is_some() {
        return Err(err(
            Some("argv"),
            "argv[0]: the program cannot come from the input".into(),
        ));
    }
    let cwd = match raw.cwd.as_deref() {
        None | Some("project") => Cwd::Project,
        Some("files") => Cwd::Files,
        Some(other) => {
            return Err(err(
                Some("cwd"),
                format!(
                    "cwd `{other}`: use `project` (default) or `files` (the thread's file area)"
                ),
            ))
        }
    };
    let timeout = match raw.timeout.as_deref() {
        None => DEFAULT_TIMEOUT,
        Some(t) => humantime::parse_duration(t).map_err(|e| {
            err(
                Some("timeout"),
                format!("timeout `{t}`: {e} (e.g. 30s, 2m)"),
            )
        })?,
    };
    let approval = match raw.approval.as_deref() {
        None | Some("none") => false,
        Some("required") => true,
        Some(other) => {
            return Err(err(
                Some("approval"),
                format!("approval `{other}`: use `required` or leave it out"),
            ))
        }
    };
    for v in &raw.env {
        if v.is_empty() || v.contains('=') {
            return Err(err(
                Some("env"),
                format!("env `{v}`: list variable names only; their values come from weft's environment"),
            ));
        }
    }
    let input_schema = raw
        .input_schema
        .unwrap_or_else(|| serde_json::json!({"type": "object"}));
    schema::check_schema(&input_schema).map_err(|m| err(Some("input_schema"), m))?;
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
fn placeholder(arg: &str) -> Option<&str> {
    arg.strip_prefix("{input.")?
        .strip_suffix('}')
        .filter(|k| !k.is_empty() && !k.contains(['{', '}']))
}

/// What a finished call gives the thread: the result text, whether it failed, and the file in
/// the area that holds the full output when it was cut.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CommandResult {
    /// Result for the model.
    pub content: String,
    /// Non-zero exit, signal, timeout, cancel or refusal.
    pub is_error: bool,
}

impl CommandResult {
    fn err(content: String) -> CommandResult {
        CommandResult {
            content,
            is_error: true,
        }
    }
}

/// Runs one call of `tool`: validates `input`, starts the process in its own group with the
/// input on stdin, and waits for it, its timeout or `cancel`, whichever comes first. The whole
/// group is killed on timeout and cancel. `files` is the thread's file area; `call_id` names the
/// file that keeps a cut output.
/// What a call's process gets besides its input: the thread's environment values for the
/// tool's `env` names (over weft's own environment), and the secrets its output is cleaned of
/// before anything of it is kept or returned.
#[derive(Default)]
pub(crate) struct CallEnv {
    /// Resolved values (thread → parent chain → project → user), secrets decrypted.
    pub vars: std::collections::BTreeMap<String, String>,
    /// The secrets to hide.
    pub redactor: std::sync::Arc<crate::core::redact::Redactor>,
}

pub(crate) async fn run(
    tool: &CommandTool,
    input: &Value,
    project_root: &Path,
    files: &Path,
    call_id: &str,
    cancel: CancellationToken,
    env: &CallEnv,
) -> CommandResult {
    if let Err(m) = schema::validate(&tool.input_schema, input) {
        return CommandResult::err(format!(
            "invalid input for tool `{}`: {m}; nothing was run",
            tool.name
        ));
    }
    let empty = Map::new();
    let obj = input.as_object().unwrap_or(&empty);
    let mut argv = Vec::with_capacity(tool.argv.len());
    for a in &tool.argv {
        match placeholder(a) {
            Some(k) => match obj.get(k) {
                Some(Value::String(s)) => argv.push(s.clone()),
                Some(Value::Null) | None => {
                    return CommandResult::err(format!(
                        "tool `{}` needs input `{k}` for its arguments; nothing was run",
                        tool.name
                    ))
                }
                Some(other) => argv.push(other.to_string()),
            },
            None => argv.push(a.clone()),
        }
    }
    let program = resolve_program(&argv[0]);
    if tool.cwd == Cwd::Files {
        // Areas are made on first use.
        if let Err(e) = std::fs::create_dir_all(files) {
            return CommandResult::err(format!(
                "tool `{}`: the file area cannot be made: {e}",
                tool.name
            ));
        }
    }
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(&argv[1..])
        .current_dir(match tool.cwd {
            Cwd::Project => project_root,
            Cwd::Files => files,
        })
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for name in &tool.env {
        match env.vars.get(name) {
            Some(v) => {
                cmd.env(name, v);
            }
            None => {
                if let Some(v) = std::env::var_os(name) {
                    cmd.env(name, v);
                }
            }
        }
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return CommandResult::err(format!(
                "tool `{}` could not start `{}`: {e} (argv in {})",
                tool.name,
                program.display(),
                tool.source.display()
            ))
        }
    };
    let group = child.id();
    let kill_group = || {
        if let Some(pid) = group
            .and_then(|p| i32::try_from(p).ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    };
    let stdin_bytes = serde_json::to_vec(input).unwrap_or_default();
    let stdin = child.stdin.take();
    // The pipes are read by tasks of their own: the call ends when the process exits, and a
    // grandchild still holding a pipe open dies with the group right after.
    let out_task = tokio::spawn(read_capped(child.stdout.take(), HARD_OUTPUT_CAP));
    let err_task = tokio::spawn(read_tail(child.stderr.take(), STDERR_TAIL));
    let exited = async {
        if let Some(mut w) = stdin {
            // A tool that does not read its stdin closes the pipe: not an error.
            let _ = w.write_all(&stdin_bytes).await;
            let _ = w.shutdown().await;
        }
        child.wait().await
    };
    let status = tokio::select! {
        s = exited => Some(s),
        _ = tokio::time::sleep(tool.timeout) => None,
        _ = cancel.cancelled() => {
            kill_group();
            return CommandResult::err(format!("tool `{}` was cancelled: its process group was killed", tool.name));
        }
    };
    // Whatever happened, nothing of the call outlives it (a grandchild it left behind included).
    kill_group();
    let Some(status) = status else {
        return CommandResult::err(format!(
            "tool `{}` timed out after {}: its process group was killed",
            tool.name,
            humantime::format_duration(tool.timeout)
        ));
    };
    let out = out_task.await.unwrap_or_default();
    let err = err_task.await.unwrap_or_default();
    let status = match status {
        Ok(s) => s,
        Err(e) => return CommandResult::err(format!("tool `{}`: {e}", tool.name)),
    };
    let (out, truncated_by_cap) = out;
    let stderr_tail = env
        .redactor
        .redact(&String::from_utf8_lossy(&err))
        .into_owned();
    if !status.success() {
        let how = match (
            status.code(),
            std::os::unix::process::ExitStatusExt::signal(&status),
        ) {
            (Some(c), _) => format!("exited with status {c}"),
            (None, Some(sig)) => format!("was killed by signal {sig}"),
            _ => "failed".to_string(),
        };
        return CommandResult::err(format!(
            "tool `{}` {how}; stderr (tail): {}",
            tool.name,
            stderr_tail.trim_end()
        ));
    }
    // Cleaned before it is cut, kept in the file area or returned.
    let text = env
        .redactor
        .redact(&String::from_utf8_lossy(&out))
        .into_owned();
    if (text.len() as u64) <= tool.max_output && !truncated_by_cap {
        return CommandResult {
            content: text,
            is_error: false,
        };
    }
    CommandResult {
        content: cut_and_keep(
            &text,
            text.len(),
            tool.max_output,
            files,
            &tool.name,
            call_id,
            truncated_by_cap,
        ),
        is_error: false,
    }
}

/// A result longer than `max` bytes: the first `max` bytes (on a character boundary) and a note
/// naming where the whole text was kept in the thread's file area (`tool-output/`).
pub(super) fn cut_and_keep(
    text: &str,
    total: usize,
    max: u64,
    files: &Path,
    tool: &str,
    call_id: &str,
    capped: bool,
) -> String {
    let rel = format!("tool-output/{}-{}.txt", sanitize(tool), sanitize(call_id));
    let kept = std::fs::create_dir_all(files.join("tool-output"))
        .and_then(|()| std::fs::write(files.join(&rel), text));
    let mut cut = (max as usize).min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let note = match kept {
        Ok(()) => format!(
            "\n[output cut at {cut} of {total} bytes{}; the whole output is in the file area at `{rel}` (file_read)]",
            if capped { ", itself cut at the 64 MiB cap" } else { "" }
        ),
        Err(e) => format!("\n[output cut at {cut} of {total} bytes; keeping the whole output failed: {e}]"),
    };
    format!("{}{note}", &text[..cut])
}

/// A bare program name is looked up in weft's own `PATH` (the child's environment is cleared).
pub(super) fn resolve_program(p: &str) -> PathBuf {
    if p.contains('/') {
        return PathBuf::from(p);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|d| d.join(p))
        .find(|c| c.is_file())
        .unwrap_or_else(|| PathBuf::from(p))
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// Reads at most `cap` bytes, then drains (and drops) the rest so the writer never blocks.
async fn read_capped(r: Option<impl AsyncRead + Unpin>, cap: u64) -> (Vec<u8>, bool) {
    let Some(mut r) = r else {
        return (Vec::new(), false);
    };
    let mut out = Vec::new();
    let _ = (&mut r).take(cap).read_to_end(&mut out).await;
    let mut sink = [0u8; 8192];
    let mut more = false;
    while let Ok(n) = r.read(&mut sink).await {
        if n == 0 {
            break;
        }
        more = true;
    }
    (out, more)
}

/// Keeps the last `keep` bytes.
async fn read_tail(r: Option<impl AsyncRead + Unpin>, keep: usize) -> Vec<u8> {
    let Some(mut r) = r else {
        return Vec::new();
    };
    let mut tail = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > keep * 2 {
            tail.drain(..tail.len() - keep);
        }
    }
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
    }
    tail
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
