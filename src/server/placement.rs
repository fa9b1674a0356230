//! A node's placement of children (#26; `thread/placed.rs` has the thread's side): the queue of
//! children waiting for a node with room (`placements` on the project's Postgres database), the
//! [`NodePlacer`] a node's runtime places through when it runs `max_live_threads` threads, and
//! the loop that takes queued children while the node has room (`FOR UPDATE SKIP LOCKED`: each
//! is taken by one node). A placed child's end and a cancel of it travel as API requests to the
//! owner of the thread concerned (`peer::request`, through the database between nodes).

use crate::core::ids::ThreadId;
use crate::project::Project;
use crate::runtime::{Runtime, WeakRuntime};
use crate::sql::{params, Db, Step};
use crate::thread::placer::{Placed, Placer};
use crate::thread::ThreadReport;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The queue (its own schema concern).
const STEPS: &[Step] = &[
    Step {
        sql: "CREATE TABLE IF NOT EXISTS placements(child TEXT PRIMARY KEY, parent TEXT NOT NULL,
           parent_owner INTEGER NOT NULL, request TEXT NOT NULL, queued_at TEXT NOT NULL)",
        postgres: None,
    },
    // The node that took the child and is starting it (the row goes once it is registered).
    Step {
        sql: "ALTER TABLE placements ADD COLUMN taken_by INTEGER",
        postgres: None,
    },
];

/// How often a node with room looks at the queue (and at once when a child is queued: the
/// queuing node notifies [`CHANNEL`]).
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// How often, and how long apart, a placed child's end is sent to its parent's node until taken.
/// Bounded (a node's shutdown waits for it): a live parent's stand-in, and the adopter of a
/// dead parent, also read the child's registry row and settle it from there.
const REPORT_TRIES: u32 = 30;
const REPORT_AGAIN: Duration = Duration::from_secs(1);

/// The notification channel of the queue.
const CHANNEL: &str = "weft_placements";

/// A child taken from the queue: its id, its parent's, and what it starts from (or why that
/// does not parse).
type Taken = (ThreadId, ThreadId, Result<Placed, String>);

/// A node's placer: full at `max_live` live threads.
pub(crate) struct NodePlacer {
    project: Project,
    rt: WeakRuntime,
    max_live: Option<usize>,
    db: Mutex<Option<Db>>,
}

impl NodePlacer {
    /// The placer of node runtime `rt`, full at `max_live` live threads (never, without).
    pub(crate) fn new(rt: &Runtime, max_live: Option<usize>) -> Arc<NodePlacer> {
        Arc::new(NodePlacer {
            project: rt.project().clone(),
            rt: rt.downgrade(),
            max_live,
            db: Mutex::new(None),
        })
    }

    /// Runs `work` on the queue's connection (made, and the table with it, when missing).
    fn with<T>(&self, work: impl FnOnce(&mut Db) -> Result<T, String>) -> Result<T, String> {
        let mut guard = self
            .db
            .lock()
            .map_err(|_| "placement: lock poisoned".to_string())?;
        if guard.is_none() {
            let url = self.project.config().map_err(|e| e.to_string())?.database;
            let url = url.ok_or("placing children needs the project's Postgres database")?;
            let mut db = Db::postgres(&url).map_err(|e| e.to_string())?;
            crate::sql::migrate(&mut db, "placements", STEPS).map_err(|e| e.to_string())?;
            *guard = Some(db);
        }
        let done = work(guard.as_mut().expect("made above"));
        if done.is_err() {
            *guard = None; // a broken connection is made again next time
        }
        done
    }

    /// Takes the oldest queued child, if any — its own node's too (it has room again; or it is
    /// the only node) — and one taken by a node whose lease ran out before it registered the
    /// child. The row stays, marked taken, until the child is registered ([`Self::done`]).
    fn take(&self) -> Result<Option<Taken>, String> {
        let me = crate::core::owner::me();
        self.with(|db| {
            let now = crate::runtime::node::now_ms(db);
            let row = db
                .row(
                    &format!(
                        "UPDATE placements SET taken_by = ?1 WHERE child = (SELECT child FROM placements
                           WHERE taken_by IS NULL OR taken_by NOT IN
                             (SELECT owner FROM nodes WHERE owner IS NOT NULL AND expires_at_ms > {now})
                           ORDER BY queued_at LIMIT 1 FOR UPDATE SKIP LOCKED)
                         RETURNING child, parent, request"
                    ),
                    params![me],
                )
                .map_err(|e| e.to_string())?;
            let Some(r) = row else { return Ok(None) };
            let text = |i| r.text(i).map_err(|e| e.to_string());
            let child = ThreadId::parse(&text(0)?).map_err(|e| e.to_string())?;
            let parent = ThreadId::parse(&text(1)?).map_err(|e| e.to_string())?;
            let placed = serde_json::from_str(&text(2)?)
                .map_err(|e| format!("its queued request does not parse: {e}"));
            Ok(Some((child, parent, placed)))
        })
    }

    /// Child `child`, taken from the queue, is registered (or reported as not started): its
    /// row goes.
    fn done(&self, child: &ThreadId) {
        let gone = self.with(|db| {
            db.execute(
                "DELETE FROM placements WHERE child=?1",
                params![child.as_str()],
            )
            .map_err(|e| e.to_string())
        });
        if let Err(e) = gone {
            tracing::warn!(thread = %child, "placement queue: cannot remove a started child: {e}");
        }
    }

    /// The owner of thread `id` in the registry, waiting up to 10 s for its row (a child just
    /// taken from the queue registers as it starts, after a spawn slot).
    async fn owner_of(rt: &Runtime, id: &ThreadId) -> Option<u32> {
        for _ in 0..100 {
            if let Ok(Some(v)) = rt.get(id) {
                return Some(v.row.owner_pid);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }
}

impl Placer for NodePlacer {
    fn max_live(&self) -> Option<usize> {
        self.max_live
    }

    fn queue(&self, child: &ThreadId, parent: &ThreadId, placed: &Placed) -> Result<(), String> {
        let request = serde_json::to_string(placed).map_err(|e| e.to_string())?;
        self.with(|db| {
            db.execute(
                "INSERT INTO placements(child, parent, parent_owner, request, queued_at) VALUES(?1, ?2, ?3, ?4, ?5)",
                params![
                    child.as_str(),
                    parent.as_str(),
                    crate::core::owner::me(),
                    request,
                    crate::core::ids::now_ts()
                ],
            )
            .map_err(|e| e.to_string())?;
            // Wakes the nodes with room at once (they also look on their own).
            let _ = db.notify(CHANNEL);
            Ok(())
        })
    }

    fn cancel(&self, child: ThreadId, reason: String) -> crate::provider::BoxFuture<bool> {
        // Withdrawn only while no node has taken it.
        let withdrawn = self.with(|db| {
            db.execute(
                "DELETE FROM placements WHERE child=?1 AND taken_by IS NULL",
                params![child.as_str()],
            )
            .map_err(|e| e.to_string())
        });
        let (rt, project) = (Runtime::upgrade(&self.rt), self.project.clone());
        Box::pin(async move {
            if matches!(withdrawn, Ok(1)) {
                return true;
            }
            let Some(rt) = rt else { return false };
            let Some(owner) = NodePlacer::owner_of(&rt, &child).await else {
                tracing::warn!(thread = %child, "placed child to cancel not found in the registry");
                return false;
            };
            let req = json!({ "method": "POST", "path": format!("/v1/threads/{child}/cancel"),
                              "body": { "reason": reason } });
            if let Err(e) = super::peer::request(&project, owner, &req).await {
                tracing::warn!(thread = %child, "cannot cancel the placed child: {e}");
            }
            false
        })
    }

    fn report(&self, parent: ThreadId, report: ThreadReport) -> crate::provider::BoxFuture<()> {
        let (rt, project) = (Runtime::upgrade(&self.rt), self.project.clone());
        Box::pin(async move {
            let Some(rt) = rt else { return };
            let child = report.thread_id.clone();
            let req = json!({ "method": "POST", "path": format!("/v1/threads/{child}/placed_end"),
                              "body": report });
            // Until it is taken: the parent's node may be dead and its threads not yet adopted
            // (then the adopter, the parent's owner by then, settles it).
            for attempt in 0..REPORT_TRIES {
                if attempt > 0 {
                    tokio::time::sleep(REPORT_AGAIN).await;
                }
                let Some(owner) = NodePlacer::owner_of(&rt, &parent).await else {
                    continue;
                };
                match super::peer::request(&project, owner, &req).await {
                    Ok(r) if r["status"].as_u64().is_some_and(|s| s < 300) => return,
                    other => {
                        tracing::warn!(thread = %child, attempt, "its parent's node did not take its end (trying again): {other:?}")
                    }
                }
            }
            tracing::error!(thread = %child, "its parent's node never took its end: its guarantee stays held until the parent's tree is recovered");
        })
    }
}

/// Takes queued children while `placer`'s node has room, until the runtime is gone.
pub(crate) fn take_queued(rt: &Runtime, placer: Arc<NodePlacer>) -> tokio::task::JoinHandle<()> {
    let weak = rt.downgrade();
    let project = rt.project().clone();
    tokio::spawn(async move {
        let wake = super::relay::listen(&project, CHANNEL.to_string()).await;
        let mut took = false;
        loop {
            // Again at once after a child was taken: the queue may hold more.
            if !took {
                super::relay::nap(wake.as_deref(), LOOK_EVERY).await;
            }
            took = false;
            let Some(rt) = Runtime::upgrade(&weak) else {
                return;
            };
            // Room here first: a child taken from the queue has its place.
            let Some(place) = rt.room(placer.max_live) else {
                continue;
            };
            let p = placer.clone();
            let taken = tokio::task::spawn_blocking(move || p.take())
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            match taken {
                Ok(Some((child, parent, placed))) => {
                    took = true;
                    let placer = placer.clone();
                    tokio::spawn(async move {
                        start(&rt, &placer, place, child, parent, placed).await;
                    });
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("placement queue: {e}"),
            }
        }
    })
}

/// Starts a child taken from the queue; one that cannot start is reported ended to its parent.
/// One already registered was started by a node that died before it took the row away: that
/// node's adopter has it.
async fn start(
    rt: &Runtime,
    placer: &Arc<NodePlacer>,
    place: crate::thread::slot::Slot,
    child: ThreadId,
    parent: ThreadId,
    placed: Result<Placed, String>,
) {
    if matches!(rt.get(&child), Ok(Some(_))) {
        placer.done(&child);
        return;
    }
    let started = match placed {
        Ok(p) => {
            let directive = p.directive.clone();
            let started = rt
                .start_placed(place, child.clone(), parent.clone(), p)
                .await;
            started.map_err(|e| (directive, e.to_string()))
        }
        Err(e) => Err((String::new(), e)),
    };
    match started {
        Ok(id) => {
            tracing::info!(thread = %id, parent = %parent, "started a child placed here");
            placer.done(&child);
        }
        Err((directive, e)) => {
            tracing::warn!(thread = %child, "a placed child could not start: {e}");
            let error = crate::core::status::Status::Error;
            let report = crate::thread::placed::not_started(&child, &directive, error, &e);
            placer.done(&child);
            placer.report(parent, report).await;
        }
    }
}
