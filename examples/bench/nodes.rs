//! `bench nodes`: the `w`×`d` tree (as `bench tree` makes it) run by real `weft serve --node`
//! processes on one PostgreSQL server (`pg.rs` starts it): on one node, then on three nodes of
//! this machine, each running at most a third of the tree (plus one level's width) at a time
//! so that its children spread over all three (#26: a full node queues its children in the
//! database; nodes with room take them). Reports the wall time from the root's start to its
//! end, the threads each node ran, and the tree's spend, which must be the same both ways.
//! The `weft` binary is the one built beside this bench (built here when missing).

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `weft serve --node` process; killed on drop.
struct Node {
    child: Child,
    base: String,
    token: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `weft` binary of this bench's profile (`target/<profile>/weft`), built when missing.
fn weft_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let bin = profile_dir.join("weft");
    if !bin.is_file() {
        eprintln!("nodes: building the weft binary ({})", bin.display());
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cargo.args(["build", "--bin", "weft"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cargo.arg("--release");
        }
        let built = cargo.status().ok()?;
        if !built.success() {
            return None;
        }
    }
    Some(bin)
}

/// Starts node `name` of project `root` (the tree's project), with `home` as its WEFT_HOME.
fn start_node(bin: &Path, root: &Path, home: &Path, name: &str) -> Node {
    use std::io::BufRead;
    let script = root.join("script.yaml");
    let mut child = Command::new(bin)
        .env("WEFT_HOME", home)
        .arg("--project")
        .arg(root)
        .args(["serve", "--addr", "127.0.0.1:0", "--script"])
        .arg(&script)
        .args(["--node", name, "--node-lease", "5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().strip_prefix("weft serve: ").unwrap_or_else(|| {
        panic!("nodes: weft serve printed {line:?}");
    });
    let (base, token) = url.split_once("/#token=").unwrap();
    Node {
        child,
        base: base.to_string(),
        token: token.to_string(),
    }
}

/// A fresh database `name` on `server`; its URL.
async fn database(server: &super::pg::Server, name: &str) -> String {
    let (c, conn) = tokio_postgres::connect(&server.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    for sql in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        c.batch_execute(&sql).await.unwrap();
    }
    server
        .url
        .replace("dbname=postgres", &format!("dbname={name}"))
}

/// Runs the tree from `first` and waits for its root's end: (wall, root's row as the API says).
async fn run_tree(first: &Node) -> (Duration, Value) {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let http = reqwest::Client::new();
    let call = |m: reqwest::Method, path: String| {
        http.request(m, format!("{}{path}", first.base))
            .bearer_auth(&first.token)
    };
    let t0 = Instant::now();
    let start = call(reqwest::Method::POST, "/v1/threads".into())
        .body(json!({ "directive": "l0" }).to_string());
    let started = json_of(start).await;
    let root = started["thread_id"].as_str().unwrap().to_string();
    loop {
        let v = json_of(call(reqwest::Method::GET, format!("/v1/threads/{root}"))).await;
        let status = v["row"]["status"].as_str().unwrap_or("");
        if matches!(status, "completed" | "error" | "cancelled") {
            return (t0.elapsed(), v);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "nodes: the tree ends within 10 min"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The JSON body of `req`'s answer.
async fn json_of(req: reqwest::RequestBuilder) -> Value {
    req.send().await.unwrap().json().await.unwrap()
}

/// Threads per owner (node) of the tree's project.
async fn per_node(url: &str) -> Vec<i64> {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let rows = c
        .query(
            "SELECT COUNT(*) FROM threads GROUP BY owner_pid ORDER BY 1 DESC",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// The tree on `nodes` nodes: wall seconds, threads per node, the tree's spend.
async fn on_nodes(
    server: &super::pg::Server,
    bin: &Path,
    w: usize,
    d: usize,
    nodes: usize,
) -> Value {
    let n = super::tree_size(w, d);
    let p = super::tree_project(w, d, false, None);
    fitting_caps(&p.root, w, d);
    let url = database(server, &format!("nodes{nodes}")).await;
    let cap = match nodes {
        1 => String::new(),
        k => format!("node: {{ name: x, max_live_threads: {} }}\n", n / k + w),
    };
    super::add_config(&p, &format!("database: \"{url}\"\n{cap}"));
    let home = p.root.join("home");
    let running: Vec<Node> = (0..nodes)
        .map(|i| start_node(bin, &p.root, &home, &format!("n{i}")))
        .collect();
    let (wall, root) = run_tree(&running[0]).await;
    drop(running);
    assert_eq!(root["row"]["status"], "completed", "nodes: {root}");
    let spread = per_node(&url).await;
    assert_eq!(
        spread.iter().sum::<i64>() as usize,
        n,
        "nodes: every thread ran"
    );
    json!({
        "wall_s": wall.as_secs_f64(), "threads_per_s": n as f64 / wall.as_secs_f64(),
        "threads_per_node": spread, "spend_nanos": root["row"]["spend_nanos"],
    })
}

/// Caps that fit: a thread at level `l` may spend (w + 1)^(d - l) times a leaf's $0.0001 — its
/// children's budgets and as much again for itself. (`bench tree`'s $1000 at every level would
/// keep every child on its parent's node: a placed child's whole budget is set aside from its
/// parent's chain, and a child whose budget cannot be runs where its parent runs.)
fn fitting_caps(root: &Path, w: usize, d: usize) {
    for level in 0..=d {
        let path = root.join("directives").join(format!("l{level}.md"));
        let text = std::fs::read_to_string(&path).unwrap();
        let cap = 0.0001 * ((w + 1) as f64).powi((d - level) as i32);
        std::fs::write(
            &path,
            text.replace("spend: 1000", &format!("spend: {cap:.4}")),
        )
        .unwrap();
    }
}

/// The tree on one node, then on three.
pub(super) async fn bench_nodes(w: usize, d: usize) -> Value {
    let Some(server) = super::pg::start(&super::bench_tmp()) else {
        eprintln!("nodes: skipped (no PostgreSQL server binaries in /usr/lib/postgresql/*/bin)");
        return json!({ "skipped": "no PostgreSQL server" });
    };
    let Some(bin) = weft_binary() else {
        eprintln!("nodes: skipped (the weft binary could not be built)");
        return json!({ "skipped": "no weft binary" });
    };
    let one = on_nodes(&server, &bin, w, d, 1).await;
    let three = on_nodes(&server, &bin, w, d, 3).await;
    assert_eq!(
        one["spend_nanos"], three["spend_nanos"],
        "nodes: the same spend both ways"
    );
    println!(
        "nodes: {}×{} tree, one node {:.2} s, three nodes {:.2} s ({:?} threads per node)",
        w,
        d,
        f64_of(&one, "wall_s"),
        f64_of(&three, "wall_s"),
        three["threads_per_node"]
    );
    json!({ "threads": super::tree_size(w, d), "one_node": one, "three_nodes": three })
}

fn f64_of(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}
