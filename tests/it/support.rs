//! Shared fixtures: a temporary project with directives, config and a script.
// Some helpers serve only the modules that drive the `weft` binary (feature `cli`).
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use weft::LimitSet;
use weft::ThreadReport;
use weft::{Project, Runtime};

/// One signing-key home for the whole test binary (set before any runtime opens).
pub fn weft_home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("weft-test-home-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::env::set_var("WEFT_HOME", &dir);
        dir
    })
}

/// Default test price: input $1/M (1000 nanos/token), output $4/M (4000 nanos/token).
pub const IN_NANOS: i64 = 1000;
pub const OUT_NANOS: i64 = 4000;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    /// The Postgres database its config names (`database:`), if it is not on SQLite.
    pub database: Option<String>,
}

/// Which backend a test's project keeps its state in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded SQLite under `.weft/state/`.
    Sqlite,
    /// A fresh database on the test's PostgreSQL server (`tests/it/pg.rs`).
    Postgres,
}

/// Both backends, for tests that must hold on each.
pub const BACKENDS: [Backend; 2] = [Backend::Sqlite, Backend::Postgres];

impl Fixture {
    /// A project with `directives` (name → text), `script` and optional extra config lines.
    pub fn new(directives: &[(&str, &str)], script: &str, extra_config: &str) -> Fixture {
        weft_home();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join(".weft")).unwrap();
        for (name, text) in directives {
            let p = root.join("directives").join(format!("{name}.md"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        std::fs::write(root.join("script.yaml"), script).unwrap();
        let config = format!(
            "pricing:\n  scripted: {{ input: 1.00, output: 4.00 }}\ncancel_grace: 2s\n{extra_config}"
        );
        std::fs::write(root.join(".weft/config.yaml"), config).unwrap();
        Fixture {
            dir,
            database: None,
        }
    }

    /// As [`Fixture::new`], its state on `backend`; None (after a loud skip) when that is
    /// Postgres and no test server can start.
    pub fn on(
        backend: Backend,
        directives: &[(&str, &str)],
        script: &str,
        extra_config: &str,
    ) -> Option<Fixture> {
        let database = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(crate::pg::fresh_database()?),
        };
        let extra = match &database {
            Some(url) => format!("database: \"{url}\"\n{extra_config}"),
            None => extra_config.to_string(),
        };
        let mut fx = Fixture::new(directives, script, &extra);
        fx.database = database;
        Some(fx)
    }

    /// Runs `sql` on the project's state — on the SQLite file `.weft/state/<file>`, or on its
    /// Postgres database (where every concern's tables are) — and returns every row's columns
    /// as text (NULL as "").
    pub fn query(&self, file: &str, sql: &str) -> Vec<Vec<String>> {
        match &self.database {
            Some(url) => {
                let name = url.rsplit("dbname=").next().unwrap();
                let out = crate::pg::server().unwrap().psql(name, sql);
                out.lines()
                    .filter(|l| !l.is_empty())
                    .map(|l| l.split('|').map(str::to_string).collect())
                    .collect()
            }
            None => {
                let db =
                    rusqlite::Connection::open(self.root().join(".weft/state").join(file)).unwrap();
                let mut stmt = db.prepare(sql).unwrap();
                let n = stmt.column_count();
                stmt.query_map([], |r| {
                    (0..n)
                        .map(|i| {
                            Ok(match r.get_ref(i)? {
                                rusqlite::types::ValueRef::Null => String::new(),
                                rusqlite::types::ValueRef::Integer(v) => v.to_string(),
                                rusqlite::types::ValueRef::Real(v) => v.to_string(),
                                rusqlite::types::ValueRef::Text(t)
                                | rusqlite::types::ValueRef::Blob(t) => {
                                    String::from_utf8_lossy(t).into_owned()
                                }
                            })
                        })
                        .collect()
                })
                .unwrap()
                .map(Result::unwrap)
                .collect()
            }
        }
    }

    /// The registry, read-only, wherever this project keeps it.
    pub fn registry(&self) -> Result<weft::internals::Store, weft::internals::RegistryError> {
        let url = self
            .database
            .as_deref()
            .map(|u| weft::DatabaseUrl::parse(u).unwrap());
        weft::internals::Store::open_read_only_at(
            url.as_ref(),
            &self.root().join(".weft/state/registry.db"),
        )
    }

    /// A project whose config.yaml is exactly `config`.
    pub fn raw(directives: &[(&str, &str)], script: &str, config: &str) -> Fixture {
        let fx = Fixture::new(directives, script, "");
        std::fs::write(fx.root().join(".weft/config.yaml"), config).unwrap();
        fx
    }

    /// As [`Fixture::raw`], its state on `backend` (the `database:` line added to `config`).
    pub fn raw_on(
        backend: Backend,
        directives: &[(&str, &str)],
        script: &str,
        config: &str,
    ) -> Option<Fixture> {
        let fx = Fixture::on(backend, directives, script, "")?;
        let database = match &fx.database {
            Some(url) => format!("database: \"{url}\"\n"),
            None => String::new(),
        };
        std::fs::write(
            fx.root().join(".weft/config.yaml"),
            format!("{config}\n{database}"),
        )
        .unwrap();
        Some(fx)
    }

    /// A runtime on the project's configured providers (no script forced).
    pub async fn runtime_configured(&self) -> Runtime {
        Runtime::open(self.project()).await.unwrap()
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn project(&self) -> Project {
        Project {
            root: self.root().to_path_buf(),
        }
    }

    pub async fn runtime(&self) -> Runtime {
        Runtime::builder(self.project())
            .script(self.root().join("script.yaml"))
            .open()
            .await
            .unwrap()
    }

    /// Runs a root thread and returns its report with the runtime (for audits).
    pub async fn run(&self, directive: &str, inputs: Value) -> (ThreadReport, Runtime) {
        let rt = self.runtime().await;
        let inputs: Map<String, Value> = inputs.as_object().cloned().unwrap_or_default();
        let report = rt
            .run(directive, inputs, LimitSet::default())
            .await
            .unwrap();
        (report, rt)
    }

    /// Starts a root thread of `directive` (no inputs, default limits) without waiting for it:
    /// the runtime, its handle and its id.
    pub async fn start(&self, directive: &str) -> (Runtime, weft::ThreadHandle, String) {
        let rt = self.runtime().await;
        let handle = rt
            .start(directive, Map::new(), LimitSet::default())
            .await
            .unwrap();
        let id = handle.id().to_string();
        (rt, handle, id)
    }

    /// The id of the (first) thread of `directive`.
    pub fn id_of(&self, directive: &str) -> String {
        self.rows()
            .into_iter()
            .find(|r| r.directive == directive)
            .unwrap_or_else(|| panic!("no thread of {directive}"))
            .id
            .to_string()
    }

    /// Every registry row of the project.
    pub fn rows(&self) -> Vec<weft::internals::ThreadRow> {
        self.registry().unwrap().list(false, 100_000).unwrap()
    }

    /// Every registry row of the project, or none while the registry is not made yet (a
    /// process that just started), for polling.
    pub fn rows_so_far(&self) -> Vec<weft::internals::ThreadRow> {
        self.registry()
            .and_then(|s| s.list(false, 100_000))
            .unwrap_or_default()
    }

    /// Where the project keeps its thread records (files, or its database server).
    pub fn records(&self) -> weft::internals::Records {
        weft::internals::Records::open(&self.project()).unwrap()
    }

    /// The transcript events of a thread.
    pub fn events(&self, id: &str) -> Vec<Value> {
        weft::internals::read_transcript(&self.records(), &weft::ThreadId::parse(id).unwrap(), None)
            .unwrap()
            .events
    }

    /// The contents of a thread's tool results, in order.
    pub fn tool_results(&self, id: &str) -> Vec<String> {
        self.events(id)
            .iter()
            .filter(|e| e["type"] == "tool_result")
            .map(|e| e["content"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Verifies every thread; returns the failures.
    pub fn verify_all(&self) -> Vec<weft::internals::Verdict> {
        let project = self.project();
        let (trust, _) = weft::internals::Trust::load(&project.trust_dir());
        let records = self.records();
        self.rows()
            .iter()
            .map(|r| {
                weft::internals::verify_thread(
                    &records,
                    &trust,
                    &weft::ThreadId::parse(&r.id).unwrap(),
                )
            })
            .filter(|v| !v.ok)
            .collect()
    }

    /// The signed thread.json of a thread.
    pub fn doc(&self, id: &str) -> weft::internals::ThreadDoc {
        let project = self.project();
        let (trust, _) = weft::internals::Trust::load(&project.trust_dir());
        weft::internals::ThreadDoc::read_verified(
            &self.records(),
            &weft::ThreadId::parse(id).unwrap(),
            &trust,
        )
        .unwrap()
    }
}

/// Sum over every LLM attempt (llm_call and llm_retry events) of every thread: usage × test price.
pub fn expected_spend(fx: &Fixture) -> i64 {
    let mut total = 0i64;
    for r in fx.rows() {
        for e in fx.events(&r.id) {
            if e["type"] == "llm_call" || e["type"] == "llm_retry" {
                let i = e["usage"]["input_tokens"].as_i64().unwrap();
                let o = e["usage"]["output_tokens"].as_i64().unwrap();
                total += i * IN_NANOS + o * OUT_NANOS; // prices are whole nanos per token: no rounding
            }
        }
    }
    total
}

/// `weft verify --all` of `project` passes (its output shown when it does not).
#[cfg(feature = "cli")]
pub fn verify_cli_clean(project: &Path) {
    let verify = weft_cmd(project)
        .args(["verify", "--all"])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
}

/// Whether a registry row's owner is a node's lease number rather than a pid (`core/owner.rs`).
pub fn is_node_owner(owner: u32) -> bool {
    owner >= 1 << 30
}

/// A directive text.
pub fn directive(front: &str, body: &str) -> String {
    format!("---\n{front}\n---\n{body}\n")
}

/// Every file under `dir` (recursively) whose name ends in `.{ext}`.
pub fn files_with_ext(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_with_ext(&p, ext));
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
    out
}

/// Polls `f` every 10 ms until it holds; fails the test after 20 s naming `what`.
pub async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !f() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The `weft` binary, with the suite's key home, on `project`.
#[cfg(feature = "cli")]
pub fn weft_cmd(project: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_weft"));
    c.env("WEFT_HOME", weft_home())
        .env_remove("WEFT_DATABASE_URL")
        .arg("--project")
        .arg(project);
    c
}

/// The JSON a `weft` command prints in `project`; the command must succeed.
#[cfg(feature = "cli")]
pub fn weft_json(project: &Path, args: &[&str]) -> Value {
    let out = weft_cmd(project).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "weft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `weft threads --json` of `project` (empty before any run).
#[cfg(feature = "cli")]
pub fn rows_json(project: &Path) -> Vec<Value> {
    let o = weft_cmd(project)
        .args(["threads", "--json"])
        .output()
        .unwrap();
    serde_json::from_slice(&o.stdout).unwrap_or_default()
}

/// A script for directive `name` making one turn of `calls` per entry, then ending with text.
pub fn calls_script(name: &str, turns: &[Vec<(&str, Value)>]) -> String {
    let mut script = format!("{name}:\n");
    for calls in turns {
        script += "  - tool_calls:\n";
        for (tool, input) in calls {
            script += &format!("      - {{ name: {tool}, input: {input} }}\n");
        }
    }
    script + "  - text: done\n"
}

/// The results of a thread's tool calls, in the order they were made: (content, is_error).
pub fn tool_results(fx: &Fixture, id: &str) -> Vec<(String, bool)> {
    let events = fx.events(id);
    events
        .iter()
        .filter(|e| e["type"] == "tool_use")
        .map(|u| {
            let r = events
                .iter()
                .find(|r| r["type"] == "tool_result" && r["id"] == u["id"])
                .unwrap_or_else(|| panic!("no result for {u}"));
            (
                r["content"].as_str().unwrap_or_default().to_string(),
                r["is_error"] == true,
            )
        })
        .collect()
}

/// [`tool_results`] with each content read as JSON (a plain text stays a JSON string).
pub fn tool_values(fx: &Fixture, id: &str) -> Vec<(Value, bool)> {
    tool_results(fx, id)
        .into_iter()
        .map(|(c, e)| (serde_json::from_str(&c).unwrap_or(Value::String(c)), e))
        .collect()
}

/// Spawns `cmd` with stdout piped and returns it with the first line it prints (a server's
/// address or port).
#[cfg_attr(not(any(feature = "server", feature = "otel")), allow(dead_code))]
pub fn spawn_announcing(cmd: &mut std::process::Command) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

/// A test that cannot run here (a server or tool it needs is missing) says so, loudly: under
/// `CI=true` it fails — `.ci/run` installs everything, so a missing piece is a broken CI, never a
/// pass — and elsewhere it prints SKIPPED and the caller returns.
pub fn skip(why: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    assert!(!ci, "CI=true and {why}");
    eprintln!("{why}");
}

/// Where `.ci/run` installs the MCP servers and the OTLP decoder (`$WEFT_MCP_DIR`).
pub fn mcp_dir() -> std::path::PathBuf {
    std::env::var_os("WEFT_MCP_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/weft-mcp")
        })
}

/// The Python of `$WEFT_MCP_DIR/venv` when it can import `modules` (e.g. `mcp, httpx2`), else
/// None after [`skip`] saying what `test` misses (a failure under CI=true).
pub fn venv_python(modules: &str, test: &str) -> Option<std::path::PathBuf> {
    let p = mcp_dir().join("venv/bin/python");
    let has = p.exists()
        && std::process::Command::new(&p)
            .args(["-c", &format!("import {modules}")])
            .status()
            .is_ok_and(|s| s.success());
    if has {
        return Some(p);
    }
    skip(&format!(
        "{test}: SKIPPED — no `{modules}` in {}/venv. `.ci/run` installs them (pip)",
        mcp_dir().display()
    ));
    None
}

/// Two command tools for the approval tests: `upper` (its YAML says a person approves each
/// call) and `say` (a directive's `approval:` list may name it).
pub fn approval_tools(fx: &Fixture) {
    std::fs::create_dir_all(fx.root().join("tools")).unwrap();
    std::fs::write(
        fx.root().join("tools/upper.yaml"),
        "name: upper\nargv: [tr, a-z, A-Z]\napproval: required\n",
    )
    .unwrap();
    std::fs::write(
        fx.root().join("tools/say.yaml"),
        "name: say\nargv: [printf, \"%s\", \"{input.word}\"]\n",
    )
    .unwrap();
}

/// Runs `cmd` with `input` on its stdin (then closed) and waits at most `secs` for it.
#[cfg(feature = "cli")]
pub fn fed(
    cmd: &mut std::process::Command,
    input: &[u8],
    secs: u64,
    what: &str,
) -> std::process::Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    exits_within(child, secs, what)
}

/// `weft mcp` on `project` (scripted by `script`), spoken to over raw JSON-RPC lines: the
/// handshake is sent, then a `tools/call` of `run_directive` for `directive`. Its stdin stays
/// open (dropping it is the client going away).
#[cfg(feature = "mcp-server")]
pub fn mcp_running(
    project: &Path,
    script: &Path,
    directive: &str,
) -> (std::process::Child, std::process::ChildStdin) {
    use std::io::Write;
    let mut child = weft_cmd(project)
        .args(["mcp", "--script"])
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for l in [
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run_directive", "arguments": {"directive": directive}}}),
    ] {
        writeln!(stdin, "{l}").unwrap();
    }
    stdin.flush().unwrap();
    (child, stdin)
}

/// Waits for `child` at most `secs`; kills it and fails the test naming `what` after that.
#[cfg(feature = "cli")]
pub fn exits_within(mut child: std::process::Child, secs: u64, what: &str) -> std::process::Output {
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(secs) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: the process had not exited after {secs} s\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `weft run <directive> --json --script script.yaml` on the fixture's project, started (output
/// piped: read it with `exits_within`).
#[cfg(feature = "cli")]
pub fn spawn_run(fx: &Fixture, directive: &str) -> std::process::Child {
    weft_cmd(fx.root())
        .args(["run", directive, "--json", "--script"])
        .arg(fx.root().join("script.yaml"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Config of an MCP server `stuck` whose start hangs while `mark` exists, then fails (at once
/// when it does not exist): the test's end, removing the mark, ends it.
pub fn stuck_server(mark: &std::path::Path) -> String {
    let sh = format!(
        "while [ -e {m} ]; do sleep 0.1; done; exit 1",
        m = mark.display()
    );
    format!(
        "mcp_servers:\n  stuck: {{ command: sh, args: [\"-c\", {}] }}\n",
        serde_json::json!(sh)
    )
}

/// Whether a process runs whose command line names `mark` (the stuck server).
pub fn server_runs(mark: &std::path::Path) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
        std::fs::read(p.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&*mark.to_string_lossy()))
    })
}
