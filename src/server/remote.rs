//! Live events of threads that other processes run — the other nodes of a cluster (#26). A node's
//! SSE clients watch the whole project, but its runtime only hears its own threads; so the node
//! follows, in the shared records, the transcripts of every thread another owner runs and
//! publishes their lines to its clients as it publishes its own (tool calls and results, costs,
//! starts and ends). It looks every 250 ms: threads another owner runs or has just finished
//! (from the registry), then the lines each added since the last look (one page read each). A
//! thread is followed until its end line is published; at most [`MAX_FOLLOWED`] at a time.
//! Threads already running when the node starts are followed from their current end.

use super::events::{line_item, Hub};
use crate::core::ids::ThreadId;
use crate::registry::ThreadFilter;
use crate::runtime::Runtime;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How often the records are read.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Threads followed at once, at most.
const MAX_FOLLOWED: usize = 500;

/// Follows other owners' threads for `hub` while the runtime lives.
pub(crate) fn follow(rt: &Runtime, hub: Arc<Hub>) -> tokio::task::JoinHandle<()> {
    let weak = rt.downgrade();
    tokio::spawn(async move {
        // Thread → the last seq published, and when it was created.
        let mut followed: Followed = HashMap::new();
        // Threads whose end was published, kept while the registry may still list them as
        // recently updated (never followed again: their lines were all published).
        let mut ended: HashMap<ThreadId, std::time::Instant> = HashMap::new();
        let started = crate::core::ids::now_ts();
        let mut since = started.clone();
        loop {
            let Some(rt) = Runtime::upgrade(&weak) else {
                return;
            };
            let (hub2, mut f) = (hub.clone(), std::mem::take(&mut followed));
            let mut e = std::mem::take(&mut ended);
            let looked = crate::core::ids::now_ts();
            let (from, began) = (since.clone(), started.clone());
            let done = tokio::task::spawn_blocking(move || {
                look(&rt, &hub2, (&mut f, &mut e), &from, &began);
                (f, e)
            })
            .await;
            (followed, ended) = done.unwrap_or_default();
            ended.retain(|_, at| at.elapsed() < Duration::from_secs(10));
            // A little overlap: a row updated as the last look read is read again.
            since = earlier(&looked);
            tokio::time::sleep(LOOK_EVERY).await;
        }
    })
}

/// `ts` less a second (stored times sort as text).
fn earlier(ts: &str) -> String {
    humantime::parse_rfc3339(ts)
        .ok()
        .and_then(|t| t.checked_sub(Duration::from_secs(1)))
        .map(|t| humantime::format_rfc3339_millis(t).to_string())
        .unwrap_or_else(|| ts.to_string())
}

/// Followed threads: the last seq published of each, and when it was created.
type Followed = HashMap<ThreadId, (i64, String)>;

/// One look: new threads of other owners into `followed` (none that `ended` lists; one created
/// before `started` from its current end), then their new lines to `hub` — the end lines last,
/// children's before their parents' (a client that stops at a root's end has seen the whole
/// tree); a thread whose end line is published moves to `ended`.
fn look(
    rt: &Runtime,
    hub: &Hub,
    (followed, ended): (&mut Followed, &mut HashMap<ThreadId, std::time::Instant>),
    since: &str,
    started: &str,
) {
    let me = crate::core::owner::me();
    let live = ThreadFilter {
        status: vec!["created".into(), "running".into()],
        limit: Some(MAX_FOLLOWED),
        ..Default::default()
    };
    let recent = ThreadFilter {
        updated_since: Some(since.to_string()),
        limit: Some(MAX_FOLLOWED),
        ..Default::default()
    };
    for filter in [live, recent] {
        for row in rt.list(&filter).unwrap_or_default() {
            if row.owner_pid == me || followed.len() >= MAX_FOLLOWED || ended.contains_key(&row.id)
            {
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = followed.entry(row.id.clone()) {
                // Started before this node began following: from its current end.
                let from = match row.created_at.as_str() < started {
                    true => last_seq(rt, &row.id),
                    false => -1,
                };
                e.insert((from, row.created_at.clone()));
            }
        }
    }
    let mut ends = Vec::new();
    followed.retain(|id, (seq, created)| match publish_new(rt, hub, id, seq) {
        Read::Ended(end) => {
            ends.extend(end.map(|e| (created.clone(), id.clone(), e)));
            ended.insert(id.clone(), std::time::Instant::now());
            false
        }
        Read::Going => true,
        Read::Unreadable => false,
    });
    // Newest first: a child is created after its parent.
    ends.sort_by(|a, b| b.0.cmp(&a.0));
    for (_, id, (name, data)) in ends {
        hub.publish(name, Some(id), None, &data);
    }
}

/// The seq of `id`'s last line (-1: none).
fn last_seq(rt: &Runtime, id: &ThreadId) -> i64 {
    let mut after = -1;
    while let Ok(page) = rt.transcript(id, Some(after), 10_000) {
        after = page
            .lines
            .last()
            .and_then(|l| l["seq"].as_i64())
            .unwrap_or(after);
        if page.next.is_none() {
            break;
        }
    }
    after
}

/// The end line of a followed thread: its event's name and data.
type EndItem = (&'static str, serde_json::Value);

/// What one read of a followed thread found.
enum Read {
    /// Its transcript cannot be read (not followed; a thread still running is found again by
    /// the next look, from its start).
    Unreadable,
    /// Its lines so far were published; it goes on.
    Going,
    /// It ended: its lines were published but its end line, returned to publish last.
    Ended(Option<EndItem>),
}

/// Publishes `id`'s lines after `seq`, its end line aside (see [`Read`]).
fn publish_new(rt: &Runtime, hub: &Hub, id: &ThreadId, seq: &mut i64) -> Read {
    let Ok(page) = rt.transcript(id, Some(*seq), 1_000) else {
        return Read::Unreadable;
    };
    let (mut ended, mut end) = (false, None);
    for l in &page.lines {
        let (n, kind) = (l["seq"].as_i64().unwrap_or(*seq), l["type"].as_str());
        *seq = n.max(*seq);
        let Some((name, data)) = kind.and_then(|k| line_item(id, n, k, l)) else {
            ended |= kind == Some("thread_finished");
            continue;
        };
        if kind == Some("thread_finished") {
            (ended, end) = (true, Some((name, data)));
            continue;
        }
        let parent = (name == "thread_started")
            .then(|| l["parent"].as_str().and_then(|p| ThreadId::parse(p).ok()))
            .flatten();
        hub.publish(name, Some(id.clone()), parent, &data);
    }
    match ended {
        true => Read::Ended(end),
        false => Read::Going,
    }
}
