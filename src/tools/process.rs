//! Running one call of a command tool (see `command.rs`): the input validated and put into
//! argv's placeholders, the program started in its own process group with a cleared
//! environment, the input on stdin, stdout read up to a hard cap and stderr's tail kept.
//!
//! Owns the environment allow-list, output bounds (a long output is cut and kept whole in the
//! thread's file area) and the kill of the whole process group when the call ends, times out or
//! is cancelled. Must never run anything through a shell, pass a variable the tool does not list,
//! return or keep output before it is cleaned of secrets, or leave a process of a call behind.

use super::command::{placeholder, CommandTool, Cwd};
use super::schema;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;
use tokio_util::sync::CancellationToken;

/// Never read more than this of a tool's stdout into memory, whatever it prints.
const HARD_OUTPUT_CAP: u64 = 64 * 1024 * 1024;
/// The tail of stderr an error result carries.
const STDERR_TAIL: usize = 2048;

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

/// What a call's process gets besides its input: the thread's environment values for the
/// tool's `env` names (over weft's own environment), and the secrets its output is cleaned of
/// before anything of it is kept or returned.
#[derive(Default)]
pub(crate) struct CallEnv {
    /// Resolved values (thread → parent chain → project → user), secrets decrypted.
    pub vars: std::collections::BTreeMap<String, String>,
    /// The secrets to hide.
    pub redactor: std::sync::Arc<crate::core::redact::Redactor>,
    /// Where the call's process group is recorded while it runs (`.weft/state/procs`; see
    /// `groups.rs`), so recovery can kill it if this process dies.
    pub procs: Option<PathBuf>,
}

/// Runs one call of `tool`: validates `input`, starts the process in its own group with the
/// input on stdin, and waits for it, its timeout or `cancel`, whichever comes first. The whole
/// group is killed on timeout and cancel. `files` is the thread's file area; `call_id` names the
/// file that keeps a cut output.
pub(crate) async fn run(
    tool: &CommandTool,
    input: &Value,
    project_root: &Path,
    files: &Path,
    call_id: &str,
    cancel: CancellationToken,
    env: &CallEnv,
) -> CommandResult {
    let started = start(tool, input, project_root, files, env).await;
    let exited = match started {
        Ok(child) => {
            let group = child.id().unwrap_or_default();
            let recorded = super::groups::record(env.procs.as_deref(), group, call_id);
            let exited = wait(tool, child, input, &cancel).await;
            recorded.done();
            exited
        }
        Err(refused) => Err(refused),
    };
    match exited {
        Ok(exited) => outcome(tool, exited, files, call_id, env),
        Err(failed) => failed,
    }
}

/// Checks `input` and starts the call's process (from the spawner thread, its leader killed
/// if weft dies: `groups.rs`); an error is the result for the model (nothing was run).
async fn start(
    tool: &CommandTool,
    input: &Value,
    project_root: &Path,
    files: &Path,
    env: &CallEnv,
) -> Result<Child, CommandResult> {
    if let Err(m) = schema::validate(&tool.input_schema, input) {
        return Err(CommandResult::err(format!(
            "invalid input for tool `{}`: {m}; nothing was run",
            tool.name
        )));
    }
    let argv = fill_argv(tool, input)?;
    let program = resolve_program(&argv[0]);
    let cwd = working_dir(tool, project_root, files)?;
    super::groups::spawn(command(tool, &program, &argv[1..], cwd, env))
        .await
        .map_err(|e| {
            CommandResult::err(format!(
                "tool `{}` could not start `{}`: {e} (argv in {})",
                tool.name,
                program.display(),
                tool.source.display()
            ))
        })
}

/// `tool`'s argv with each `{input.<key>}` placeholder replaced by the input's value (a string
/// as it is, anything else as JSON); a missing value refuses the call. A value starting with
/// `-` is refused unless a `--` argument comes before its placeholder (the end of options): a
/// model's input is an operand, never an option of the program.
fn fill_argv(tool: &CommandTool, input: &Value) -> Result<Vec<String>, CommandResult> {
    let empty = Map::new();
    let obj = input.as_object().unwrap_or(&empty);
    let mut operands_only = false;
    let mut out = Vec::with_capacity(tool.argv.len());
    for a in &tool.argv {
        let Some(k) = placeholder(a) else {
            operands_only |= a == "--";
            out.push(a.clone());
            continue;
        };
        let value = match obj.get(k) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => {
                return Err(CommandResult::err(format!(
                    "tool `{}` needs input `{k}` for its arguments; nothing was run",
                    tool.name
                )))
            }
            Some(other) => other.to_string(),
        };
        if value.starts_with('-') && !operands_only {
            return Err(CommandResult::err(format!(
                "tool `{}`: input `{k}` starts with `-` and would be read as an option; nothing was run (the tool's argv can put `--` before `{{input.{k}}}` to pass such values as operands)",
                tool.name
            )));
        }
        out.push(value);
    }
    Ok(out)
}

/// The folder the call runs in; the file area is made on first use.
fn working_dir<'a>(
    tool: &CommandTool,
    project_root: &'a Path,
    files: &'a Path,
) -> Result<&'a Path, CommandResult> {
    match tool.cwd {
        Cwd::Project => Ok(project_root),
        Cwd::Files => match std::fs::create_dir_all(files) {
            Ok(()) => Ok(files),
            Err(e) => Err(CommandResult::err(format!(
                "tool `{}`: the file area cannot be made: {e}",
                tool.name
            ))),
        },
    }
}

/// The call's process: in its own process group, with piped stdio and a cleared environment
/// holding only the tool's `env` names (the thread's values over weft's own environment).
fn command(
    tool: &CommandTool,
    program: &Path,
    args: &[String],
    cwd: &Path,
    env: &CallEnv,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
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
    cmd
}

/// What a call's process left when it exited.
struct Exited {
    /// How it exited.
    status: std::process::ExitStatus,
    /// Its stdout, at most [`HARD_OUTPUT_CAP`] bytes.
    out: Vec<u8>,
    /// Whether stdout went past the cap.
    capped: bool,
    /// The tail of its stderr.
    err: Vec<u8>,
}

/// Writes `input` to the process's stdin and waits for it to exit, for the tool's timeout or
/// for `cancel`; in every case its whole process group is killed after (a grandchild it left
/// behind included). A timeout or a cancel is the result for the model.
async fn wait(
    tool: &CommandTool,
    mut child: Child,
    input: &Value,
    cancel: &CancellationToken,
) -> Result<Exited, CommandResult> {
    let group = child.id();
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
            kill_group(group);
            return Err(CommandResult::err(format!("tool `{}` was cancelled: its process group was killed", tool.name)));
        }
    };
    // Whatever happened, nothing of the call outlives it (a grandchild it left behind included).
    kill_group(group);
    let Some(status) = status else {
        return Err(CommandResult::err(format!(
            "tool `{}` timed out after {}: its process group was killed",
            tool.name,
            humantime::format_duration(tool.timeout)
        )));
    };
    let (out, capped) = out_task.await.unwrap_or_default();
    let err = err_task.await.unwrap_or_default();
    let status = status.map_err(|e| CommandResult::err(format!("tool `{}`: {e}", tool.name)))?;
    Ok(Exited {
        status,
        out,
        capped,
        err,
    })
}

/// Kills the process group `group` (a call's process and everything it started).
fn kill_group(group: Option<u32>) {
    if let Some(pgid) = group.and_then(|p| i32::try_from(p).ok()) {
        super::groups::kill_group(pgid);
    }
}

/// The result of a call whose process exited: a failure names how it exited and the tail of
/// its stderr; a success is its stdout. Both are cleaned of secrets first; a stdout longer than
/// `max_output` is cut and kept whole in the file area.
fn outcome(
    tool: &CommandTool,
    exited: Exited,
    files: &Path,
    call_id: &str,
    env: &CallEnv,
) -> CommandResult {
    if !exited.status.success() {
        let stderr_tail = env
            .redactor
            .redact(&String::from_utf8_lossy(&exited.err))
            .into_owned();
        return CommandResult::err(format!(
            "tool `{}` {}; stderr (tail): {}",
            tool.name,
            how_it_failed(exited.status),
            stderr_tail.trim_end()
        ));
    }
    // Cleaned before it is cut, kept in the file area or returned.
    let text = env
        .redactor
        .redact(&String::from_utf8_lossy(&exited.out))
        .into_owned();
    if (text.len() as u64) <= tool.max_output && !exited.capped {
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
            exited.capped,
        ),
        is_error: false,
    }
}

/// "exited with status 3", "was killed by signal 9".
fn how_it_failed(status: std::process::ExitStatus) -> String {
    match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "failed".to_string(),
    }
}

/// A result longer than `max` bytes: the first `max` bytes (on a character boundary) and a note
/// naming where the whole text was kept in the thread's file area (`tool-output/`, written as
/// the file tools write: confined to the area, never through a link).
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
    // Confined as every write of the area is: a `tool-output` linked out is refused.
    let kept = super::files::write_confined(files, &rel, text.as_bytes());
    let mut cut = (max as usize).min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let note = match kept {
        Ok(_) => format!(
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
