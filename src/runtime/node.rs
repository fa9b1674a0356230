//! Nodes (#26, first step): a `weft serve --node NAME` holds a lease row in the project's
//! database (`nodes`: the registry's file on SQLite, the project's Postgres database across
//! machines), renewed every fifth of its length and expiring after it. A name is held by one
//! live lease at a time: a second node of that name is refused while the lease runs; once it
//! has expired the next node takes the name with the next epoch, and the old holder's renewals
//! then fail (its epoch is gone), so it stops (fencing). `weft nodes` lists every node, its
//! lease and its live threads. Times are the database server's clock, never a node's.

// Used by `weft serve --node` (the `cli` feature) only.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use crate::project::Project;
use crate::sql::{migrate, params, Db, Engine, Lock, SqlError, Step};

/// The nodes table, step by step (see `sql/migrate.rs`).
const STEPS: &[Step] = &[
    Step {
        sql: "CREATE TABLE IF NOT EXISTS nodes(name TEXT PRIMARY KEY, epoch INTEGER NOT NULL,
           pid INTEGER NOT NULL, host TEXT NOT NULL, addr TEXT NOT NULL, started_at TEXT NOT NULL,
           expires_at_ms INTEGER NOT NULL, live_threads INTEGER NOT NULL,
           max_live_threads INTEGER)",
        postgres: None,
    },
    // The owner number of the name's holder on a shared database (see `core/owner.rs`).
    Step {
        sql: "ALTER TABLE nodes ADD COLUMN owner INTEGER",
        postgres: None,
    },
];

/// A node's lease could not be taken, renewed or read.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NodeError(String);

impl NodeError {
    /// The name was taken over (this holder's lease had run out): it must stop.
    pub(crate) fn is_lost(&self) -> bool {
        self.0.contains("lost its lease")
    }
}

impl From<SqlError> for NodeError {
    fn from(e: SqlError) -> NodeError {
        NodeError(format!("nodes: {e}"))
    }
}

/// One node as `weft nodes` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Node {
    /// Its name (`--node`).
    pub name: String,
    /// Which holder of the name this is (1, then one more each time the name is taken over).
    pub epoch: i64,
    /// Its process.
    pub pid: i64,
    /// Its machine.
    pub host: String,
    /// Where it serves.
    pub addr: String,
    /// When it joined.
    pub started_at: String,
    /// Milliseconds its lease still runs (≤ 0: expired).
    pub lease_left_ms: i64,
    /// Whether the lease runs.
    pub alive: bool,
    /// Threads it ran at its last renewal.
    pub live_threads: i64,
    /// Its capacity, if it set one.
    pub max_live_threads: Option<i64>,
}

/// The database server's clock in milliseconds, as SQL.
pub(crate) fn now_ms(db: &Db) -> &'static str {
    match db.engine() {
        Engine::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        Engine::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    }
}

/// The project's nodes table (made if missing; None: `make` is false and a project on
/// SQLite has no registry.db yet, so no node ever joined).
pub(super) fn open(project: &Project, make: bool) -> Result<Option<Db>, NodeError> {
    let config = project.config().map_err(|e| NodeError(e.to_string()))?;
    let file = project.state_dir().join("registry.db");
    if config.database.is_none() {
        if !make && !file.exists() {
            return Ok(None);
        }
        std::fs::create_dir_all(project.state_dir())
            .map_err(|e| NodeError(format!("{}: {e}", project.state_dir().display())))?;
    }
    let mut db = Db::open(config.database.as_ref(), &file, false)?;
    migrate(&mut db, "nodes", STEPS)?;
    Ok(Some(db))
}

/// This machine's name.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// A held lease: renew it, or give it up.
pub(crate) struct Lease {
    db: Db,
    name: String,
    epoch: i64,
    length_ms: i64,
    owner: Option<u32>,
}

/// What joining as a node needs.
pub(crate) struct Joining<'a> {
    /// The node's name.
    pub name: &'a str,
    /// Where it serves.
    pub addr: &'a str,
    /// Its capacity, if any.
    pub max_live_threads: Option<i64>,
    /// How long a lease runs without renewal.
    pub length: std::time::Duration,
}

/// Takes the name `j.name` for this process, refused while another holder's lease runs.
pub(crate) fn join(project: &Project, j: &Joining<'_>) -> Result<Lease, NodeError> {
    let Some(mut db) = open(project, true)? else {
        return Err(NodeError("nodes: no database".into()));
    };
    let length_ms = i64::try_from(j.length.as_millis()).unwrap_or(i64::MAX / 2);
    let now = now_ms(&db);
    // A running lease is refused before any lock is taken (locking its row would wait behind
    // the holder's writes, with the registry's lock held).
    if let Some(r) = db.row(
        &format!("SELECT pid, host, expires_at_ms - {now} FROM nodes WHERE name=?1"),
        params![j.name],
    )? {
        if r.int(2)? > 0 {
            return Err(held_by(j.name, r.int(0)?, &r.text(1)?, r.int(2)?));
        }
    }
    db.begin_write(Lock::Registry)?;
    // FOR UPDATE on Postgres: a takeover waits for the old holder's writes still in flight (they
    // hold its row in KEY SHARE, see `fence.rs`).
    let lock = match db.engine() {
        Engine::Sqlite => "",
        Engine::Postgres => " FOR UPDATE",
    };
    let held = db.row(
        &format!("SELECT epoch, pid, host, expires_at_ms - {now} FROM nodes WHERE name=?1{lock}"),
        params![j.name],
    )?;
    let epoch = match &held {
        Some(r) if r.int(3)? > 0 => {
            db.rollback();
            return Err(held_by(j.name, r.int(1)?, &r.text(2)?, r.int(3)?));
        }
        Some(r) => r.int(0)? + 1,
        None => 1,
    };
    let owner = match next_owner(&db) {
        Ok(o) => o,
        Err(e) => {
            db.rollback();
            return Err(e);
        }
    };
    let taken = db.execute(
        &format!(
            "INSERT INTO nodes(name, epoch, pid, host, addr, started_at, expires_at_ms, live_threads, max_live_threads, owner)
             VALUES(?1, ?2, ?3, ?4, ?5, ?6, {now} + ?7, 0, ?8, ?9)
             ON CONFLICT(name) DO UPDATE SET epoch=excluded.epoch, pid=excluded.pid, host=excluded.host,
               addr=excluded.addr, started_at=excluded.started_at, expires_at_ms=excluded.expires_at_ms,
               live_threads=0, max_live_threads=excluded.max_live_threads, owner=excluded.owner
             WHERE nodes.expires_at_ms <= {now}"
        ),
        params![
            j.name,
            epoch,
            i64::from(std::process::id()),
            host(),
            j.addr,
            crate::core::ids::now_ts(),
            length_ms,
            j.max_live_threads,
            owner
        ],
    )?;
    db.commit()?;
    if taken == 0 {
        return Err(NodeError(format!(
            "node `{}` was renewed by its holder at this moment; try again",
            j.name
        )));
    }
    Ok(Lease {
        db,
        name: j.name.to_string(),
        epoch,
        length_ms,
        owner,
    })
}

/// A name another holder's running lease keeps.
fn held_by(name: &str, pid: i64, host: &str, left_ms: i64) -> NodeError {
    NodeError(format!(
        "node `{name}` is held by pid {pid} on {host} for {left_ms} ms more; give it another name, or stop that node"
    ))
}

/// The owner number the next holder of a name gets on a shared database: one past every number
/// ever given (rows are never deleted, and a takeover only raises a row's number). None on
/// SQLite: nodes there share one machine, whose owner locks judge their threads.
fn next_owner(db: &Db) -> Result<Option<u32>, NodeError> {
    if db.engine() == Engine::Sqlite {
        return Ok(None);
    }
    let base = i64::from(crate::core::owner::NODE_BASE);
    let next = db
        .row(
            "SELECT COALESCE(MAX(owner), ?1) + 1 FROM nodes",
            params![base],
        )?
        .map_or(Ok(base + 1), |r| r.int(0))?;
    u32::try_from(next)
        .ok()
        .filter(|n| crate::core::owner::is_node(*n) && *n < u32::MAX >> 1)
        .map(Some)
        .ok_or_else(|| NodeError(format!("nodes: owner numbers are used up ({next})")))
}

/// The owner numbers of the nodes whose lease runs now (by the database's clock).
pub(crate) fn live_owners_in(db: &Db) -> Result<std::collections::HashSet<u32>, NodeError> {
    let now = now_ms(db);
    let rows = db.query(
        &format!("SELECT owner FROM nodes WHERE owner IS NOT NULL AND expires_at_ms > {now}"),
        &[],
    )?;
    rows.iter()
        .map(|r| Ok(u32::try_from(r.int(0)?).unwrap_or(0)))
        .collect::<Result<_, SqlError>>()
        .map_err(NodeError::from)
}

/// Buries `owner`, a node whose lease ran out, before its threads are adopted: locks its row
/// FOR UPDATE, which waits for every transaction of it still in flight (each holds the row in KEY
/// SHARE, see `fence.rs`), and sets its lease to 0, which no renewal extends. False when its
/// lease runs again (a renewal committed meanwhile): adopt nothing of it. An owner whose row is
/// gone (its name was taken over, which locked the row the same way) counts as buried.
pub(crate) fn bury(db: &mut Db, owner: u32) -> Result<bool, NodeError> {
    if db.engine() == Engine::Sqlite {
        return Ok(true);
    }
    let now = now_ms(db);
    db.begin_unlocked("")?;
    let done = (|| {
        let row = db.row(
            "SELECT expires_at_ms FROM nodes WHERE owner=?1 FOR UPDATE",
            params![owner],
        )?;
        if row.is_none() {
            return Ok(true);
        }
        let n = db.execute(
            &format!(
                "UPDATE nodes SET expires_at_ms = 0, live_threads = 0
                 WHERE owner=?1 AND expires_at_ms <= {now}"
            ),
            params![owner],
        )?;
        Ok::<bool, SqlError>(n == 1)
    })();
    match done {
        Ok(b) => {
            db.commit()?;
            Ok(b)
        }
        Err(e) => {
            db.rollback();
            Err(e.into())
        }
    }
}

/// [`live_owners_in`] the project's database (empty when no node ever joined it).
pub(crate) fn live_owners(project: &Project) -> Result<std::collections::HashSet<u32>, NodeError> {
    match open(project, false)? {
        Some(db) => live_owners_in(&db),
        None => Ok(Default::default()),
    }
}

impl Lease {
    /// The owner number this lease gave the process (None on SQLite).
    pub(crate) fn owner(&self) -> Option<u32> {
        self.owner
    }

    /// Runs the lease on from now, recording `live` threads; fails when the name was taken
    /// over meanwhile (this node's lease had expired: it must stop).
    pub(crate) fn renew(&mut self, live: i64) -> Result<(), NodeError> {
        let now = now_ms(&self.db);
        let n = self.db.execute(
            &format!(
                "UPDATE nodes SET expires_at_ms = {now} + ?3, live_threads = ?4
                 WHERE name=?1 AND epoch=?2 AND expires_at_ms > {now}"
            ),
            params![self.name.as_str(), self.epoch, self.length_ms, live],
        )?;
        match n {
            0 => Err(NodeError(format!(
                "node `{}` lost its lease (epoch {}): it ran out (another node may hold the name now)",
                self.name, self.epoch
            ))),
            _ => Ok(()),
        }
    }

    /// Gives the name up now (a clean stop).
    pub(crate) fn leave(&mut self) {
        let now = now_ms(&self.db);
        let _ = self.db.execute(
            &format!(
                "UPDATE nodes SET expires_at_ms = {now}, live_threads = 0 WHERE name=?1 AND epoch=?2"
            ),
            params![self.name.as_str(), self.epoch],
        );
    }
}

/// Every node of the project, by name.
pub(crate) fn list(project: &Project) -> Result<Vec<Node>, NodeError> {
    let Some(db) = open(project, false)? else {
        return Ok(Vec::new());
    };
    let now = now_ms(&db);
    db.query(
        &format!(
            "SELECT name, epoch, pid, host, addr, started_at, expires_at_ms - {now}, live_threads,
               max_live_threads FROM nodes ORDER BY name"
        ),
        &[],
    )?
    .iter()
    .map(|r| {
        let left = r.int(6)?;
        Ok(Node {
            name: r.text(0)?,
            epoch: r.int(1)?,
            pid: r.int(2)?,
            host: r.text(3)?,
            addr: r.text(4)?,
            started_at: r.text(5)?,
            lease_left_ms: left,
            alive: left > 0,
            live_threads: r.int(7)?,
            max_live_threads: r.opt_int(8)?,
        })
    })
    .collect::<Result<_, SqlError>>()
    .map_err(NodeError::from)
}
