//! Several `weft serve` nodes on one Debian PostgreSQL (#26), as real processes on loopback.
//! A node that dies (`kill -9`) or stops past its lease has its threads adopted by a live node:
//! claimed once, their calls in flight charged at their bound, finalized `interrupted`, the
//! tree's spend within its cap, nothing left open in the ledger, every record verifying — and,
//! with `auto_resume: true`, the tree resumed there and completed. A node that comes back after
//! its lease ran out writes nothing over the adoption (fenced by the database).

use crate::serve::Server;
use crate::support::{directive, weft_cmd, Backend, Fixture};
use serde_json::json;
use std::time::{Duration, Instant};

/// root → 3 leaves (not waited, then `wait_threads`); each leaf's one call takes a minute, so
/// it is in flight when its node dies.
pub(crate) const SCRIPT: &str = r#"
root:
  - usage: { input_tokens: 20, output_tokens: 5 }
    tool_calls:
      - { name: spawn_thread, input: { directive: leaf, wait: false } }
      - { name: spawn_thread, input: { directive: leaf, wait: false } }
      - { name: spawn_thread, input: { directive: leaf, wait: false } }
  - usage: { input_tokens: 30, output_tokens: 5 }
    tool_calls: [ { name: wait_threads, input: {} } ]
  - text: root done
    usage: { input_tokens: 40, output_tokens: 5 }
leaf:
  - text: leaf done
    delay: LEAF_DELAY
    usage: { input_tokens: 10, output_tokens: 5 }
"#;

/// The tree's root may spend this much (nano-USD).
pub(crate) const CAP: i64 = 50_000_000;

pub(crate) fn tree(extra: &str) -> Option<Fixture> {
    tree_with(extra, "60s")
}

/// A second checkout of `fx`'s project (its own folder, so its own `.weft/`) on the same
/// database: a process there is judged by lock files this checkout does not have.
fn other_checkout(fx: &Fixture) -> Fixture {
    let url = fx.database.clone().unwrap();
    let [root, leaf] = directives();
    let mut other = Fixture::new(
        &[("root", &root), ("leaf", &leaf)],
        &SCRIPT.replace("LEAF_DELAY", "60s"),
        &format!("database: \"{url}\"\n"),
    );
    other.database = Some(url);
    other
}

/// [`tree`], each leaf's call taking `delay`.
pub(crate) fn tree_with(extra: &str, delay: &str) -> Option<Fixture> {
    let [root, leaf] = directives();
    Fixture::on(
        Backend::Postgres,
        &[("root", &root), ("leaf", &leaf)],
        &SCRIPT.replace("LEAF_DELAY", delay),
        extra,
    )
}

/// The tree's two directives: `root` (may spend `CAP`) and `leaf`.
pub(crate) fn directives() -> [String; 2] {
    let perms =
        "permissions: [\"thread.spawn.leaf\"]\nlimits: { spawns: 5, concurrency: 5, spend: 0.05 }";
    [
        directive(perms, "Root."),
        directive("limits: { tokens: 2000, spend: 0.01 }", "Leaf."),
    ]
}

/// Node `name` of `fx`'s project, its lease one second.
pub(crate) fn node(fx: &Fixture, name: &str) -> Server {
    node_leased(fx, name, "1")
}

/// Node `name` of `fx`'s project, its lease `secs` long.
pub(crate) fn node_leased(fx: &Fixture, name: &str, secs: &str) -> Server {
    let script = fx.root().join("script.yaml");
    Server::start(
        fx,
        &[
            "--script",
            script.to_str().unwrap(),
            "--node",
            name,
            "--node-lease",
            secs,
        ],
    )
}

/// Polls the registry until `want` holds for the tree's rows (bounded), returning them.
pub(crate) fn rows_when(
    fx: &Fixture,
    what: &str,
    secs: u64,
    want: impl Fn(&[weft::internals::ThreadRow]) -> bool,
) -> Vec<weft::internals::ThreadRow> {
    let start = Instant::now();
    loop {
        let rows = fx.rows_so_far();
        if want(&rows) {
            return rows;
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "{what} within {secs} s: {:#?}",
            rows.iter()
                .map(|r| (r.id.to_string(), r.status, r.owner_pid, r.error.clone()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts the tree on `srv`; its root's id.
pub(crate) async fn start_tree(srv: &Server) -> String {
    let (status, body) = srv
        .call("POST", "/v1/threads", Some(json!({ "directive": "root" })))
        .await;
    assert!((200..300).contains(&status), "{status} {body}");
    body["thread_id"].as_str().unwrap().to_string()
}

/// Sends a cancel of thread `id` to `srv` (whichever node runs it); it must be taken.
pub(crate) async fn cancel_via(srv: &Server, id: &str) {
    let (s, said) = srv
        .call("POST", &format!("/v1/threads/{id}/cancel"), Some(json!({})))
        .await;
    assert!((200..300).contains(&s), "{s} {said}");
}

/// The tree is running on one node: its root and three leaves, every leaf's call in flight
/// (reserved in the ledger).
pub(crate) fn running_tree(fx: &Fixture) -> Vec<weft::internals::ThreadRow> {
    let rows = rows_when(fx, "the tree runs", 30, |rows| {
        rows.len() == 4 && rows.iter().all(|r| r.status.as_str() == "running")
    });
    let start = Instant::now();
    loop {
        let n = fx.query(
            "ledger.db",
            "SELECT COUNT(DISTINCT thread) FROM reservations WHERE thread LIKE 'leaf-%'",
        );
        if n == [["3"]] {
            return rows;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "three calls in flight: {n:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// After an adoption: every thread of the first tree ended `interrupted`, the tree's spend
/// within its cap and above what was recorded (the leaves' calls in flight charged at their
/// bound), nothing open in the ledger, and `weft verify --all` clean.
pub(crate) fn adopted_cleanly(fx: &Fixture, first: &[weft::internals::ThreadRow], dead_owner: u32) {
    let rows = fx.rows();
    for r in first {
        let now = rows.iter().find(|x| x.id == r.id).unwrap();
        assert_eq!(now.status.as_str(), "error", "{now:?}");
        let said = now.error.clone().unwrap_or_default();
        assert!(
            said.contains("interrupted") && said.contains("lease"),
            "{said}"
        );
        assert_ne!(
            now.owner_pid, dead_owner,
            "claimed by the adopting node: {now:?}"
        );
    }
    let root = rows.iter().find(|r| r.parent_id.is_none()).unwrap();
    let leaves: Vec<_> = rows
        .iter()
        .filter(|r| r.parent_id.as_ref() == Some(&root.id))
        .collect();
    for l in &leaves {
        assert!(
            l.spend_nanos > 0,
            "the call in flight is charged at its bound: {l:?}"
        );
    }
    assert!(
        root.spend_nanos <= CAP,
        "spend {} within the cap {CAP}",
        root.spend_nanos
    );
    crate::support::verify_cli_clean(fx.root());
}

/// Nothing is open in the ledger, and no account spent past its bound.
pub(crate) fn ledger_closed(fx: &Fixture) {
    let counts = fx.query(
        "ledger.db",
        "SELECT (SELECT COUNT(*) FROM reservations), (SELECT COUNT(*) FROM accounts WHERE closed=0),
                (SELECT COUNT(*) FROM accounts WHERE inflight<>0 OR spent>max)",
    );
    assert_eq!(
        counts,
        [["0", "0", "0"]],
        "open reservations, open accounts, overspent accounts"
    );
}

/// `kill -9` of the node running a tree: a live node adopts the tree within a few leases, and
/// with `auto_resume: true` resumes its root there, which completes.
#[tokio::test]
async fn a_dead_nodes_tree_is_adopted_by_a_live_node() {
    for resume in [false, true] {
        let extra = if resume { "auto_resume: true\n" } else { "" };
        let Some(fx) = tree(extra) else {
            return;
        };
        let a = node(&fx, "a");
        let b = node(&fx, "b");
        start_tree(&b).await;
        let first = running_tree(&fx);
        let dead_owner = first[0].owner_pid;
        assert!(
            dead_owner >= 1 << 30,
            "a node owns by its lease's number: {dead_owner}"
        );
        std::process::Command::new("kill")
            .args(["-9", &b.pid().to_string()])
            .status()
            .unwrap();
        let killed = Instant::now();
        rows_when(&fx, "the dead node's threads adopted", 20, |rows| {
            first
                .iter()
                .all(|f| rows.iter().any(|r| r.id == f.id && r.status.is_terminal()))
        });
        eprintln!(
            "adopted {:.2} s after kill -9 (lease 1 s)",
            killed.elapsed().as_secs_f64()
        );
        adopted_cleanly(&fx, &first, dead_owner);
        if resume {
            let root = first
                .iter()
                .find(|r| r.parent_id.is_none())
                .unwrap()
                .id
                .clone();
            let rows = rows_when(&fx, "the resumed tree completes", 30, |rows| {
                rows.iter().any(|r| {
                    r.continuation_of.as_ref() == Some(&root) && r.status.as_str() == "completed"
                })
            });
            let next = rows
                .iter()
                .find(|r| r.continuation_of.as_ref() == Some(&root))
                .unwrap();
            assert!(
                next.owner_pid >= 1 << 30 && next.owner_pid != dead_owner,
                "{next:?}"
            );
            assert!(next.spend_nanos <= CAP, "{next:?}");
        }
        ledger_closed(&fx);
        drop(a);
    }
}

/// A node stopped (SIGSTOP) past its lease has its tree adopted; when it comes back it finds
/// its lease gone and stops, and the cancels it then sends its threads write nothing over the
/// adoption: the database refuses every write of a node whose lease ran out (the fence).
#[tokio::test]
async fn a_node_that_comes_back_after_adoption_writes_nothing_over_it() {
    // The leaves' calls end while their node is stopped: when it comes back they try to
    // record their answers and settle at once.
    let Some(fx) = tree_with("", "2s") else {
        return;
    };
    let a = node(&fx, "a");
    let script = fx.root().join("script.yaml");
    let b = Server::start_cmd(
        &fx,
        weft_cmd(fx.root()).stderr(std::process::Stdio::piped()),
        &[
            "--script",
            script.to_str().unwrap(),
            "--node",
            "b",
            "--node-lease",
            "1",
        ],
    );
    start_tree(&b).await;
    let first = running_tree(&fx);
    let calls_started = Instant::now();
    let stopped_owner = first[0].owner_pid;
    let signal = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &b.pid().to_string()])
            .status()
            .unwrap()
    };
    signal("-STOP");
    rows_when(&fx, "the stopped node's threads adopted", 20, |rows| {
        first
            .iter()
            .all(|f| rows.iter().any(|r| r.id == f.id && r.status.is_terminal()))
    });
    let adopted: Vec<(String, String)> = first
        .iter()
        .map(|f| {
            let id = f.id.to_string();
            let bytes = fx.records().transcript(&f.id).unwrap().unwrap();
            (id, String::from_utf8_lossy(&bytes).into_owned())
        })
        .collect();
    std::thread::sleep(Duration::from_millis(2500).saturating_sub(calls_started.elapsed()));
    signal("-CONT");
    let (status, said) = b.exits_within(30, "the node that came back");
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("lease"), "{said}");
    assert!(
        said.contains("lost its lease"),
        "the database refused its writes: {said}"
    );
    // Nothing it tried landed: each transcript is as the adoption left it, and every thread
    // is still `interrupted`, not `cancelled`.
    for (id, before) in &adopted {
        let tid = weft::ThreadId::parse(id).unwrap();
        let after = fx.records().transcript(&tid).unwrap().unwrap();
        assert_eq!(&String::from_utf8_lossy(&after), before, "{id}");
    }
    adopted_cleanly(&fx, &first, stopped_owner);
    ledger_closed(&fx);
    drop(a);
}

/// Any node answers for every thread: node A reads the tree node B runs (list, one thread, its
/// transcript) from the database, and a cancel sent to A reaches B through the database and
/// ends the whole tree within a second.
#[tokio::test]
async fn a_cancel_sent_to_one_node_ends_a_tree_another_node_runs() {
    let Some(fx) = tree("") else {
        return;
    };
    let a = node(&fx, "a");
    let b = node(&fx, "b");
    // Node a's clients see node b's tree live, from its start to its end.
    let mut seen = Box::pin(a.events("/v1/events", None).await);
    let root = start_tree(&b).await;
    let first = running_tree(&fx);
    let (s, one) = a.call("GET", &format!("/v1/threads/{root}"), None).await;
    assert_eq!(s, 200, "{one}");
    let (s, listed) = a
        .call("GET", &format!("/v1/threads?root={root}"), None)
        .await;
    assert_eq!(s, 200, "{listed}");
    assert_eq!(
        listed["threads"].as_array().map_or(0, Vec::len),
        4,
        "{listed}"
    );
    let (s, lines) = a
        .call("GET", &format!("/v1/threads/{root}/transcript"), None)
        .await;
    assert_eq!(s, 200, "{lines}");
    let asked = Instant::now();
    cancel_via(&a, &root).await;
    rows_when(&fx, "the tree cancelled", 10, |rows| {
        first.iter().all(|f| {
            rows.iter()
                .any(|r| r.id == f.id && r.status.as_str() == "cancelled")
        })
    });
    let took = asked.elapsed();
    eprintln!(
        "a cancel through node a ended node b's tree in {:.3} s",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_millis(1500), "{took:?}");
    let got =
        crate::serve::until_root_finishes(&mut seen, |d| d["thread_id"] == root.as_str()).await;
    for f in &first {
        let id = f.id.as_str();
        assert!(
            got.iter()
                .any(|(name, _, d)| name == "thread_started" && d["thread_id"] == id),
            "node a's stream has {id} start: {got:?}"
        );
    }
    let end = &got.last().unwrap().2;
    assert_eq!(end["status"], "cancelled", "{end}");
    ledger_closed(&fx);
    drop((a, b));
}

/// A node adopts the threads of dead nodes only: a live `weft run` of another checkout on the
/// same database (a pid whose owner lock is on that checkout, or another machine) is left
/// running, though this node finds no lock file for it.
#[tokio::test]
async fn a_node_adopts_no_thread_of_a_live_process_it_cannot_see() {
    let Some(fx) = tree("") else {
        return;
    };
    let a = node(&fx, "a");
    let b = node(&fx, "b");
    let other = other_checkout(&fx);
    let run = Killed(crate::support::spawn_run(&other, "root"));
    let run_pid = run.0.id();
    let elsewhere = rows_when(&fx, "the other checkout's tree runs", 30, |rows| {
        rows.iter()
            .filter(|r| r.owner_pid == run_pid && r.status.as_str() == "running")
            .count()
            == 4
    });
    start_tree(&b).await;
    let dead_owner = rows_when(&fx, "node b's tree runs", 30, |rows| {
        rows.iter()
            .filter(|r| {
                crate::support::is_node_owner(r.owner_pid) && r.status.as_str() == "running"
            })
            .count()
            == 4
    })
    .into_iter()
    .find(|r| crate::support::is_node_owner(r.owner_pid))
    .unwrap()
    .owner_pid;
    std::process::Command::new("kill")
        .args(["-9", &b.pid().to_string()])
        .status()
        .unwrap();
    rows_when(&fx, "node b's tree adopted", 20, |rows| {
        rows.iter().filter(|r| r.owner_pid == dead_owner).count() == 0
            && rows.iter().filter(|r| r.status.as_str() == "error").count() == 4
    });
    // Two more looks of node a: the other checkout's threads still run, still its own.
    std::thread::sleep(Duration::from_millis(1200));
    let rows = fx.rows();
    for e in &elsewhere {
        let now = rows.iter().find(|r| r.id == e.id).unwrap();
        assert_eq!(
            (now.status.as_str(), now.owner_pid),
            ("running", run_pid),
            "{now:?}"
        );
    }
    drop((run, a, b));
}

/// A child process killed when dropped (a failing test leaves nothing running).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
