//! Live events for SSE clients: one pump turns the runtime's [`Event`]s into numbered items kept
//! in a bounded journal and fanned out to every client. An item's SSE id is
//! `<boot>.<n>.<ms>` (this server's start, its number, its time): a client reconnecting with
//! `Last-Event-ID` gets the journal's items after `n`, or — when the journal no longer holds
//! them or the id is from an earlier server — every transcript line of the threads in its scope
//! since `ms`, so it misses nothing that is still in the transcripts (it may see some twice).
//! One request replays at most [`MAX_REPLAY_THREADS`] threads and [`MAX_REPLAY_ITEMS`] items
//! (a stale id cannot make it read every transcript of the project); past that it gets a
//! `lagged` event saying where the rest is. An id is outside input: any numbers in it are
//! answered, never a panic (a time in the future is now).
//!
//! Slow clients never slow threads: the pump never waits on a client; a client that falls
//! behind the fan-out channel catches up from the journal.

use crate::core::ids::ThreadId;
use crate::runtime::Runtime;
use crate::thread::Event;
use axum::body::Bytes;
use serde_json::{json, Value};
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// Items the journal keeps for reconnecting and lagging clients.
const JOURNAL: usize = 65_536;
/// Threads whose transcripts one reconnecting client's replay reads at most (newest first).
const MAX_REPLAY_THREADS: usize = 200;
/// Items one replay sends at most (the newest).
const MAX_REPLAY_ITEMS: usize = 10_000;

/// One event as clients get it.
#[derive(Debug)]
pub(crate) struct Item {
    /// Its number (0 for an item replayed from a transcript).
    pub n: u64,
    /// The thread it is about (None: every client gets it, e.g. `lagged`).
    pub thread: Option<ThreadId>,
    /// For `thread_started`: the parent (subtree streams follow new children through it).
    pub parent: Option<ThreadId>,
    /// The whole SSE frame (`event:`, `id:`, `data:`), made once for every client.
    pub frame: Bytes,
}

impl Item {
    fn new(
        n: u64,
        id: String,
        name: &'static str,
        thread: Option<ThreadId>,
        parent: Option<ThreadId>,
        data: &Value,
    ) -> Item {
        // serde_json escapes newlines inside strings, so the data is one line.
        let frame = format!("event: {name}\nid: {id}\ndata: {data}\n\n");
        Item {
            n,
            thread,
            parent,
            frame: Bytes::from(frame),
        }
    }
}

/// The journal and the fan-out of one server.
pub(crate) struct Hub {
    boot: u64,
    journal: Mutex<VecDeque<Arc<Item>>>,
    tx: broadcast::Sender<Arc<Item>>,
    /// The number of the last item published.
    last: std::sync::atomic::AtomicU64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The SSE name and data of a transcript line of `thread`: tool calls and results, LLM calls'
/// costs, a thread's start and end (a replay from transcripts rebuilds those from their lines).
/// Other lines (messages, checkpoints, bookkeeping) are not sent: with 100 clients on a 10×4
/// tree they doubled the frames for little (a client reads the transcript for them).
pub(crate) fn line_item(
    thread: &ThreadId,
    seq: i64,
    kind: &str,
    data: &Value,
) -> Option<(&'static str, Value)> {
    let t = thread.as_str();
    Some(match kind {
        "checkpoint" | "status" => return None,
        "thread_started" => (
            "thread_started",
            json!({ "thread_id": t, "parent_id": data["parent"], "directive": data["directive"], "seq": seq }),
        ),
        "thread_finished" => {
            let mut d = data.clone();
            d["thread_id"] = json!(t);
            d["seq"] = json!(seq);
            ("thread_finished", d)
        }
        "tool_use" => (
            "tool_call",
            json!({ "thread_id": t, "seq": seq, "call_id": data["id"], "name": data["name"], "input": data["input"] }),
        ),
        "tool_result" => (
            "tool_result",
            json!({ "thread_id": t, "seq": seq, "call_id": data["id"], "is_error": data["is_error"], "content": data["content"] }),
        ),
        "emit" => (
            "emit",
            json!({ "thread_id": t, "seq": seq, "event": data["event"], "data": data["data"] }),
        ),
        "llm_call" => (
            "cost",
            json!({ "thread_id": t, "seq": seq, "model": data["model"], "usage": data["usage"],
                    "cost_nanos": data["cost_nanos"], "error": data.get("error") }),
        ),
        _ => return None,
    })
}

/// The SSE name, data and (for a start) parent of a live event.
fn event_item(ev: &Event) -> Option<(&'static str, Value, Option<ThreadId>)> {
    Some(match ev {
        Event::Started {
            id,
            parent,
            directive,
        } => (
            "thread_started",
            json!({ "thread_id": id, "parent_id": parent, "directive": directive }),
            parent.clone(),
        ),
        Event::Turn { id, turns, spend } => (
            "turn",
            json!({ "thread_id": id, "turns": turns, "own_spend_nanos": spend.0 }),
            None,
        ),
        Event::Waiting { id, waiting } => (
            "waiting",
            json!({ "thread_id": id, "waiting": waiting }),
            None,
        ),
        Event::Status { id, text } => ("status", json!({ "thread_id": id, "text": text }), None),
        Event::Finished(r) => {
            let mut d = serde_json::to_value(r).unwrap_or_default();
            d["thread_id"] = json!(r.thread_id);
            ("thread_finished", d, None)
        }
        Event::Line {
            id,
            seq,
            kind,
            data,
        } => {
            // The start and the end come as their own events.
            if kind == "thread_finished" {
                return None;
            }
            let (name, d) = line_item(id, *seq, kind, data)?;
            (name, d, None)
        }
        Event::Token { id, text } => ("token", json!({ "thread_id": id, "text": text }), None),
    })
}

impl Hub {
    /// Starts the pump for `rt`'s events.
    pub(crate) fn start(rt: &Runtime) -> Arc<Hub> {
        let (tx, _) = broadcast::channel(1024);
        let hub = Arc::new(Hub {
            boot: now_ms(),
            journal: Mutex::new(VecDeque::with_capacity(1024)),
            tx,
            last: Default::default(),
        });
        let mut rx = rt.events();
        let pump = hub.clone();
        // Its own OS thread: as a task it got one turn in a hundred beside busy clients and fell
        // behind the threads (measured: half the events of the 10×4 tree lost with 100 clients).
        let spawned = std::thread::Builder::new().name("weft-sse-pump".into()).spawn(move || {
            loop {
                // Only the pump holds the hub: its server is gone.
                if Arc::strong_count(&pump) == 1 {
                    return;
                }
                let (name, data, parent, thread) = match rx.blocking_recv() {
                    Ok(ev) => match event_item(&ev) {
                        Some((name, data, parent)) => {
                            (name, data, parent, Some(ev.thread_id().clone()))
                        }
                        None => continue,
                    },
                    // Every client is told, so it can read what it missed (the page re-lists).
                    Err(broadcast::error::RecvError::Lagged(k)) => {
                        tracing::warn!("the event pump fell {k} events behind the threads; SSE clients are told to catch up from the API");
                        ("lagged", json!({ "missed": k }), None, None)
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                pump.publish(name, thread, parent, &data);
            }
        });
        if let Err(e) = spawned {
            tracing::error!("cannot start the event pump: {e}; SSE clients get no live events");
        }
        hub
    }

    /// Numbers an item, keeps it in the journal and sends it to every client (in the journal's
    /// order: both under its lock).
    pub(crate) fn publish(
        &self,
        name: &'static str,
        thread: Option<ThreadId>,
        parent: Option<ThreadId>,
        data: &Value,
    ) {
        let Ok(mut j) = self.journal.lock() else {
            return;
        };
        let n = self.last.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let id = format!("{}.{n}.{}", self.boot, now_ms());
        let item = Arc::new(Item::new(n, id, name, thread, parent, data));
        if j.len() >= JOURNAL {
            j.pop_front();
        }
        j.push_back(item.clone());
        let _ = self.tx.send(item);
    }

    /// Subscribes a client that has seen up to `last_id` (its `Last-Event-ID`), over `scope`.
    /// Returns what it missed and the live feed after it.
    pub(crate) fn subscribe(
        &self,
        rt: &Runtime,
        last_id: Option<&str>,
        scope: &mut Scope,
    ) -> (Vec<Arc<Item>>, Feed) {
        // Subscribed before the journal is read: nothing falls between the two.
        let rx = self.tx.subscribe();
        let journal: Vec<Arc<Item>> = self
            .journal
            .lock()
            .map(|j| j.iter().cloned().collect())
            .unwrap_or_default();
        let newest = journal.last().map_or(0, |i| i.n);
        let oldest = journal.first().map_or(newest + 1, |i| i.n);
        let mut missed = Vec::new();
        match last_id.and_then(parse_id) {
            Some((boot, n, _)) if boot == self.boot && n.saturating_add(1) >= oldest => {
                for i in journal.iter().filter(|i| i.n > n) {
                    if scope.admits(i) {
                        missed.push(i.clone());
                    }
                }
            }
            Some((_, _, ms)) => missed = replay(rt, self.boot, newest, ms.min(now_ms()), scope),
            None => {}
        }
        // A subtree scope learns of children started before now.
        if last_id.is_none() {
            for i in &journal {
                scope.admits(i);
            }
        }
        (missed, Feed { rx, seen: newest })
    }
}

/// A live feed: items after the ones a client was given on subscribing.
pub(crate) struct Feed {
    rx: broadcast::Receiver<Arc<Item>>,
    seen: u64,
}

impl Feed {
    /// The next item after those already given; catches up from `hub`'s journal after a lag.
    pub(crate) async fn next(&mut self, hub: &Hub) -> Option<Vec<Arc<Item>>> {
        match self.rx.recv().await {
            Ok(i) if i.n <= self.seen => Some(Vec::new()),
            Ok(i) => {
                self.seen = i.n;
                Some(vec![i])
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                let mut caught: Vec<Arc<Item>> = hub
                    .journal
                    .lock()
                    .map(|j| j.iter().filter(|i| i.n > self.seen).cloned().collect())
                    .unwrap_or_default();
                // Fell past the journal too: say how much is gone (the API has it all).
                if let Some(first) = caught.first().filter(|f| f.n > self.seen + 1) {
                    let missed = first.n - self.seen - 1;
                    let id = format!("{}.{}.{}", hub.boot, first.n - 1, now_ms());
                    let data = json!({ "missed": missed });
                    caught.insert(0, Arc::new(Item::new(0, id, "lagged", None, None, &data)));
                }
                if let Some(last) = caught.last() {
                    self.seen = last.n.max(self.seen);
                }
                Some(caught)
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

/// Which threads a stream carries: all, or one subtree (growing as children start).
pub(crate) struct Scope {
    members: Option<HashSet<ThreadId>>,
}

impl Scope {
    /// Every thread.
    pub(crate) fn all() -> Scope {
        Scope { members: None }
    }

    /// `root`'s subtree: the threads it has now, and every thread started under them later.
    pub(crate) fn subtree(rt: &Runtime, root: &ThreadId) -> Scope {
        let mut members: HashSet<ThreadId> = rt
            .tree(root)
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.id)
            .collect();
        members.insert(root.clone());
        Scope {
            members: Some(members),
        }
    }

    /// Whether `item` belongs to the scope (a start under a member makes its thread one).
    pub(crate) fn admits(&mut self, item: &Item) -> bool {
        let Some(m) = &mut self.members else {
            return true;
        };
        let Some(thread) = &item.thread else {
            return true;
        };
        if item.parent.as_ref().is_some_and(|p| m.contains(p)) {
            m.insert(thread.clone());
        }
        m.contains(thread)
    }
}

/// `<boot>.<n>.<ms>` → its parts.
pub(super) fn parse_id(id: &str) -> Option<(u64, u64, u64)> {
    let mut p = id.trim().split('.').map(|x| x.parse::<u64>().ok());
    Some((p.next()??, p.next()??, p.next()??))
}

/// Transcript lines since `ms` of the threads in `scope` updated since then, oldest first, as
/// items numbered `newest` (a client reconnecting after them resumes from the journal there).
/// Bounded: the newest [`MAX_REPLAY_THREADS`] threads, the newest [`MAX_REPLAY_ITEMS`] items;
/// a cut replay starts with a `lagged` event saying so.
fn replay(rt: &Runtime, boot: u64, newest: u64, ms: u64, scope: &mut Scope) -> Vec<Arc<Item>> {
    let since = crate::core::ids::ts_of_ms(ms.saturating_sub(1000));
    let filter = crate::registry::ThreadFilter {
        updated_since: Some(since.clone()),
        limit: Some(MAX_REPLAY_THREADS + 1),
        ..Default::default()
    };
    let mut rows = rt.list(&filter).unwrap_or_default();
    let mut cut = rows.len() > MAX_REPLAY_THREADS;
    rows.truncate(MAX_REPLAY_THREADS);
    rows.reverse();
    let mut lines: Vec<(String, Arc<Item>)> = Vec::new();
    for row in rows {
        replay_thread(rt, (boot, newest, ms), &row.id, &since, &mut lines);
    }
    lines.sort_by(|a, b| a.0.cmp(&b.0));
    let mut items: Vec<Arc<Item>> = lines
        .into_iter()
        .map(|(_, i)| i)
        .filter(|i| scope.admits(i))
        .collect();
    if items.len() > MAX_REPLAY_ITEMS {
        cut = true;
        items.drain(..items.len() - MAX_REPLAY_ITEMS);
    }
    if cut {
        let data = json!({
            "missed": null,
            "why": format!("the Last-Event-ID is older than one reconnect replays ({MAX_REPLAY_THREADS} threads, {MAX_REPLAY_ITEMS} events): read the rest from GET /v1/threads and /v1/threads/{{id}}/transcript"),
        });
        let id = format!("{boot}.{newest}.{ms}");
        items.insert(0, Arc::new(Item::new(0, id, "lagged", None, None, &data)));
    }
    items
}

/// The items of thread `id`'s transcript lines since `since`, with their times, into `lines`
/// (numbered as [`replay`]'s, whose boot, newest and ms come first).
fn replay_thread(
    rt: &Runtime,
    (boot, newest, ms): (u64, u64, u64),
    id: &ThreadId,
    since: &str,
    lines: &mut Vec<(String, Arc<Item>)>,
) {
    // One read of the whole transcript (pages would read the file once per page).
    let Ok(page) = rt.transcript(id, None, usize::MAX) else {
        return;
    };
    for l in &page.lines {
        let ts = l["ts"].as_str().unwrap_or_default().to_string();
        if ts.as_str() < since {
            continue;
        }
        let (seq, kind) = (l["seq"].as_i64().unwrap_or(-1), l["type"].as_str());
        let Some((name, data)) = kind.and_then(|k| line_item(id, seq, k, l)) else {
            continue;
        };
        let parent = (name == "thread_started")
            .then(|| l["parent"].as_str().and_then(|p| ThreadId::parse(p).ok()))
            .flatten();
        let item = Item::new(
            0,
            format!("{boot}.{newest}.{}", ms_of_ts(&ts).unwrap_or(ms)),
            name,
            Some(id.clone()),
            parent,
            &data,
        );
        lines.push((ts, Arc::new(item)));
    }
}

/// Milliseconds since the epoch of a stored `ts`.
fn ms_of_ts(ts: &str) -> Option<u64> {
    humantime::parse_rfc3339(ts)
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn an_emit_line_is_an_emit_event_for_clients() {
        let id = crate::core::ids::ThreadId::parse("t-1-00000000").unwrap();
        let data = json!({ "event": "progress", "data": { "done": 1 } });
        let (name, body) = super::line_item(&id, 7, "emit", &data).unwrap();
        assert_eq!(name, "emit");
        assert_eq!(
            body,
            json!({ "thread_id": "t-1-00000000", "seq": 7, "event": "progress", "data": { "done": 1 } })
        );
    }
}
