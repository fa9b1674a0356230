//! Trees spread over several `weft serve` nodes on one Debian PostgreSQL (#26): a node at
//! `max_live_threads` queues its children for nodes with room, which run them on a guarantee
//! and report their ends back across nodes. The spread tree spends exactly what it spends on
//! one node; a cancel sent to any node ends it whole; and when a node dies — the one running a
//! placed child, or the one running its parent — every thread still ends, its parent hears of
//! it, and the ledger closes with nothing left open.

use crate::cluster::{
    cancel_via, ledger_closed, node, node_leased, rows_when, start_tree, tree_with, CAP,
};
use crate::serve::Server;
use serde_json::json;
use std::time::{Duration, Instant};
use weft::internals::ThreadRow;

/// A tree started on a full node (`max_live_threads: 1`: its root fills it) has its children
/// placed on the nodes with room; each reports its end to the root across nodes, and the tree
/// completes with exactly the spend of the same tree on one node.
#[tokio::test]
async fn a_full_nodes_children_run_on_nodes_with_room_and_spend_the_same() {
    let completed = |root: String| {
        move |rows: &[weft::internals::ThreadRow]| {
            rows.iter()
                .any(|r| r.id.as_str() == root && r.status.as_str() == "completed")
        }
    };
    // The same tree on one node: what it spends.
    let Some(one) = tree_with("", "300ms") else {
        return;
    };
    let solo = node(&one, "solo");
    let root = start_tree(&solo).await;
    let rows = rows_when(
        &one,
        "the tree on one node completes",
        30,
        completed(root.clone()),
    );
    let expected = rows
        .iter()
        .find(|r| r.id.as_str() == root)
        .unwrap()
        .spend_nanos;
    drop(solo);
    let Some(fx) = tree_with("node: { max_live_threads: 1 }\n", "300ms") else {
        return;
    };
    let a = node_leased(&fx, "a", "3");
    let b = node_leased(&fx, "b", "3");
    let c = node_leased(&fx, "c", "3");
    let root = start_tree(&a).await;
    let rows = rows_when(
        &fx,
        "the spread tree completes",
        60,
        completed(root.clone()),
    );
    let seen: Vec<_> = rows
        .iter()
        .map(|r| (r.id.to_string(), r.status, r.owner_pid, r.error.clone()))
        .collect();
    assert_eq!(rows.len(), 4, "{seen:#?}");
    assert!(
        rows.iter().all(|r| r.status.as_str() == "completed"),
        "{rows:#?}"
    );
    let root_row = rows.iter().find(|r| r.id.as_str() == root).unwrap();
    let elsewhere: std::collections::HashSet<u32> = rows
        .iter()
        .filter(|r| r.parent_id.is_some())
        .map(|r| r.owner_pid)
        .collect();
    assert!(
        !elsewhere.contains(&root_row.owner_pid) && elsewhere.len() == 2,
        "the leaves ran on the two nodes with room: {rows:#?}"
    );
    assert_eq!(
        root_row.spend_nanos, expected,
        "the same spend as on one node"
    );
    ledger_closed(&fx);
    crate::support::verify_cli_clean(fx.root());
    drop((a, b, c));
}

/// A tree spread over three nodes (its root on a full node a, its leaves on b and c) ends
/// whole when a cancel for its root is sent to node c: the cancel reaches the root on a through
/// the database, and the root's cancel reaches its leaves on b and c the same way.
#[tokio::test]
async fn a_cancel_sent_to_any_node_ends_a_tree_spread_over_three() {
    let Some(fx) = tree_with("node: { max_live_threads: 1 }\n", "60s") else {
        return;
    };
    let a = node_leased(&fx, "a", "3");
    let b = node_leased(&fx, "b", "3");
    let c = node_leased(&fx, "c", "3");
    let root = start_tree(&a).await;
    // Each node runs one thread: the root fills a, a leaf each b and c; the third leaf waits
    // in the queue for a node with room.
    let rows = rows_when(&fx, "the leaves run on b and c", 30, |rows| {
        rows.len() == 3 && rows.iter().all(|r| r.status.as_str() == "running")
    });
    let owners: std::collections::HashSet<u32> = rows.iter().map(|r| r.owner_pid).collect();
    assert_eq!(owners.len(), 3, "one tree on three nodes: {owners:?}");
    let asked = Instant::now();
    cancel_via(&c, &root).await;
    let ended = rows_when(&fx, "the whole tree cancelled", 15, |rows| {
        rows.len() == 3 && rows.iter().all(|r| r.status.as_str() == "cancelled")
    });
    // The queued leaf was withdrawn: it never started anywhere, and nothing waits in the queue.
    let queued = fx.query("registry.db", "SELECT COUNT(*) FROM placements");
    assert_eq!(queued, [["0"]], "the queue is empty");
    let events = fx.events(&root);
    assert!(
        events.iter().any(|e| e["type"] == "child_finished"
            && e["status"] == "cancelled"
            && e["error"]
                .as_str()
                .is_some_and(|t| t.contains("waited for a node with room"))),
        "the waiting leaf's end is in its parent's record: {events:?}"
    );
    eprintln!(
        "a cancel through node c ended a tree on a, b and c in {:.3} s",
        asked.elapsed().as_secs_f64()
    );
    let root_row = ended.iter().find(|r| r.id.as_str() == root).unwrap();
    assert!(root_row.spend_nanos <= CAP, "{root_row:?}");
    ledger_closed(&fx);
    crate::support::verify_cli_clean(fx.root());
    drop((a, b, c));
}

/// Kills node `srv` (`kill -9`).
fn kill(srv: &Server) {
    std::process::Command::new("kill")
        .args(["-9", &srv.pid().to_string()])
        .status()
        .unwrap();
}

/// The owner number of node `name`'s lease.
fn owner_of_node(fx: &crate::support::Fixture, name: &str) -> u32 {
    let got = fx.query(
        "registry.db",
        &format!("SELECT owner FROM nodes WHERE name='{name}'"),
    );
    got[0][0].parse().unwrap()
}

/// A spread tree runs: `threads` threads, of which `on_b` run on node b, each with its call in
/// flight (reserved in the ledger). Returns b's threads.
fn b_in_flight(fx: &crate::support::Fixture, threads: usize, on_b: usize) -> Vec<ThreadRow> {
    let b = owner_of_node(fx, "b");
    let start = Instant::now();
    loop {
        let rows = fx.rows_so_far();
        let of_b: Vec<ThreadRow> = rows.iter().filter(|r| r.owner_pid == b).cloned().collect();
        let running = of_b.iter().all(|r| r.status.as_str() == "running");
        if rows.len() == threads && of_b.len() == on_b && running {
            let ids: Vec<String> = of_b.iter().map(|r| format!("'{}'", r.id)).collect();
            let sql = format!(
                "SELECT COUNT(DISTINCT thread) FROM reservations WHERE thread IN ({})",
                ids.join(",")
            );
            if fx.query("ledger.db", &sql) == [[on_b.to_string()]] {
                return of_b;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{on_b} calls in flight on b of {threads} threads: {rows:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The node running a placed child dies (`kill -9`) mid-call: another node adopts the child
/// (finalized `interrupted`, its call in flight charged at its bound), the child's parent on a
/// live node hears of its end, and the tree goes on and completes — a queued leaf runs where
/// there is room — within its cap, with the ledger closed and every record verifying. Twice:
/// adopted by a third node c, and by the parent's own node a (which then holds both the
/// parent's tree and the placed subtrees in one book).
#[tokio::test]
async fn a_placed_childs_node_dies_and_its_parent_hears_of_it() {
    // Root on a (full at one), a leaf each on b and c, the third queued; b's leaf adopted by c
    // or a. Then: root and a leaf on a (full at two), two leaves on b, adopted by a alone.
    for (names, max_live, threads, on_b) in
        [(&["a", "b", "c"][..], 1, 3, 1), (&["a", "b"][..], 2, 4, 2)]
    {
        let config = format!("node: {{ max_live_threads: {max_live} }}\nauto_resume: true\n");
        let Some(fx) = tree_with(&config, "5s") else {
            return;
        };
        let nodes: Vec<Server> = names.iter().map(|n| node_leased(&fx, n, "2")).collect();
        let root = start_tree(&nodes[0]).await;
        let on_b = b_in_flight(&fx, threads, on_b);
        kill(&nodes[1]);
        let killed = Instant::now();
        let done = rows_when(&fx, "the tree completes without node b", 60, |rows| {
            rows.iter()
                .any(|r| r.id.as_str() == root && r.status.as_str() == "completed")
        });
        let events = fx.events(&root);
        for b_leaf in &on_b {
            let leaf = done.iter().find(|r| r.id == b_leaf.id).unwrap();
            let by = if leaf.owner_pid == owner_of_node(&fx, "a") {
                "a, its parent's node"
            } else {
                "c"
            };
            eprintln!(
                "the tree completed {:.2} s after node b died; b's leaf adopted by {by}",
                killed.elapsed().as_secs_f64()
            );
            let said = leaf.error.clone().unwrap_or_default();
            assert_eq!(leaf.status.as_str(), "error", "{leaf:?}");
            assert!(
                said.contains("interrupted") && said.contains("lease"),
                "{said}"
            );
            assert!(
                leaf.spend_nanos > 0,
                "its call in flight charged at its bound: {leaf:?}"
            );
            assert!(
                events.iter().any(|e| e["type"] == "child_finished"
                    && e["id"] == leaf.id.as_str()
                    && e["status"] == "error"),
                "the root heard of its leaf's end: {events:?}"
            );
        }
        assert_eq!(done.len(), 4, "every leaf ran: {done:#?}");
        assert!(done.iter().all(|r| r.status.is_terminal()), "{done:#?}");
        let root_row = done.iter().find(|r| r.id.as_str() == root).unwrap();
        let charged: i64 = on_b
            .iter()
            .map(|l| done.iter().find(|r| r.id == l.id).unwrap().spend_nanos)
            .sum();
        assert!(root_row.spend_nanos <= CAP, "{root_row:?}");
        assert!(
            root_row.spend_nanos > charged,
            "the tree's spend counts the adopted leaves' charges ({charged}): {root_row:?}"
        );
        ledger_closed(&fx);
        crate::support::verify_cli_clean(fx.root());
        drop(nodes);
    }
}

/// The node running the root of a spread tree dies (`kill -9`): another node adopts the root
/// (finalized `interrupted`), its leaf still queued is withdrawn, and its leaves running on the
/// other nodes are cancelled there; their ends are settled against the tree by the adopter, so
/// the ledger closes with nothing open, the spend within the cap and every record verifying.
#[tokio::test]
async fn a_parents_node_dies_and_its_placed_children_end() {
    let Some(fx) = tree_with("node: { max_live_threads: 1 }\n", "60s") else {
        return;
    };
    let a = node_leased(&fx, "a", "2");
    let b = node_leased(&fx, "b", "2");
    let c = node_leased(&fx, "c", "2");
    let root = start_tree(&a).await;
    b_in_flight(&fx, 3, 1);
    kill(&a);
    let killed = Instant::now();
    let done = rows_when(&fx, "every thread ends", 30, |rows| {
        rows.len() == 3 && rows.iter().all(|r| r.status.is_terminal())
    });
    eprintln!(
        "a dead root's placed children ended {:.2} s after its node died",
        killed.elapsed().as_secs_f64()
    );
    for r in &done {
        let want = if r.id.as_str() == root {
            "error"
        } else {
            "cancelled"
        };
        assert_eq!(r.status.as_str(), want, "{r:?}");
    }
    let queued = fx.query("registry.db", "SELECT COUNT(*) FROM placements");
    assert_eq!(queued, [["0"]], "the queued leaf was withdrawn");
    // The leaves' ends are settled (relayed to the adopter) shortly after they end.
    let start = Instant::now();
    while fx.query(
        "ledger.db",
        "SELECT COUNT(*) FROM accounts WHERE closed=0 OR inflight<>0",
    ) != [["0"]]
    {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the ledger closes: {:?}",
            fx.query(
                "ledger.db",
                "SELECT id, parent, max, spent, inflight, guaranteed, pool_left, closed, owner, placed FROM accounts"
            )
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ledger_closed(&fx);
    let root_row = fx
        .rows()
        .into_iter()
        .find(|r| r.id.as_str() == root)
        .unwrap();
    assert!(root_row.spend_nanos <= CAP, "{root_row:?}");
    crate::support::verify_cli_clean(fx.root());
    drop((b, c));
}

/// root → 10 mids → 10 leaves each: 111 threads.
const WIDE: &str = r#"
root:
  - usage: { input_tokens: 20, output_tokens: 5 }
    tool_calls: [MIDS]
  - usage: { input_tokens: 30, output_tokens: 5 }
    tool_calls: [ { name: wait_threads, input: {} } ]
  - text: root done
    usage: { input_tokens: 40, output_tokens: 5 }
mid:
  - usage: { input_tokens: 15, output_tokens: 5 }
    tool_calls: [LEAVES]
  - usage: { input_tokens: 25, output_tokens: 5 }
    tool_calls: [ { name: wait_threads, input: {} } ]
  - text: mid done
    usage: { input_tokens: 35, output_tokens: 5 }
leaf:
  - text: leaf done
    delay: 200ms
    usage: { input_tokens: 10, output_tokens: 5 }
"#;

/// The 111-thread tree's project on a fresh Postgres database (with `extra` config).
fn wide_tree(extra: &str) -> Option<crate::support::Fixture> {
    let spawn = |d: &str| {
        let one = format!("{{ name: spawn_thread, input: {{ directive: {d}, wait: false }} }}");
        vec![one; 10].join(", ")
    };
    let script = WIDE
        .replace("MIDS", &spawn("mid"))
        .replace("LEAVES", &spawn("leaf"));
    let limits = "limits: { spawns: 10, concurrency: 10, depth: 3";
    let root = crate::support::directive(
        &format!(
            "permissions: [\"thread.spawn.mid\", \"thread.spawn.leaf\"]\n{limits}, spend: 3.0 }}"
        ),
        "Root.",
    );
    let mid = crate::support::directive(
        &format!("permissions: [\"thread.spawn.leaf\"]\n{limits}, spend: 0.2 }}"),
        "Mid.",
    );
    let leaf = crate::support::directive("limits: { tokens: 2000, spend: 0.01 }", "Leaf.");
    crate::support::Fixture::on(
        crate::support::Backend::Postgres,
        &[("root", &root), ("mid", &mid), ("leaf", &leaf)],
        &script,
        extra,
    )
}

/// Starts the 111-thread tree on `srv` and waits for it to complete; its rows.
async fn wide_tree_completes(
    fx: &crate::support::Fixture,
    srv: &Server,
) -> (String, Vec<ThreadRow>) {
    let root = start_tree(srv).await;
    let rows = rows_when(fx, "the 111-thread tree completes", 120, |rows| {
        rows.iter()
            .any(|r| r.id.as_str() == root && r.status.is_terminal())
    });
    let bad: Vec<_> = rows
        .iter()
        .filter(|r| r.status.as_str() != "completed")
        .map(|r| (r.id.to_string(), r.status, r.error.clone()))
        .collect();
    assert!(
        bad.is_empty() && rows.len() == 111,
        "{} rows; not completed: {bad:#?}",
        rows.len()
    );
    (root, rows)
}

/// A 111-thread tree (10 × 10 leaves) whose children spread over all three nodes (each runs
/// at most 40 threads) ends with exactly the spend of the same tree on one node, the ledger
/// closed and every record verifying.
#[tokio::test]
async fn a_111_thread_tree_spread_over_three_nodes_spends_exactly_as_on_one() {
    let Some(one) = wide_tree("") else {
        return;
    };
    let solo = node(&one, "solo");
    let (root, rows) = wide_tree_completes(&one, &solo).await;
    let expected = rows
        .iter()
        .find(|r| r.id.as_str() == root)
        .unwrap()
        .spend_nanos;
    drop(solo);
    let Some(fx) = wide_tree("node: { max_live_threads: 40 }\n") else {
        return;
    };
    let nodes: Vec<Server> = ["a", "b", "c"]
        .iter()
        .map(|n| node_leased(&fx, n, "3"))
        .collect();
    let started = Instant::now();
    let (root, rows) = wide_tree_completes(&fx, &nodes[0]).await;
    eprintln!(
        "111 threads over three nodes in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    let mut per_node = std::collections::BTreeMap::new();
    for r in &rows {
        *per_node.entry(r.owner_pid).or_insert(0) += 1;
    }
    eprintln!("threads per node: {per_node:?}");
    assert_eq!(
        per_node.len(),
        3,
        "the tree ran on all three nodes: {per_node:?}"
    );
    let spent = rows
        .iter()
        .find(|r| r.id.as_str() == root)
        .unwrap()
        .spend_nanos;
    assert_eq!(spent, expected, "the same spend as on one node");
    ledger_closed(&fx);
    crate::support::verify_cli_clean(fx.root());
    drop(nodes);
}

/// On a full node, a child whose whole budget cannot be set aside from its parent's chain (a
/// placed subtree's guarantee is all of its budget) runs where its parent runs, sharing the
/// chain call by call as on one node: the tree is never refused on several nodes what one node
/// runs, and spends the same.
#[tokio::test]
async fn a_child_whose_budget_cannot_be_set_aside_runs_beside_its_parent() {
    // The root may spend $0.10: one leaf's $0.06 can be set aside, not a second's; a call
    // (2,000 tokens at most, a leaf's 200) holds a small part of it, so on one node all run.

    let perms =
        "permissions: [\"thread.spawn.leaf\"]\nlimits: { tokens: 2000, spawns: 5, concurrency: 5, spend: 0.1 }";
    let root = crate::support::directive(perms, "Root.");
    let leaf = crate::support::directive("limits: { tokens: 200, spend: 0.06 }", "Leaf.");
    let script = crate::cluster::SCRIPT.replace("LEAF_DELAY", "300ms");
    let config = "node: { max_live_threads: 1 }\n";
    let Some(fx) = crate::support::Fixture::on(
        crate::support::Backend::Postgres,
        &[("root", &root), ("leaf", &leaf)],
        &script,
        config,
    ) else {
        return;
    };
    let nodes: Vec<Server> = ["a", "b"]
        .iter()
        .map(|n| node_leased(&fx, n, "3"))
        .collect();
    let root = start_tree(&nodes[0]).await;
    let rows = rows_when(&fx, "the tree completes", 60, |rows| {
        rows.iter()
            .any(|r| r.id.as_str() == root && r.status.is_terminal())
    });
    assert_eq!(rows.len(), 4, "{rows:#?}");
    assert!(
        rows.iter().all(|r| r.status.as_str() == "completed"),
        "no leaf refused: {rows:#?}"
    );
    let a = owner_of_node(&fx, "a");
    let beside = rows.iter().filter(|r| r.owner_pid == a).count();
    assert_eq!(
        beside, 3,
        "the root and two leaves on a, one leaf placed on b: {rows:#?}"
    );
    let root_row = rows.iter().find(|r| r.id.as_str() == root).unwrap();
    assert!(root_row.spend_nanos <= 100_000_000, "{root_row:?}");
    ledger_closed(&fx);
    crate::support::verify_cli_clean(fx.root());
    drop(nodes);
}

/// The only node, full (`max_live_threads: 2`): the children it queues wait for room on it and
/// then run there, each reporting to its parent as from another node; the tree completes with
/// the same spend as without the bound. A placed child's end is never taken over HTTP (it comes
/// from the node that ran the child, through the database).
#[tokio::test]
async fn a_lone_full_node_runs_its_queued_children_when_it_has_room() {
    let Some(fx) = tree_with("node: { max_live_threads: 2 }\n", "300ms") else {
        return;
    };
    let a = node_leased(&fx, "a", "3");
    let root = start_tree(&a).await;
    let rows = rows_when(&fx, "the tree completes on its one node", 60, |rows| {
        rows.iter()
            .any(|r| r.id.as_str() == root && r.status.is_terminal())
    });
    assert_eq!(rows.len(), 4, "{rows:#?}");
    assert!(
        rows.iter().all(|r| r.status.as_str() == "completed"),
        "{rows:#?}"
    );
    let leaf = rows.iter().find(|r| r.parent_id.is_some()).unwrap();
    let (status, said) = a
        .call(
            "POST",
            &format!("/v1/threads/{}/placed_end", leaf.id),
            Some(json!({ "thread_id": leaf.id.as_str() })),
        )
        .await;
    assert_eq!(status, 403, "{said}");
    ledger_closed(&fx);
    crate::support::verify_cli_clean(fx.root());
    drop(a);
}
