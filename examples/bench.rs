//! weft's macro benchmarks (issue: benchmarks). One command runs them and prints a table:
//!
//! ```sh
//! cargo run --release --example bench -- all                 # full sizes, writes bench.json
//! cargo run --release --example bench -- all --size tiny     # what CI runs
//! cargo run --release --example bench -- tree --durability strict
//! ```
//!
//! Every scenario uses the scripted provider at zero latency with full signing and durability,
//! in a fresh temporary project. Numbers are printed, never asserted.

use serde_json::{json, Map, Value};

/// The allocator the `weft` binary uses (see src/main.rs), so the figures are what users get;
/// `WEFT_BENCH_ALLOC=system` uses the system's instead (for valgrind's heap profilers).
#[global_allocator]
static GLOBAL: Alloc = Alloc;

struct Alloc;

/// 0: not read yet; 1: reading (the read's own allocations use the system's, and are freed
/// before it ends); 2: system; 3: mimalloc. The first allocation happens before any other thread.
static CHOICE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn system() -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    match CHOICE.load(Relaxed) {
        0 => {
            CHOICE.store(1, Relaxed);
            let sys = std::env::var_os("WEFT_BENCH_ALLOC").is_some_and(|v| v == "system");
            CHOICE.store(if sys { 2 } else { 3 }, Relaxed);
            sys
        }
        c => c <= 2,
    }
}

unsafe impl std::alloc::GlobalAlloc for Alloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        match system() {
            true => unsafe { std::alloc::System.alloc(l) },
            false => unsafe { mimalloc::MiMalloc.alloc(l) },
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        match system() {
            true => unsafe { std::alloc::System.dealloc(p, l) },
            false => unsafe { mimalloc::MiMalloc.dealloc(p, l) },
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, n: usize) -> *mut u8 {
        match system() {
            true => unsafe { std::alloc::System.realloc(p, l, n) },
            false => unsafe { mimalloc::MiMalloc.realloc(p, l, n) },
        }
    }
}

#[path = "bench/cluster.rs"]
mod cluster;
#[path = "bench/nodes.rs"]
mod nodes;
#[path = "bench/pg.rs"]
mod pg;
#[path = "bench/scale.rs"]
mod scale;
#[path = "bench/turn_floor.rs"]
mod turn_floor;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use weft::LimitSet;
use weft::ThreadId;
use weft::{Project, Runtime};

struct Args {
    what: String,
    tiny: bool,
    strict: bool,
    json: PathBuf,
    /// `--shape W,D`: the tree's (and the cancelled tree's) width and depth (profiling at a
    /// size between tiny and full).
    shape: Option<(usize, usize)>,
}

fn args() -> Args {
    let mut a = Args {
        what: "all".into(),
        tiny: false,
        strict: false,
        json: PathBuf::from("target/bench.json"),
        shape: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--size" => a.tiny = it.next().as_deref() == Some("tiny"),
            "--durability" => a.strict = it.next().as_deref() == Some("strict"),
            "--json" => a.json = it.next().map(PathBuf::from).unwrap_or(a.json),
            "--shape" => {
                a.shape = it.next().and_then(|s| {
                    let (w, d) = s.split_once(',')?;
                    Some((w.parse().ok()?, d.parse().ok()?))
                })
            }
            other => a.what = other.to_string(),
        }
    }
    a
}

/// Peak and current resident set size of this process, in KiB (Linux; 0 elsewhere).
fn rss_kib() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (get("VmHWM:"), get("VmRSS:"))
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

struct Proj {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

fn project(directives: &[(&str, String)], script: &str, strict: bool) -> Proj {
    let dir = tempfile::Builder::new()
        .prefix("weft-bench-")
        .tempdir_in(bench_tmp())
        .unwrap();
    let root = dir.path().to_path_buf();
    std::fs::create_dir_all(root.join(".weft")).unwrap();
    for (n, t) in directives {
        let p = root.join("directives").join(format!("{n}.md"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, t).unwrap();
    }
    std::fs::write(root.join("script.yaml"), script).unwrap();
    let durability = if strict { "strict" } else { "normal" };
    std::fs::write(
        root.join(".weft/config.yaml"),
        format!("durability: {durability}\ncancel_grace: 30s\npricing:\n  scripted: {{ input: 0.001, output: 0.001 }}\n"),
    )
    .unwrap();
    Proj { _dir: dir, root }
}

/// Benchmarks write under the system temp dir (`$TMPDIR`, else /tmp; set TMPDIR to measure
/// another disk). The floor measures the same place, so the ratios compare like with like.
fn bench_tmp() -> PathBuf {
    let p = std::env::temp_dir().join("weft-bench");
    std::fs::create_dir_all(&p).unwrap();
    p
}

async fn open(p: &Proj) -> Runtime {
    Runtime::builder(Project {
        root: p.root.clone(),
    })
    .script(p.root.join("script.yaml"))
    .open()
    .await
    .unwrap()
}

fn front(w: usize, spawn: Option<&str>) -> String {
    // Capabilities are attenuated by the parent's, so every spawning level holds the same one.
    let perms = spawn
        .map(|_| "permissions: [\"thread.spawn.**\"]\n".to_string())
        .unwrap_or_default();
    format!("---\n{perms}limits: {{ turns: 5, spawns: {w}, concurrency: {w}, depth: 10, spend: 1000, duration: 1h }}\n---\nWork.\n")
}

/// A tree of width `w` and depth `d`: each inner thread spawns `w` children (waiting, in one
/// parallel tool round) then answers; leaves answer at once. 2 turns inner, 1 turn leaf.
fn tree_project(w: usize, d: usize, strict: bool, leaf_delay: Option<&str>) -> Proj {
    tree_project_widths(&vec![w; d], strict, leaf_delay)
}

/// A tree whose level `l` threads each spawn `widths[l]` children (the last level's are the
/// leaves), as [`tree_project`]; a leaf's call takes `leaf_delay` when given. Every level's
/// `spawns` and `concurrency` are the widest level's: a child's limits are capped by its parent's.
fn tree_project_widths(widths: &[usize], strict: bool, leaf_delay: Option<&str>) -> Proj {
    let most = widths.iter().copied().max().unwrap_or(1);
    let mut dirs = Vec::new();
    let mut script = String::new();
    // Level `l` spawns `Some(w)` children; the last level (`None`) is the leaves.
    let levels = widths.iter().map(|w| Some(*w)).chain([None]);
    for (level, width) in levels.enumerate() {
        let name = format!("l{level}");
        if let Some(w) = width {
            let next = format!("l{}", level + 1);
            dirs.push((name.clone(), front(most, Some(&next))));
            let calls: Vec<String> = (0..w)
                .map(|_| {
                    format!("      - {{ name: spawn_thread, input: {{ directive: {next} }} }}")
                })
                .collect();
            script += &format!(
                "{name}:\n  - usage: {{ input_tokens: 100, output_tokens: 20 }}\n    tool_calls:\n{}\n  - text: done\n    usage: {{ input_tokens: 200, output_tokens: 10 }}\n",
                calls.join("\n")
            );
        } else {
            dirs.push((name.clone(), front(most, None)));
            let delay = leaf_delay
                .map(|d| format!("    delay: {d}\n"))
                .unwrap_or_default();
            script += &format!("{name}:\n  - text: leaf\n{delay}    usage: {{ input_tokens: 50, output_tokens: 5 }}\n");
        }
    }
    let dirs: Vec<(&str, String)> = dirs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    project(&dirs, &script, strict)
}

/// CPU time (user + system, all threads) this process has used so far, in seconds (Linux).
fn cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at its closing parenthesis.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    (f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) as f64 / 100.0
}

/// `WEFT_BENCH_PERF_CTL=<fifo>`: `enable`/`disable` written to perf's control fifo around the
/// measured phase (`perf record -D -1 --control fifo:<fifo>`), so a profile holds only it.
fn perf_ctl(cmd: &str) {
    if let Some(path) = std::env::var_os("WEFT_BENCH_PERF_CTL") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(path) {
            let _ = writeln!(f, "{cmd}");
        }
    }
}

fn tree_size(w: usize, d: usize) -> usize {
    (0..=d).map(|l| w.pow(l as u32)).sum()
}

fn parse_ts(s: &str) -> Option<std::time::SystemTime> {
    humantime::parse_rfc3339(s).ok()
}

async fn bench_tree(w: usize, d: usize, strict: bool) -> Value {
    let p = tree_project(w, d, strict, None);
    tree_on(&p, w, d).await
}

/// Adds `lines` to the project's config.
fn add_config(p: &Proj, lines: &str) {
    let path = p.root.join(".weft/config.yaml");
    let mut config = std::fs::read_to_string(&path).unwrap();
    config.push_str(lines);
    std::fs::write(path, config).unwrap();
}

/// Runs the `w`×`d` tree of project `p` (made by [`tree_project`]) and measures it.
/// Milliseconds from `end` until the search index holds every thread that ended (the indexer
/// waits for a burst of endings to stop, see src/store/later.rs): not part of any wall time.
fn caught_up(rt: &weft::Runtime, end: Instant) -> f64 {
    rt.store().flush_index();
    end.elapsed().as_secs_f64() * 1e3
}

async fn tree_on(p: &Proj, w: usize, d: usize) -> Value {
    let strict = std::fs::read_to_string(p.root.join(".weft/config.yaml"))
        .unwrap_or_default()
        .contains("durability: strict");
    let rt = open(p).await;
    let n = tree_size(w, d);
    let t0 = Instant::now();
    let report = rt.run("l0", Map::new(), LimitSet::default()).await.unwrap();
    let wall = t0.elapsed();
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    let rows = weft::internals::Store::read_project(&Project {
        root: p.root.clone(),
    })
    .unwrap()
    .list(false, usize::MAX >> 1)
    .unwrap();
    assert_eq!(rows.len(), n, "every thread ran");
    let mut lat: Vec<f64> = rows
        .iter()
        .filter_map(|r| {
            Some(
                parse_ts(&r.updated_at)?
                    .duration_since(parse_ts(&r.created_at)?)
                    .ok()?
                    .as_secs_f64()
                    * 1e3,
            )
        })
        .collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    let (peak, _) = rss_kib();
    let indexed = caught_up(&rt, t0 + wall);
    rt.shutdown();
    json!({
        "threads": n, "width": w, "depth": d, "durability": if strict { "strict" } else { "normal" },
        "wall_s": wall.as_secs_f64(), "threads_per_s": n as f64 / wall.as_secs_f64(),
        "index_caught_up_ms": indexed,
        "mean_overhead_us": wall.as_secs_f64() * 1e6 / n as f64,
        "p50_spawn_to_terminal_ms": pct(&lat, 0.5), "p99_spawn_to_terminal_ms": pct(&lat, 0.99),
        "peak_rss_mib": peak as f64 / 1024.0,
    })
}

/// The `w`×`d` tree with the HTTP server up, without clients and then with `clients` SSE
/// clients on `/v1/events` (each in this process, reading and parsing every event): the wall
/// times, their ratio, and the events delivered per second to all clients together.
/// The search index at scale: `n` finished threads of six varied messages each (words drawn
/// from a 2,000-word vocabulary, Zipf-like), written through the store; then the time to index
/// them all from nothing (`backfill` after store.db is removed), a second backfill with nothing
/// to do, and the latency of two-word queries (best hit per thread, 3 messages of context).
fn bench_search(n: usize) -> Value {
    use weft::ThreadStore;
    let p = project(&[], "", false);
    let store = weft::FileStore::open(&Project {
        root: p.root.clone(),
    })
    .unwrap();
    let vocab: Vec<String> = (0..2000).map(|i| format!("w{i:x}q")).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // Zipf-like: small ranks far more often.
    let word = |r: &mut dyn FnMut() -> u64| {
        let u = (r() % 1_000_000) as f64 / 1_000_000.0;
        vocab[((u * u * u) * 2000.0) as usize % 2000].clone()
    };
    let t0 = Instant::now();
    for i in 0..n {
        let events = (0..6)
            .map(|m| {
                let text: Vec<String> = (0..24).map(|_| word(&mut next)).collect();
                if m % 2 == 0 {
                    json!({ "type": "message", "role": "user", "text": text.join(" ") })
                } else {
                    json!({ "type": "assistant_text", "text": text.join(" ") })
                }
            })
            .collect();
        store
            .create(weft::NewThread {
                directive: format!("bench/d{}", i % 10),
                status: "completed".into(),
                events,
                ..Default::default()
            })
            .unwrap();
    }
    let write_s = t0.elapsed().as_secs_f64();
    drop(store);
    for f in ["store.db", "store.db-wal", "store.db-shm"] {
        let _ = std::fs::remove_file(p.root.join(".weft/state").join(f));
    }
    let store = weft::FileStore::open(&Project {
        root: p.root.clone(),
    })
    .unwrap();
    let t1 = Instant::now();
    let full = store.backfill().unwrap();
    let backfill_s = t1.elapsed().as_secs_f64();
    assert_eq!(full.indexed, n);
    let t2 = Instant::now();
    let again = store.backfill().unwrap();
    let noop_s = t2.elapsed().as_secs_f64();
    assert_eq!(again.indexed, 0);
    let mut lat = Vec::new();
    let mut hits = 0;
    for _ in 0..200 {
        let q = format!("{} {}", word(&mut next), word(&mut next));
        let t = Instant::now();
        hits += store.search(&weft::SearchQuery::new(&q)).unwrap().len();
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    json!({
        "threads": n, "messages": n * 6, "write_s": write_s, "backfill_s": backfill_s,
        "threads_indexed_per_s": n as f64 / backfill_s, "noop_backfill_s": noop_s,
        "query_p50_ms": pct(&lat, 0.5), "query_p95_ms": pct(&lat, 0.95), "hits_per_query": hits as f64 / 200.0,
    })
}

async fn bench_sse(w: usize, d: usize, clients: usize) -> Value {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let n = tree_size(w, d);
    let mut walls = Vec::new();
    let mut delivered = 0u64;
    let mut emitted = 0u64;
    let mut deliver_s = 0.0;
    let mut pump_lost = 0u64;
    for k in [0, clients] {
        let p = tree_project(w, d, false, None);
        let rt = open(&p).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(weft::internals::serve_http(
            rt.clone(),
            listener,
            "t".repeat(64),
            async move {
                let _ = stop_rx.await;
            },
        ));
        // Each client counts events until the root's `thread_finished` (the tree's last event;
        // its number is how many the server sent), or 5 s of quiet (a client that lagged past
        // the journal lost events, counted as missing).
        let (root_tx, root_rx) = tokio::sync::watch::channel(String::new());
        let http = reqwest::Client::new();
        let mut tasks = Vec::new();
        for _ in 0..k {
            let resp = http
                .get(format!("{base}/v1/events"))
                .bearer_auth("t".repeat(64))
                .send()
                .await
                .unwrap();
            let root_rx = root_rx.clone();
            tasks.push(tokio::spawn(async move {
                use eventsource_stream::Eventsource;
                use futures_util::StreamExt;
                let mut s = resp.bytes_stream().eventsource();
                let (mut got, mut total, mut lost) = (0u64, 0u64, 0u64);
                loop {
                    let next =
                        tokio::time::timeout(std::time::Duration::from_secs(5), s.next()).await;
                    let Ok(Some(Ok(ev))) = next else { break };
                    got += 1;
                    if ev.event == "lagged" {
                        lost += ev
                            .data
                            .trim_start_matches("{\"missed\":")
                            .trim_end_matches('}')
                            .parse::<u64>()
                            .unwrap_or(1);
                    }
                    if ev.event == "thread_finished" {
                        let root = root_rx.borrow().clone();
                        if !root.is_empty()
                            && ev.data.contains(&format!("\"thread_id\":\"{root}\""))
                        {
                            total = ev
                                .id
                                .split('.')
                                .nth(1)
                                .and_then(|x| x.parse().ok())
                                .unwrap_or(0);
                            break;
                        }
                    }
                }
                (got, total, lost, Instant::now())
            }));
        }
        let t0 = Instant::now();
        let handle = rt
            .start("l0", Map::new(), LimitSet::default())
            .await
            .unwrap();
        let _ = root_tx.send(handle.id().to_string());
        let report = handle.wait().await.unwrap();
        walls.push(t0.elapsed().as_secs_f64());
        assert_eq!(report.status, weft::Status::Completed);
        let mut end = t0;
        for t in tasks {
            let (got, total, lost, at) = t.await.unwrap();
            delivered += got;
            pump_lost = pump_lost.max(lost);
            emitted = emitted.max(total);
            end = end.max(at);
        }
        deliver_s = end.duration_since(t0).as_secs_f64();
        let _ = stop_tx.send(());
        let _ = server.await;
        rt.shutdown();
    }
    json!({
        "threads": n, "clients": clients,
        "wall_without_clients_s": walls[0], "wall_with_clients_s": walls[1],
        "slowdown": walls[1] / walls[0],
        "events_delivered": delivered, "events_expected": emitted * clients as u64,
        "events_lost_by_the_pump": pump_lost,
        "events_per_s": delivered as f64 / deliver_s,
    })
}

/// 1,000 turns (50 with `--size tiny`); `WEFT_BENCH_TURNS=<n>` for a longer profile.
fn turn_count(tiny: bool) -> usize {
    let env = std::env::var("WEFT_BENCH_TURNS").ok();
    env.and_then(|n| n.parse().ok())
        .unwrap_or(if tiny { 50 } else { 1000 })
}

async fn bench_turns(turns: usize, strict: bool) -> Value {
    let mut script = String::from("looper:\n");
    for _ in 0..turns {
        script += "  - tool_calls: [ { name: wait_threads, input: {} } ]\n    usage: { input_tokens: 10, output_tokens: 2 }\n";
    }
    script += "  - text: done\n    usage: { input_tokens: 10, output_tokens: 2 }\n";
    let d = format!("---\npermissions: [\"thread.spawn.none\"]\nlimits: {{ turns: {}, tokens: 100000000, spend: 1000, duration: 1h }}\n---\nLoop.\n", turns + 1);
    let p = project(&[("looper", d)], &script, strict);
    let rt = open(&p).await;
    // What `weft run` watches: progress, not every transcript line.
    let mut events = rt.progress_events();
    perf_ctl("enable");
    let t0 = Instant::now();
    let handle = rt
        .start("looper", Map::new(), LimitSet::default())
        .await
        .unwrap();
    let done = handle.wait();
    // Per-turn latency: the gaps between consecutive turn events, timed as they arrive.
    let mut stamps = Vec::with_capacity(turns + 1);
    let mut done = Box::pin(done);
    let report = loop {
        tokio::select! {
            ev = events.recv() => {
                if let Ok(weft::Event::Turn { .. }) = ev {
                    stamps.push(Instant::now());
                }
            }
            r = &mut done => break r.unwrap(),
        }
    };
    let wall = t0.elapsed();
    perf_ctl("disable");
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    let mut gaps: Vec<f64> = stamps
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6)
        .collect();
    // WEFT_BENCH_GAPS=1: the slowest gaps with their turn (to find what recurs).
    if std::env::var_os("WEFT_BENCH_GAPS").is_some() {
        let mut slow: Vec<(usize, f64)> = gaps.iter().copied().enumerate().collect();
        slow.sort_by(|a, b| b.1.total_cmp(&a.1));
        eprintln!("slowest gaps (turn, µs): {:?}", &slow[..slow.len().min(40)]);
    }
    gaps.sort_by(|a, b| a.total_cmp(b));
    rt.shutdown();
    // WEFT_BENCH_NO_PARTS=1: the turn loop alone (for profiling it).
    let parts = match std::env::var_os("WEFT_BENCH_NO_PARTS") {
        Some(_) => Value::Null,
        None => turn_parts(strict).await,
    };
    // The same number of turns with nothing but what SPEC makes a turn do (turn_floor.rs), once
    // the runtime above has stopped.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir_in(bench_tmp()).unwrap();
    use turn_floor::{turn_floor, Ledger};
    let floor = turn_floor(turns, dir.path(), Ledger::Journal, strict).await;
    let floor_commit = turn_floor(turns, dir.path(), Ledger::Commit, strict).await;
    json!({
        "turns": turns, "durability": if strict { "strict" } else { "normal" },
        "floor_us_per_turn": floor, "floor_commit_us_per_turn": floor_commit,
        "us_per_turn_mean": wall.as_secs_f64() * 1e6 / (turns + 1) as f64,
        "us_per_turn_p50": pct(&gaps, 0.5), "us_per_turn_p99": pct(&gaps, 0.99),
        "note": "p50/p99: gaps between consecutive turn events; mean: wall time / turns",
        "parts_us": parts,
    })
}

/// What a turn is made of, each measured alone: transcript appends (a turn writes ~4 lines),
/// a ledger reserve+settle through the actor, a registry update through the actor, a signature.
async fn turn_parts(strict: bool) -> Value {
    const N: usize = 2000;
    let p = project(&[], "", strict);
    let rt = open(&p).await;
    let (registry, ledger) = weft::internals::actors(&rt);
    let signer = weft::internals::signer(&rt);
    let id = ThreadId::parse("bench-1").unwrap();
    let durability = if strict {
        weft::Durability::Strict
    } else {
        weft::Durability::Normal
    };
    let records = weft::internals::Records::files(&weft::Project {
        root: p.root.clone(),
    });
    let mut w =
        weft::internals::TranscriptWriter::create(&records, &id, signer.clone(), durability, 64)
            .unwrap();
    let t = Instant::now();
    for i in 0..N {
        w.append(
            "tool_result",
            json!({ "id": format!("call_{i}"), "content": "{\"threads\":[]}", "is_error": false }),
        )
        .unwrap();
    }
    let append = t.elapsed().as_secs_f64() * 1e6 / N as f64;
    let _ = ractor::call!(ledger, |reply| weft::internals::LedgerMsg::Open {
        id: id.clone(),
        parent: None,
        max: weft::Nanos(1_000_000_000_000),
        guarantee: weft::Nanos::ZERO,
        min_first_call: weft::Nanos::ZERO,
        reply
    });
    let price = weft::Price {
        input: 1000,
        output: 1000,
        cache_read: 0,
        cache_write: 0,
    };
    let t = Instant::now();
    for _ in 0..N {
        let g = ractor::call!(ledger, |reply| weft::internals::LedgerMsg::Reserve {
            id: id.clone(),
            price,
            prompt_tokens: 100,
            want_output: 100,
            min_output: 1,
            reply
        })
        .unwrap()
        .unwrap();
        let _ = ractor::call!(ledger, |reply| weft::internals::LedgerMsg::Settle {
            reservation: g.reservation,
            actual: weft::Nanos(1),
            reply: Some(reply)
        });
    }
    let ledger = t.elapsed().as_secs_f64() * 1e6 / N as f64;
    let bench_id = weft::ThreadId::parse("bench-1").unwrap();
    let row = weft::internals::ThreadRow {
        directive: "x".into(),
        ..weft::internals::ThreadRow::new(bench_id.clone(), bench_id, weft::Status::Running)
    };
    let _ = ractor::call!(registry, |reply| {
        weft::internals::RegistryMsg::Register {
            row: Box::new(row.clone()),
            admit: None,
            reply,
        }
    });
    let t = Instant::now();
    for i in 0..N {
        let mut r = row.clone();
        r.turns = i as u64;
        let _ = ractor::call!(registry, |reply| weft::internals::RegistryMsg::Update {
            row: Box::new(r),
            reply: Some(reply)
        });
    }
    let registry = t.elapsed().as_secs_f64() * 1e6 / N as f64;
    let doc = json!({ "id": "bench-1", "status": "running", "cost": { "turns": 3 }, "limits": { "turns": 10 } });
    let t = Instant::now();
    for _ in 0..N {
        let _ = signer.sign(weft::internals::THREAD_DOMAIN, &doc);
    }
    let sign = t.elapsed().as_secs_f64() * 1e6 / N as f64;
    rt.shutdown();
    json!({ "transcript_append": append, "ledger_reserve_settle": ledger, "registry_update": registry, "ed25519_sign_jcs": sign })
}

async fn bench_memory(n: usize) -> Value {
    let p = project(
        &[("idle", "---\nlimits: { duration: 1h }\n---\nWait.\n".into())],
        "idle:\n  - text: never\n    delay: 1h\n",
        false,
    );
    let rt = open(&p).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, before) = rss_kib();
    let mut handles = Vec::with_capacity(n);
    for _ in 0..n {
        let handle = rt
            .start("idle", Map::new(), LimitSet::default())
            .await
            .unwrap();
        let id = handle.id().clone();
        let done = handle.wait();
        handles.push((id, done));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, after) = rss_kib();
    let per = (after.saturating_sub(before)) as f64 / n as f64;
    let (t, cpu) = (Instant::now(), cpu_s());
    perf_ctl("enable");
    for (id, _) in &handles {
        rt.cancel(id, "bench done");
    }
    for (_, done) in handles {
        let _ = done.await;
    }
    let cancel_s = t.elapsed().as_secs_f64();
    perf_ctl("disable");
    let cancel_cpu_s = cpu_s() - cpu;
    rt.shutdown();
    json!({ "live_threads": n, "rss_before_mib": before as f64 / 1024.0, "rss_after_mib": after as f64 / 1024.0,
            "kib_per_live_thread": per, "cancel_all_roots_s": cancel_s, "cancel_cpu_s": cancel_cpu_s })
}

async fn bench_cancel(w: usize, d: usize) -> Value {
    let p = tree_project(w, d, false, Some("1h"));
    let rt = open(&p).await;
    let n = tree_size(w, d);
    let store =
        weft::internals::Store::open_read_only(&p.root.join(".weft/state/registry.db")).unwrap();
    let t0 = Instant::now();
    let handle = rt
        .start("l0", Map::new(), LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().clone();
    let done = handle.wait();
    let db = rusqlite::Connection::open_with_flags(
        p.root.join(".weft/state/registry.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    loop {
        let live = scale::count(&db, "'running'");
        if live == n {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "tree never fully live ({live}/{n})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let build_s = t0.elapsed().as_secs_f64();
    let (t, cpu) = (Instant::now(), cpu_s());
    perf_ctl("enable");
    rt.cancel(&id, "bench");
    let report = done.await.unwrap();
    let cancel_s = t.elapsed().as_secs_f64();
    perf_ctl("disable");
    let cancel_cpu_s = cpu_s() - cpu;
    let indexed = caught_up(&rt, t + Duration::from_secs_f64(cancel_s));
    assert_eq!(report.status, weft::Status::Cancelled);
    let left = store.list(true, 10).unwrap().len();
    let (violations, open) = rt.audit().await;
    rt.shutdown();
    json!({ "threads": n, "tree_live_after_s": build_s, "cancel_to_all_finalized_s": cancel_s, "cancel_cpu_s": cancel_cpu_s,
            "index_caught_up_ms": indexed,
            "left_running": left, "ledger_violations": violations.len(), "open_reservations": open })
}

async fn bench_ledger(spawns: usize, k: usize, callers: usize) -> Value {
    use weft::internals::LedgerMsg;
    use weft::{Nanos, Price};
    let p = project(&[], "", false);
    let rt = open(&p).await;
    let (_, ledger) = weft::internals::actors(&rt);
    // (a) `spawns` concurrent guarantees of 1000 nanos against a parent that has exactly k × 1000.
    let parent = ThreadId::parse("parent-0").unwrap();
    let _ = ractor::call!(ledger, |reply| LedgerMsg::Open {
        id: parent.clone(),
        parent: None,
        max: Nanos(1000 * k as i64),
        guarantee: Nanos::ZERO,
        min_first_call: Nanos::ZERO,
        reply
    });
    let t = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..spawns {
        let ledger = ledger.clone();
        let parent = parent.clone();
        tasks.push(tokio::spawn(async move {
            let id = ThreadId::parse(&format!("kid-{i}")).unwrap();
            matches!(
                ractor::call!(ledger, |reply| LedgerMsg::Open {
                    id,
                    parent: Some(parent),
                    max: Nanos(1_000_000),
                    guarantee: Nanos(1000),
                    min_first_call: Nanos(1),
                    reply
                }),
                Ok(Ok(()))
            )
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    let admit_s = t.elapsed().as_secs_f64();
    // (b) `callers` threads at depth 5 reserving and settling at once, each call up the chain.
    let mut chain_tip = Vec::new();
    for c in 0..callers {
        chain_tip.push(open_chain(&ledger, &format!("c{c}")).await);
    }
    const CALLS: usize = 20;
    let price = Price {
        input: 1000,
        output: 1000,
        cache_read: 0,
        cache_write: 0,
    };
    let t = Instant::now();
    let mut tasks = Vec::new();
    for tip in chain_tip {
        let ledger = ledger.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..CALLS {
                reserve_and_settle(&ledger, &tip, price).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let el = t.elapsed().as_secs_f64();
    let (violations, _) = rt.audit().await;
    rt.shutdown();
    json!({ "concurrent_guarantee_spawns": spawns, "budget_admits": k, "admitted": admitted, "exactly_k": admitted == k,
            "admission_s": admit_s, "depth5_callers": callers, "reservations": callers * CALLS,
            "reservations_per_s": (callers * CALLS) as f64 / el, "violations": violations.len() })
}

/// Opens a chain of 5 accounts `<prefix>-l0` … `-l4` with no cap to speak of; returns its tip.
async fn open_chain(
    ledger: &ractor::ActorRef<weft::internals::LedgerMsg>,
    prefix: &str,
) -> ThreadId {
    use weft::internals::LedgerMsg;
    let mut up: Option<ThreadId> = None;
    for level in 0..5 {
        let id = ThreadId::parse(&format!("{prefix}-l{level}")).unwrap();
        let _ = ractor::call!(ledger, |reply| LedgerMsg::Open {
            id: id.clone(),
            parent: up.clone(),
            max: weft::Nanos(i64::MAX / 4),
            guarantee: weft::Nanos::ZERO,
            min_first_call: weft::Nanos::ZERO,
            reply
        });
        up = Some(id);
    }
    up.expect("five levels")
}

/// One call's reservation (100 tokens in, up to 100 out) on `tip`'s chain, settled at 150 nanos.
async fn reserve_and_settle(
    ledger: &ractor::ActorRef<weft::internals::LedgerMsg>,
    tip: &ThreadId,
    price: weft::Price,
) {
    use weft::internals::LedgerMsg;
    let g = ractor::call!(ledger, |reply| LedgerMsg::Reserve {
        id: tip.clone(),
        price,
        prompt_tokens: 100,
        want_output: 100,
        min_output: 1,
        reply
    })
    .unwrap()
    .unwrap();
    let _ = ractor::call!(ledger, |reply| LedgerMsg::Settle {
        reservation: g.reservation,
        actual: weft::Nanos(150),
        reply: Some(reply)
    });
}

/// The floor: bare ractor actors doing the same spawn/message pattern, nothing persisted; and
/// the unavoidable costs per thread on this disk (fsync, ed25519 signature, SQLite commit).
async fn bench_floor(w: usize, d: usize) -> Value {
    use ractor::{Actor, ActorProcessingErr, ActorRef};
    struct Node;
    enum Msg {
        Go,
        Done,
    }
    struct St {
        parent: Option<ActorRef<Msg>>,
        depth: usize,
        pending: usize,
        w: usize,
        done: Option<tokio::sync::oneshot::Sender<()>>,
    }
    type Args = (
        Option<ActorRef<Msg>>,
        usize,
        usize,
        Option<tokio::sync::oneshot::Sender<()>>,
    );
    impl Actor for Node {
        type Msg = Msg;
        type State = St;
        type Arguments = Args;
        async fn pre_start(&self, me: ActorRef<Msg>, a: Args) -> Result<St, ActorProcessingErr> {
            me.cast(Msg::Go)?;
            Ok(St {
                parent: a.0,
                depth: a.1,
                pending: 0,
                w: a.2,
                done: a.3,
            })
        }
        async fn handle(
            &self,
            me: ActorRef<Msg>,
            m: Msg,
            s: &mut St,
        ) -> Result<(), ActorProcessingErr> {
            match m {
                Msg::Go if s.depth > 0 => {
                    for _ in 0..s.w {
                        Actor::spawn_linked(
                            None,
                            Node,
                            (Some(me.clone()), s.depth - 1, s.w, None),
                            me.get_cell(),
                        )
                        .await?;
                    }
                    s.pending = s.w;
                }
                Msg::Done if s.pending > 1 => s.pending -= 1,
                _ => {
                    if let Some(p) = &s.parent {
                        p.cast(Msg::Done)?;
                    }
                    if let Some(tx) = s.done.take() {
                        let _ = tx.send(());
                    }
                    me.stop(None);
                }
            }
            Ok(())
        }
        async fn handle_supervisor_evt(
            &self,
            _me: ActorRef<Msg>,
            _e: ractor::SupervisionEvent,
            _s: &mut St,
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }
    let n = tree_size(w, d);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let t = Instant::now();
    Actor::spawn(None, Node, (None, d, w, Some(tx)))
        .await
        .unwrap();
    rx.await.unwrap();
    let actors_s = t.elapsed().as_secs_f64();
    // Unavoidable work, measured alone on the bench disk.
    let dir = tempfile::tempdir_in(bench_tmp()).unwrap();
    const N: usize = 300;
    let t = Instant::now();
    for i in 0..N {
        let p = dir.path().join(format!("f{i}"));
        let f = std::fs::File::create(&p).unwrap();
        std::io::Write::write_all(&mut &f, b"{\"x\":1}\n").unwrap();
        f.sync_all().unwrap();
    }
    let fsync_us = t.elapsed().as_secs_f64() * 1e6 / N as f64;
    // The file work every thread does, bare: a directory, a transcript, two atomic replaces.
    let t = Instant::now();
    for i in 0..n {
        let td = dir.path().join(format!("t{i}"));
        std::fs::create_dir(&td).unwrap();
        std::fs::write(td.join("transcript.jsonl"), b"{}\n").unwrap();
        for _ in 0..2 {
            std::fs::write(td.join("thread.json.tmp"), b"{}").unwrap();
            std::fs::rename(td.join("thread.json.tmp"), td.join("thread.json")).unwrap();
        }
    }
    let files_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let signer = weft::internals::Signer::load_or_create(dir.path()).unwrap();
    let doc = json!({"id": "x", "status": "completed", "limits": {"turns": 3}});
    let t = Instant::now();
    for _ in 0..N * 10 {
        let _ = signer.sign(weft::internals::THREAD_DOMAIN, &doc);
    }
    let sign_us = t.elapsed().as_secs_f64() * 1e6 / (N * 10) as f64;
    let db = rusqlite::Connection::open(dir.path().join("x.db")).unwrap();
    db.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);").unwrap();
    let t = Instant::now();
    for i in 0..N * 10 {
        db.execute("INSERT INTO t(id, v) VALUES(?1, 'x')", [i as i64])
            .unwrap();
    }
    let sqlite_us = t.elapsed().as_secs_f64() * 1e6 / (N * 10) as f64;
    json!({ "bare_actor_tree_threads": n, "bare_actor_tree_s": actors_s, "bare_actor_threads_per_s": n as f64 / actors_s,
            "fsync_us": fsync_us, "thread_files_us": files_us, "ed25519_sign_us": sign_us, "sqlite_wal_commit_us": sqlite_us })
}

/// LangGraph running the equivalent tree in the same invocation (benches/langgraph_tree.py, in a
/// venv the script creates from PyPI). Returns null with a reason when Python or PyPI is missing.
fn bench_langgraph(w: usize, d: usize) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/langgraph_tree.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg(w.to_string())
        .arg(d.to_string())
        .output();
    match out {
        Ok(o) if o.status.success() => serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| json!({ "error": format!("bad output ({e}): {}", String::from_utf8_lossy(&o.stdout)) })),
        Ok(o) => json!({ "error": String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("failed").to_string() }),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

fn row(name: &str, value: String, target: &str) {
    println!("{name:<44} {value:>18}   {target}");
}

/// SPEC §11's floor under ending `n` threads: each signs a final checkpoint and its final
/// thread.json (two ed25519 signatures, at the floor scenario's measured cost), spread over
/// every core; nothing else counted. Empty when the floor scenario did not run.
fn sign_floor(v: &Value, n: f64) -> String {
    let Some(sign_us) = v["floor"]["ed25519_sign_us"].as_f64() else {
        return String::new();
    };
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
    format!("SPEC floor {:.2} s", 2.0 * n * sign_us / 1e6 / cores)
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    weft::prefer_small_pages();
    let a = args();
    let (w, d) = a.shape.unwrap_or(if a.tiny { (3, 2) } else { (10, 4) });
    let mut out = serde_json::Map::new();
    let machine = format!(
        "{} cores, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::env::consts::OS
    );
    out.insert("machine".into(), json!(machine));
    out.insert("dir".into(), json!(bench_tmp().display().to_string()));
    let scenarios = [
        "floor",
        "tree",
        "turns",
        "memory",
        "cancel",
        "scale",
        "ledger",
        "langgraph",
        "sse",
        "search",
        "postgres",
        "cluster",
        "nodes",
    ];
    if a.what == "all" {
        // Each scenario in a fresh process, so memory figures are not polluted by the others.
        for name in scenarios {
            let part =
                std::env::temp_dir().join(format!("weft-bench-{name}-{}.json", std::process::id()));
            let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
            cmd.arg(name)
                .arg("--json")
                .arg(&part)
                .stdout(std::process::Stdio::null());
            if a.tiny {
                cmd.args(["--size", "tiny"]);
            }
            if a.strict {
                cmd.args(["--durability", "strict"]);
            }
            let status = cmd.status().unwrap();
            let v: Value = std::fs::read(&part)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or(Value::Null);
            let _ = std::fs::remove_file(&part);
            out.insert(
                name.into(),
                v.get(name)
                    .cloned()
                    .unwrap_or_else(|| json!({ "error": format!("scenario failed: {status}") })),
            );
        }
    } else {
        let v = match a.what.as_str() {
            "floor" => bench_floor(w, d).await,
            "tree" => bench_tree(w, d, a.strict).await,
            "turns" => bench_turns(turn_count(a.tiny), a.strict).await,
            "memory" => bench_memory(if a.tiny { 200 } else { 10_000 }).await,
            "cancel" => {
                let (cw, cd) = a.shape.unwrap_or(if a.tiny { (5, 2) } else { (100, 2) });
                bench_cancel(cw, cd).await
            }
            "scale" => {
                let widths: &[usize] = if a.tiny { &[3, 3, 10] } else { &[10, 10, 1000] };
                scale::bench_scale(widths).await
            }
            "ledger" => {
                if a.tiny {
                    bench_ledger(100, 7, 50).await
                } else {
                    bench_ledger(1000, 137, 1000).await
                }
            }
            "langgraph" => bench_langgraph(w, d),
            "sse" => bench_sse(w, d, if a.tiny { 10 } else { 100 }).await,
            "search" => bench_search(if a.tiny { 300 } else { 10_000 }),
            "postgres" => pg::bench_postgres(w, d, if a.tiny { 50 } else { 1000 }).await,
            "cluster" => {
                let calls = if a.tiny { 200 } else { 5000 };
                tokio::task::spawn_blocking(move || cluster::bench_cluster(calls))
                    .await
                    .unwrap()
            }
            "nodes" => nodes::bench_nodes(w, d).await,
            other => {
                eprintln!("unknown scenario `{other}` (all, {})", scenarios.join(", "));
                std::process::exit(2);
            }
        };
        out.insert(a.what.clone(), v);
    }
    let v = Value::Object(out);
    println!(
        "\nweft benchmarks ({machine}; durability {})",
        if a.strict { "strict" } else { "normal" }
    );
    println!("{:<44} {:>18}   target", "measure", "value");
    if let Some(t) = v.get("tree") {
        row(
            &format!("tree {}×{} ({} threads): wall", w, d, t["threads"]),
            format!("{:.2} s", f(t, "wall_s")),
            "≤ 2 s (10×4)",
        );
        row("  threads/s", format!("{:.0}", f(t, "threads_per_s")), "");
        row(
            "  mean overhead per thread",
            format!("{:.0} µs", f(t, "mean_overhead_us")),
            "",
        );
        row(
            "  spawn→terminal p50 / p99",
            format!(
                "{:.1} / {:.1} ms",
                f(t, "p50_spawn_to_terminal_ms"),
                f(t, "p99_spawn_to_terminal_ms")
            ),
            "",
        );
        row(
            "  peak RSS",
            format!("{:.0} MiB", f(t, "peak_rss_mib")),
            "≤ 150 MiB",
        );
        row(
            "  search index caught up after the end",
            format!("{:.0} ms", f(t, "index_caught_up_ms")),
            "",
        );
        if let Some(fl) = v.get("floor") {
            row(
                "  × bare-ractor floor (threads/s)",
                format!(
                    "{:.1}×",
                    f(fl, "bare_actor_threads_per_s") / f(t, "threads_per_s")
                ),
                "≤ 15×",
            );
            let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
            let per_thread = 3.0 * f(fl, "ed25519_sign_us") + f(fl, "thread_files_us");
            row(
                "  SPEC floor: 3 signatures + files, per core",
                format!("{:.2} s", f(t, "threads") * per_thread / 1e6 / cores),
                "",
            );
        }
    }
    if let Some(t) = v.get("turns") {
        row(
            &format!("per turn ({} turns): mean", t["turns"]),
            format!("{:.0} µs", f(t, "us_per_turn_mean")),
            "≤ 50 µs, p99 ≤ 150",
        );
        row(
            "  floor: SPEC's turn alone, journal / commit",
            format!(
                "{:.0} / {:.0} µs",
                f(t, "floor_us_per_turn"),
                f(t, "floor_commit_us_per_turn")
            ),
            "turn_floor.rs",
        );
        row(
            "  p50 / p99",
            format!(
                "{:.0} / {:.0} µs",
                f(t, "us_per_turn_p50"),
                f(t, "us_per_turn_p99")
            ),
            "",
        );
        let p = &t["parts_us"];
        for (label, key) in [
            ("  transcript append (per line)", "transcript_append"),
            ("  ledger reserve+settle", "ledger_reserve_settle"),
            ("  registry update", "registry_update"),
            ("  ed25519 sign (JCS)", "ed25519_sign_jcs"),
        ] {
            row(label, format!("{:.1} µs", f(p, key)), "");
        }
    }
    if let Some(m) = v.get("memory") {
        row(
            &format!("memory ({} live idle threads)", m["live_threads"]),
            format!("{:.1} KiB/thread", f(m, "kib_per_live_thread")),
            "≤ 16 KiB",
        );
    }
    if let Some(c) = v.get("cancel") {
        row(
            &format!("cancel root of {} live threads", c["threads"]),
            format!("{:.3} s", f(c, "cancel_to_all_finalized_s")),
            &format!("≤ 1 s (10k); {}", sign_floor(&v, f(c, "threads"))),
        );
        row(
            "  search index caught up after the end",
            format!("{:.0} ms", f(c, "index_caught_up_ms")),
            "",
        );
    }
    if let Some(m) = v.get("memory") {
        row(
            &format!("cancel {} live roots", m["live_threads"]),
            format!("{:.3} s", f(m, "cancel_all_roots_s")),
            &format!("≤ 1 s; {}", sign_floor(&v, f(m, "live_threads"))),
        );
    }
    if let Some(s) = v.get("scale") {
        row(
            &format!("scale: {} live threads: all live after", s["threads"]),
            format!("{:.1} s", f(s, "all_live_after_s")),
            "",
        );
        row(
            "  spawn rate (sustained 10–90% / overall)",
            format!(
                "{:.0} / {:.0} /s",
                f(s, "sustained_spawn_rate_per_s"),
                f(s, "spawn_rate_per_s")
            ),
            "≥ 5,000/s",
        );
        row(
            "  RSS live / per live thread",
            format!(
                "{:.0} MiB / {:.1} KiB",
                f(s, "rss_live_mib"),
                f(s, "kib_per_live_thread")
            ),
            "≤ 2 GiB",
        );
        row(
            "  cancel root → all finalized",
            format!("{:.2} s", f(s, "cancel_to_all_finalized_s")),
            &format!("≤ 1 s; {}", sign_floor(&v, f(s, "threads"))),
        );
        row(
            "  left running / open reservations",
            format!("{} / {}", s["left_running"], s["open_reservations"]),
            "0 / 0",
        );
    }
    if let Some(l) = v.get("ledger") {
        row(
            &format!(
                "ledger: {} guarantee spawns, budget for {}",
                l["concurrent_guarantee_spawns"], l["budget_admits"]
            ),
            format!("{} admitted", l["admitted"]),
            "exactly K",
        );
        row(
            "  depth-5 reservations/s",
            format!("{:.0}", f(l, "reservations_per_s")),
            "",
        );
    }
    if let Some(fl) = v.get("floor") {
        row(
            "floor: bare ractor tree threads/s",
            format!("{:.0}", f(fl, "bare_actor_threads_per_s")),
            "",
        );
        row(
            "floor: fsync / ed25519 sign / SQLite commit",
            format!(
                "{:.0}/{:.0}/{:.0} µs",
                f(fl, "fsync_us"),
                f(fl, "ed25519_sign_us"),
                f(fl, "sqlite_wal_commit_us")
            ),
            "",
        );
        row(
            "floor: a thread's files (dir, transcript, 2 replaces)",
            format!("{:.0} µs", f(fl, "thread_files_us")),
            "",
        );
        if let Some(t) = v.get("tree") {
            let files_s = f(fl, "thread_files_us") * f(t, "threads") / 1e6;
            row(
                "  tree's file work alone, on this disk",
                format!("{files_s:.2} s"),
                "",
            );
        }
    }
    if let Some(e) = v.get("sse") {
        row(
            &format!("tree with {} SSE clients: wall", e["clients"]),
            format!(
                "{:.2} s / {:.2} s",
                f(e, "wall_with_clients_s"),
                f(e, "wall_without_clients_s")
            ),
            "with / without",
        );
        row(
            "  slowdown with clients",
            format!("{:.2}×", f(e, "slowdown")),
            "≤ 1.1×",
        );
        row(
            "  events delivered to all clients",
            format!(
                "{:.0}/s ({} of {})",
                f(e, "events_per_s"),
                e["events_delivered"],
                e["events_expected"]
            ),
            "",
        );
    }
    if let Some(s) = v.get("search") {
        row(
            &format!("search: index {} threads from nothing", s["threads"]),
            format!("{:.2} s", f(s, "backfill_s")),
            &format!("{:.0} threads/s", f(s, "threads_indexed_per_s")),
        );
        row(
            "  backfill with nothing to do",
            format!("{:.2} s", f(s, "noop_backfill_s")),
            "",
        );
        row(
            "  query (2 words, best per thread) p50 / p95",
            format!(
                "{:.1} / {:.1} ms",
                f(s, "query_p50_ms"),
                f(s, "query_p95_ms")
            ),
            "",
        );
    }
    if let Some(pg) = v.get("postgres").filter(|p| p.get("skipped").is_none()) {
        row(
            &format!("tree on Postgres ({} threads) vs SQLite", pg["threads"]),
            format!(
                "{:.2} / {:.2} s = {:.2}x",
                f(pg, "postgres_wall_s"),
                f(pg, "sqlite_wall_s"),
                f(pg, "ratio")
            ),
            "within 3x of SQLite",
        );
        row(
            "  reserve+settle round trip, Postgres / SQLite",
            format!(
                "{:.0} / {:.0} µs",
                f(pg, "postgres_reserve_settle_us"),
                f(pg, "sqlite_reserve_settle_us")
            ),
            "",
        );
    }
    if let Some(n) = v.get("nodes").filter(|p| p.get("skipped").is_none()) {
        row(
            &format!("tree on nodes ({} threads): 1 / 3 nodes", n["threads"]),
            format!(
                "{:.2} / {:.2} s",
                f(&n["one_node"], "wall_s"),
                f(&n["three_nodes"], "wall_s")
            ),
            "same spend",
        );
    }
    if let Some(lg) = v.get("langgraph") {
        if let Some(e) = lg.get("error") {
            row("langgraph", "not run".into(), e.as_str().unwrap_or(""));
        } else {
            row(
                &format!("langgraph tree ({} threads): wall", lg["threads"]),
                format!("{:.2} s", f(lg, "wall_s")),
                "",
            );
            row("  threads/s", format!("{:.0}", f(lg, "threads_per_s")), "");
            row(
                "  peak RSS",
                format!("{:.0} MiB", f(lg, "peak_rss_mib")),
                "",
            );
            if let Some(t) = v.get("tree") {
                row(
                    "  weft / langgraph throughput",
                    format!("{:.1}×", f(t, "threads_per_s") / f(lg, "threads_per_s")),
                    "≥ 25×",
                );
                row(
                    "  weft / langgraph peak RSS",
                    format!("{:.2}×", f(t, "peak_rss_mib") / f(lg, "peak_rss_mib")),
                    "",
                );
            }
        }
    }
    std::fs::create_dir_all(a.json.parent().unwrap_or(Path::new("."))).ok();
    std::fs::write(&a.json, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    println!("\nwrote {}", a.json.display());
    // A scenario that fails fails the run (`.ci/run` runs them all, tiny): a benchmark that
    // cannot run is a defect, not a number.
    let failed: Vec<&String> = v
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(_, s)| s.get("error").is_some())
                .map(|(k, _)| k)
                .collect()
        })
        .unwrap_or_default();
    if !failed.is_empty() {
        eprintln!(
            "bench: scenario(s) failed: {failed:?} (see {})",
            a.json.display()
        );
        std::process::exit(1);
    }
}
