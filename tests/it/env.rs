//! Environment values and secrets (issue 13): values reach a command tool resolved project →
//! user → thread → parent chain (a parent's `set_env` reaches its child's next call; a thread
//! never shadows what the project or the user set, #22); a secret
//! is stored encrypted, reaches the tool that lists it, and appears nowhere weft writes or sends
//! — not in any file under `.weft/`, not in live events (what SSE is built from), not in a tool
//! result, not in streamed text — and another user's key cannot open it.

use crate::support::{directive, tool_results, weft_cmd, weft_home, Fixture};
use serde_json::Value;
use std::io::Write;

fn weft(fx: &Fixture, args: &[&str]) -> String {
    let out = weft_cmd(fx.root()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "weft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The tool results of a thread, in call order.
fn results(fx: &Fixture, id: &str) -> Vec<String> {
    tool_results(fx, id).into_iter().map(|(c, _)| c).collect()
}

const ORDER_SCRIPT: &str = r#"parent:
  - tool_calls: [ { name: greet, input: {} } ]
  - tool_calls: [ { name: set_env, input: { name: GREET_ORDER, value: from-parent } } ]
  - tool_calls: [ { name: greet, input: {} } ]
  - tool_calls: [ { name: spawn_thread, input: { directive: child } } ]
  - text: done
child:
  - tool_calls: [ { name: greet, input: {} } ]
  - tool_calls: [ { name: set_env, input: { name: GREET_ORDER, value: from-child } } ]
  - tool_calls: [ { name: greet, input: {} } ]
  - text: done
solo:
  - tool_calls: [ { name: greet, input: {} } ]
  - text: done
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_resolve_project_then_user_then_thread_then_parents() {
    let parent = directive(
        "permissions: [ tool.greet, env.set, \"thread.spawn.child\" ]",
        "p",
    );
    let child = directive("permissions: [ tool.greet, env.set ]", "c");
    let solo = directive("permissions: [ tool.greet ]", "s");
    let fx = Fixture::new(
        &[("parent", &parent), ("child", &child), ("solo", &solo)],
        ORDER_SCRIPT,
        "",
    );
    std::fs::create_dir_all(fx.root().join("tools")).unwrap();
    std::fs::write(
        fx.root().join("tools/greet.yaml"),
        "name: greet\nargv: [sh, -c, 'printf \"%s\" \"$GREET_ORDER\"']\nenv: [GREET_ORDER]\n",
    )
    .unwrap();
    let rt = fx.runtime().await;
    let report = rt
        .run("parent", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    let p = report.thread_id.to_string();
    let kid = fx.id_of("child");
    let pr = results(&fx, &p);
    assert_eq!(
        (pr[0].as_str(), pr[2].as_str()),
        ("", "from-parent"),
        "{pr:?}"
    );
    let cr = results(&fx, &kid);
    assert_eq!(
        (cr[0].as_str(), cr[2].as_str()),
        ("from-parent", "from-child"),
        "{cr:?}"
    );
    // The project's and the user's values win over every thread's.
    weft(&fx, &["env", "set", "GREET_ORDER", "from-user", "--user"]);
    weft(&fx, &["env", "set", "GREET_ORDER", "from-project"]);
    let solo = rt
        .run("solo", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(results(&fx, solo.thread_id.as_str())[0], "from-project");
    weft(&fx, &["env", "unset", "GREET_ORDER"]);
    let solo = rt
        .run("solo", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(results(&fx, solo.thread_id.as_str())[0], "from-user");
    rt.shutdown();
    weft(&fx, &["env", "unset", "GREET_ORDER", "--user"]);
    let listed: Value =
        serde_json::from_str(&weft(&fx, &["env", "list", "--thread", &kid, "--json"])).unwrap();
    assert_eq!(listed[0]["scope"], format!("thread:{kid}"), "{listed}");
    assert_eq!(listed[0]["value"], "from-child");
}

const SECRET: &str = "sk-live-7f3a9b2c4d";
const MODEL_SECRET: &str = "model-set-5e6f7a8b";

const SECRET_SCRIPT: &str = r#"leaky:
  - tool_calls: [ { name: leak, input: {} } ]
  - tool_calls: [ { name: set_env, input: { name: MODEL_KEY, value: model-set-5e6f7a8b, secret: true } } ]
  - text: "The token was sk-live-7f3a9b2c4d and mine is model-set-5e6f7a8b."
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_its_tool_and_nothing_else() {
    let leaky = directive("permissions: [ tool.leak, env.set ]", "Use the API.");
    let fx = Fixture::new(&[("leaky", &leaky)], SECRET_SCRIPT, "");
    std::fs::create_dir_all(fx.root().join("tools")).unwrap();
    std::fs::write(
        fx.root().join("tools/leak.yaml"),
        "name: leak\nargv: [sh, -c, 'echo \"token=$API_TOKEN_T\"; printf %s \"$API_TOKEN_T\" | sha256sum; yes \"$API_TOKEN_T\" | head -c 20000']\nenv: [API_TOKEN_T, PATH]\nmax_output: 2000\n",
    )
    .unwrap();
    // Read from stdin: the secret is never an argument.
    let mut set = weft_cmd(fx.root())
        .args(["env", "set", "API_TOKEN_T", "-", "--secret"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(set.stdin.take().unwrap(), "{SECRET}").unwrap();
    assert!(set.wait().unwrap().success());

    let rt = fx.runtime().await;
    let mut live = rt.events();
    let report = rt
        .run("leaky", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    rt.drain_hooks().await;
    let id = report.thread_id.to_string();

    // The tool got the real value (its digest proves it) and the model only the marker.
    let out = &results(&fx, &id)[0];
    let digest = sha256_hex(SECRET.as_bytes());
    assert!(out.contains(&digest), "the tool received the secret: {out}");
    assert!(
        out.contains("token=[secret:API_TOKEN_T]") && !out.contains(SECRET),
        "{out}"
    );
    assert!(
        out.contains("tool-output/"),
        "the long output was kept in the file area: {out}"
    );
    let said = report.result.clone().unwrap_or_default();
    assert_eq!(
        said,
        "The token was [secret:API_TOKEN_T] and mine is [secret:MODEL_KEY]."
    );

    // Live events: lines and streamed text, all clean; the text adds up to the redacted answer.
    let (mut streamed, mut lines) = (String::new(), 0);
    while let Ok(ev) = live.try_recv() {
        match ev {
            weft::Event::Token { text, .. } => streamed.push_str(&text),
            weft::Event::Line { data, .. } => {
                lines += 1;
                let d = data.to_string();
                assert!(
                    !d.contains(SECRET) && !d.contains(MODEL_SECRET),
                    "a live line leaked: {d}"
                );
            }
            _ => {}
        }
    }
    assert!(lines > 5);
    assert_eq!(
        streamed, said,
        "streamed text is redacted, nothing held back at the end"
    );

    // No file under .weft/ holds either secret in clear: transcripts, thread.json, the spilled
    // output, the registry, the search index, the env store.
    let mut scanned = 0;
    for (f, bytes) in all_file_bytes(&fx.root().join(".weft")) {
        scanned += 1;
        for s in [SECRET, MODEL_SECRET] {
            assert!(!contains(&bytes, s.as_bytes()), "{} holds {s}", f.display());
        }
    }
    assert!(scanned > 8, "{scanned} files");
    let log = weft(&fx, &["log", &id, "--json"]);
    assert!(!log.contains(SECRET) && log.contains("[secret:API_TOKEN_T]"));
    let tool_use = fx
        .events(&id)
        .into_iter()
        .find(|l| l["name"] == "set_env")
        .unwrap();
    assert_eq!(tool_use["input"]["value"], "[secret:MODEL_KEY]");
    rt.shutdown();

    // Listing never shows it; another user's key cannot open it.
    let listed = weft(&fx, &["env", "list"]);
    assert!(
        listed.contains("[secret:API_TOKEN_T]") && !listed.contains(SECRET),
        "{listed}"
    );
    let other = tempfile::tempdir().unwrap();
    let stranger = weft_cmd(fx.root())
        .env("WEFT_HOME", other.path())
        .args(["env", "list", "--thread", &id])
        .output()
        .unwrap();
    assert_eq!(stranger.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&stranger.stderr).contains("does not decrypt"),
        "{}",
        String::from_utf8_lossy(&stranger.stderr)
    );
    assert!(weft_home().join("secrets.key").exists());

    // Over real SSE from `weft serve`: a run started through the API, every event read.
    let script = fx.root().join("script.yaml");
    let srv = crate::serve::Server::start(&fx, &["--script", script.to_str().unwrap()]);
    let mut stream = Box::pin(srv.events("/v1/events", None).await);
    let (status, started) = srv
        .call(
            "POST",
            "/v1/threads",
            Some(serde_json::json!({ "directive": "leaky" })),
        )
        .await;
    assert_eq!(status, 201, "{started}");
    let root = started["thread_id"].as_str().unwrap().to_string();
    let got =
        crate::serve::until_root_finishes(&mut stream, |d| d["thread_id"] == root.as_str()).await;
    let all = serde_json::to_string(&got.iter().map(|e| e.2.clone()).collect::<Vec<_>>()).unwrap();
    assert!(got.iter().any(|e| e.0 == "tool_result"), "{all}");
    assert!(all.contains("[secret:API_TOKEN_T]"), "{all}");
    assert!(
        !all.contains(SECRET) && !all.contains(MODEL_SECRET),
        "an SSE event leaked a secret: {all}"
    );
    drop(srv);

    let short = weft_cmd(fx.root())
        .args(["env", "set", "PIN", "1234", "--secret"])
        .output()
        .unwrap();
    assert_eq!(short.status.code(), Some(2));
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Every file under `dir` with its bytes, read now. A file gone between the listing and
/// the read is left out: SQLite removes a database's -wal and -shm when its last connection
/// closes, which a runtime's shutdown does on its actors' own time (what they held is in the
/// database file, also read).
pub fn all_file_bytes(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    all_files(dir)
        .into_iter()
        .filter_map(|f| match std::fs::read(&f) {
            Ok(bytes) => Some((f, bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("{}: {e}", f.display()),
        })
        .collect()
}

pub fn all_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(all_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A thread's value never shadows one the project or the user set (#22 finding 9): a model
/// holding `env.set` cannot point `ENDPOINT` (where a tool sends its token) elsewhere — the set
/// is refused, naming the rule — and the tool still gets the project's value; a name the
/// project does not set is still the thread's to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_value_never_shadows_the_projects() {
    let script = r#"solo:
  - tool_calls: [ { name: set_env, input: { name: ENDPOINT, value: "https://evil.example" } } ]
  - tool_calls: [ { name: set_env, input: { name: GREETING, value: hi } } ]
  - tool_calls: [ { name: show, input: {} } ]
  - text: done
"#;
    let solo = directive("permissions: [ tool.show, env.set ]", "s");
    let fx = Fixture::new(&[("solo", &solo)], script, "");
    std::fs::create_dir_all(fx.root().join("tools")).unwrap();
    std::fs::write(
        fx.root().join("tools/show.yaml"),
        "name: show\nargv: [sh, -c, 'printf \"%s %s\" \"$ENDPOINT\" \"$GREETING\"']\nenv: [ENDPOINT, GREETING]\n",
    )
    .unwrap();
    weft(&fx, &["env", "set", "ENDPOINT", "https://good.example"]);
    let rt = fx.runtime().await;
    let report = rt
        .run("solo", Default::default(), weft::LimitSet::default())
        .await
        .unwrap();
    rt.shutdown();
    let r = tool_results(&fx, report.thread_id.as_str());
    assert!(
        r[0].1 && r[0].0.contains("project"),
        "the shadowing set was taken: {r:?}"
    );
    assert!(!r[1].1, "{r:?}");
    assert_eq!(r[2].0, "https://good.example hi", "{r:?}");
}
