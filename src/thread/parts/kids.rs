//! A thread's children and the calls waiting for them: who is live, whose report someone has
//! claimed, which waits are resolved, and which children handed off to a continuation.

use crate::core::ids::ThreadId;
use crate::core::status::Status;
use crate::thread::msg::ThreadMsg;
use crate::thread::report::ThreadReport;
use crate::tools::ToolOutcome;
use ractor::ActorRef;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};

/// One child.
#[derive(Default)]
pub(crate) struct Child {
    /// Its actor, once its spawn has reported.
    pub(crate) actor: Option<ActorRef<ThreadMsg>>,
    /// Its report, once it has ended.
    pub(crate) report: Option<ThreadReport>,
    /// Some call (spawn wait=true or wait_threads) has consumed or will consume the report.
    pub(crate) claimed: bool,
}

/// A tool call waiting for children (`spawn_thread` with wait, `wait_threads`).
pub(crate) struct Waiter {
    /// The call answered when they have all reported.
    pub(crate) call_id: String,
    /// Which wait of the thread this is (a call id can come again in a later turn: a timer
    /// set for an earlier wait must not answer it).
    serial: u64,
    /// The children it waits for.
    ids: Vec<ThreadId>,
    /// It asked for one child: answered with that child's report alone (else a list).
    single: bool,
    /// How many of `ids`, from the front, have reported: `ids[reported]` is the first that has
    /// not (reports are never taken back). Only that child's report can move the wait on, so a
    /// report looks at each wait once instead of rescanning its reported children; a parent of
    /// 1,000 children spawned with `wait` looked up half a million reports while they ended.
    reported: usize,
}

impl Waiter {
    /// The children it waits for.
    pub(crate) fn ids(&self) -> &[ThreadId] {
        &self.ids
    }

    /// It asked for one child.
    pub(crate) fn single(&self) -> bool {
        self.single
    }

    /// Moves past the children that have reported; true once they all have.
    fn advance(&mut self, map: &HashMap<ThreadId, Child>) -> bool {
        while let Some(id) = self.ids.get(self.reported) {
            if !has_reported(map, id) {
                return false;
            }
            self.reported += 1;
        }
        true
    }
}

/// Whether child `id` has reported.
fn has_reported(map: &HashMap<ThreadId, Child>, id: &ThreadId) -> bool {
    map.get(id).is_some_and(|c| c.report.is_some())
}

/// A thread's children and waits.
#[derive(Default)]
pub(crate) struct Kids {
    /// Every child, live or ended.
    pub(crate) map: HashMap<ThreadId, Child>,
    /// Calls waiting for children, in the order they were made.
    pub(crate) waiters: Vec<Waiter>,
    /// Waits made so far (the next one's serial).
    waits_made: u64,
    /// Reports nobody waits for, announced to the model before its next turn.
    pub(crate) announce: Vec<ThreadReport>,
    /// Children that handed off, to the continuation that took each one's place.
    pub(crate) continued: HashMap<ThreadId, ThreadId>,
    /// Spawns under way when `cancel_siblings` fired: their child is cancelled on arrival.
    pub(crate) doomed: HashSet<String>,
    /// Spawns whose task is still under way (by call id): a thread never finalizes before they
    /// report, so no child can start after its parent has ended.
    pub(crate) spawning: HashSet<String>,
}

impl Kids {
    /// Children started and not yet ended.
    pub(crate) fn live(&self) -> Vec<ThreadId> {
        self.map
            .iter()
            .filter(|(_, c)| c.report.is_none() && c.actor.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether any child is started and not yet ended. Allocates nothing and stops at the
    /// first: a parent asks this at each child's report, and collecting the live ids each time
    /// cost a parent of 1,000 children half a million id copies while they ended.
    pub(crate) fn any_live(&self) -> bool {
        self.map
            .values()
            .any(|c| c.report.is_none() && c.actor.is_some())
    }

    /// The entry of `id`, made empty if it has none yet.
    pub(crate) fn entry(&mut self, id: &ThreadId) -> &mut Child {
        self.map.entry(id.clone()).or_default()
    }

    /// Marks `id`'s report as some call's result.
    pub(crate) fn claim(&mut self, id: &ThreadId) {
        if let Some(c) = self.map.get_mut(id) {
            c.claimed = true;
        }
    }

    /// Whether every one of `ids` has reported.
    pub(crate) fn all_reported(&self, ids: &[ThreadId]) -> bool {
        ids.iter().all(|id| has_reported(&self.map, id))
    }

    /// `ids` with each child that handed off replaced by its last continuation (which answers
    /// in its place), each once, in their order.
    pub(crate) fn latest_ids(&self, ids: Vec<ThreadId>) -> Vec<ThreadId> {
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(ids.len());
        for mut id in ids {
            while let Some(next) = self.continued.get(&id) {
                id = next.clone();
            }
            if seen.insert(id.clone()) {
                out.push(id);
            }
        }
        out
    }

    /// Call `call_id` now waits for `ids` (answered by [`Self::take_ready`]). A child that
    /// handed off is waited for in its continuation: its own report, `continued`, is nobody's
    /// result, and a wait left on it would never be answered. Returns the wait's serial (see
    /// [`Self::take_waiter`]). `single`: it asked for one child.
    pub(crate) fn wait(&mut self, call_id: String, ids: Vec<ThreadId>, single: bool) -> u64 {
        self.waits_made += 1;
        let mut w = Waiter {
            call_id,
            serial: self.waits_made,
            single,
            ids: self.latest_ids(ids),
            reported: 0,
        };
        w.advance(&self.map);
        self.waiters.push(w);
        self.waits_made
    }

    /// Takes the waits that are complete now that `id` has reported (or its spawn, for a wait
    /// made after its report), the latest first.
    pub(crate) fn take_ready(&mut self, id: &ThreadId) -> Vec<Waiter> {
        let mut ready = Vec::new();
        for i in (0..self.waiters.len()).rev() {
            let w = &mut self.waiters[i];
            let done = match w.ids.get(w.reported) {
                Some(next) if next == id => w.advance(&self.map),
                Some(_) => false,
                None => true,
            };
            if done {
                ready.push(self.waiters.remove(i));
            }
        }
        ready
    }

    /// Takes the wait of tool call `call_id`.
    pub(crate) fn take_waiter(&mut self, call_id: &str, serial: u64) -> Option<Waiter> {
        let i = self
            .waiters
            .iter()
            .position(|w| w.call_id == call_id && w.serial == serial)?;
        Some(self.waiters.remove(i))
    }

    /// The continuation `new` takes child `old`'s place, waits included. The old child stays
    /// live until its own end is reported (so the parent never ends before it), but its
    /// `continued` report is nobody's result.
    pub(crate) fn rekey(&mut self, old: &ThreadId, new: ThreadId, actor: ActorRef<ThreadMsg>) {
        let claimed = std::mem::replace(&mut self.entry(old).claimed, true);
        self.map.insert(
            new.clone(),
            Child {
                actor: Some(actor),
                report: None,
                claimed,
            },
        );
        for w in &mut self.waiters {
            for (i, id) in w.ids.iter_mut().enumerate() {
                if id == old {
                    *id = new.clone();
                    // The continuation has not reported: the wait is back to it.
                    w.reported = w.reported.min(i);
                }
            }
        }
        self.continued.insert(old.clone(), new);
    }

    /// The last continuation of `child` (itself when it never handed off) and its actor.
    pub(crate) fn latest(
        &self,
        mut child: ThreadId,
        mut actor: ActorRef<ThreadMsg>,
    ) -> (ThreadId, ActorRef<ThreadMsg>) {
        while let Some(next) = self.continued.get(&child).cloned() {
            if let Some(a) = self.map.get(&next).and_then(|c| c.actor.clone()) {
                actor = a;
            }
            child = next;
        }
        (child, actor)
    }

    /// The result of a wait: each child's report, or `running` for those still live at a
    /// timeout; `single`: it asked for one child (its report alone, an error if it failed).
    pub(crate) fn wait_result(
        &self,
        ids: &[ThreadId],
        single: bool,
        timed_out: bool,
    ) -> ToolOutcome {
        let mut any_failed = false;
        let items: Vec<Value> = ids
            .iter()
            .map(
                |id| match self.map.get(id).and_then(|c| c.report.as_ref()) {
                    Some(r) => {
                        any_failed |= r.status != Status::Completed;
                        json!(r)
                    }
                    None => json!({ "thread_id": id, "status": "running" }),
                },
            )
            .collect();
        let single = single && ids.len() == 1;
        let mut out = if single && !timed_out {
            ToolOutcome::ok(items.into_iter().next().unwrap_or(Value::Null))
        } else {
            ToolOutcome::ok(json!({ "threads": items, "timed_out": timed_out }))
        };
        out.is_error = any_failed && single;
        out
    }

    /// Every live child whose actor it knows (those still spawning are withdrawn by the
    /// thread's cancel token, `SpawnRequest::withdrawn`).
    pub(crate) fn live_actors(&self) -> Vec<(ThreadId, ActorRef<ThreadMsg>)> {
        let actor = |id: ThreadId| {
            let a = self.map.get(&id)?.actor.clone()?;
            Some((id, a))
        };
        self.live().into_iter().filter_map(actor).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::ThreadRow;

    fn id(s: &str) -> ThreadId {
        ThreadId::parse(s).unwrap()
    }

    fn report(kids: &mut Kids, child: &str, status: Status) {
        let row = ThreadRow::new(id(child), id("root-1"), status);
        kids.entry(&id(child)).report = Some(ThreadReport::of_row(&row));
    }

    /// A wait is answered at the report of its last child, whatever the order of reports.
    #[test]
    fn a_wait_is_answered_when_its_last_child_reports() {
        let mut kids = Kids::default();
        kids.wait(
            "call_1".into(),
            vec![id("a-1"), id("b-1"), id("c-1")],
            false,
        );
        report(&mut kids, "b-1", Status::Completed);
        assert!(kids.take_ready(&id("b-1")).is_empty());
        report(&mut kids, "a-1", Status::Completed);
        assert!(kids.take_ready(&id("a-1")).is_empty());
        report(&mut kids, "c-1", Status::Error);
        let ready = kids.take_ready(&id("c-1"));
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].call_id, "call_1");
        assert!(kids.waiters.is_empty());
    }

    /// A wait made after its child ended (a spawn reported late) is answered at once.
    #[test]
    fn a_wait_on_a_child_that_already_ended_is_answered_at_once() {
        let mut kids = Kids::default();
        report(&mut kids, "a-1", Status::Completed);
        kids.wait("call_1".into(), vec![id("a-1")], false);
        assert_eq!(kids.take_ready(&id("a-1")).len(), 1);
    }

    /// A timeout set for an earlier wait of the same call id answers nothing later.
    #[test]
    fn a_timeout_answers_only_the_wait_it_was_set_for() {
        let mut kids = Kids::default();
        let first = kids.wait("call_1".into(), vec![id("a-1")], false);
        report(&mut kids, "a-1", Status::Completed);
        assert_eq!(kids.take_ready(&id("a-1")).len(), 1);
        let second = kids.wait("call_1".into(), vec![id("b-1")], false);
        assert!(kids.take_waiter("call_1", first).is_none());
        assert!(kids.take_waiter("call_1", second).is_some());
    }

    /// A wait that asked for two ids of one chain (a child and its continuation) is answered
    /// with a list, as asked, though it waits for one child.
    #[test]
    fn a_wait_keeps_the_shape_it_asked_for() {
        let mut kids = Kids::default();
        kids.continued.insert(id("a-1"), id("a-2"));
        kids.wait("call_1".into(), vec![id("a-1"), id("a-2")], false);
        report(&mut kids, "a-2", Status::Error);
        let w = kids.take_ready(&id("a-2")).pop().unwrap();
        assert_eq!(w.ids(), &[id("a-2")]);
        let out = kids.wait_result(w.ids(), w.single(), false);
        let v: Value = serde_json::from_str(&out.content).unwrap();
        assert_eq!(v["threads"].as_array().map(Vec::len), Some(1), "{v}");
        assert!(!out.is_error, "a list is not an error");
    }

    /// A wait naming a child that already handed off waits for its continuation, once: the
    /// handed-off child's own report (`continued`) neither answers it nor leaves it hanging.
    #[test]
    fn a_wait_on_a_handed_off_child_is_answered_by_its_continuation() {
        let mut kids = Kids::default();
        kids.continued.insert(id("a-1"), id("a-2"));
        kids.continued.insert(id("a-2"), id("a-3"));
        kids.wait(
            "call_1".into(),
            vec![id("a-1"), id("a-3"), id("b-1")],
            false,
        );
        assert_eq!(kids.waiters[0].ids(), &[id("a-3"), id("b-1")]);
        report(&mut kids, "b-1", Status::Completed);
        report(&mut kids, "a-1", Status::Continued);
        assert!(kids.take_ready(&id("b-1")).is_empty());
        // A `continued` report resolves no wait (`child_finished` returns before).
        report(&mut kids, "a-3", Status::Completed);
        assert_eq!(kids.take_ready(&id("a-3")).len(), 1);
    }
}
