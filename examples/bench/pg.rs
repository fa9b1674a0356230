//! `bench postgres`: the same tree on SQLite and on a PostgreSQL server in one run, and one
//! caller's reserve + settle round trip on each. The server is Debian's (`/usr/lib/postgresql/
//! <v>/bin`), started here in the bench's temporary directory (tmpfs when TMPDIR=/dev/shm) with
//! the server's default durability, listening on a Unix socket only; stopped when the scenario
//! ends. Without the binaries the scenario says so and reports nothing.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use weft::Price;

/// A running server; stopped on drop.
pub(super) struct Server {
    pg_ctl: PathBuf,
    data: PathBuf,
    user: Option<&'static str>,
    pub(super) url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let (Some(keep), Some(base)) =
            (std::env::var_os("WEFT_BENCH_PG_LOG"), self.data.parent())
        {
            let _ = std::fs::copy(base.join("log"), keep);
        }
        let _ = as_user(self.user, &self.pg_ctl)
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(self.data.parent().unwrap_or(&self.data));
    }
}

fn as_user(user: Option<&str>, program: &Path) -> Command {
    match user {
        Some(u) => {
            let mut c = Command::new("runuser");
            c.args(["-u", u, "--"]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// Starts a server under `tmp`; None (with the reason on stderr) when it cannot.
pub(super) fn start(tmp: &Path) -> Option<Server> {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").is_file())
        .max()?;
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let user = root.then_some("postgres");
    let base = tmp.join(format!("pg-{}", std::process::id()));
    std::fs::create_dir_all(&base).ok()?;
    if let Some(u) = user {
        Command::new("chown")
            .args(["-R", u])
            .arg(&base)
            .status()
            .ok()?;
    }
    let data = base.join("data");
    let init = as_user(user, &bin.join("initdb"))
        .args([
            "-U",
            "weft",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "-D",
        ])
        .arg(&data)
        .output()
        .ok()?;
    if !init.status.success() {
        eprintln!(
            "postgres: initdb failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        return None;
    }
    // WEFT_BENCH_PG_OPTS: more server options for profiling (e.g. `-c log_statement=all`,
    // with WEFT_BENCH_PG_LOG=<file> to keep the server's log).
    let opts = format!(
        "-k {} -c listen_addresses='' -c max_connections=100 {}",
        base.display(),
        std::env::var("WEFT_BENCH_PG_OPTS").unwrap_or_default()
    );
    let started = as_user(user, &bin.join("pg_ctl"))
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(base.join("log"))
        .args(["-o", &opts, "-w", "start"])
        .output()
        .ok()?;
    if !started.status.success() {
        eprintln!(
            "postgres: pg_ctl start failed: {}",
            String::from_utf8_lossy(&started.stderr)
        );
        return None;
    }
    let server = Server {
        pg_ctl: bin.join("pg_ctl"),
        data,
        user,
        url: format!("host={} user=weft dbname=postgres", base.display()),
    };
    Some(server)
}

/// One caller's reserve + settle round trips (depth-5 chain) on the project `p`: mean µs.
async fn round_trip(p: &super::Proj, n: usize) -> f64 {
    let rt = super::open(p).await;
    let (_, ledger) = weft::internals::actors(&rt);
    let tip = super::open_chain(&ledger, "rt").await;
    let price = Price {
        input: 1000,
        output: 1000,
        cache_read: 0,
        cache_write: 0,
    };
    let t = Instant::now();
    for _ in 0..n {
        super::reserve_and_settle(&ledger, &tip, price).await;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    rt.shutdown();
    us
}

/// The `w`×`d` tree and `n` round trips on SQLite, then on Postgres.
pub(super) async fn bench_postgres(w: usize, d: usize, n: usize) -> Value {
    let Some(server) = start(&super::bench_tmp()) else {
        eprintln!("postgres: skipped (no PostgreSQL server binaries in /usr/lib/postgresql/*/bin)");
        return json!({ "skipped": "no PostgreSQL server" });
    };
    let sqlite = super::bench_tree(w, d, false).await;
    let p = super::tree_project(w, d, false, None);
    super::add_config(&p, &format!("database: \"{}\"\n", server.url));
    let pg = super::tree_on(&p, w, d).await;
    let ratio = pg["wall_s"].as_f64().unwrap_or(0.0) / sqlite["wall_s"].as_f64().unwrap_or(1.0);
    let p1 = super::project(&[], "", false);
    let sqlite_rt = round_trip(&p1, n).await;
    let p2 = super::project(&[], "", false);
    super::add_config(&p2, &format!("database: \"{}\"\n", server.url));
    let pg_rt = round_trip(&p2, n).await;
    drop(server);
    json!({
        "threads": pg["threads"], "sqlite_wall_s": sqlite["wall_s"], "postgres_wall_s": pg["wall_s"],
        "ratio": ratio, "sqlite_peak_rss_mib": sqlite["peak_rss_mib"], "postgres_peak_rss_mib": pg["peak_rss_mib"],
        "round_trips": n, "sqlite_reserve_settle_us": sqlite_rt, "postgres_reserve_settle_us": pg_rt,
    })
}
