//! What places children on other nodes (#26), as the thread room sees it: the [`Placer`] a
//! node sets on its runtime, what a placed child starts from ([`Placed`]), and the runtime's
//! [`Placement`] state (the placer, and the stand-ins of children placed elsewhere; see
//! `placed.rs`).
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use super::msg::ThreadMsg;
use super::report::ThreadReport;
use super::slot::Slot;
use crate::core::ids::ThreadId;
use crate::core::limits::LimitSet;
use ractor::ActorRef;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What places children on other nodes (the node that serves; see `server/placement.rs`).
pub(crate) trait Placer: Send + Sync {
    /// How many threads this node runs at most before its children go to nodes with room
    /// (None: no bound).
    fn max_live(&self) -> Option<usize>;
    /// Queues child `child` of `parent` (its budget set aside, its account placed), started
    /// from `req`'s directive, inputs and limits by a node with room.
    fn queue(&self, child: &ThreadId, parent: &ThreadId, placed: &Placed) -> Result<(), String>;
    /// Stops placed child `child`: withdrawn while still queued (true), else cancelled where
    /// it runs (false; its end comes back as a report).
    fn cancel(&self, child: ThreadId, reason: String) -> crate::provider::BoxFuture<bool>;
    /// Tells `parent`'s node that placed child `report.thread_id`, run here, ended.
    fn report(&self, parent: ThreadId, report: ThreadReport) -> crate::provider::BoxFuture<()>;
}

/// What a placed child starts from, as its parent's node queued it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Placed {
    /// Its directive.
    pub directive: String,
    /// Its inputs.
    pub inputs: serde_json::Map<String, serde_json::Value>,
    /// The limits its parent's call asked (they only lower), as [`limits_json`] writes them.
    pub overrides: serde_json::Value,
}

/// `set` as JSON (each limit given, money in nanos, durations in milliseconds).
fn limits_json(set: &LimitSet) -> serde_json::Value {
    serde_json::json!({
        "turns": set.turns, "tokens": set.tokens, "spend_nanos": set.spend.map(|n| n.0),
        "duration_ms": set.duration.map(|d| d.as_millis() as u64), "depth": set.depth,
        "spawns": set.spawns, "concurrency": set.concurrency,
    })
}

/// [`limits_json`] read back (what is missing or not a number is not set).
fn limits_of(v: &serde_json::Value) -> LimitSet {
    let u = |k: &str| v[k].as_u64();
    LimitSet {
        turns: u("turns"),
        tokens: u("tokens"),
        spend: v["spend_nanos"].as_i64().map(crate::core::money::Nanos),
        duration: u("duration_ms").map(std::time::Duration::from_millis),
        depth: v["depth"].as_i64(),
        spawns: u("spawns"),
        concurrency: u("concurrency"),
    }
}

impl Placed {
    /// What a child of `directive`, `inputs` and limits `overrides` starts from.
    pub(crate) fn new(
        directive: &str,
        inputs: &serde_json::Map<String, serde_json::Value>,
        overrides: &LimitSet,
    ) -> Placed {
        Placed {
            directive: directive.to_string(),
            inputs: inputs.clone(),
            overrides: limits_json(overrides),
        }
    }

    /// The limits it was asked to start under.
    pub(crate) fn limits(&self) -> LimitSet {
        limits_of(&self.overrides)
    }
}

/// A runtime's placement: who places, how many threads live here, and the stand-ins of its
/// threads' placed children.
#[derive(Default)]
pub(crate) struct Placement {
    /// Threads whose actors live here, and places taken for threads starting here (see
    /// [`Slot`]).
    live: Arc<AtomicUsize>,
    /// What places children on other nodes when this one is full (set by a node that serves).
    pub placer: OnceLock<Arc<dyn Placer>>,
    /// The stand-ins of children placed on other nodes, by child.
    pub stand_ins: Mutex<HashMap<ThreadId, ActorRef<ThreadMsg>>>,
}

impl Placement {
    /// A place for a thread that starts here whatever the count (a root, a resume, a hook's
    /// spawn, a child given files).
    pub(crate) fn slot(&self) -> Slot {
        self.live.fetch_add(1, Ordering::SeqCst);
        Slot::of(self.live.clone())
    }

    /// A place for a thread that may start elsewhere: None when `max` live here already.
    pub(crate) fn try_slot(&self, max: usize) -> Option<Slot> {
        let taken = self
            .live
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            });
        taken.ok().map(|_| Slot::of(self.live.clone()))
    }

    /// How many threads live here.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}
