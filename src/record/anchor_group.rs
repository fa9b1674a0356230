//! Roots that end together share one append of the anchor log (group commit): the first to
//! find no append under way writes every line queued meanwhile — one lock, one write, one sync
//! (or one transaction on a server) — and each caller returns once its own line is stored.
//! Ten thousand roots cancelled at once otherwise took turns on the log's lock, each syncing
//! the file for its one line.

use crate::core::ids::now_ts;
use crate::record::place::Records;
use crate::record::signing::Signer;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};

/// A root's anchor line before its place in the chain is known.
pub(crate) struct Pending {
    /// The line without `prev`, `at` and `signature`.
    pub(crate) line: Value,
    /// Who signs it.
    pub(crate) signer: Arc<Signer>,
    /// The signature's domain.
    pub(crate) domain: &'static str,
}

impl Pending {
    /// The line chained after the line hashed `prev`, stamped now and signed.
    fn chained(&self, prev: &str) -> Vec<u8> {
        let mut line = self.line.clone();
        line["prev"] = json!(prev);
        line["at"] = json!(now_ts());
        let sig = self.signer.sign(self.domain, &line);
        line["signature"] = serde_json::to_value(sig).unwrap_or(Value::Null);
        line.to_string().into_bytes()
    }
}

/// What an append's callers are told: io errors are not `Clone`, so their kind and message.
type Outcome = Result<(), (io::ErrorKind, String)>;

/// The appends to one anchor log from this process.
#[derive(Default)]
struct Group {
    state: Mutex<State>,
    stored: Condvar,
}

#[derive(Default)]
struct State {
    /// Lines waiting for the next append, by ticket.
    queue: Vec<(u64, Pending)>,
    next_ticket: u64,
    /// An append is under way.
    appending: bool,
    /// Outcomes not yet taken by their callers.
    done: HashMap<u64, Outcome>,
}

/// The group of each anchor log, by what names it (`Records::anchors_key`): the lines of
/// one group are written through whichever caller's `Records` appends them.
static GROUPS: LazyLock<Mutex<HashMap<String, Arc<Group>>>> = LazyLock::new(Default::default);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Appends `line` to `records`' anchor log, with whatever other roots of this process queued
/// meanwhile; returns once it is stored, or with the error that kept it from being stored.
pub(crate) fn append(records: &Records, line: Pending) -> io::Result<()> {
    let group = lock(&GROUPS)
        .entry(records.anchors_key())
        .or_default()
        .clone();
    let mut st = lock(&group.state);
    let ticket = st.next_ticket;
    st.next_ticket += 1;
    st.queue.push((ticket, line));
    loop {
        if let Some(outcome) = st.done.remove(&ticket) {
            return outcome.map_err(|(kind, msg)| io::Error::new(kind, msg));
        }
        if st.appending {
            // Off the runtime's workers: a caller may be an async task (a dead thread's end),
            // and the append it waits for may be a whole batch long.
            st = crate::sql::off_workers(|| group.stored.wait(st))
                .unwrap_or_else(|e| e.into_inner());
            continue;
        }
        // No append under way: this caller writes the queue, its own line in it.
        st.appending = true;
        let batch = std::mem::take(&mut st.queue);
        drop(st);
        // A panic while signing must not leave the queue waiting forever on this append.
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(records, &batch)))
                .unwrap_or_else(|_| {
                    Err((io::ErrorKind::Other, "the anchor append panicked".into()))
                });
        st = lock(&group.state);
        for (t, _) in &batch {
            st.done.insert(*t, outcome.clone());
        }
        st.appending = false;
        group.stored.notify_all();
    }
}

/// One append of every line of `batch`, in order.
fn write(records: &Records, batch: &[(u64, Pending)]) -> Outcome {
    records
        .append_anchor(&mut |i, prev| batch.get(i).map(|(_, p)| p.chained(prev)))
        .map_err(|e| (e.kind(), e.to_string()))
}
