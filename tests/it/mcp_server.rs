//! weft as an MCP server, driven by clients nobody here wrote: the official MCP Python SDK
//! (`mcp` from PyPI, in `$WEFT_MCP_DIR/venv`) over stdio (`weft mcp`) and over streamable HTTP
//! (`/mcp` of `weft serve`), and the MCP Inspector's CLI mode from npm. Every tree a client
//! starts stays under `mcp_server.max_spend` and the limits it asked for.

use super::serve::Server;
use crate::support::{directive, mcp_dir, rows_json, skip, Fixture};
use serde_json::{json, Value};
use std::path::PathBuf;

const FANOUT: &str = include_str!("../../examples/research/directives/research/fanout.md");
const QUESTION: &str = include_str!("../../examples/research/directives/research/question.md");
const SOURCE: &str = include_str!("../../examples/research/directives/research/source.md");
const SCRIPT: &str = include_str!("../../examples/research/script.yaml");

/// The research example, `other/secret` beside it (never opened to clients) and `slow/wait`
/// (one call of 60 s), with `mcp_server` as given (None: not configured).
fn project(mcp_server: Option<&str>) -> Fixture {
    let secret = directive("description: not for MCP clients", "Say hi.");
    let slow = directive(
        "description: one long call\nlimits: { spend: 0.02 }",
        "Wait.",
    );
    let script = format!(
        "{SCRIPT}\nother/secret:\n  - text: hi\nslow/wait:\n  - text: done\n    delay: 60s\n    usage: {{ input_tokens: 10, output_tokens: 10 }}\n"
    );
    let config = mcp_server.map_or(String::new(), |m| format!("mcp_server: {m}\n"));
    // Front matter renaming a file into, and out of, the open patterns.
    let into = directive(
        "name: research/deploy\ndescription: renamed into research/",
        "Deploy.",
    );
    let out_of = directive(
        "name: ops/renamed\ndescription: renamed out of research/",
        "Hi.",
    );
    Fixture::new(
        &[
            ("ops/deploy", &into),
            ("research/renamed", &out_of),
            ("research/fanout", FANOUT),
            ("research/question", QUESTION),
            ("research/source", SOURCE),
            ("other/secret", &secret),
            ("slow/wait", &slow),
        ],
        &script,
        &config,
    )
}

/// The Python of the venv holding the MCP SDK, or None (SKIPPED; fails under CI=true).
fn sdk_python() -> Option<PathBuf> {
    crate::support::venv_python("mcp.client.streamable_http, httpx2", "mcp_server")
}

/// Runs the SDK client (`tests/fixtures/mcp/weft_client.py`) with `args` on `steps`; its
/// answers, one per step that prints.
fn sdk(python: &PathBuf, args: &[&str], steps: Value) -> Vec<Value> {
    let client = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/mcp/weft_client.py"
    );
    let mut cmd = std::process::Command::new(python);
    cmd.arg(client)
        .args(args)
        .env("WEFT_HOME", crate::support::weft_home());
    let input = steps.to_string();
    let out = crate::support::fed(&mut cmd, input.as_bytes(), 120, "the MCP Python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the MCP Python client failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The SDK over stdio: `weft mcp` on `fx`'s project.
fn over_stdio(python: &PathBuf, fx: &Fixture, steps: Value) -> Vec<Value> {
    let weft = env!("CARGO_BIN_EXE_weft");
    let root = fx.root().to_string_lossy().to_string();
    let script = fx.root().join("script.yaml").to_string_lossy().to_string();
    sdk(python, &["stdio", weft, &root, &script], steps)
}

/// A registry row of `fx` by id.
fn row(fx: &Fixture, id: &str) -> Value {
    rows_json(fx.root())
        .into_iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("no row {id}"))
}

#[test]
fn the_python_sdk_runs_a_directive_over_stdio_within_its_cap() {
    let Some(py) = sdk_python() else { return };
    let fx = project(Some(
        "{ max_spend: 0.05, directives: [\"research/*\", \"slow/*\"] }",
    ));
    let run = json!({"op": "call", "tool": "run_directive", "progress": true,
        "args": {"directive": "research/fanout", "inputs": {"topic": "looms"}}});
    let a = over_stdio(
        &py,
        &fx,
        json!([{"op": "init"}, {"op": "call", "tool": "list_directives"}, run]),
    );
    assert_eq!(a[0]["server"]["name"], "weft");
    let tools: Vec<&str> = a[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        [
            "run_directive",
            "list_directives",
            "thread_status",
            "cancel_thread",
            "search_threads"
        ]
    );
    assert_eq!(a[0]["templates"], json!(["weft://threads/{id}/transcript"]));
    // Listed: what clients may start, with the inputs as JSON Schema; never other/secret.
    let listed: Vec<&str> = a[1]["structured"]["directives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        [
            "research/fanout",
            "research/question",
            "research/source",
            "slow/wait"
        ]
    );
    let fanout = &a[1]["structured"]["directives"][0];
    assert_eq!(fanout["inputs"]["required"], json!(["topic"]));
    assert_eq!(fanout["inputs"]["properties"]["width"]["default"], 3);
    // The tree ran whole: its result, outputs and spend, the registry's spend, under the cap.
    let r = &a[2];
    assert_eq!(r["is_error"], false, "{r}");
    let s = &r["structured"];
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["outputs"]["answers"], 3);
    let id = s["thread_id"].as_str().unwrap();
    let root = row(&fx, id);
    assert_eq!(s["spend_nanos"], root["spend_nanos"]);
    assert!(s["spend_nanos"].as_i64().unwrap() <= 50_000_000, "{s}");
    let rows = rows_json(fx.root());
    assert_eq!(
        rows.len(),
        10,
        "the root, 3 questions, 6 sources: {rows:#?}"
    );
    // Progress named every thread as it started and as it ended.
    let msgs: Vec<&str> = r["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        msgs.iter().filter(|m| m.starts_with("started ")).count(),
        10,
        "{msgs:?}"
    );
    assert_eq!(
        msgs.iter().filter(|m| m.starts_with("completed ")).count(),
        10,
        "{msgs:?}"
    );
    // Each thread counts once started and once ended: progress only grows, to its total.
    let last = r["progress"].as_array().unwrap().last().unwrap();
    assert_eq!(
        (&last["progress"], &last["total"]),
        (&json!(20.0), &json!(20.0))
    );
}

#[test]
fn an_mcp_client_can_only_lower_limits_and_start_what_the_config_opens() {
    let Some(py) = sdk_python() else { return };
    let fx = project(Some("{ max_spend: 0.004, directives: [\"research/*\"] }"));
    let call = |args: Value| json!({"op": "call", "tool": "run_directive", "args": args});
    let a = over_stdio(
        &py,
        &fx,
        json!([
            // Asking for more than max_spend gets max_spend: the tree stops at its cap.
            call(
                json!({"directive": "research/fanout", "inputs": {"topic": "x"}, "limits": {"spend": 5}})
            ),
            call(json!({"directive": "other/secret"})),
            call(json!({"directive": "../directives/other/secret.md"})),
            call(
                json!({"directive": "research/fanout", "inputs": {"topic": "x"}, "limits": {"turns": 1}})
            ),
            call(json!({"directive": "research/fanout"})),
            call(json!({"directive": "ops/deploy"})),
            call(json!({"directive": "research/renamed"})),
        ]),
    );
    let capped = &a[0]["structured"];
    assert_eq!(capped["status"], "error", "{capped}");
    assert!(
        capped["error"]
            .as_str()
            .unwrap()
            .contains("limit exceeded: spend"),
        "{capped}"
    );
    let spent = row(&fx, capped["thread_id"].as_str().unwrap())["spend_nanos"]
        .as_i64()
        .unwrap();
    assert!(
        spent > 0 && spent <= 4_000_000,
        "spent {spent} of a 0.004 cap"
    );
    for (i, needle) in [
        (1, "is not open to MCP clients"),
        (2, "not a directive name"),
    ] {
        assert_eq!(a[i]["is_error"], true, "{}", a[i]);
        assert!(
            a[i]["text"][0].as_str().unwrap().contains(needle),
            "{}",
            a[i]
        );
    }
    let lowered = &a[3]["structured"];
    assert_eq!(lowered["turns"], 1, "{lowered}");
    assert_eq!(a[4]["is_error"], true);
    assert!(
        a[4]["text"][0].as_str().unwrap().contains("topic"),
        "{}",
        a[4]
    );
    // Nothing but the capped and the lowered trees ever started.
    let roots = rows_json(fx.root())
        .into_iter()
        .filter(|r| r["parent_id"].is_null())
        .count();
    assert_eq!(roots, 2);
}

#[test]
fn an_unconfigured_mcp_server_opens_nothing_and_says_how() {
    let Some(py) = sdk_python() else { return };
    let fx = project(None);
    let a = over_stdio(
        &py,
        &fx,
        json!([
            {"op": "call", "tool": "run_directive", "args": {"directive": "research/fanout", "inputs": {"topic": "x"}}},
            {"op": "call", "tool": "list_directives"},
        ]),
    );
    for r in &a {
        assert_eq!(r["is_error"], true, "{r}");
        let text = r["text"][0].as_str().unwrap();
        assert!(
            text.contains("mcp_server: { max_spend") && text.contains("config.yaml"),
            "{text}"
        );
    }
    assert!(rows_json(fx.root()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_over_http_cancels_and_reads_a_tree_behind_its_own_token() {
    let Some(py) = sdk_python() else { return };
    let fx = project(Some(
        "{ max_spend: 0.03, directives: [\"research/*\", \"slow/*\"], max_live_trees: 1 }",
    ));
    let script = fx.root().join("script.yaml");
    let srv = Server::start(&fx, &["--script", script.to_str().unwrap()]);
    let url = format!("{}/mcp", srv.base);
    let mcp_token = std::fs::read_to_string(fx.root().join(".weft/mcp.token")).unwrap();
    assert_ne!(mcp_token, srv.token);
    // No token, or the API's, gets no MCP; MCP's gets no API.
    let http = reqwest::Client::new();
    for token in ["", srv.token.as_str()] {
        let r = http
            .post(&url)
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
    }
    let api = http
        .get(format!("{}/v1/threads", srv.base))
        .bearer_auth(&mcp_token)
        .send()
        .await
        .unwrap();
    assert_eq!(api.status().as_u16(), 401);
    let (py2, url2, token) = (py.clone(), url.clone(), mcp_token.clone());
    let a = tokio::task::spawn_blocking(move || {
        sdk(
            &py2,
            &["http", &url2, &token],
            json!([
                {"op": "call", "tool": "run_directive", "args": {"directive": "slow/wait"}, "progress": true, "cancel_after": 2.0},
                {"op": "sleep", "secs": 1.5},
                {"op": "call", "tool": "run_directive", "args": {"directive": "slow/wait", "wait": false}},
                {"op": "call", "tool": "run_directive", "args": {"directive": "slow/wait", "wait": false}},
            ]),
        )
    })
    .await
    .unwrap();
    assert_eq!(a[0]["cancelled"], true, "{}", a[0]);
    let started = a[1]["structured"]["thread_id"]
        .as_str()
        .unwrap()
        .to_string();
    // The cancelled request's tree ends cancelled, well before its 60 s call.
    let first = || {
        rows_json(fx.root())
            .into_iter()
            .find(|r| r["id"] != started.as_str())
            .unwrap()
    };
    crate::support::wait_until("the cancelled request's tree to end", || {
        first()["status"] == "cancelled"
    })
    .await;
    let (py3, url3, token) = (py.clone(), url.clone(), mcp_token.clone());
    let first_id = first()["id"].as_str().unwrap().to_string();
    let uri = format!("weft://threads/{first_id}/transcript");
    let id2 = started.clone();
    let b = tokio::task::spawn_blocking(move || {
        sdk(
            &py3,
            &["http", &url3, &token],
            json!([
                {"op": "call", "tool": "cancel_thread", "args": {"id": id2}},
                {"op": "sleep", "secs": 1.0},
                {"op": "call", "tool": "thread_status", "args": {"id": id2}},
                {"op": "read", "uri": uri},
                {"op": "resources"},
                {"op": "call", "tool": "search_threads", "args": {"query": "Wait"}},
            ]),
        )
    })
    .await
    .unwrap();
    assert_eq!(b[0]["is_error"], false, "{}", b[0]);
    crate::support::wait_until("cancel_thread's tree to end", || {
        row(&fx, &started)["status"] == "cancelled"
    })
    .await;
    assert!(["cancelled", "running"].contains(&b[1]["structured"]["status"].as_str().unwrap()));
    let text = b[2]["contents"][0]["text"].as_str().unwrap();
    let page: Value = serde_json::from_str(text).unwrap();
    assert!(!page["lines"].as_array().unwrap().is_empty(), "{page}");
    let uris = b[3]["uris"].as_array().unwrap();
    assert_eq!(uris.len(), 2, "{uris:?}");
    assert!(
        !b[4]["structured"]["hits"].as_array().unwrap().is_empty(),
        "{}",
        b[4]
    );
}

/// An MCP client's cancel withdraws a start that waits on a slow MCP server the directive may
/// use: the row ends `cancelled` at once, not when the server answers or its 60 s start
/// timeout runs out (before, the request's token reached the tree only once it had started).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_clients_cancel_withdraws_a_start_that_waits_on_a_server() {
    let Some(py) = sdk_python() else { return };
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("hang");
    std::fs::write(&mark, "").unwrap();
    let d = directive(
        "description: waits on a server\npermissions: [\"mcp.stuck.*\"]",
        "Wait.",
    );
    let config = format!(
        "mcp_server: {{ max_spend: 0.03, directives: [\"slow/*\"] }}\n{}",
        crate::support::stuck_server(&mark)
    );
    let fx = Fixture::new(
        &[("slow/stuck", &d)],
        "slow/stuck:\n  - text: done\n",
        &config,
    );
    let script = fx.root().join("script.yaml");
    let srv = Server::start(&fx, &["--script", script.to_str().unwrap()]);
    let url = format!("{}/mcp", srv.base);
    let token = std::fs::read_to_string(fx.root().join(".weft/mcp.token")).unwrap();
    let client = tokio::task::spawn_blocking(move || {
        sdk(
            &py,
            &["http", &url, &token],
            json!([
                {"op": "call", "tool": "run_directive", "args": {"directive": "slow/stuck"}, "cancel_after": 3.0},
                {"op": "sleep", "secs": 20.0},
            ]),
        )
    });
    let server_runs = || crate::support::server_runs(&mark);
    crate::support::wait_until("the directive's server to be starting", server_runs).await;
    let asked = std::time::Instant::now();
    crate::support::wait_until("the cancelled start to end", || {
        rows_json(fx.root())
            .first()
            .is_some_and(|r| r["status"] == "cancelled")
    })
    .await;
    let took = asked.elapsed();
    assert!(
        took < std::time::Duration::from_secs(8),
        "the start ended {took:?} after the server started (the client cancelled after 3 s)"
    );
    let answers = client.await.unwrap();
    assert_eq!(answers[0]["cancelled"], true, "{}", answers[0]);
    let rows = rows_json(fx.root());
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["turns"], 0, "{rows:?}");
}

/// The MCP Inspector's launcher (npm `@modelcontextprotocol/inspector`, in
/// `$WEFT_MCP_DIR/inspector`), or None (SKIPPED; fails under CI=true).
fn inspector() -> Option<PathBuf> {
    let p = mcp_dir().join(
        "inspector/node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js",
    );
    if p.exists() {
        return Some(p);
    }
    skip(&format!(
        "mcp_server: SKIPPED — {} is missing. `.ci/run` installs it (npm install --prefix $WEFT_MCP_DIR/inspector @modelcontextprotocol/inspector)",
        p.display()
    ));
    None
}

/// The Inspector's CLI mode with `args`: its JSON answer.
fn inspect(launcher: &PathBuf, args: &[&str]) -> Value {
    let child = std::process::Command::new("node")
        .arg(launcher)
        .arg("--cli")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = crate::support::exits_within(child, 120, "the MCP Inspector CLI");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "inspector {args:?}: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_inspector_cli_runs_a_directive_over_stdio_and_lists_tools_over_http() {
    let Some(launcher) = inspector() else { return };
    let fx = project(Some("{ max_spend: 0.05, directives: [\"research/*\"] }"));
    let script = fx.root().join("script.yaml");
    let home = format!("WEFT_HOME={}", crate::support::weft_home().display());
    let (l2, root, script2) = (launcher.clone(), fx.root().to_path_buf(), script.clone());
    let ran = tokio::task::spawn_blocking(move || {
        inspect(
            &l2,
            &[
                "-e",
                &home,
                "--method",
                "tools/call",
                "--tool-name",
                "run_directive",
                "--tool-arg",
                "directive=research/fanout",
                r#"inputs={"topic":"looms"}"#,
                "--",
                env!("CARGO_BIN_EXE_weft"),
                "mcp",
                "--project",
                root.to_str().unwrap(),
                "--script",
                script2.to_str().unwrap(),
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(ran["isError"], false, "{ran}");
    let s = &ran["structuredContent"];
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(
        s["spend_nanos"],
        row(&fx, s["thread_id"].as_str().unwrap())["spend_nanos"]
    );
    let srv = Server::start(&fx, &["--script", script.to_str().unwrap()]);
    let token = std::fs::read_to_string(fx.root().join(".weft/mcp.token")).unwrap();
    let (url, auth) = (
        format!("{}/mcp", srv.base),
        format!("Authorization: Bearer {token}"),
    );
    let listed = tokio::task::spawn_blocking(move || {
        inspect(
            &launcher,
            &[
                "--transport",
                "http",
                "--server-url",
                &url,
                "--header",
                &auth,
                "--method",
                "tools/list",
            ],
        )
    })
    .await
    .unwrap();
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(names.contains(&"run_directive"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weft_mcp_cancels_its_trees_and_exits_when_its_client_goes_away() {
    let fx = project(Some("{ max_spend: 0.03, directives: [\"slow/*\"] }"));
    let script = fx.root().join("script.yaml");
    let (child, stdin) = crate::support::mcp_running(fx.root(), &script, "slow/wait");
    crate::support::wait_until("the tree to start", || {
        rows_json(fx.root())
            .iter()
            .any(|r| r["status"] == "running")
    })
    .await;
    let since = std::time::Instant::now();
    drop(stdin);
    let out = tokio::task::spawn_blocking(move || {
        crate::support::exits_within(child, 20, "weft mcp after its client closed stdin")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = rows_json(fx.root());
    assert_eq!(rows[0]["status"], "cancelled", "{rows:?}");
    assert!(since.elapsed() < std::time::Duration::from_secs(15));
    // stdout held the protocol only: every line is a JSON-RPC message.
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert_eq!(v["jsonrpc"], "2.0", "{l}");
    }
}
