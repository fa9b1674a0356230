//! The `weft` binary end to end: the demo, `--json`, exit codes, and tamper detection by `verify`.

use crate::support::{directive, weft_home, Fixture};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn weft(project: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .arg("--project")
        .arg(project)
        .env("WEFT_HOME", weft_home())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A copy of the research demo in a temp dir.
fn demo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/research");
    for rel in [
        "directives/research/fanout.md",
        "directives/research/question.md",
        "directives/research/source.md",
        "script.yaml",
        ".weft/config.yaml",
    ] {
        let to = dir.path().join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(src.join(rel), to).unwrap();
    }
    dir
}

fn transcript(project: &Path, id: &str) -> std::path::PathBuf {
    project
        .join(".weft/threads")
        .join(id)
        .join("transcript.jsonl")
}

fn run_demo(dir: &Path) -> Value {
    let script = dir.join("script.yaml");
    let o = weft(
        dir,
        &[
            "run",
            "research/fanout",
            "-i",
            "topic=looms",
            "--script",
            script.to_str().unwrap(),
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn demo_runs_and_reports_json() {
    let dir = demo();
    let out = run_demo(dir.path());
    assert_eq!(out["status"], "completed");
    assert_eq!(out["outputs"]["answers"], 3);
    assert_eq!(out["cost"]["turns"], 3);
    assert_eq!(out["cost"]["threads"], 10, "root + 3 questions + 6 sources");
    // 3 questions × (1800 in, 170 out + 2 sources × (300 in, 60 out)) + root (4900 in, 360 out).
    let expected = 4900 * 1000 + 360 * 4000 + 3 * ((1800 + 600) * 1000 + (170 + 120) * 4000);
    assert_eq!(out["cost"]["spend_nanos"], expected);
    let o = weft(dir.path(), &["threads", "--json"]);
    let rows: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rows.len(), 10);
    assert!(rows.iter().all(|r| r["status"] == "completed"
        && r["id"].is_string()
        && r.get("parent_id").is_some()));
    let o = weft(dir.path(), &["verify", "--all"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("10 verified, 0 failed"));
}

#[test]
fn verify_detects_an_edited_thread_json_and_an_edited_transcript_line() {
    let dir = demo();
    let out = run_demo(dir.path());
    let id = out["thread_id"].as_str().unwrap();
    let tdir = dir.path().join(".weft/threads").join(id);
    // Edit the signed spend in thread.json.
    let doc_path = tdir.join("thread.json");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let spend = out["cost"]["spend_nanos"].as_i64().unwrap().to_string();
    std::fs::write(&doc_path, doc.replacen(&spend, "1", 1)).unwrap();
    let o = weft(dir.path(), &["verify", id]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("thread.json") && text(&o).contains("bad signature"),
        "{}",
        text(&o)
    );
    std::fs::write(&doc_path, doc).unwrap();
    assert!(weft(dir.path(), &["verify", id]).status.success());
    // Edit one transcript line (line 3) without touching its hash links.
    let tr_path = tdir.join("transcript.jsonl");
    let tr = std::fs::read_to_string(&tr_path).unwrap();
    let mut lines: Vec<String> = tr.lines().map(String::from).collect();
    lines[2] = lines[2].replacen("\"seq\":2", "\"seq\":2,\"x\":1", 1);
    std::fs::write(&tr_path, lines.join("\n") + "\n").unwrap();
    let o = weft(dir.path(), &["verify", id]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("transcript.jsonl:4: broken chain"),
        "{}",
        text(&o)
    );
}

#[test]
fn verify_detects_a_transcript_cut_short_as_a_head_mismatch() {
    let dir = demo();
    let out = run_demo(dir.path());
    let id = out["thread_id"].as_str().unwrap();
    let tr_path = transcript(dir.path(), id);
    let tr = std::fs::read_to_string(&tr_path).unwrap();
    // Dropping the last lines keeps the chain valid; only thread.json's signed head betrays it.
    let lines: Vec<&str> = tr.lines().collect();
    std::fs::write(&tr_path, lines[..lines.len() - 2].join("\n") + "\n").unwrap();
    let o = weft(dir.path(), &["verify", id, "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let verdicts: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let problems = verdicts[0]["problems"].to_string();
    assert!(problems.contains("head mismatch"), "{problems}");
}

#[test]
fn a_torn_last_line_is_reported_not_fatal() {
    let dir = demo();
    let out = run_demo(dir.path());
    let id = out["thread_id"].as_str().unwrap();
    let tr_path = transcript(dir.path(), id);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&tr_path)
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"seq\":99,\"ty").unwrap();
    let o = weft(dir.path(), &["verify", id]);
    assert!(
        text(&o).contains("torn last transcript line"),
        "{}",
        text(&o)
    );
}

#[test]
fn bad_directives_and_inputs_exit_2_naming_file_line_and_input() {
    let fx = Fixture::new(
        &[
            ("typo", &directive("limits: { turnz: 3 }", "x")),
            (
                "broken",
                "---\nname: broken\nlimits: [unclosed\n---\nbody\n",
            ),
            (
                "needs",
                &directive(
                    "inputs:\n  topic: { type: string, required: true }\n  n: { type: integer }",
                    "{input:topic}",
                ),
            ),
        ],
        "default:\n  - text: hi\n",
        "",
    );
    let script = fx.root().join("script.yaml");
    let s = script.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["run", "typo", "--script", s],
            "typo.md:2:1: unknown limit `turnz`",
        ),
        (&["run", "broken", "--script", s], "broken.md:3"),
        (
            &["run", "needs", "--script", s],
            "missing required input `topic`",
        ),
        (
            &[
                "run", "needs", "-i", "topic=x", "-i", "n=many", "--script", s,
            ],
            "input `n`: `many` is not of type integer",
        ),
        (
            &[
                "run",
                "needs",
                "-i",
                "topic=x",
                "-i",
                "colour=red",
                "--script",
                s,
            ],
            "unknown input `colour`",
        ),
    ];
    for (args, want) in cases {
        let o = weft(fx.root(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains(want),
            "{args:?}: wanted `{want}` in {}",
            text(&o)
        );
    }
    if fx.root().join(".weft/state/registry.db").exists() {
        assert!(fx.rows().is_empty(), "no thread registered");
    }
    let o = weft(
        fx.root(),
        &[
            "run", "needs", "-i", "topic=x", "--limit", "depth=-1", "--script", s,
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("limit exceeded: depth"), "{}", text(&o));
    let o = weft(fx.root(), &["show", "../../etc"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_thread_error_exits_1() {
    let fx = Fixture::new(
        &[("solo", &directive("limits: { turns: 1 }", "x"))],
        "solo:\n  - tool_calls: [ { name: nope, input: {} } ]\n",
        "",
    );
    let script = fx.root().join("script.yaml");
    let o = weft(
        fx.root(),
        &[
            "run",
            "solo",
            "--script",
            script.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(out["error"], "limit exceeded: turns 1/1");
}

/// `weft log --follow` from another process tails a live thread and its subtree (`--tree`, each
/// line tagged) and exits once every thread of it has ended; `--json` is the stored lines.
#[test]
fn log_follows_a_live_tree_from_another_process_until_it_ends() {
    let top = directive("permissions: [\"thread.spawn.kid\"]", "Go.");
    let kid = directive("", "Kid.");
    let script = r#"
top:
  - text: "spawning"
    delay: 300ms
    tool_calls:
      - { name: spawn_thread, input: { directive: kid, wait: true } }
  - text: top done
kid:
  - text: kid done
    delay: 700ms
"#;
    let fx = Fixture::new(&[("top", &top), ("kid", &kid)], script, "");
    let mut run = crate::support::weft_cmd(fx.root())
        .args(["run", "top", "--json", "--script"])
        .arg(fx.root().join("script.yaml"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let id = loop {
        if let Some(r) = crate::support::rows_json(fx.root()).first() {
            break r["id"].as_str().unwrap().to_string();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let t0 = std::time::Instant::now();
    let follow = weft(fx.root(), &["log", &id, "--follow", "--tree"]);
    let took = t0.elapsed();
    assert!(run.wait().unwrap().success());
    assert!(follow.status.success(), "{}", text(&follow));
    let out = text(&follow);
    // It was live: it waited for the kid's 700 ms turn, and saw both ends.
    assert!(took >= std::time::Duration::from_millis(700), "{took:?}");
    let kid_tag = out
        .lines()
        .find(|l| l.contains("started") && l.contains("kid on"))
        .unwrap_or_else(|| panic!("no kid start: {out}"));
    assert!(kid_tag.contains("[kid·"), "{kid_tag}");
    assert_eq!(out.matches("finished").count(), 2, "{out}");
    assert!(
        out.contains("kid done") && out.contains("top done"),
        "{out}"
    );
    assert!(!out.contains("checkpoint"), "{out}");
    // The last line printed is the root's end.
    let last = out.lines().rev().find(|l| !l.starts_with(' ')).unwrap();
    assert!(
        last.contains("[top·") && last.contains("finished") && last.contains("completed"),
        "{last}"
    );
    // --json: every stored line of the thread, as stored.
    let json = weft(fx.root(), &["log", &id, "--json"]);
    let lines: Vec<Value> = text(&json)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let stored = std::fs::read_to_string(transcript(fx.root(), &id)).unwrap();
    assert_eq!(lines.len(), stored.lines().count());
    assert!(lines.iter().all(|l| l["thread_id"] == id.as_str()));
    // An unknown thread: a usage error naming it.
    let o = weft(fx.root(), &["log", "top-1795423435448-d886b9ff0000"]);
    assert_eq!(o.status.code(), Some(2));
}

/// Processes opening a fresh project at the same moment (a `weft serve` and a `weft run` started
/// together) both get its databases and its trust store: neither fails with "database is
/// locked" while the other creates them, nor reads the user's public key half-written.
#[cfg(feature = "server")]
#[test]
fn a_run_and_a_serve_opening_a_fresh_project_together_both_start() {
    use std::io::BufRead;
    for round in 0..8 {
        let fx = Fixture::new(
            &[("solo", &directive("", "Answer."))],
            "solo:\n  - text: ok\n    delay: 200ms\n",
            "",
        );
        let run = crate::support::weft_cmd(fx.root())
            .args(["run", "solo", "--json", "--script"])
            .arg(fx.root().join("script.yaml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut serve = crate::support::weft_cmd(fx.root())
            .args(["serve", "--addr", "127.0.0.1:0"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let _ = std::io::BufReader::new(serve.stdout.take().unwrap()).read_line(&mut line);
        let _ = serve.kill();
        let served = serve.wait_with_output().unwrap();
        let o = run.wait_with_output().unwrap();
        let errs = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stderr),
            String::from_utf8_lossy(&served.stderr)
        );
        assert!(o.status.success(), "round {round}: {errs}");
        assert!(
            line.starts_with("weft serve: http://"),
            "round {round}: {line:?} {errs}"
        );
        assert!(!errs.contains("not an ed25519"), "round {round}: {errs}");
    }
}

/// `weft --version` names the commit the binary was built from.
#[test]
fn the_version_names_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let out = weft(dir.path(), &["--version"]);
    let said = text(&out);
    assert!(out.status.success() && said.contains("(commit "), "{said}");
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(head) = head {
        assert!(said.contains(&head), "built from {head}: {said}");
    }
}

/// `weft completions bash|zsh|fish` prints each shell's script for every command; bash reads
/// the bash script without a syntax error, and a closed pipe ends the command quietly.
#[test]
fn completions_cover_every_command_for_three_shells() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, mark) in [
        ("bash", "_weft()"),
        ("zsh", "#compdef weft"),
        ("fish", "complete -c weft"),
    ] {
        let out = weft(dir.path(), &["completions", shell]);
        let script = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && script.contains(mark),
            "{shell}: {}",
            text(&out)
        );
        for cmd in ["run", "serve", "nodes", "verify", "completions"] {
            assert!(script.contains(cmd), "{shell} completes `{cmd}`");
        }
        if shell == "bash" {
            let file = dir.path().join("weft.bash");
            std::fs::write(&file, &script).unwrap();
            let checked = Command::new("bash").arg("-n").arg(&file).output().unwrap();
            assert!(
                checked.status.success(),
                "{}",
                String::from_utf8_lossy(&checked.stderr)
            );
        }
    }
    // Its reader gone before it writes (as `| head` does): it ends quietly, without a panic.
    let mut closed = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["completions", "bash"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(closed.stdout.take());
    let out = closed.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("panicked"), "{err}");
}

/// `weft` asks for its memory in small pages (BENCHMARKS.md: a tree of 11,111 threads peaks
/// ~10 MiB lower): the kernel reports transparent huge pages off for a running `weft run`.
#[test]
fn a_running_weft_uses_small_pages() {
    let slow = "s:\n  - text: done\n    delay: 30s\n";
    let fx = Fixture::new(&[("s", &directive("", "Wait."))], slow, "");
    let mut run = crate::support::spawn_run(&fx, "s");
    let status = format!("/proc/{}/status", run.id());
    let mut thp = None;
    for _ in 0..100 {
        let text = std::fs::read_to_string(&status).unwrap_or_default();
        thp = text
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))
            .map(|v| v.trim().to_string());
        // The flag is set first thing in main, before the project is even read.
        if thp.as_deref() == Some("0") || text.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = run.kill();
    let _ = run.wait();
    match thp.as_deref() {
        Some(v) => assert_eq!(v, "0", "a running weft has THP_enabled: {v}"),
        None => crate::support::skip("this kernel's /proc/<pid>/status has no THP_enabled"),
    }
}
