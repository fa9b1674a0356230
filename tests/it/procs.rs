//! Nothing outlives its owner (#23, processes): a command tool's process group — its
//! grandchildren included — dies with the weft process that started it, however that process
//! ends: `kill -9` (the kernel kills the leader; recovery kills the rest, recorded in
//! `.weft/state/procs`), SIGTERM (handled like Ctrl-C), a tree's cancel while an `after_complete`
//! hook's command or a scheduled tool runs. Real processes; `pgrep` finds nothing afterwards.

use crate::support::{directive, exits_within, spawn_run, wait_until, weft_cmd, Fixture};
use std::path::Path;
use std::process::{Child, Command};

/// A `sleep` argument no other process on the machine uses.
fn marker() -> String {
    let n = std::process::id() as u64 * 1000
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_micros() as u64
            % 1000;
    format!("{}.{}", 90000 + n % 9000, n % 97)
}

/// Pids of processes whose command line is `sleep <arg>` (`pgrep`, from procps: `.ci/run`
/// installs it).
fn sleeping(arg: &str) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-f", &format!("^sleep {arg}$")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Whether `pgrep` and `kill` are here; if not the test cannot look, and says so (failing
/// under CI=true).
fn can_look() -> bool {
    let found = |p: &str| {
        Command::new("sh")
            .args([
                "-c",
                &format!("command -v {p} >/dev/null && [ -x \"$(command -v {p})\" ]"),
            ])
            .status()
            .is_ok_and(|s| s.success())
    };
    let here =
        found("pgrep") && (Path::new("/usr/bin/kill").exists() || Path::new("/bin/kill").exists());
    if !here {
        crate::support::skip("SKIPPED: pgrep or kill not found (install procps)");
    }
    here
}

fn signal(child: &Child, sig: &str) {
    Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
}

/// A project whose `t` directive calls tool `nap`: a shell leaving two sleeps in its group.
fn napping(mark: &str, hooks: &str) -> Fixture {
    let t = directive("permissions: [ tool.nap, schedule ]", "Nap.");
    let script = "t:\n  - tool_calls: [ { name: nap, input: {} } ]\n  - text: done\n";
    let fx = Fixture::new(&[("t", &t)], script, "");
    std::fs::create_dir_all(fx.root().join("tools")).unwrap();
    std::fs::write(
        fx.root().join("tools/nap.yaml"),
        format!("name: nap\nargv: [sh, -c, 'sleep {mark} & sleep {mark}; wait']\ntimeout: 10m\ninput_schema: {{ type: object }}\n"),
    )
    .unwrap();
    if !hooks.is_empty() {
        std::fs::write(fx.root().join(".weft/hooks.yaml"), hooks).unwrap();
    }
    fx
}

async fn until_sleeping(mark: &str, n: usize) {
    wait_until(&format!("{n} `sleep {mark}` to run"), || {
        sleeping(mark).len() >= n
    })
    .await;
}

/// Once the tool's two sleeps run, sends weft `sig`; weft exits within `secs` and, after
/// `then` (e.g. a recovery), nothing of the tool's group is left. Returns how weft exited.
async fn stop_weft(
    weft: Child,
    mark: &str,
    sig: &str,
    secs: u64,
    then: impl FnOnce(),
) -> std::process::Output {
    until_sleeping(mark, 2).await;
    signal(&weft, sig);
    let out = exits_within(weft, secs, &format!("weft after {sig}"));
    then();
    until_gone(mark).await;
    out
}

async fn until_gone(mark: &str) {
    wait_until(&format!("every `sleep {mark}` to be gone"), || {
        sleeping(mark).is_empty()
    })
    .await;
}

/// `kill -9` of weft mid-call: the kernel kills the tool's leader at once (parent-death
/// signal); the grandchildren it left in its group are killed by the next process's recovery,
/// which finds the group recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_process_group_dies_with_a_killed_weft() {
    if !can_look() {
        return;
    }
    let mark = marker();
    let fx = napping(&mark, "");
    let weft = spawn_run(&fx, "t");
    until_sleeping(&mark, 2).await;
    let recorded = std::fs::read_dir(fx.root().join(".weft/state/procs"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(recorded, 1, "the running group is recorded");
    stop_weft(weft, &mark, "-KILL", 10, || {
        let o = weft_cmd(fx.root()).arg("recover").output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    })
    .await;
    let left = std::fs::read_dir(fx.root().join(".weft/state/procs"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "the record goes with the group");
}

/// SIGTERM is handled like Ctrl-C: the thread is cancelled, its tool's whole group killed, and
/// weft exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cancels_and_kills_the_tools_group() {
    if !can_look() {
        return;
    }
    let mark = marker();
    let fx = napping(&mark, "");
    let weft = spawn_run(&fx, "t");
    let out = stop_weft(weft, &mark, "-TERM", 15, || {}).await;
    assert_eq!(
        out.status.code(),
        Some(130),
        "cancelled, not killed by the signal"
    );
}

/// A hook's command carries the cancel of the tree that caused it: Ctrl-C while an
/// `after_complete` hook's command runs (its thread already ended) kills its group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hooks_command_dies_with_its_trees_cancel() {
    if !can_look() {
        return;
    }
    let mark = marker();
    let hooks = format!(
        "hooks:\n  - {{ id: slow, event: after_complete, condition: {{ path: status, op: eq, value: completed }}, action: {{ run: {{ argv: [sh, -c, 'sleep {mark} & sleep {mark}; wait'], timeout: 10m }} }} }}\n"
    );
    let t = directive("", "Quick.");
    let fx = Fixture::new(&[("t", &t)], "t:\n  - text: done\n", "");
    std::fs::write(fx.root().join(".weft/hooks.yaml"), hooks).unwrap();
    let weft = spawn_run(&fx, "t");
    stop_weft(weft, &mark, "-INT", 15, || {}).await;
}

/// A scheduled tool carries the cancel of the tree that scheduled it: the tree's cancel (through
/// the control socket: `weft cancel <root>`) kills it while it runs, after the root has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_tool_dies_with_its_trees_cancel() {
    if !can_look() {
        return;
    }
    let mark = marker();
    let fx = napping(&mark, "");
    std::fs::write(
        fx.root().join("script.yaml"),
        "t:\n  - tool_calls: [ { name: schedule, input: { tool: nap, delay: 0 } } ]\n  - text: scheduled\n",
    )
    .unwrap();
    let rt = fx.runtime().await;
    let h = rt
        .start("t", Default::default(), Default::default())
        .await
        .unwrap();
    let root = h.id().clone();
    let report = h.wait().await.unwrap();
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    until_sleeping(&mark, 2).await;
    assert!(
        rt.cancel(&root, "stop"),
        "the ended root's caused work is reachable"
    );
    until_gone(&mark).await;
    rt.drain_hooks().await;
    rt.shutdown();
}

/// A cancel of a root whose chain handed off and ended reaches what the last link caused:
/// `r` hands off at its turns limit to `r2` (a root of its own), whose `after_complete` hook's
/// command still runs after the chain ended; `Runtime::cancel(r)` kills it. (Before, the
/// chain's links were gone with its last actor and the cancel found nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_handed_off_root_reaches_what_its_continuation_caused() {
    if !can_look() {
        return;
    }
    let mark = marker();
    let hooks = format!(
        "hooks:\n  - {{ id: go_on, event: limit, condition: {{ path: limit_code, op: eq, value: turns }}, action: {{ control: handoff }} }}\n  - {{ id: slow, event: after_complete, condition: {{ path: status, op: eq, value: completed }}, action: {{ run: {{ argv: [sh, -c, 'sleep {mark} & sleep {mark}; wait'], timeout: 10m }} }} }}\n"
    );
    let t = directive("limits: { turns: 1 }", "Work.");
    let script = "t:\n  - tool_calls: [ { name: thread_status, input: { id: nobody-1 } } ]\n  - text: done\n";
    let fx = Fixture::new(&[("t", &t)], script, "");
    std::fs::write(fx.root().join(".weft/hooks.yaml"), hooks).unwrap();
    let rt = fx.runtime().await;
    let h = rt
        .start("t", Default::default(), Default::default())
        .await
        .unwrap();
    let first = h.id().clone();
    let report = h.wait().await.unwrap();
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    assert_ne!(report.thread_id, first, "the chain handed off");
    until_sleeping(&mark, 2).await;
    assert!(
        rt.cancel(&first, "stop"),
        "the chain's caused work is reachable through its first thread"
    );
    until_gone(&mark).await;
    rt.drain_hooks().await;
    rt.shutdown();
}
