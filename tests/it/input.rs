//! No input hangs or leaks (issue 23): what a model, a client or a file hands weft — a glob, a
//! number, a link planted in the file area — gets a clear error or a bounded answer, never a
//! panic, a hang or a path out of the area. Every call goes through a real thread with the
//! scripted provider choosing the calls.

use crate::support::{calls_script, directive, tool_results, Fixture};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use weft::Status;

/// A project whose root (permissions `perms`) makes `turns` of calls, with command tools
/// (file name → YAML).
fn project(perms: &str, tools: &[(&str, &str)], turns: &[Vec<(&str, Value)>]) -> Fixture {
    let root = directive(&format!("permissions: {perms}"), "Use tools.");
    let fx = Fixture::new(&[("root", &root)], &calls_script("root", turns), "");
    for (name, yaml) in tools {
        let p = fx.root().join("tools").join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, yaml).unwrap();
    }
    fx
}

/// Runs the root (60 s bound: a hang fails the test instead of holding it); its status and
/// its tool results in call order.
async fn run(fx: &Fixture) -> (Status, Vec<(String, bool)>) {
    let (report, _rt) = tokio::time::timeout(Duration::from_secs(60), fx.run("root", json!({})))
        .await
        .expect("the thread did not end within 60 s");
    let r = tool_results(fx, report.thread_id.as_str());
    (report.status, r)
}

fn value(r: &(String, bool)) -> Value {
    serde_json::from_str(&r.0).unwrap_or_else(|_| panic!("not JSON: {r:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pathological_glob_is_answered_at_once() {
    let name = "a".repeat(60);
    let fx = project(
        "[fs.read, fs.write]",
        &[],
        &[
            vec![("file_write", json!({"path": name, "content": "x"}))],
            vec![
                ("file_find", json!({"glob": "*a*a*a*a*a*a*a*a*a*ab"})),
                ("file_find", json!({"glob": "**/**/**/**/**/**/**/**/**/b"})),
                ("file_find", json!({"glob": "*a*a*a*a*a*a*a*a*a*a"})),
            ],
        ],
    );
    let t0 = Instant::now();
    let (status, r) = run(&fx).await;
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(status, Status::Completed);
    assert_eq!(value(&r[1])["paths"], json!([]));
    assert_eq!(value(&r[2])["paths"], json!([]));
    assert_eq!(value(&r[3])["paths"], json!([name]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_over_a_huge_area_stops_and_says_so() {
    let fx = project(
        "[fs.read, tool.many]",
        &[(
            "many.yaml",
            "name: many\nargv: [sh, \"-c\", \"mkdir d && cd d && i=0; while [ $i -lt 10100 ]; do : > f$i; i=$((i+1)); done\"]\ncwd: files\ntimeout: 60s\n",
        )],
        &[
            vec![("many", json!({}))],
            vec![
                ("file_find", json!({"glob": "**/nothing-matches"})),
                ("file_find", json!({"glob": "d/f1"})),
            ],
        ],
    );
    let (status, r) = run(&fx).await;
    assert_eq!(status, Status::Completed);
    assert!(!r[0].1, "{:?}", r[0]);
    let cut = value(&r[1]);
    assert_eq!(cut["paths"], json!([]));
    let note = cut["cut"].as_str().unwrap_or_else(|| panic!("{cut}"));
    assert!(note.contains("10000") && note.contains("narrow"), "{note}");
    // A glob that starts with a folder walks only that folder.
    assert_eq!(value(&r[2])["paths"], json!(["d/f1"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_link_in_the_area_is_neither_read_nor_written() {
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "SECRET").unwrap();
    let target = secret.display().to_string();
    let fx = project(
        "[fs.read, fs.write, tool.hardlink]",
        &[(
            "hardlink.yaml",
            "name: hardlink\nargv: [ln, \"{input.target}\", hard.txt]\ncwd: files\n",
        )],
        &[
            vec![("hardlink", json!({"target": target}))],
            vec![
                ("file_read", json!({"path": "hard.txt"})),
                (
                    "file_write",
                    json!({"path": "hard.txt", "content": "planted"}),
                ),
                ("file_grep", json!({"pattern": "SECRET"})),
            ],
        ],
    );
    let (_, r) = run(&fx).await;
    assert!(!r[0].1, "the link was made: {:?}", r[0]);
    for (i, (content, is_error)) in r.iter().enumerate().skip(1).take(2) {
        assert!(is_error, "call {i} was let through: {content}");
        assert!(content.contains("hard link"), "call {i}: {content}");
    }
    assert_eq!(value(&r[3])["matches"], json!([]), "grep read through it");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "SECRET");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_output_is_never_kept_through_a_symlink_out_of_the_area() {
    let outside = tempfile::tempdir().unwrap();
    let fx = project(
        "[fs.read, \"tool.*\"]",
        &[
            (
                "mklink.yaml",
                "name: mklink\nargv: [ln, \"-s\", \"{input.target}\", tool-output]\ncwd: files\n",
            ),
            (
                "long.yaml",
                "name: long\nargv: [seq, \"1\", \"5000\"]\nmax_output: 100\n",
            ),
        ],
        &[
            vec![(
                "mklink",
                json!({"target": outside.path().display().to_string()}),
            )],
            vec![("long", json!({}))],
        ],
    );
    let (_, r) = run(&fx).await;
    assert!(!r[0].1, "the link was made: {:?}", r[0]);
    assert!(r[1].0.starts_with("1\n2\n3\n"), "{:?}", r[1]);
    assert!(r[1].0.contains("refused"), "{:?}", r[1]);
    let leaked: Vec<_> = std::fs::read_dir(outside.path()).unwrap().collect();
    assert!(leaked.is_empty(), "written outside the area: {leaked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_schedule_delay_is_an_error_not_a_crash() {
    let fx = project(
        "[schedule]",
        &[],
        &[vec![
            ("schedule", json!({"tool": "x", "delay": 1e20})),
            (
                "schedule",
                json!({"tool": "x", "delay": "99999999999999999999999999h"}),
            ),
        ]],
    );
    let (status, r) = run(&fx).await;
    assert_eq!(status, Status::Completed, "{r:?}");
    assert!(r[0].1 && r[0].0.contains("30 days"), "{:?}", r[0]);
    assert!(r[1].1 && r[1].0.contains("delay"), "{:?}", r[1]);
}

#[cfg(feature = "js")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_run_code_timeout_is_bounded_not_a_panic() {
    let fx = project(
        "[code.run]",
        &[],
        &[vec![(
            "run_code",
            json!({"source": "6 * 7", "timeout": 1e300}),
        )]],
    );
    let (status, r) = run(&fx).await;
    assert_eq!(status, Status::Completed);
    assert!(!r[0].1, "{:?}", r[0]);
    assert_eq!(value(&r[0])["result"], 42, "{:?}", r[0]);
}
