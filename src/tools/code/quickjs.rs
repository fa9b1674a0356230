//! The `js` feature's engine behind `run_code` (see `code.rs`): QuickJS through rquickjs, with
//! its memory accounting, stack limit and interrupt handler (time, cancel), and the prelude's
//! helpers. Must never give a script I/O of its own (no modules, files, network or clock beyond
//! `Date`), nor a helper the thread's capabilities do not cover.

use super::env::CodeEnv;
use crate::store::ThreadStore;
use rquickjs::{Context, Ctx, Exception, Function, Runtime};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Memory a script may allocate.
const MEMORY: usize = 32 << 20;
/// Stack a script may use.
const STACK: usize = 512 << 10;
/// Time a script gets unless it asks for less (or more, up to [`MAX_TIME`]).
const DEFAULT_TIME: Duration = Duration::from_secs(5);
/// The most time a script may ask for.
const MAX_TIME: Duration = Duration::from_secs(30);
/// Bytes of console output and of the result kept.
const MAX_TEXT: usize = 64 << 10;

const PRELUDE: &str = r#"
globalThis.kv = { get: (k) => { const t = __kv_get(String(k)); return t === "" ? null : JSON.parse(t); },
                  set: (k, v) => { __kv_set(String(k), v === undefined ? "null" : JSON.stringify(v)); } };
globalThis.files = { read: (p) => __read(String(p)),
                     write: (p, t) => JSON.parse(__file("file_write", JSON.stringify({ path: String(p), content: String(t) }))),
                     list: (p) => JSON.parse(__file("file_list", JSON.stringify({ path: p === undefined ? "." : String(p) }))).entries.map((e) => e.name) };
globalThis.console = { log: (...a) => __log(a.map((x) => typeof x === "string" ? x : JSON.stringify(x)).join(" ")) };
"#;

fn throw(ctx: &Ctx<'_>, msg: &str) -> rquickjs::Error {
    Exception::throw_message(ctx, msg)
}

/// Runs `source`; Ok is `{result, logs}`, Err the message for the model (with any logs).
pub(crate) fn run(source: &str, timeout: Option<f64>, env: CodeEnv) -> Result<Value, String> {
    let time = timeout
        .filter(|t| t.is_finite() && *t > 0.0)
        .map_or(DEFAULT_TIME, |t| {
            // Checked: a model's 1e300 means "the most", not a panic.
            Duration::try_from_secs_f64(t).unwrap_or(MAX_TIME)
        })
        .min(MAX_TIME);
    let rt = Runtime::new().map_err(|e| format!("the JavaScript engine did not start: {e}"))?;
    rt.set_memory_limit(MEMORY);
    rt.set_max_stack_size(STACK);
    let deadline = Instant::now() + time;
    let cancel = env.cancel.clone();
    let stopped: Arc<Mutex<Option<&'static str>>> = Arc::default();
    let why = stopped.clone();
    rt.set_interrupt_handler(Some(Box::new(move || {
        let reason = if cancel.is_cancelled() {
            Some("the thread was cancelled")
        } else if Instant::now() >= deadline {
            Some("it ran out of time")
        } else {
            None
        };
        if let (Some(r), Ok(mut w)) = (reason, why.lock()) {
            *w = Some(r);
        }
        reason.is_some()
    })));
    let ctx =
        Context::full(&rt).map_err(|e| format!("the JavaScript engine did not start: {e}"))?;
    let logs: Arc<Mutex<String>> = Arc::default();
    let outcome = ctx.with(|ctx| -> Result<Value, String> {
        install(&ctx, &env, logs.clone()).map_err(|e| format!("helpers: {e}"))?;
        // A promise (an async script, a dynamic import) is settled first: its jobs run under
        // the same limits.
        let value = ctx.eval::<rquickjs::Value, _>(source).and_then(|v| match v.as_promise() {
            Some(p) => p.finish::<rquickjs::Value>(),
            None => Ok(v),
        });
        match value {
            Ok(v) => {
                let text = ctx
                    .json_stringify(v)
                    .ok()
                    .flatten()
                    .and_then(|s| s.to_string().ok())
                    .unwrap_or_else(|| "null".into());
                if text.len() > MAX_TEXT {
                    return Err(format!("the result is {} bytes as JSON; at most {MAX_TEXT} (write big data to a file)", text.len()));
                }
                Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
            }
            Err(rquickjs::Error::Exception) => {
                let thrown = ctx.catch();
                let text = thrown
                    .as_exception()
                    .map(|e| format!("{}{}", e.message().unwrap_or_default(), e.stack().map(|s| format!("\n{s}")).unwrap_or_default()))
                    .or_else(|| ctx.json_stringify(thrown).ok().flatten().and_then(|s| s.to_string().ok()))
                    .unwrap_or_else(|| "an exception".into());
                Err(text)
            }
            Err(rquickjs::Error::WouldBlock) => Err("its promise never settled".into()),
            Err(e) => Err(e.to_string()),
        }
    });
    let logs = logs.lock().map(|l| l.clone()).unwrap_or_default();
    let stop = stopped.lock().ok().and_then(|s| *s);
    match (outcome, stop) {
        (Ok(result), _) => Ok(json!({ "result": result, "logs": logs })),
        (Err(_), Some(reason)) => Err(format!(
            "the script was stopped: {reason} (limit {time:?}); logs: {logs}"
        )),
        (Err(e), None) if e.contains("out of memory") => Err(format!(
            "the script was stopped: it used more than {} MiB; logs: {logs}",
            MEMORY >> 20
        )),
        (Err(e), None) => Err(format!("the script failed: {e}; logs: {logs}")),
    }
}

/// The helpers behind the prelude's `kv`, `files` and `console`.
fn install<'js>(ctx: &Ctx<'js>, env: &CodeEnv, logs: Arc<Mutex<String>>) -> rquickjs::Result<()> {
    install_kv(ctx, env)?;
    install_files(ctx, env)?;
    install_log(ctx, logs)?;
    ctx.eval::<(), _>(PRELUDE)
}

/// `__kv_get` and `__kv_set`: the thread's key-value store (capability `kv`).
fn install_kv<'js>(ctx: &Ctx<'js>, env: &CodeEnv) -> rquickjs::Result<()> {
    let g = ctx.globals();
    let (kv_ok, _, _) = env.allowed;
    let (store, thread) = (env.store.clone(), env.thread.clone());
    g.set(
        "__kv_get",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, key: String| -> rquickjs::Result<String> {
                if !kv_ok {
                    return Err(throw(
                        &ctx,
                        "permission denied: `kv` is not granted to this thread",
                    ));
                }
                match store.kv_get(&thread, &key) {
                    Ok(v) => Ok(v.map(|v| v.to_string()).unwrap_or_default()),
                    Err(e) => Err(throw(&ctx, &e.to_string())),
                }
            },
        )?,
    )?;
    let (store, thread) = (env.store.clone(), env.thread.clone());
    g.set(
        "__kv_set",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, key: String, json: String| -> rquickjs::Result<()> {
                if !kv_ok {
                    return Err(throw(
                        &ctx,
                        "permission denied: `kv` is not granted to this thread",
                    ));
                }
                let value: Value = serde_json::from_str(&json).unwrap_or(Value::Null);
                let value = (!value.is_null()).then_some(value);
                store
                    .kv_set(&thread, &key, value)
                    .map_err(|e| throw(&ctx, &e.to_string()))
            },
        )?,
    )
}

/// `__file` (the file tools, by name) and `__read` (a file's exact text): the thread's file
/// area (capabilities `fs.read`, `fs.write`).
fn install_files<'js>(ctx: &Ctx<'js>, env: &CodeEnv) -> rquickjs::Result<()> {
    let g = ctx.globals();
    let (_, read_ok, write_ok) = env.allowed;
    let (area, limits) = (env.area.clone(), env.limits);
    g.set(
        "__file",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, op: String, input: String| -> rquickjs::Result<String> {
                let tool = crate::tools::FileTool::parse(&op);
                let ok = match tool.map(|t| t.capability()) {
                    Some("fs.read") => read_ok,
                    Some("fs.write") => write_ok,
                    _ => false,
                };
                let (Some(tool), true) = (tool, ok) else {
                    return Err(throw(
                        &ctx,
                        &format!("permission denied: this thread may not {op}"),
                    ));
                };
                let input: Value = serde_json::from_str(&input).unwrap_or(Value::Null);
                match crate::tools::files::run(tool, &input, &area, limits) {
                    Ok(v) => Ok(v.to_string()),
                    Err(e) => Err(throw(&ctx, &e)),
                }
            },
        )?,
    )?;
    let (area, max) = (env.area.clone(), env.limits.max_file_bytes);
    g.set(
        "__read",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, rel: String| -> rquickjs::Result<String> {
                if !read_ok {
                    return Err(throw(
                        &ctx,
                        "permission denied: this thread may not read its file area (`fs.read`)",
                    ));
                }
                // The exact text (file_read's lines are for models); confined like every file tool.
                let path =
                    crate::tools::files::resolve(&area, &rel).map_err(|e| throw(&ctx, &e))?;
                let size = std::fs::metadata(&path)
                    .map_err(|e| throw(&ctx, &format!("{rel}: {e}")))?
                    .len();
                if size > max {
                    return Err(throw(
                        &ctx,
                        &format!("{rel} is {size} bytes; files.read reads at most {max}"),
                    ));
                }
                std::fs::read_to_string(&path).map_err(|e| throw(&ctx, &format!("{rel}: {e}")))
            },
        )?,
    )
}

/// `__log`: console lines, kept up to [`MAX_TEXT`] bytes.
fn install_log(ctx: &Ctx<'_>, logs: Arc<Mutex<String>>) -> rquickjs::Result<()> {
    ctx.globals().set(
        "__log",
        Function::new(ctx.clone(), move |line: String| {
            if let Ok(mut l) = logs.lock() {
                if l.len() < MAX_TEXT {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        })?,
    )
}
