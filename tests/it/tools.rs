//! Tools that act on the world (SPEC §8): command tools from `tools/*.yaml` run as real
//! processes, and the thread's private file area. Every call goes through a real thread with the
//! scripted provider choosing the calls.

use crate::support::{
    calls_script, directive, rows_json as rows, tool_results as results, wait_until, weft_cmd,
    Fixture,
};
use serde_json::{json, Value};
use std::path::Path;
use weft::Status;

/// A project with `tools` (file name → YAML), extra project files, and a root directive whose
/// turns make the given calls, one turn per entry.
fn project(
    perms: &str,
    tools: &[(&str, &str)],
    files: &[(&str, &str)],
    turns: &[Vec<(&str, Value)>],
    config: &str,
) -> Fixture {
    let script = calls_script("root", turns);
    let root = directive(&format!("permissions: {perms}"), "Use tools.");
    let fx = Fixture::new(&[("root", &root)], &script, config);
    for (name, yaml) in tools {
        let p = fx.root().join("tools").join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, yaml).unwrap();
    }
    for (rel, text) in files {
        let p = fx.root().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    fx
}

async fn run(fx: &Fixture) -> (weft::ThreadReport, Vec<(String, bool)>) {
    let (report, _rt) = fx.run("root", json!({})).await;
    let r = results(fx, report.thread_id.as_str());
    (report, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_tool_gets_its_input_on_stdin_and_placeholders_as_whole_arguments() {
    let fx = project(
        "[tool.upper, tool.say]",
        &[
            ("upper.yaml", "name: upper\ndescription: Upper-case the input.\nargv: [tr, a-z, A-Z]\ninput_schema: { type: object, properties: { text: { type: string } }, required: [text] }\n"),
            ("say.yaml", "name: say\nargv: [printf, \"%s\", \"{input.word}\"]\n"),
            ("hidden.yaml", "name: hidden\nargv: [\"true\"]\n"),
        ],
        &[],
        &[vec![
            ("upper", json!({"text": "hi there"})),
            ("upper", json!({"words": 1})),
            ("say", json!({"word": "$(touch pwned); echo x"})),
            ("hidden", json!({})),
        ]],
        "",
    );
    let (report, r) = run(&fx).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(r[0], (r#"{"TEXT":"HI THERE"}"#.to_string(), false));
    assert!(
        r[1].1 && r[1].0.contains("input.text is required"),
        "{:?}",
        r[1]
    );
    assert_eq!(r[2], ("$(touch pwned); echo x".to_string(), false));
    assert!(
        !fx.root().join("pwned").exists(),
        "nothing went through a shell"
    );
    assert!(r[3].1 && r[3].0.contains("ungranted"), "{:?}", r[3]);
    // Offered to the model only when granted: the refusal lists what this thread was offered.
    let offered = r[3].0.split("available: ").nth(1).unwrap_or_default();
    assert!(
        offered.contains("upper") && offered.contains("say"),
        "{offered}"
    );
    assert!(!offered.contains("hidden"), "{offered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_tool_sees_only_the_environment_it_lists() {
    // Variables cargo sets for every test process: one listed, the others not.
    let fx = project(
        "[\"tool.*\"]",
        &[
            ("env1.yaml", "name: env1\nargv: [sh, \"-c\", \"echo ${CARGO_PKG_NAME:-none} ${CARGO_MANIFEST_DIR:-none} ${HOME:-nohome}\"]\nenv: [CARGO_PKG_NAME]\n"),
        ],
        &[],
        &[vec![("env1", json!({}))]],
        "",
    );
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let (_, r) = run(&fx).await;
    assert_eq!(r[0], ("weft none nohome\n".to_string(), false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_error_results_with_status_and_stderr() {
    let fx = project(
        "[\"tool.*\"]",
        &[
            ("fails.yaml", "name: fails\nargv: [sh, \"-c\", \"echo partial; echo something broke >&2; exit 3\"]\n"),
            ("slow.yaml", "name: slow\nargv: [sleep, \"30\"]\ntimeout: 300ms\n"),
            ("missing.yaml", "name: missing\nargv: [no-such-program-weft]\n"),
        ],
        &[],
        &[vec![
            ("fails", json!({})),
            ("slow", json!({})),
            ("missing", json!({})),
        ]],
        "",
    );
    let started = std::time::Instant::now();
    let (report, r) = run(&fx).await;
    assert_eq!(report.status, Status::Completed);
    assert!(r[0].1, "{:?}", r[0]);
    assert!(
        r[0].0.contains("status 3") && r[0].0.contains("something broke"),
        "{:?}",
        r[0]
    );
    assert!(
        r[1].1 && r[1].0.contains("timed out after 300ms"),
        "{:?}",
        r[1]
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert!(r[2].1 && r[2].0.contains("could not start"), "{:?}", r[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_output_is_cut_and_kept_whole_in_the_file_area() {
    let fx = project(
        "[\"tool.*\", fs.read]",
        &[(
            "long.yaml",
            "name: long\nargv: [seq, \"1\", \"5000\"]\nmax_output: 100\n",
        )],
        &[],
        &[vec![("long", json!({}))]],
        "",
    );
    let (report, r) = run(&fx).await;
    assert!(!r[0].1, "{:?}", r[0]);
    assert!(r[0].0.starts_with("1\n2\n3\n"), "{:?}", r[0]);
    assert!(
        r[0].0.contains("output cut at 100 of 23893 bytes"),
        "{:?}",
        r[0]
    );
    let area = fx
        .root()
        .join(".weft/threads")
        .join(report.thread_id.as_str())
        .join("files/tool-output");
    let kept: Vec<_> = std::fs::read_dir(&area).unwrap().flatten().collect();
    assert_eq!(kept.len(), 1);
    let whole = std::fs::read_to_string(kept[0].path()).unwrap();
    assert_eq!(whole.lines().count(), 5000);
}

/// Whether a process is gone (or a zombie waiting for its reaper).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

const SPAWNER: &str =
    "#!/bin/sh\nsleep 300 &\necho $! > grandchild.pid\necho $$ > child.pid\nsleep 300\n";

fn pids(area: &Path) -> (u32, u32) {
    let read = |f: &str| {
        std::fs::read_to_string(area.join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    (read("child.pid"), read("grandchild.pid"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_kills_the_whole_process_group() {
    let fx = project(
        "[\"tool.*\"]",
        &[(
            "spawner.yaml",
            "name: spawner\nargv: [bin/spawner.sh]\ncwd: files\ntimeout: 1s\n",
        )],
        &[("bin/spawner.sh", SPAWNER)],
        &[vec![("spawner", json!({}))]],
        "",
    );
    let (report, r) = run(&fx).await;
    assert!(r[0].1 && r[0].0.contains("timed out"), "{:?}", r[0]);
    let area = fx
        .root()
        .join(".weft/threads")
        .join(report.thread_id.as_str())
        .join("files");
    let (child, grandchild) = pids(&area);
    wait_until("the tool's processes are gone", || {
        gone(child) && gone(grandchild)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_thread_kills_its_tools_process_group() {
    let fx = project(
        "[\"tool.*\"]",
        &[(
            "spawner.yaml",
            "name: spawner\nargv: [bin/spawner.sh]\ncwd: files\ntimeout: 10m\n",
        )],
        &[("bin/spawner.sh", SPAWNER)],
        &[vec![("spawner", json!({}))]],
        "",
    );
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let area = fx
        .root()
        .join(".weft/threads")
        .join(handle.id().as_str())
        .join("files");
    wait_until("the tool started its processes", || {
        area.join("child.pid").exists() && area.join("grandchild.pid").exists()
    })
    .await;
    let (child, grandchild) = pids(&area);
    assert!(!gone(child) && !gone(grandchild));
    handle.cancel("enough");
    let report = tokio::time::timeout(std::time::Duration::from_secs(10), handle.wait())
        .await
        .expect("the thread ends promptly")
        .unwrap();
    assert_eq!(report.status, Status::Cancelled);
    wait_until("the tool's processes are gone", || {
        gone(child) && gone(grandchild)
    })
    .await;
    let r = results(&fx, report.thread_id.as_str());
    assert!(
        r[0].1 && r[0].0.contains("cancelled"),
        "the killed call is recorded: {r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_tool_file_is_refused_naming_file_line_and_field() {
    let fx = project(
        "[]",
        &[("bad.yaml", "name: bad\nargv: [ls]\ntimeout: forever\n")],
        &[],
        &[],
        "",
    );
    let err = weft::Runtime::open(fx.project())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("tools/bad.yaml:3: timeout `forever`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_tool_may_take_a_built_in_tools_name() {
    let names = weft::internals::builtin_tool_names();
    assert!(
        names.len() >= 21 && names.contains(&"scheduled_cancel"),
        "{names:?}"
    );
    for name in names {
        let file = format!("name: {name}\nargv: [ls]\n");
        let fx = project("[]", &[("t.yaml", &file)], &[], &[], "");
        let err = weft::Runtime::open(fx.project())
            .await
            .err()
            .unwrap_or_else(|| panic!("a command tool named `{name}` was accepted"))
            .to_string();
        assert!(
            err.contains("tools/t.yaml") && err.contains("built-in"),
            "{name}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_tools_work_inside_the_area() {
    let fx = project(
        "[fs.read, fs.write]",
        &[],
        &[],
        &[
            vec![
                (
                    "file_write",
                    json!({"path": "notes/a.md", "content": "alpha\nbeta\ngamma\n"}),
                ),
                (
                    "file_write",
                    json!({"path": "notes/deep/b.txt", "content": "beta too"}),
                ),
            ],
            vec![
                (
                    "file_read",
                    json!({"path": "notes/a.md", "offset": 2, "limit": 1}),
                ),
                ("file_list", json!({"path": "notes"})),
                ("file_find", json!({"glob": "**/*.txt"})),
                ("file_grep", json!({"pattern": "^bet"})),
            ],
            vec![("file_delete", json!({"path": "notes/deep"}))],
            vec![("file_find", json!({"glob": "**"}))],
        ],
        "",
    );
    let (report, r) = run(&fx).await;
    assert_eq!(report.status, Status::Completed);
    assert!(r.iter().all(|(_, e)| !e), "{r:#?}");
    let v = |i: usize| serde_json::from_str::<Value>(&r[i].0).unwrap();
    assert_eq!(v(2)["content"], "beta\n");
    assert_eq!(v(2)["total_lines"], 3);
    assert_eq!(v(3)["entries"][0]["name"], "a.md");
    assert_eq!(v(3)["entries"][1]["type"], "dir");
    assert_eq!(v(4)["paths"], json!(["notes/deep/b.txt"]));
    let m = v(5)["matches"].as_array().unwrap().clone();
    assert_eq!(m.len(), 2, "{m:?}");
    assert_eq!(m[0]["path"], "notes/a.md");
    assert_eq!(m[0]["line"], 2);
    assert_eq!(v(7)["paths"], json!(["notes/a.md"]));
    let on_disk = fx
        .root()
        .join(".weft/threads")
        .join(report.thread_id.as_str())
        .join("files/notes/a.md");
    assert_eq!(
        std::fs::read_to_string(on_disk).unwrap(),
        "alpha\nbeta\ngamma\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_path_leaves_the_file_area() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "SECRET").unwrap();
    let out = outside.path().display().to_string();
    let fx = project(
        "[fs.read, fs.write, tool.mklink]",
        &[(
            "mklink.yaml",
            "name: mklink\nargv: [ln, \"-s\", \"{input.target}\", escape]\ncwd: files\n",
        )],
        &[],
        &[
            vec![("mklink", json!({"target": out}))],
            vec![
                ("file_read", json!({"path": "../thread.json"})),
                ("file_read", json!({"path": format!("{out}/secret.txt")})),
                ("file_read", json!({"path": "escape/secret.txt"})),
                (
                    "file_write",
                    json!({"path": "escape/planted.txt", "content": "x"}),
                ),
                ("file_list", json!({"path": "escape"})),
                ("file_grep", json!({"pattern": "SECRET", "path": "escape"})),
                ("file_delete", json!({"path": "escape/secret.txt"})),
                ("file_write", json!({"path": "a/../../x", "content": "x"})),
                ("file_find", json!({"glob": "**"})),
                ("file_grep", json!({"pattern": "SECRET"})),
            ],
        ],
        "",
    );
    let (_, r) = run(&fx).await;
    assert!(!r[0].1, "the link was made: {:?}", r[0]);
    for (i, (content, is_error)) in r.iter().enumerate().skip(1).take(8) {
        assert!(is_error, "call {i} was let through: {content}");
        assert!(content.contains("refused"), "call {i}: {content}");
    }
    // Walking the area never follows the link out.
    assert!(!r[9].1 && !r[10].1, "{:?} {:?}", r[9], r[10]);
    assert_eq!(
        serde_json::from_str::<Value>(&r[9].0).unwrap()["paths"],
        json!([])
    );
    assert_eq!(
        serde_json::from_str::<Value>(&r[10].0).unwrap()["matches"],
        json!([])
    );
    assert!(outside.path().join("secret.txt").exists());
    assert!(!outside.path().join("planted.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_and_area_sizes_are_bounded_by_config() {
    let fx = project(
        "[fs.write]",
        &[],
        &[],
        &[
            vec![
                (
                    "file_write",
                    json!({"path": "big", "content": "x".repeat(101)}),
                ),
                (
                    "file_write",
                    json!({"path": "one", "content": "x".repeat(100)}),
                ),
            ],
            vec![
                (
                    "file_write",
                    json!({"path": "two", "content": "x".repeat(100)}),
                ),
                (
                    "file_write",
                    json!({"path": "one", "content": "y".repeat(100)}),
                ),
            ],
        ],
        "files: { max_file_bytes: 100, max_area_bytes: 150 }\n",
    );
    let (_, r) = run(&fx).await;
    assert!(r[0].1 && r[0].0.contains("max_file_bytes"), "{:?}", r[0]);
    assert!(!r[1].1, "{:?}", r[1]);
    assert!(r[2].1 && r[2].0.contains("max_area_bytes"), "{:?}", r[2]);
    assert!(
        !r[3].1,
        "replacing a file counts its new size only: {:?}",
        r[3]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_tools_need_their_capabilities() {
    let fx = project(
        "[fs.read]",
        &[],
        &[],
        &[vec![
            ("file_write", json!({"path": "a", "content": "x"})),
            ("file_list", json!({})),
        ]],
        "",
    );
    let (_, r) = run(&fx).await;
    assert!(r[0].1 && r[0].0.contains("ungranted"), "{:?}", r[0]);
    assert!(!r[1].1, "{:?}", r[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_travel_down_with_a_spawn_and_up_with_a_return() {
    let root = directive(
        "permissions: [\"thread.spawn.**\", fs.read, fs.write]",
        "Delegate.",
    );
    let kid = directive("permissions: [fs.read, fs.write]", "Work.");
    let script = r#"
root:
  - tool_calls:
      - { name: file_write, input: { path: brief.md, content: "the brief" } }
  - tool_calls:
      - { name: spawn_thread, input: { directive: kid, files: ["../escape"] } }
      - { name: spawn_thread, input: { directive: kid, files: [brief.md] } }
  - tool_calls:
      - { name: file_list, input: { path: from } }
  - text: done
kid:
  - tool_calls:
      - { name: file_read, input: { path: brief.md } }
      - { name: file_write, input: { path: out/result.txt, content: "the result" } }
  - tool_calls:
      - { name: directive_return, input: { files: [out/result.txt] } }
"#;
    let fx = Fixture::new(&[("root", &root), ("kid", &kid)], script, "");
    let (report, _rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let r = results(&fx, report.thread_id.as_str());
    assert!(r[1].1 && r[1].0.contains("refused"), "{:?}", r[1]);
    assert!(!r[2].1, "{:?}", r[2]);
    let child: Value = serde_json::from_str(&r[2].0).unwrap();
    let kid_id = child["thread_id"].as_str().unwrap().to_string();
    let handed = format!("from/{kid_id}/out/result.txt");
    assert_eq!(child["files"], json!([handed]), "{child}");
    let kid_results = results(&fx, &kid_id);
    let read: Value = serde_json::from_str(&kid_results[0].0).unwrap();
    assert_eq!(
        read["content"], "the brief\n",
        "the attachment reached the child"
    );
    let parent_area = fx
        .root()
        .join(".weft/threads")
        .join(report.thread_id.as_str())
        .join("files");
    assert_eq!(
        std::fs::read_to_string(parent_area.join(&handed)).unwrap(),
        "the result"
    );
}

/// A person answers from another terminal: `weft run` parks two calls (one by the tool's YAML,
/// one by the directive's `approval:` list) and waits; `weft approve` runs one, `weft deny`
/// gives the model the other's refusal.
#[test]
fn calls_wait_for_a_person_who_approves_or_denies_from_another_terminal() {
    let root = directive(
        "permissions: [\"tool.*\"]\napproval: [tool.say]",
        "Use tools.",
    );
    let script = r#"
root:
  - tool_calls:
      - { name: upper, input: { text: "approved" } }
      - { name: say, input: { word: "denied" } }
  - text: done
"#;
    let fx = Fixture::new(&[("root", &root)], script, "");
    crate::support::approval_tools(&fx);
    let script_path = fx.root().join("script.yaml");
    let run = weft_cmd(fx.root())
        .args(["run", "root", "--json", "--script"])
        .arg(&script_path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let id = loop {
        let rs = rows(fx.root());
        if let Some(r) = rs.iter().find(|r| {
            r["waiting"]
                .as_str()
                .is_some_and(|w| w.contains("upper") && w.contains("say"))
        }) {
            assert_eq!(r["status"], "running");
            break r["id"].as_str().unwrap().to_string();
        }
        assert!(start.elapsed().as_secs() < 30, "never waited: {rs:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let show = weft_cmd(fx.root()).args(["show", &id]).output().unwrap();
    assert!(String::from_utf8_lossy(&show.stdout).contains("waiting    approval of"));
    // Two wait: a decision must name one.
    let o = weft_cmd(fx.root()).args(["approve", &id]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("name one with --call"));
    let o = weft_cmd(fx.root())
        .args(["approve", &id, "--call", "call_0_0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = weft_cmd(fx.root())
        .args(["deny", &id, "--call", "call_0_1", "--reason", "not today"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = run.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = results(&fx, &id);
    assert_eq!(r[0], (r#"{"TEXT":"APPROVED"}"#.to_string(), false));
    assert!(
        r[1].1 && r[1].0.contains("denied by a person: not today"),
        "{:?}",
        r[1]
    );
    let events = fx.events(&id);
    let count = |t: &str| events.iter().filter(|e| e["type"] == t).count();
    assert_eq!(
        (count("approval_requested"), count("approval_decided")),
        (2, 2)
    );
    let row = rows(fx.root())
        .into_iter()
        .find(|r| r["id"] == id.as_str())
        .unwrap();
    assert!(row.get("waiting").is_none_or(Value::is_null), "{row}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_cancelled_while_waiting_runs_nothing() {
    let fx = project(
        "[\"tool.*\"]",
        &[(
            "touch.yaml",
            "name: touch\nargv: [touch, ran]\ncwd: files\napproval: required\n",
        )],
        &[],
        &[vec![("touch", json!({}))]],
        "",
    );
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().to_string();
    wait_until("the call waits", || {
        fx.events(&id)
            .iter()
            .any(|e| e["type"] == "approval_requested")
    })
    .await;
    handle.cancel("no");
    let report = handle.wait().await.unwrap();
    assert_eq!(report.status, Status::Cancelled);
    let area = fx.root().join(".weft/threads").join(&id).join("files");
    assert!(!area.join("ran").exists(), "the parked call ran");
    let r = results(&fx, &id);
    assert!(r[0].1 && r[0].0.contains("waited for approval"), "{r:?}");
    assert!(rt
        .decide(&report.thread_id, None, true, None)
        .await
        .is_err());
}

/// A model cannot turn a placeholder into an option (#22 finding 8): `wc -w {input.path}` with
/// `--files0-from=/etc/hostname` is refused before anything runs; after a `--` in the tool's
/// argv the same value is an operand, as the program reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_value_starting_with_a_dash_is_never_an_option() {
    let fx = project(
        "[tool.count, tool.count_operands]",
        &[
            (
                "count.yaml",
                "name: count\nargv: [wc, -w, \"{input.path}\"]\n",
            ),
            (
                "count_operands.yaml",
                "name: count_operands\nargv: [wc, -w, --, \"{input.path}\"]\ncwd: files\n",
            ),
        ],
        &[],
        &[
            vec![("count", json!({"path": "--files0-from=/etc/hostname"}))],
            vec![("count_operands", json!({"path": "-x"}))],
        ],
        "",
    );
    let (report, r) = run(&fx).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert!(r[0].1, "an option was passed through: {:?}", r[0]);
    assert!(
        r[0].0.contains("starts with `-`") && r[0].0.contains("nothing was run"),
        "{:?}",
        r[0]
    );
    // After `--`, wc reads `-x` as a file name (which does not exist): an operand, run.
    assert!(
        r[1].0.contains("-x") && !r[1].0.contains("starts with `-`"),
        "{:?}",
        r[1]
    );
}

/// Authority travels whole (#22 finding 6): a child that declares no permissions inherits its
/// parent's capabilities *and* its approval list, so its call of a listed tool waits for a
/// person (here none answers before the child's duration ends: the call is recorded as not
/// run); and `schedule {tool}` of a tool that needs approval is refused, since an effect has no
/// person to wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_travels_with_capabilities_and_schedule_cannot_skip_it() {
    let boss = directive(
        "permissions: [tool.count, thread.spawn.kid, schedule]\napproval: [tool.count]",
        "Boss.",
    );
    let kid = directive("limits: { duration: 1s }", "Kid.");
    let script = r#"boss:
  - tool_calls: [ { name: schedule, input: { tool: count, inputs: { path: x }, delay: 1h } } ]
  - tool_calls: [ { name: spawn_thread, input: { directive: kid } } ]
  - text: done
kid:
  - tool_calls: [ { name: count, input: { path: x } } ]
  - text: counted
"#;
    let fx = Fixture::new(&[("boss", &boss), ("kid", &kid)], script, "");
    count_tool(&fx);
    let (report, _rt) = fx.run("boss", json!({})).await;
    let boss_results = results(&fx, report.thread_id.as_str());
    assert!(
        boss_results[0].1 && boss_results[0].0.contains("approval"),
        "scheduled past its approval: {boss_results:?}"
    );
    let kid_id = fx.id_of("kid");
    let kinds: Vec<String> = fx
        .events(&kid_id)
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        kinds.contains(&"approval_requested".to_string()),
        "{kinds:?}"
    );
    let kid_results = results(&fx, &kid_id);
    assert!(
        kid_results.iter().all(|(c, _)| !c.contains("counted")),
        "the child ran the tool unasked: {kid_results:?}"
    );
}

/// A child whose directive writes `permissions: []` holds no capability, where one that writes
/// no `permissions` inherits its parent's: an explicit empty list never hands a child
/// everything its parent may do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_writes_no_permissions_out_holds_none() {
    let boss = directive("permissions: [tool.count, \"thread.spawn.*\"]", "Boss.");
    let bare = directive("permissions: []", "Bare.");
    let heir = directive("", "Heir.");
    let script = r#"boss:
  - tool_calls:
      - { name: spawn_thread, input: { directive: bare } }
      - { name: spawn_thread, input: { directive: heir } }
  - text: done
bare:
  - tool_calls: [ { name: count, input: { path: x } } ]
  - text: tried
heir:
  - text: fine
"#;
    let fx = Fixture::new(
        &[("boss", &boss), ("bare", &bare), ("heir", &heir)],
        script,
        "",
    );
    count_tool(&fx);
    let (report, _rt) = fx.run("boss", json!({})).await;
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    let bare_id = fx.id_of("bare");
    assert!(
        fx.doc(&bare_id).capabilities.is_empty(),
        "{:?}",
        fx.doc(&bare_id).capabilities
    );
    let tried = results(&fx, &bare_id);
    assert!(
        tried
            .iter()
            .all(|(c, is_error)| *is_error && !c.contains("counted")),
        "a child with `permissions: []` ran its parent's tool: {tried:?}"
    );
    let heir_caps = fx.doc(&fx.id_of("heir")).capabilities;
    assert!(
        heir_caps.contains(&"tool.count".to_string()),
        "{heir_caps:?}"
    );
}

/// The project's command tool `count` (it prints "counted").
fn count_tool(fx: &Fixture) {
    std::fs::create_dir_all(fx.root().join("tools")).unwrap();
    std::fs::write(
        fx.root().join("tools/count.yaml"),
        "name: count\nargv: [echo, counted]\n",
    )
    .unwrap();
}
