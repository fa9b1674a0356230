//! `bench cluster`: how many calls one root account sustains when three nodes reserve under it
//! at once (#26), for the two ways a tree's cap can hold across machines, on one Debian
//! PostgreSQL server (`pg.rs` starts it):
//! - `per_call`: every call is reserved by one transaction up its chain (five accounts; the
//!   root is every node's) that checks each account's cap and adds the call's bound in flight,
//!   and settled by a second that moves it to spent — the root row is locked by every call of
//!   every node;
//! - `guarantee`: a node sets aside a guarantee of `CHUNK` calls' bounds from the chain in one
//!   transaction, serves those calls from memory (weft's in-process book; its cost is `bench
//!   ledger`'s), and gives back what is left in a second.
//!
//! Each node is an OS thread with a connection of its own; the figures are calls per second
//! over all nodes and the mean wall time one call's accounting adds.

use serde_json::{json, Value};
use std::time::Instant;
use tokio_postgres::{Client, NoTls};

/// Calls served from one guarantee.
const CHUNK: i64 = 1000;

/// One call's bound and its cost, nano-USD.
const BOUND: i64 = 5_000;
const COST: i64 = 3_000;

async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// The accounts: one root, and under it a chain of four for each node.
async fn setup(url: &str, nodes: usize) -> Vec<Vec<String>> {
    let c = connect(url).await;
    c.batch_execute(
        "DROP TABLE IF EXISTS acct;
         CREATE TABLE acct(id TEXT PRIMARY KEY, max BIGINT NOT NULL, inflight BIGINT NOT NULL,
           spent BIGINT NOT NULL, guaranteed BIGINT NOT NULL);
         INSERT INTO acct VALUES('root', 4000000000000000, 0, 0, 0);",
    )
    .await
    .unwrap();
    let mut chains = Vec::new();
    for n in 0..nodes {
        let mut chain = vec!["root".to_string()];
        for level in 1..5 {
            let id = format!("n{n}-l{level}");
            c.execute(
                "INSERT INTO acct VALUES($1, 4000000000000000, 0, 0, 0)",
                &[&id],
            )
            .await
            .unwrap();
            chain.push(id);
        }
        chains.push(chain);
    }
    chains
}

/// `calls` calls on `chain`, each reserved and settled by its own transactions.
async fn per_call(c: &Client, chain: &[String], calls: i64) {
    for _ in 0..calls {
        c.batch_execute("BEGIN").await.unwrap();
        let fits: bool = c
            .query_one(
                "WITH u AS (UPDATE acct SET inflight = inflight + $1 WHERE id = ANY($2)
                   RETURNING spent + inflight + guaranteed <= max AS fits)
                 SELECT bool_and(fits) FROM u",
                &[&BOUND, &chain],
            )
            .await
            .unwrap()
            .get(0);
        c.batch_execute(if fits { "COMMIT" } else { "ROLLBACK" })
            .await
            .unwrap();
        // (the call runs here)
        c.execute(
            "UPDATE acct SET inflight = inflight - $1, spent = spent + $2 WHERE id = ANY($3)",
            &[&BOUND, &COST, &chain],
        )
        .await
        .unwrap();
    }
}

/// `calls` calls on `chain`, served `CHUNK` at a time from a guarantee.
async fn guaranteed(c: &Client, chain: &[String], calls: i64) {
    let mut left = calls;
    while left > 0 {
        let n = left.min(CHUNK);
        let set_aside = n * BOUND;
        c.execute(
            "UPDATE acct SET guaranteed = guaranteed + $1 WHERE id = ANY($2)",
            &[&set_aside, &chain],
        )
        .await
        .unwrap();
        // Served from memory: reserve and settle against the guarantee.
        let (mut inflight, mut spent) = (0i64, 0i64);
        for _ in 0..n {
            assert!(spent + inflight + BOUND <= set_aside);
            inflight += BOUND;
            std::hint::black_box(inflight);
            inflight -= BOUND;
            spent += COST;
        }
        c.execute(
            "UPDATE acct SET guaranteed = guaranteed - $1, spent = spent + $2 WHERE id = ANY($3)",
            &[&set_aside, &spent, &chain],
        )
        .await
        .unwrap();
        left -= n;
    }
}

/// Runs `calls` calls on each of `nodes` nodes at once by `how`: calls/s over all of them.
fn run(url: &str, nodes: usize, calls: i64, how: &'static str) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let chains = rt.block_on(setup(url, nodes));
    let start = Instant::now();
    let threads: Vec<_> = chains
        .into_iter()
        .map(|chain| {
            let url = url.to_string();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let c = connect(&url).await;
                    match how {
                        "per_call" => per_call(&c, &chain, calls).await,
                        _ => guaranteed(&c, &chain, calls).await,
                    }
                });
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let rate = (calls * nodes as i64) as f64 / start.elapsed().as_secs_f64();
    let spent: i64 = rt.block_on(async {
        let c = connect(url).await;
        c.query_one("SELECT spent FROM acct WHERE id='root'", &[])
            .await
            .unwrap()
            .get(0)
    });
    assert_eq!(
        spent,
        COST * calls * nodes as i64,
        "{how}: the root's spend is exact"
    );
    rate
}

/// Both ways, from one node and from three.
pub(super) fn bench_cluster(calls: i64) -> Value {
    let Some(server) = super::pg::start(&super::bench_tmp()) else {
        eprintln!("cluster: skipped (no PostgreSQL server binaries in /usr/lib/postgresql/*/bin)");
        return json!({ "skipped": "no PostgreSQL server" });
    };
    let mut out = serde_json::Map::new();
    for how in ["per_call", "guarantee"] {
        for nodes in [1usize, 3] {
            let rate = run(&server.url, nodes, calls, how);
            println!("cluster {how}, {nodes} node(s): {rate:.0} calls/s on one root");
            out.insert(
                format!("{how}_{nodes}_nodes_calls_per_s"),
                json!(rate.round()),
            );
        }
    }
    out.insert("calls_per_node".into(), json!(calls));
    out.insert("chunk".into(), json!(CHUNK));
    Value::Object(out)
}
