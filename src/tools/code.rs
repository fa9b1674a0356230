//! `run_code {source, timeout?}` (capability `code.run`): JavaScript in an embedded QuickJS
//! (rquickjs) with no I/O of its own — no modules, no files, no network, no clock beyond
//! `Date` — and helpers only for the thread's key-value store (`kv.get`, `kv.set`) and file area
//! (`files.read`, `files.write`, `files.list`), each checked against the thread's capabilities
//! (`kv`, `fs.read`, `fs.write`) like the tools they mirror. Limits: memory (32 MiB), stack
//! (512 KiB), time (`timeout`, default 5 s, at most 30 s) and the thread's cancel, all enforced
//! by the engine's interrupt handler and allocator accounting, so a runaway script stops.
//!
//! The engine (`code/quickjs.rs`) is behind the `js` feature; a weft built without it refuses
//! every call with a tool error that says so.

use serde_json::Value;

mod env;
#[cfg(feature = "js")]
mod quickjs;

pub(crate) use env::CodeEnv;

/// Runs `source`; Ok is `{result, logs}`, Err the message for the model (with any logs).
#[cfg(feature = "js")]
pub(crate) fn run(source: &str, timeout: Option<f64>, env: CodeEnv) -> Result<Value, String> {
    quickjs::run(source, timeout, env)
}

/// Without the `js` feature there is no engine: the call is refused, saying why.
#[cfg(not(feature = "js"))]
pub(crate) fn run(_source: &str, _timeout: Option<f64>, _env: CodeEnv) -> Result<Value, String> {
    Err("run_code is not available: this weft was built without the `js` feature (QuickJS); nothing was run".into())
}
