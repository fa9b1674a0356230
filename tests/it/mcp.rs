//! MCP tool servers nobody here wrote, installed from the package registries by `.ci/run` into
//! `$WEFT_MCP_DIR` (default `~/.cache/weft-mcp`): `@modelcontextprotocol/server-everything` from
//! npm over stdio and over streamable HTTP, and `mcp-server-time` from PyPI over stdio.

use crate::support::{
    calls_script, directive, mcp_dir, skip, tool_results as results, wait_until, Fixture,
};
use serde_json::{json, Value};
use std::path::PathBuf;
use weft::Status;

/// The server-everything entry point, or None (the test says SKIPPED).
fn everything() -> Option<PathBuf> {
    let p = mcp_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if p.exists() {
        return Some(p);
    }
    skip(&format!(
        "mcp: SKIPPED — {} is missing. `.ci/run` installs it (npm install --prefix $WEFT_MCP_DIR @modelcontextprotocol/server-everything)",
        p.display()
    ));
    None
}

/// The Python of the venv holding mcp-server-time, or None (SKIPPED).
fn time_python() -> Option<PathBuf> {
    let p = mcp_dir().join("venv/bin/python");
    let ok = p.exists() && mcp_dir().join("venv/bin/mcp-server-time").exists();
    if ok {
        return Some(p);
    }
    skip(&format!(
        "mcp: SKIPPED — no mcp-server-time in {}/venv. `.ci/run` installs it (pip install mcp-server-time)",
        mcp_dir().display()
    ));
    None
}

/// A root directive making one turn of `calls` per entry, under `perms`, with `config`.
fn fixture(perms: &str, turns: &[Vec<(&str, Value)>], config: &str) -> Fixture {
    let script = calls_script("root", turns);
    let root = directive(&format!("permissions: {perms}"), "Use MCP tools.");
    Fixture::new(&[("root", &root)], &script, config)
}

fn stdio_config(js: &std::path::Path, marker: &str) -> String {
    format!(
        "mcp_servers:\n  everything: {{ command: node, args: [{}, stdio, {marker}] }}\n",
        json!(js.display().to_string())
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_stdio_answers_granted_tools_only() {
    let Some(js) = everything() else { return };
    let fx = fixture(
        "[mcp.everything.echo, mcp.everything.get-sum]",
        &[vec![
            (
                "mcp__everything__echo",
                json!({"message": "hello from weft"}),
            ),
            ("mcp__everything__get-sum", json!({"a": 2, "b": 3})),
            ("mcp__everything__get-env", json!({})),
            (
                "mcp__everything__echo",
                json!({"message": "y".repeat(70_000)}),
            ),
        ]],
        &stdio_config(&js, "stdio-basic"),
    );
    let (report, _rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let r = results(&fx, report.thread_id.as_str());
    assert!(!r[0].1 && r[0].0.contains("hello from weft"), "{:?}", r[0]);
    assert!(!r[1].1 && r[1].0.contains('5'), "{:?}", r[1]);
    assert!(r[2].1 && r[2].0.contains("ungranted"), "{:?}", r[2]);
    // A result too long for the model is cut, and kept whole in the file area.
    assert!(!r[3].1, "{:?}", &r[3].0[..200]);
    assert!(r[3].0.len() < 66_000, "{}", r[3].0.len());
    assert!(r[3]
        .0
        .contains("the whole output is in the file area at `tool-output/"));
    let kept = fx
        .root()
        .join(".weft/threads")
        .join(report.thread_id.as_str())
        .join("files/tool-output");
    let files: Vec<_> = std::fs::read_dir(kept).unwrap().flatten().collect();
    assert_eq!(files.len(), 1);
    assert!(std::fs::metadata(files[0].path()).unwrap().len() > 70_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_streamable_http() {
    let Some(js) = everything() else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = tokio::process::Command::new("node")
        .arg(&js)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until("the HTTP MCP server listens", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    // The token comes from a variable cargo sets for every test (no set_var in a threaded test).
    let token = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    let fx = fixture(
        "[\"mcp.web.*\"]",
        &[vec![("mcp__web__echo", json!({"message": "over http"}))]],
        &format!(
            "mcp_servers:\n  web: {{ url: \"http://127.0.0.1:{port}/mcp\", headers: {{ Authorization: \"Bearer ${{CARGO_MANIFEST_DIR}}\" }} }}\n"
        ),
    );
    let (report, _rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let r = results(&fx, report.thread_id.as_str());
    assert!(!r[0].1 && r[0].0.contains("over http"), "{:?}", r[0]);
    let transcript = std::fs::read_to_string(
        fx.root()
            .join(".weft/threads")
            .join(report.thread_id.as_str())
            .join("transcript.jsonl"),
    )
    .unwrap();
    assert!(
        !transcript.contains(&token),
        "a credential reached the transcript"
    );
    let _ = server.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_server_time_from_pypi() {
    let Some(py) = time_python() else { return };
    let fx = fixture(
        "[\"mcp.time.*\"]",
        &[vec![(
            "mcp__time__get_current_time",
            json!({"timezone": "UTC"}),
        )]],
        &format!(
            "mcp_servers:\n  time: {{ command: {}, args: [\"-m\", mcp_server_time] }}\n",
            json!(py.display().to_string())
        ),
    );
    let (report, _rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let r = results(&fx, report.thread_id.as_str());
    assert!(!r[0].1, "{:?}", r[0]);
    let v: Value = serde_json::from_str(&r[0].0).unwrap_or(Value::Null);
    assert_eq!(v["timezone"], "UTC", "{:?}", r[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_thread_abandons_its_mcp_call() {
    let Some(js) = everything() else { return };
    let fx = fixture(
        "[\"mcp.everything.*\"]",
        &[vec![(
            "mcp__everything__trigger-long-running-operation",
            json!({"duration": 60, "steps": 60}),
        )]],
        &stdio_config(&js, "stdio-cancel"),
    );
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().to_string();
    wait_until("the MCP call is under way", || {
        fx.events(&id).iter().any(|e| e["type"] == "tool_use")
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    handle.cancel("enough");
    let report = tokio::time::timeout(std::time::Duration::from_secs(10), handle.wait())
        .await
        .expect("the thread ends without waiting for the 60 s operation")
        .unwrap();
    assert_eq!(report.status, Status::Cancelled);
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let r = results(&fx, &id);
    assert!(r[0].1 && r[0].0.contains("cancelled"), "{:?}", r[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_is_started_again() {
    let Some(js) = everything() else { return };
    let marker = format!("weft-crash-{}", std::process::id());
    let fx = fixture(
        "[\"mcp.everything.*\", tool.kill-server]",
        &[
            vec![("mcp__everything__echo", json!({"message": "one"}))],
            vec![("kill-server", json!({}))],
            vec![("mcp__everything__echo", json!({"message": "two"}))],
            vec![("mcp__everything__echo", json!({"message": "three"}))],
        ],
        &stdio_config(&js, &marker),
    );
    std::fs::create_dir_all(fx.root().join("tools")).unwrap();
    std::fs::write(
        fx.root().join("tools/kill.yaml"),
        // No pkill (procps is not on every machine): sh and grep find the server by its marker.
        format!(
            "name: kill-server\nargv: [sh, \"-c\", 'for p in /proc/[0-9]*; do n=${{p#/proc/}}; [ \"$n\" = \"$$\" ] && continue; grep -qa {marker} $p/cmdline 2>/dev/null && kill -KILL $n 2>/dev/null; done; true']\n"
        ),
    )
    .unwrap();
    let (report, _rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let r = results(&fx, report.thread_id.as_str());
    assert!(!r[0].1 && r[0].0.contains("one"), "{:?}", r[0]);
    assert!(!r[1].1, "the server was killed: {:?}", r[1]);
    // The call that meets the dead server may fail (an error result, never a crash)...
    assert!(r[2].1 || r[2].0.contains("two"), "{:?}", r[2]);
    // ...and the server is started again for the next one.
    assert!(!r[3].1 && r[3].0.contains("three"), "{:?}", r[3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_literal_credential_in_the_config_is_refused() {
    let fx = fixture(
        "[]",
        &[],
        "mcp_servers:\n  web: { url: \"http://127.0.0.1:9/mcp\", headers: { Authorization: \"Bearer abc123\" } }\n",
    );
    let err = weft::Runtime::open(fx.project())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("credential is never written in the file"),
        "{err}"
    );
    assert!(
        err.contains("config.yaml:"),
        "names the file and line: {err}"
    );
}

/// The server is told: cancelling a thread sends `notifications/cancelled` for its MCP call,
/// which the official Python SDK turns into the cancellation of the tool's task (observed here
/// by a small server on that SDK, `tests/fixtures/mcp/cancel_probe.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_reaches_the_server_as_notifications_cancelled() {
    let Some(py) = time_python() else { return };
    let probe =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp/cancel_probe.py");
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("mark");
    let fx = fixture(
        "[\"mcp.probe.*\"]",
        &[vec![("mcp__probe__hang", json!({"seconds": 60}))]],
        &format!(
            "mcp_servers:\n  probe: {{ command: {}, args: [{}, {}] }}\n",
            json!(py.display().to_string()),
            json!(probe.display().to_string()),
            json!(mark.display().to_string())
        ),
    );
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let started = marks.path().join("mark.started");
    wait_until("the tool runs on the server", || started.exists()).await;
    handle.cancel("enough");
    let report = handle.wait().await.unwrap();
    assert_eq!(report.status, Status::Cancelled);
    wait_until("the server saw notifications/cancelled", || mark.exists()).await;
}

/// `weft env` values reach a stdio MCP server through its `env` list (the project's over the
/// user's: a server is shared by every thread); a secret among them comes back from the server
/// only as `[secret:NAME]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_values_reach_an_mcp_server_and_its_secrets_come_back_redacted() {
    let Some(js) = everything() else { return };
    let config = format!(
        "mcp_servers:\n  everything: {{ command: node, args: [{}, stdio, env-probe], env: [MCP_PROBE, MCP_SECRET] }}\n",
        json!(js.display().to_string())
    );
    let fx = fixture(
        "[mcp.everything.get-env]",
        &[vec![("mcp__everything__get-env", json!({}))]],
        &config,
    );
    let store = weft::FileStore::open(&fx.project()).unwrap();
    store
        .env_set(
            &weft::Scope::Project,
            "MCP_PROBE",
            "plain-probe-value",
            false,
        )
        .unwrap();
    store
        .env_set(
            &weft::Scope::Project,
            "MCP_SECRET",
            "mcp-secret-0a1b2c3d",
            true,
        )
        .unwrap();
    let (report, _rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let r = results(&fx, report.thread_id.as_str());
    assert!(!r[0].1, "{:?}", r[0]);
    assert!(r[0].0.contains("plain-probe-value"), "{}", r[0].0);
    assert!(r[0].0.contains("[secret:MCP_SECRET]"), "{}", r[0].0);
    assert!(!r[0].0.contains("mcp-secret-0a1b2c3d"));
}

/// A command server's whole process group ends with the runtime's close — a process the server
/// left behind included — and its record in `.weft/state/procs` goes with it. (Before: rmcp
/// ended the server's own process only; what it had started ran on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_whole_process_group_ends_with_the_runtime() {
    let Some(js) = everything() else { return };
    let tag = format!("weft-left-behind-{}", std::process::id());
    let fx = closed_with_helper(&js, "while :; do sleep 1; done", &tag).await;
    let procs = fx.root().join(".weft/state/procs");
    let records: Vec<_> = std::fs::read_dir(&procs)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(records.is_empty(), "records left: {records:?}");
}

/// A server-everything started by `sh -c` with `helper` (a shell script, its process tagged
/// `tag`) running beside it in its group: once a call has answered, the runtime is closed and
/// the helper must end with it. Returns the project.
async fn closed_with_helper(js: &std::path::Path, helper: &str, tag: &str) -> Fixture {
    let sh = format!(
        "sh -c {} {tag} & exec node {} stdio group",
        json!(helper),
        js.display()
    );
    let (fx, rt) = echo_through(&sh).await;
    let left = std::path::Path::new(tag).to_path_buf();
    assert!(
        crate::support::server_runs(&left),
        "the server's helper runs"
    );
    rt.close().await;
    wait_until("the server's group to end", || {
        !crate::support::server_runs(&left)
    })
    .await;
    fx
}

/// What a server leaves of its group when it exits at the end of its stdin is asked to end
/// (SIGTERM) before it is killed, as the MCP stdio shutdown asks: the helper's TERM trap runs.
/// (Before, it was killed at once, so a helper could not clean up.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_server_leaves_of_its_group_gets_sigterm_before_sigkill() {
    let Some(js) = everything() else { return };
    let marks = tempfile::tempdir().unwrap();
    let termed = marks.path().join("termed");
    let tag = format!("weft-left-termed-{}", std::process::id());
    let helper = format!(
        "trap 'touch {}; exit 0' TERM; while :; do sleep 1; done",
        termed.display()
    );
    closed_with_helper(&js, &helper, &tag).await;
    assert!(
        termed.exists(),
        "the helper was killed without a SIGTERM first"
    );
}

/// A server that ignores the end of its stdin and SIGTERM still ends with the runtime's close,
/// within the MCP stdio shutdown's bound (3 s for the end of stdin, 2 s after SIGTERM, then
/// SIGKILL to its group): `Runtime::close` never waits on a server for long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_eof_and_sigterm_is_killed_at_close() {
    let Some(js) = everything() else { return };
    let tag = format!("weft-stubborn-{}", std::process::id());
    // sh stays the leader (no exec) and passes its ignored SIGTERM on to the server.
    let sh = format!("trap '' TERM; node {} stdio {tag}; sleep 300", js.display());
    let (_fx, rt) = echo_through(&sh).await;
    let left = std::path::Path::new(&tag).to_path_buf();
    assert!(crate::support::server_runs(&left), "the server runs");
    let asked = std::time::Instant::now();
    rt.close().await;
    let took = asked.elapsed();
    eprintln!("the close took {took:?}");
    assert!(
        took < std::time::Duration::from_secs(12),
        "the close took {took:?}"
    );
    wait_until("the stubborn server to end", || {
        !crate::support::server_runs(&left)
    })
    .await;
}

/// A root that calls server-everything's echo once, the server started by `sh -c <sh>`: the
/// project and its runtime, once the call has answered and the root completed.
async fn echo_through(sh: &str) -> (Fixture, weft::Runtime) {
    let config = format!(
        "mcp_servers:\n  everything: {{ command: sh, args: [\"-c\", {}] }}\n",
        json!(sh)
    );
    let fx = fixture(
        "[\"mcp.everything.*\"]",
        &[vec![("mcp__everything__echo", json!({"message": "one"}))]],
        &config,
    );
    let (report, rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let r = results(&fx, report.thread_id.as_str());
    assert!(!r[0].1 && r[0].0.contains("one"), "{:?}", r[0]);
    (fx, rt)
}
