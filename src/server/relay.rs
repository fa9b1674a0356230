//! Steering a thread that another node runs, through the database (SPEC §13): the asking node
//! writes the API request into a `relay` row addressed to the owner number of the node that
//! runs the thread; that node takes its rows (`FOR UPDATE SKIP LOCKED`), answers each with the
//! same handlers as its HTTP and control socket (`control::handle`), and writes the reply into
//! the row, which the asker reads and deletes (the answering loop is `control::answer_relayed`).
//! The asker wakes the owner with a notification (`pg_notify` on the owner's channel), and the
//! owner also looks every 500 ms (every 100 ms without notifications), so a cancel, an
//! injected message, an approval or a denial takes effect well within a second; an asker
//! waits at most 10 s, and is refused at once when the owner's lease is not running (its threads
//! are being adopted). A request from a process that is not a node reaches a node the same way.
//! On SQLite (one machine) owners are processes, reached over their control sockets (`peer.rs`).

use crate::project::Project;
use crate::sql::{params, Db, Step};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The relay table (its own schema concern).
const STEPS: &[Step] = &[Step {
    sql: "CREATE TABLE IF NOT EXISTS relay(id INTEGER PRIMARY KEY AUTOINCREMENT,
           owner INTEGER NOT NULL, request TEXT NOT NULL, reply TEXT)",
    postgres: Some(
        "CREATE TABLE IF NOT EXISTS relay(id BIGSERIAL PRIMARY KEY, owner BIGINT NOT NULL,
           request TEXT NOT NULL, reply TEXT);
         CREATE INDEX IF NOT EXISTS relay_waiting ON relay(owner) WHERE reply IS NULL",
    ),
}];

/// How often a node looks for requests addressed to it when it has no notifications (its
/// listening session could not start); with them, it looks at each notification and every
/// [`LOOK_ANYWAY`] (a notification can be lost).
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(100);

/// How often a node that is woken by notifications looks all the same.
pub(super) const LOOK_ANYWAY: Duration = Duration::from_millis(500);

/// The notification channel of node owner `owner`'s requests.
pub(super) fn channel(owner: u32) -> String {
    format!("weft_relay_{owner}")
}

/// Listens for notifications on `channel` of `project`'s database; None (the caller polls
/// only) when it cannot.
pub(super) async fn listen(
    project: &Project,
    channel: String,
) -> Option<std::sync::Arc<tokio::sync::Notify>> {
    let url = project.config().ok()?.database?;
    let listening =
        tokio::task::spawn_blocking(move || Db::listen(&url, std::slice::from_ref(&channel)))
            .await
            .ok()?;
    listening
        .map_err(|e| tracing::warn!("no notifications, polling only: {e}"))
        .ok()
}

/// Waits `every`, or less when `wake` is notified first.
pub(super) async fn nap(wake: Option<&tokio::sync::Notify>, every: Duration) {
    match wake {
        Some(w) => drop(tokio::time::timeout(every, w.notified()).await),
        None => tokio::time::sleep(every).await,
    }
}

/// How long an asker waits for the answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Asks that wait for their answers at once, at most, in one process (each holds a connection
/// while it waits: a node relaying thousands of placed children's ends must not use up the
/// server's connections).
const ASKING_AT_ONCE: usize = 8;
static ASKING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(ASKING_AT_ONCE);

/// Connections of earlier asks, kept for the next ones (by database).
static IDLE: std::sync::Mutex<Vec<(String, Db)>> = std::sync::Mutex::new(Vec::new());

/// The project's database.
fn url_of(project: &Project) -> Result<crate::sql::DatabaseUrl, String> {
    let config = project.config().map_err(|e| e.to_string())?;
    config.database.ok_or_else(|| {
        "steering another node needs the project's Postgres database (`database:`)".into()
    })
}

/// The relay table of the database `url`.
fn open_at(url: &crate::sql::DatabaseUrl) -> Result<Db, String> {
    let mut db = Db::postgres(url).map_err(|e| e.to_string())?;
    crate::sql::migrate(&mut db, "relay", STEPS).map_err(|e| e.to_string())?;
    Ok(db)
}

/// The project's relay table.
fn open(project: &Project) -> Result<Db, String> {
    open_at(&url_of(project)?)
}

/// A connection to ask through: an idle one of the project's database, else a new one.
fn asker(project: &Project) -> Result<(String, Db), String> {
    let url = url_of(project)?;
    let key = url.secret().to_string();
    let idle = IDLE.lock().ok().and_then(|mut v| {
        let at = v.iter().position(|(k, _)| *k == key)?;
        Some(v.swap_remove(at).1)
    });
    match idle {
        Some(db) => Ok((key, db)),
        None => Ok((key, open_at(&url)?)),
    }
}

/// Sends API request `req` to the node whose owner number is `owner` and returns its reply
/// (`{"status", "body"}`, as the control socket answers).
pub(crate) async fn ask(project: &Project, owner: u32, req: &Value) -> Result<Value, String> {
    let turn = ASKING.acquire().await.map_err(|e| format!("relay: {e}"))?;
    let (project, req) = (project.clone(), req.to_string());
    tokio::task::spawn_blocking(move || {
        // Held until the connection is back (the caller may stop waiting before).
        let _turn = turn;
        let (key, db) = asker(&project)?;
        let asked = ask_now(&db, owner, &req);
        // Kept for the next ask (a connection the server dropped is made again on its use).
        if let Ok(mut idle) = IDLE.lock() {
            if idle.len() < ASKING_AT_ONCE {
                idle.push((key, db));
            }
        }
        asked
    })
    .await
    .map_err(|e| format!("relay: {e}"))?
}

fn ask_now(db: &Db, owner: u32, req: &str) -> Result<Value, String> {
    let live = crate::runtime::node::live_owners_in(db).map_err(|e| e.to_string())?;
    if !live.contains(&owner) {
        return Err(format!(
            "the node that runs this thread (owner {owner}) is not running: its lease ran out, and a live node adopts its threads shortly"
        ));
    }
    let id = db
        .row(
            "INSERT INTO relay(owner, request) VALUES(?1, ?2) RETURNING id",
            params![owner, req],
        )
        .and_then(|r| r.map_or(Ok(0), |r| r.int(0)))
        .map_err(|e| e.to_string())?;
    // Wakes the owner at once (it also looks on its own, should this be lost).
    let _ = db.notify(&channel(owner));
    let start = Instant::now();
    while start.elapsed() < ANSWER_WITHIN {
        let reply = db
            .row("SELECT reply FROM relay WHERE id=?1", params![id])
            .and_then(|r| r.map(|r| r.opt_text(0)).transpose())
            .map_err(|e| e.to_string())?
            .flatten()
            .filter(|r| !r.is_empty());
        if let Some(reply) = reply {
            let _ = db.execute("DELETE FROM relay WHERE id=?1", params![id]);
            return serde_json::from_str(&reply)
                .map_err(|e| format!("bad reply from node owner {owner}: {e}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = db.execute("DELETE FROM relay WHERE id=?1", params![id]);
    Err(format!(
        "the node that runs this thread (owner {owner}) did not answer within {} s",
        ANSWER_WITHIN.as_secs()
    ))
}

/// Takes the unanswered requests addressed to `me` (marked taken with an empty reply).
pub(super) async fn take(
    project: Project,
    db: Option<Db>,
    me: u32,
) -> (Option<Db>, Vec<(i64, Value)>) {
    let done = tokio::task::spawn_blocking(move || {
        let db = match db.map_or_else(|| open(&project), Ok) {
            Ok(db) => db,
            Err(e) => {
                tracing::warn!("relay: {e}");
                return (None, Vec::new());
            }
        };
        let rows = db.query(
            "UPDATE relay SET reply='' WHERE id IN (SELECT id FROM relay WHERE owner=?1 AND reply IS NULL
               ORDER BY id LIMIT 16 FOR UPDATE SKIP LOCKED) RETURNING id, request",
            params![me],
        );
        let taken = match rows {
            Ok(rows) => rows
                .iter()
                .filter_map(|r| {
                    // A request that does not parse is answered too (400), never left waiting.
                    let req = r.text(1).ok().and_then(|t| serde_json::from_str(&t).ok());
                    Some((r.int(0).ok()?, req.unwrap_or(Value::Null)))
                })
                .collect(),
            Err(e) => {
                tracing::warn!("relay: {e}");
                return (None, Vec::new());
            }
        };
        (Some(db), taken)
    })
    .await;
    done.unwrap_or((None, Vec::new()))
}

/// Writes the reply to request `id`.
pub(super) async fn reply_to(db: Option<Db>, id: i64, reply: String) -> Option<Db> {
    let db = db?;
    tokio::task::spawn_blocking(move || {
        if let Err(e) = db.execute("UPDATE relay SET reply=?2 WHERE id=?1", params![id, reply]) {
            tracing::warn!("relay: cannot answer request {id}: {e}");
            return None;
        }
        Some(db)
    })
    .await
    .ok()
    .flatten()
}
