//! `weft serve`: the HTTP API, its bearer token and limits, Server-Sent Events with
//! `Last-Event-ID`, and one API on two transports (a cancel over HTTP reaching a `weft run` in
//! another process). Every test runs the real binary and talks real HTTP on loopback.

use super::support::{directive, weft_cmd, Fixture};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;

/// A plain HTTP client (rustls needs its crypto provider chosen first, as weft's own does).
fn client() -> reqwest::Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    reqwest::Client::new()
}

/// A running `weft serve` (killed on drop).
pub struct Server {
    child: std::process::Child,
    pub base: String,
    pub token: String,
    http: reqwest::Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `weft serve` on a free loopback port of `fx`'s project, with `extra` arguments.
    pub fn start(fx: &Fixture, extra: &[&str]) -> Server {
        Server::start_cmd(fx, &mut weft_cmd(fx.root()), extra)
    }

    /// [`Server::start`] from `cmd` (its environment and pipes already set).
    pub fn start_cmd(fx: &Fixture, cmd: &mut std::process::Command, extra: &[&str]) -> Server {
        let (child, line) = super::support::spawn_announcing(
            cmd.args(["serve", "--addr", "127.0.0.1:0"]).args(extra),
        );
        let url = line
            .trim()
            .strip_prefix("weft serve: ")
            .unwrap_or_else(|| panic!("serve printed {line:?}"));
        let (base, token) = url.split_once("/#token=").unwrap();
        assert_eq!(
            std::fs::read_to_string(fx.root().join(".weft/serve.token")).unwrap(),
            token
        );
        Server {
            child,
            base: base.to_string(),
            token: token.to_string(),
            http: client(),
        }
    }

    /// Waits (at most `secs`) for the server to exit by itself; its exit status and stderr.
    pub fn exits_within(mut self, secs: u64, what: &str) -> (std::process::ExitStatus, String) {
        let child = std::mem::replace(
            &mut self.child,
            std::process::Command::new("true").spawn().unwrap(),
        );
        let out = super::support::exits_within(child, secs, what);
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `method path` with the token and `body`: (status, JSON body).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self
            .http
            .request(m, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.body(b.to_string());
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Opens an SSE stream at `path`, after `last_id` if given.
    pub async fn events(
        &self,
        path: &str,
        last_id: Option<&str>,
    ) -> impl futures_util::Stream<Item = (String, String, Value)> {
        let mut req = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(id) = last_id {
            req = req.header("Last-Event-ID", id);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        resp.bytes_stream()
            .eventsource()
            .filter_map(|e| async move {
                let e = e.ok()?;
                let data = serde_json::from_str(&e.data).ok()?;
                Some((e.event, e.id, data))
            })
    }
}

/// Reads `stream` until the root `root`'s `thread_finished` (30 s bound).
pub async fn until_root_finishes(
    stream: &mut (impl futures_util::Stream<Item = (String, String, Value)> + Unpin),
    root: impl Fn(&Value) -> bool,
) -> Vec<(String, String, Value)> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ev = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("no end of the root within 30 s; got {got:?}"))
            .expect("the stream ended early");
        let end = ev.0 == "thread_finished" && root(&ev.2);
        got.push(ev);
        if end {
            return got;
        }
    }
}

const RESEARCH: &str = r#"
fan:
  - text: "splitting"
    tool_calls:
      - { name: spawn_thread, input: { directive: leaf, inputs: { n: 1 }, wait: false } }
      - { name: spawn_thread, input: { directive: leaf, inputs: { n: 2 }, wait: false } }
  - tool_calls:
      - { name: wait_threads, input: {} }
  - text: all done
leaf:
  - text: leaf answer
"#;

fn research() -> Fixture {
    research_on(crate::support::Backend::Sqlite).unwrap()
}

fn research_on(backend: crate::support::Backend) -> Option<Fixture> {
    let fan = directive(
        "permissions: [\"thread.spawn.leaf\"]\nlimits: { spend: 1.0 }",
        "Fan out.",
    );
    let leaf = directive("inputs: { n: { type: integer } }", "Answer {input:n}.");
    Fixture::on(backend, &[("fan", &fan), ("leaf", &leaf)], RESEARCH, "")
}

/// The API refuses what it must (no token, bad JSON, unknown ids, huge bodies) with a clear
/// error, starts a tree at once, and its SSE stream carries the whole tree: every thread's start
/// and end, tool calls and results, streamed text, and costs that add up to the tree's spend.
#[tokio::test]
async fn the_api_starts_a_tree_and_its_events_tell_all_of_it() {
    // The same API on either backend (`weft serve` of a Postgres project).
    for backend in crate::support::BACKENDS {
        let Some(fx) = research_on(backend) else {
            return;
        };
        let script = fx.root().join("script.yaml");
        let srv = Server::start(&fx, &["--script", script.to_str().unwrap()]);
        let http = client();
        // No token, a wrong one: 401.
        let r = http
            .get(format!("{}/v1/threads", srv.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
        let r = http
            .get(format!("{}/v1/threads", srv.base))
            .bearer_auth("0".repeat(64))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
        // Bad input: named.
        let bad = |body: &str| {
            http.post(format!("{}/v1/threads", srv.base))
                .bearer_auth(&srv.token)
                .body(body.to_string())
                .send()
        };
        let r = bad("{not json").await.unwrap();
        assert_eq!(r.status().as_u16(), 400);
        assert!(r.text().await.unwrap().contains("not JSON"));
        let (s, b) = srv
            .call(
                "POST",
                "/v1/threads",
                Some(json!({ "directive": "fan", "budget": 1 })),
            )
            .await;
        assert_eq!(
            (s, b["error"].as_str().unwrap().contains("`budget`")),
            (400, true),
            "{b}"
        );
        let (s, b) = srv
            .call(
                "POST",
                "/v1/threads",
                Some(json!({ "directive": "../../etc/passwd" })),
            )
            .await;
        assert_eq!(s, 400, "{b}");
        let (s, b) = srv
            .call(
                "POST",
                "/v1/threads",
                Some(json!({ "directive": "fan", "limits": { "turns": "many" } })),
            )
            .await;
        assert!(
            s == 400 && b["error"].as_str().unwrap().contains("limits.turns"),
            "{b}"
        );
        let (s, b) = srv.call("GET", "/v1/threads/not..an-id", None).await;
        assert_eq!(s, 400, "{b}");
        let (s, _) = srv
            .call(
                "GET",
                "/v1/threads/fan-1795423813747-07704aff0000/colour",
                None,
            )
            .await;
        assert_eq!(s, 404);
        let (s, _) = srv
            .call("GET", "/v1/threads/fan-1795423813747-07704aff0000", None)
            .await;
        assert_eq!(s, 404);
        let huge = format!(
            "{{\"directive\":\"fan\",\"inputs\":{{\"x\":\"{}\"}}}}",
            "a".repeat(2 << 20)
        );
        let r = bad(&huge).await.unwrap();
        assert_eq!(r.status().as_u16(), 413);
        let (s, b) = srv.call("GET", "/v1/threads?colour=red", None).await;
        assert!(
            s == 400 && b["error"].as_str().unwrap().contains("colour"),
            "{b}"
        );

        // A tree, watched from before it starts.
        let mut all = Box::pin(srv.events("/v1/events", None).await);
        let (s, b) = srv
            .call("POST", "/v1/threads", Some(json!({ "directive": "fan" })))
            .await;
        assert_eq!(s, 201, "{b}");
        let root = b["thread_id"].as_str().unwrap().to_string();
        let got = until_root_finishes(&mut all, |d| d["thread_id"] == root.as_str()).await;
        let (s, tree) = srv
            .call("GET", &format!("/v1/threads/{root}/tree"), None)
            .await;
        assert_eq!(s, 200);
        let threads = tree["threads"].as_array().unwrap();
        assert_eq!(threads.len(), 3, "{tree}");
        for t in threads {
            let id = t["id"].as_str().unwrap();
            let of = |name: &str| {
                got.iter()
                    .filter(|(n, _, d)| n == name && d["thread_id"] == id)
                    .count()
            };
            assert_eq!(
                (of("thread_started"), of("thread_finished")),
                (1, 1),
                "{id}"
            );
            assert_eq!(t["status"], "completed");
            assert!(of("token") >= 1, "no streamed text of {id}");
            assert!(of("cost") >= 1 && of("turn") >= 1, "{id}");
        }
        let named = |name: &str| got.iter().filter(|(n, _, _)| n == name).count();
        assert_eq!((named("tool_call"), named("tool_result")), (3, 3));
        let cost: i64 = got
            .iter()
            .filter(|(n, _, _)| n == "cost")
            .map(|(_, _, d)| d["cost_nanos"].as_i64().unwrap())
            .sum();
        let (s, one) = srv.call("GET", &format!("/v1/threads/{root}"), None).await;
        assert_eq!(s, 200);
        assert_eq!(one["verified"], true, "{one}");
        assert_eq!(one["cost"]["spend_nanos"].as_i64().unwrap(), cost, "{one}");
        assert!(cost > 0);
        // Ids are unique and increasing.
        let ns: Vec<u64> = got
            .iter()
            .map(|(_, id, _)| id.split('.').nth(1).unwrap().parse().unwrap())
            .collect();
        assert!(ns.windows(2).all(|w| w[0] < w[1]), "{ns:?}");

        // The transcript, paged, is the record (a file, or rows on the server).
        let lines = fx
            .records()
            .transcript(&weft::ThreadId::parse(&root).unwrap())
            .unwrap()
            .unwrap()
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        let (mut after, mut seen) = (None::<i64>, 0usize);
        loop {
            let q = after.map_or("limit=4".to_string(), |a| format!("limit=4&after={a}"));
            let (s, page) = srv
                .call("GET", &format!("/v1/threads/{root}/transcript?{q}"), None)
                .await;
            assert_eq!(s, 200, "{page}");
            seen += page["lines"].as_array().unwrap().len();
            match page["next"].as_i64() {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(seen, lines);
        let (s, list) = srv
            .call(
                "GET",
                &format!("/v1/threads?root={root}&status=completed&limit=2"),
                None,
            )
            .await;
        assert_eq!((s, list["threads"].as_array().unwrap().len()), (200, 2));

        // Reconnecting after the fifth event gets exactly the rest, in order.
        let fifth = got[4].1.clone();
        let mut again = Box::pin(srv.events("/v1/events", Some(&fifth)).await);
        let rest = until_root_finishes(&mut again, |d| d["thread_id"] == root.as_str()).await;
        let want: Vec<&String> = got[5..].iter().map(|e| &e.1).collect();
        assert_eq!(rest.iter().map(|e| &e.1).collect::<Vec<_>>(), want);
        // An id from an earlier server: the transcripts since then, every thread's start and end.
        let before = format!("1.1.{}", now_ms() - 60_000);
        let mut sub = Box::pin(
            srv.events(&format!("/v1/threads/{root}/events"), Some(&before))
                .await,
        );
        let replayed = until_root_finishes(&mut sub, |d| d["thread_id"] == root.as_str()).await;
        for t in threads {
            let id = t["id"].as_str().unwrap();
            assert!(
                replayed
                    .iter()
                    .any(|(n, _, d)| n == "thread_started" && d["thread_id"] == id),
                "{id} not replayed: {replayed:?}"
            );
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// One API, two transports: a cancel and an inject sent to `weft serve` reach a thread that a
/// `weft run` in another process runs (through that process's control socket); the run ends
/// `cancelled` (exit 130) within its grace, and a thread that has ended refuses steering (409).
#[tokio::test]
async fn the_api_steers_a_thread_that_another_process_runs() {
    let slow = directive("", "Think slowly.");
    let fx = Fixture::new(
        &[("slow", &slow)],
        "slow:\n  - text: thinking\n    delay: 60s\n",
        "",
    );
    let script = fx.root().join("script.yaml");
    let mut run = weft_cmd(fx.root())
        .args(["run", "slow", "--json", "--script"])
        .arg(&script)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let srv = Server::start(&fx, &[]);
    let t0 = std::time::Instant::now();
    let id = loop {
        let (_, b) = srv.call("GET", "/v1/threads?status=running", None).await;
        if let Some(id) = b["threads"][0]["id"].as_str() {
            break id.to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no running thread: {b}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (s, b) = srv
        .call(
            "POST",
            &format!("/v1/threads/{id}/inject"),
            Some(json!({ "text": "hurry" })),
        )
        .await;
    assert_eq!((s, &b["queued"]), (200, &json!(true)), "{b}");
    let (s, b) = srv
        .call("POST", &format!("/v1/threads/{id}/inject"), Some(json!({})))
        .await;
    assert!(
        s == 400 && b["error"].as_str().unwrap().contains("`text`"),
        "{b}"
    );
    let t0 = std::time::Instant::now();
    let (s, b) = srv
        .call(
            "POST",
            &format!("/v1/threads/{id}/cancel"),
            Some(json!({ "reason": "from the page" })),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let status = loop {
        if let Some(st) = run.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = run.kill();
            let (_, one) = srv.call("GET", &format!("/v1/threads/{id}"), None).await;
            panic!("weft run did not end after the cancel: {one}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(130));
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    let (_, one) = srv.call("GET", &format!("/v1/threads/{id}"), None).await;
    assert_eq!(one["row"]["status"], "cancelled", "{one}");
    let (s, b) = srv
        .call("POST", &format!("/v1/threads/{id}/cancel"), None)
        .await;
    assert!(
        s == 409 && b["error"].as_str().unwrap().contains("cancelled"),
        "{b}"
    );
}

/// A non-loopback address needs `--public`.
#[test]
fn serving_beyond_loopback_needs_public() {
    let fx = research();
    let o = weft_cmd(fx.root())
        .args(["serve", "--addr", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--public"));
}

/// A browser to drive: `WEFT_CHROMIUM`, else `chromium` or `chromium-browser` on PATH.
pub(super) fn chromium() -> Option<String> {
    if let Ok(p) = std::env::var("WEFT_CHROMIUM") {
        return Some(p);
    }
    let path = std::env::var("PATH").unwrap_or_default();
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|n| {
            path.split(':')
                .map(move |d| std::path::Path::new(d).join(n))
        })
        .find(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned())
}

/// Runs the DevTools driver (`tests/fixtures/web/cdp.py`) on `url` with `steps`; its step lines.
pub(super) fn browse(chrome: &str, url: &str, steps: Value) -> Vec<Value> {
    let driver = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/web/cdp.py");
    let o = std::process::Command::new("python3")
        .arg(driver)
        .arg(chrome)
        .arg(url)
        .arg(steps.to_string())
        .output()
        .unwrap();
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        o.status.success(),
        "the browser step failed: {lines:?} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    lines
}

/// The web page in a real headless Chromium: every thread of a finished tree appears with its
/// final status, and the cancel button of a live tree's root cancels its whole subtree.
#[tokio::test]
async fn the_web_page_shows_the_live_tree_and_cancels_a_subtree() {
    let Some(chrome) = chromium() else {
        crate::support::skip("SKIPPED the_web_page_shows_the_live_tree_and_cancels_a_subtree: no chromium (CI installs Debian's; set WEFT_CHROMIUM to a browser)");
        return;
    };
    let hold = directive(
        "permissions: [\"thread.spawn.*\"]\nlimits: { spend: 1.0 }",
        "Hold on.",
    );
    let slow = directive("", "Think slowly.");
    let script = format!(
        "{RESEARCH}hold:\n  - tool_calls:\n      - {{ name: spawn_thread, input: {{ directive: slow, wait: false }} }}\n      - {{ name: spawn_thread, input: {{ directive: leaf, inputs: {{ n: 3 }}, wait: false }} }}\n  - tool_calls:\n      - {{ name: wait_threads, input: {{}} }}\n  - text: never\nslow:\n  - text: thinking\n    delay: 60s\n"
    );
    let fan = directive(
        "permissions: [\"thread.spawn.leaf\"]\nlimits: { spend: 1.0 }",
        "Fan out.",
    );
    let leaf = directive("inputs: { n: { type: integer } }", "Answer {input:n}.");
    let fx = Fixture::new(
        &[
            ("fan", &fan),
            ("leaf", &leaf),
            ("hold", &hold),
            ("slow", &slow),
        ],
        &script,
        "",
    );
    let path = fx.root().join("script.yaml");
    let srv = Server::start(&fx, &["--script", path.to_str().unwrap()]);
    let (_, b) = srv
        .call("POST", "/v1/threads", Some(json!({ "directive": "fan" })))
        .await;
    let done = b["thread_id"].as_str().unwrap().to_string();
    let (_, b) = srv
        .call("POST", "/v1/threads", Some(json!({ "directive": "hold" })))
        .await;
    let live = b["thread_id"].as_str().unwrap().to_string();
    // The finished tree, as the registry has it.
    super::support::wait_until("the fan tree to end", || {
        fx.rows()
            .iter()
            .filter(|r| r.root_id == done)
            .all(|r| r.status == "completed")
    })
    .await;
    let want: Vec<(String, String)> = fx
        .rows()
        .iter()
        .filter(|r| r.root_id == done)
        .map(|r| (r.id.to_string(), r.status.to_string()))
        .collect();
    assert_eq!(want.len(), 3);
    let shot = fx.root().join("page.png");
    let row_status =
        "[...document.querySelectorAll('.row')].map(r => [r.dataset.threadId, r.dataset.status])";
    let has = |id: &str, status: &str| {
        format!(
            "!!document.querySelector('.row[data-thread-id=\"{id}\"][data-status=\"{status}\"]')"
        )
    };
    let mut steps = vec![];
    for (id, status) in &want {
        steps.push(json!({ "wait": has(id, status) }));
    }
    steps.extend([
        json!({ "wait": format!("document.querySelectorAll('.row').length >= 6 && {}", has(&live, "running")) }),
        json!({ "eval": format!("document.querySelector('.row[data-thread-id=\"{live}\"]').click(); true") }),
        json!({ "wait": "document.querySelectorAll('#lines .line').length >= 3" }),
        json!({ "screenshot": shot.to_str().unwrap() }),
        json!({ "eval": format!("document.querySelector('.row[data-thread-id=\"{live}\"] button.cancel').click(); true") }),
        json!({ "wait": has(&live, "cancelled"), "timeout": 20 }),
        json!({ "eval": row_status }),
    ]);
    let url = format!("{}/#token={}", srv.base, srv.token);
    let out = browse(&chrome, &url, Value::Array(steps));
    // The page's last view: every thread of the cancelled tree shows its end.
    let seen = out.last().unwrap()["eval"].as_array().unwrap().clone();
    let rows = fx.rows();
    for r in rows.iter().filter(|r| r.root_id == live) {
        assert!(
            ["cancelled", "completed"].contains(&r.status.as_str()),
            "{} is {} after the page's cancel",
            r.id,
            r.status
        );
        if r.directive == "slow" {
            assert_eq!(r.status, "cancelled");
        }
    }
    assert!(
        seen.iter()
            .any(|p| p[0] == live.as_str() && p[1] == "cancelled"),
        "{seen:?}"
    );
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "no screenshot"
    );
}

/// A thread started over HTTP is recovered like one started by `weft run`: the server killed
/// with SIGKILL mid-thread, the next `weft recover` finalizes it (`error`, interrupted) and its
/// records verify.
#[tokio::test]
async fn a_thread_started_over_http_is_recovered_after_the_server_dies() {
    let slow = directive("", "Think slowly.");
    let fx = Fixture::new(
        &[("slow", &slow)],
        "slow:\n  - text: thinking\n    delay: 60s\n",
        "",
    );
    let script = fx.root().join("script.yaml");
    let mut srv = Server::start(&fx, &["--script", script.to_str().unwrap()]);
    let (s, b) = srv
        .call("POST", "/v1/threads", Some(json!({ "directive": "slow" })))
        .await;
    assert_eq!(s, 201, "{b}");
    let id = b["thread_id"].as_str().unwrap().to_string();
    let t0 = std::time::Instant::now();
    loop {
        let (_, one) = srv.call("GET", &format!("/v1/threads/{id}"), None).await;
        if one["row"]["status"] == "running" && one["verified"] == true {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "never running: {one}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    srv.child.kill().unwrap();
    srv.child.wait().unwrap();
    let o = weft_cmd(fx.root())
        .args(["recover", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = super::support::rows_json(fx.root());
    let row = rows.iter().find(|r| r["id"] == id.as_str()).unwrap();
    assert_eq!(row["status"], "error", "{row}");
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
}

/// The API names directives, never paths (#22 finding 7): a file outside the project holding
/// `permissions: ["**"]` and a big budget is refused and nothing of it runs; the control socket
/// (the same handlers, no token) is its owner's alone (mode 0600).
#[tokio::test]
async fn the_api_runs_library_directives_only_and_the_socket_is_private() {
    let fx = research();
    let script = fx.root().join("script.yaml");
    let outside = tempfile::tempdir().unwrap();
    let file = outside.path().join("rogue.md");
    std::fs::write(
        &file,
        "---\npermissions: [\"**\"]\nlimits: { spend: 5 }\n---\nDo anything.\n",
    )
    .unwrap();
    let srv = Server::start(&fx, &["--script", script.to_str().unwrap()]);
    for directive in [file.to_str().unwrap(), "./rogue.md", "leaf.md"] {
        let (s, b) = srv
            .call(
                "POST",
                "/v1/threads",
                Some(json!({ "directive": directive })),
            )
            .await;
        assert_eq!(s, 400, "{directive}: {b}");
        assert!(
            b["error"].as_str().unwrap_or("").contains("library name"),
            "{b}"
        );
    }
    assert!(fx.rows().is_empty(), "something ran: {:?}", fx.rows());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let run = fx.root().join(".weft/run");
        let socks: Vec<_> = std::fs::read_dir(&run).unwrap().flatten().collect();
        assert!(!socks.is_empty(), "no control socket in {}", run.display());
        for s in socks {
            let mode = s.metadata().unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", s.path().display());
        }
    }
}

/// A `Last-Event-ID` from the far future (or any number a client makes up) is answered like
/// any other: the stream opens, nothing is replayed from the future, and the server lives on.
#[tokio::test]
async fn a_last_event_id_from_the_far_future_opens_the_stream() {
    let fx = research();
    let srv = Server::start(&fx, &[]);
    for id in [
        "1.1.99999999999999999",
        "1.1.18446744073709551615",
        "18446744073709551615.18446744073709551615.0",
    ] {
        let mut stream = Box::pin(srv.events("/v1/events", Some(id)).await);
        let nothing = tokio::time::timeout(Duration::from_millis(300), stream.next()).await;
        assert!(nothing.is_err(), "{id}: replayed {nothing:?}");
    }
    let (status, _) = srv.call("GET", "/v1/threads", None).await;
    assert_eq!(status, 200);
}

/// The page draws a tree's levels apart in a real Chromium: the child of a last child is drawn
/// further in than its parent (its branch's leading spaces did collapse in HTML, so it was
/// drawn at its parent's indentation).
#[tokio::test]
async fn the_page_indents_the_children_of_a_last_child() {
    let Some(chrome) = chromium() else {
        crate::support::skip("SKIPPED the_page_indents_the_children_of_a_last_child: no chromium (CI installs Debian's; set WEFT_CHROMIUM to a browser)");
        return;
    };
    let spawner = |d: &str| {
        directive(
            "permissions: [\"thread.spawn.*\"]\nlimits: { spend: 1.0 }",
            &format!("Spawn {d}."),
        )
    };
    let (top, mid) = (spawner("leaf and mid"), spawner("leaf"));
    let leaf = directive("", "Answer.");
    let spawn =
        |d: &str| format!("{{ name: spawn_thread, input: {{ directive: {d}, wait: false }} }}");
    let script = format!(
        "top:\n  - tool_calls: [ {} ]\n  - tool_calls: [ {} ]\n  - tool_calls: [ {{ name: wait_threads, input: {{}} }} ]\n  - text: done\nmid:\n  - tool_calls: [ {} ]\n  - tool_calls: [ {{ name: wait_threads, input: {{}} }} ]\n  - text: done\nleaf:\n  - text: leaf\n",
        spawn("leaf"),
        spawn("mid"),
        spawn("leaf")
    );
    let fx = Fixture::new(
        &[("top", &top), ("mid", &mid), ("leaf", &leaf)],
        &script,
        "",
    );
    let path = fx.root().join("script.yaml");
    let srv = Server::start(&fx, &["--script", path.to_str().unwrap()]);
    let (_, b) = srv
        .call("POST", "/v1/threads", Some(json!({ "directive": "top" })))
        .await;
    let root = b["thread_id"].as_str().unwrap().to_string();
    super::support::wait_until("the tree to end", || {
        let rows = fx.rows();
        rows.len() == 4 && rows.iter().all(|r| r.status == "completed")
    })
    .await;
    let rows = fx.rows();
    let mid_id = rows
        .iter()
        .find(|r| r.directive == "mid")
        .unwrap()
        .id
        .to_string();
    let under_mid = rows
        .iter()
        .find(|r| r.parent_id.as_ref().map(|p| p.as_str()) == Some(mid_id.as_str()))
        .unwrap()
        .id
        .to_string();
    let widths = "[...document.querySelectorAll('.row')].map(r => [r.dataset.threadId, r.querySelector('.branch').getBoundingClientRect().width, r.querySelector('.branch').textContent])";
    let steps = json!([
        { "wait": format!("document.querySelectorAll('.row[data-status=\"completed\"]').length >= 4 && !!document.querySelector('.row[data-thread-id=\"{root}\"]')") },
        { "eval": widths },
    ]);
    let url = format!("{}/#token={}", srv.base, srv.token);
    let out = browse(&chrome, &url, steps);
    let seen = out.last().unwrap()["eval"].as_array().unwrap().clone();
    let width = |id: &str| {
        seen.iter()
            .find(|p| p[0] == id)
            .and_then(|p| p[1].as_f64())
            .unwrap_or_else(|| panic!("{id} on the page: {seen:?}"))
    };
    assert!(
        width(&under_mid) > width(&mid_id) + 10.0,
        "the last child's child is drawn further in than the last child: {seen:?}"
    );
}
