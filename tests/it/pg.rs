//! A real PostgreSQL server for the tests (Debian's `postgresql` package: `initdb`, `postgres`
//! and `psql` from `/usr/lib/postgresql/<version>/bin`), started once per test process in a
//! temporary directory — as the unprivileged `postgres` user (or `nobody`) when the tests run
//! as root — listening on a Unix socket and a free loopback port, stopped by a watchdog when
//! the test process ends, however it ends. Every test gets a database of its own.
//!
//! A missing server fails the tests under `CI=true` and prints SKIPPED elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The running test server.
pub struct Server {
    bin: PathBuf,
    socket: PathBuf,
    pub port: u16,
}

/// The Postgres server binaries: `$WEFT_PG_BIN`, else the newest `/usr/lib/postgresql/*/bin`
/// that has `initdb` and `postgres`.
fn find_bin() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("WEFT_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").is_file() && b.join("postgres").is_file())
        .collect();
    found.sort();
    found.pop()
}

/// Who runs the server: the current user, or an unprivileged one when that is root (the
/// server refuses to run as root).
fn run_as() -> Option<&'static str> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        return None;
    }
    let has = |u: &str| {
        Command::new("id")
            .arg(u)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    Some(if has("postgres") {
        "postgres"
    } else {
        "nobody"
    })
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start() -> Result<Server, String> {
    let bin = find_bin().ok_or(
        "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (apt-get install postgresql)",
    )?;
    let user = run_as();
    let base = std::env::temp_dir().join(format!("weft-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).map_err(|e| e.to_string())?;
    if let Some(u) = user {
        let ok = Command::new("chown")
            .args(["-R", u])
            .arg(&base)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(format!("cannot give {} to {u}", base.display()));
        }
    }
    let data = base.join("data");
    let out = as_user(user, &bin.join("initdb"))
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
        .map_err(|e| format!("initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let port = free_port();
    // Tuned for a test machine: what the tests assert is weft's behaviour against a live
    // server, not the server's own crash safety.
    let opts = format!(
        "-k {} -p {port} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=300 -c shared_buffers=64MB",
        base.display()
    );
    let out = as_user(user, &bin.join("pg_ctl"))
        .args(["-D"])
        .arg(&data)
        .args(["-l"])
        .arg(base.join("log"))
        .args(["-o", &opts, "-w", "-t", "60", "start"])
        .output()
        .map_err(|e| format!("pg_ctl: {e}"))?;
    if !out.status.success() {
        let log = std::fs::read_to_string(base.join("log")).unwrap_or_default();
        return Err(format!(
            "pg_ctl start failed: {}{log}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    watchdog(&bin, user, &data, &base);
    Ok(Server {
        bin,
        socket: base,
        port,
    })
}

/// Stops the server (and removes its files) once this test process is gone.
fn watchdog(bin: &Path, user: Option<&str>, data: &Path, base: &Path) {
    let stop = match user {
        Some(u) => format!("runuser -u {u} -- "),
        None => String::new(),
    };
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop}{pg_ctl} -D {data} -m immediate stop >/dev/null 2>&1; rm -rf {base}",
        pid = std::process::id(),
        pg_ctl = bin.join("pg_ctl").display(),
        data = data.display(),
        base = base.display(),
    );
    let _ = Command::new("setsid")
        .args(["sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

/// The test server, started on first use; None (after a loud skip) when it cannot start.
pub fn server() -> Option<&'static Server> {
    static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
    match SERVER.get_or_init(start) {
        Ok(s) => Some(s),
        Err(e) => {
            crate::support::skip(&format!("SKIPPED: no PostgreSQL test server: {e}"));
            None
        }
    }
}

impl Server {
    /// Runs SQL as the server's superuser on database `db`; returns psql's unaligned output.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.socket)
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "weft",
                "-d",
                db,
                "-c",
                sql,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A new, empty database; returns its connection string (over the Unix socket).
    pub fn database(&self) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "t{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        self.psql("postgres", &format!("CREATE DATABASE {name}"));
        format!(
            "host={} port={} user=weft dbname={name}",
            self.socket.display(),
            self.port
        )
    }
}

/// A fresh database on the test server, or None after a loud skip.
pub fn fresh_database() -> Option<String> {
    server().map(Server::database)
}
