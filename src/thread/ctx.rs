//! What every thread of a runtime shares ([`Ctx`]: project, config, key, trust, directive
//! library, providers, the registry and ledger actors, live events) and the live [`Event`]s.

use super::msg::{ThreadArgs, ThreadMsg};
use super::report::ThreadReport;
use crate::core::ids::ThreadId;
use crate::core::money::Nanos;
use crate::directive::Library;
use crate::ledger::LedgerMsg;
use crate::project::config::Config;
use crate::project::Project;
use crate::record::signing::{Signer, Trust};
use crate::record::thread_doc::ThreadDoc;
use crate::registry::RegistryMsg;
use ractor::ActorRef;
use std::sync::Arc;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// A live event for observers (the CLI's live tree, tests).
#[derive(Debug, Clone)]
pub enum Event {
    /// A thread started.
    Started {
        /// Thread.
        id: ThreadId,
        /// Parent.
        parent: Option<ThreadId>,
        /// Directive.
        directive: String,
    },
    /// A thread finished a turn.
    Turn {
        /// Thread.
        id: ThreadId,
        /// Turns so far.
        turns: u64,
        /// Own spend so far.
        spend: Nanos,
    },
    /// A thread started or stopped waiting on a person (e.g. the approval of a call).
    Waiting {
        /// Thread.
        id: ThreadId,
        /// What it waits for; None once nothing is.
        waiting: Option<String>,
    },
    /// A thread set its status line (`set_status`).
    Status {
        /// Thread.
        id: ThreadId,
        /// The status line.
        text: String,
    },
    /// A thread reached a terminal state.
    Finished(Box<ThreadReport>),
    /// A line was appended to a thread's transcript (checkpoints aside): a message, a tool call
    /// (`tool_use`) or result, an LLM call's usage and cost (`llm_call`), … — as stored.
    Line {
        /// Thread.
        id: ThreadId,
        /// The line's seq in the transcript.
        seq: i64,
        /// Its `type`.
        kind: String,
        /// Its payload (without seq, ts, type and prev).
        data: Arc<serde_json::Value>,
    },
    /// Streamed text of a thread's LLM call as it arrives (not stored: the whole text is in the
    /// transcript's `assistant_text` line once the call ends).
    Token {
        /// Thread.
        id: ThreadId,
        /// The new text.
        text: String,
    },
}

/// Which scheduled effects a runtime claims (see `Ctx::effects_gate`).
#[derive(Default)]
pub(crate) struct EffectsGate {
    /// None any more (the process is about to exit: what is not due stays in the store).
    pub closed: bool,
    /// Only those of these trees, by root (`weft run` once its tree has ended: its own;
    /// `weft mcp`: the trees its clients started).
    pub scope: Option<std::collections::HashSet<ThreadId>>,
}

impl EffectsGate {
    /// A gate open to every tree's effects, or (`of_none`) to no tree's until one is added.
    pub(crate) fn claiming(of_none: bool) -> tokio::sync::Mutex<EffectsGate> {
        tokio::sync::Mutex::new(EffectsGate {
            closed: false,
            scope: of_none.then(Default::default),
        })
    }
}

impl Ctx {
    /// Keeps work a thread leaves behind (hook commands, scheduled effects) for
    /// `Runtime::drain_hooks`, dropping what already finished — looked over only when the list
    /// reaches a power of two, so tracking 10⁴ cancels at once stays linear.
    pub(crate) fn track(&self, task: tokio::task::JoinHandle<()>) {
        if let Ok(mut t) = self.hook_tasks.lock() {
            if t.len() >= 64 && t.len().is_power_of_two() {
                t.retain(|h| !h.is_finished());
            }
            t.push(task);
        }
    }

    /// The current redactor (cheap: a read lock and an `Arc` clone).
    pub(crate) fn redactor(&self) -> Arc<crate::core::redact::Redactor> {
        // Never fails open: a poisoned lock still holds the secrets.
        let secrets = self.secrets.read().unwrap_or_else(|e| e.into_inner());
        secrets.redactor.clone()
    }

    /// Where a call's streamed text goes while someone listens: live `Token` events, through a
    /// redactor that holds back what could be the start of a secret until the next piece — or
    /// the returned flush, run when the call ends — shows it is not one.
    #[allow(clippy::type_complexity)]
    pub(crate) fn text_stream(
        &self,
        id: &ThreadId,
    ) -> (
        Option<crate::provider::TextSink>,
        Option<Box<dyn FnOnce() + Send>>,
    ) {
        if !self.publish_text() {
            return (None, None);
        }
        let held = Arc::new(std::sync::Mutex::new(
            crate::core::redact::StreamRedactor::default(),
        ));
        let (events, id, redactor) = (self.events.clone(), id.clone(), self.redactor());
        let send = move |text: String| {
            if !text.is_empty() {
                let _ = events.send(Event::Token {
                    id: id.clone(),
                    text,
                });
            }
        };
        let (held2, redactor2, send2) = (held.clone(), redactor.clone(), send.clone());
        let sink = crate::provider::TextSink(Arc::new(move |text: &str| {
            let out = held2
                .lock()
                .map(|mut h| h.push(&redactor2, text))
                .unwrap_or_default();
            send2(out);
        }));
        let flush = move || {
            let out = held
                .lock()
                .map(|mut h| h.finish(&redactor))
                .unwrap_or_default();
            send(out);
        };
        (Some(sink), Some(Box::new(flush)))
    }

    /// Reloads the secrets if any were set or removed since they were read: at once after a
    /// change made in this process, within [`STAMP_EVERY`] after one made by another (two
    /// `stat`s at most that often: this runs before every tool result).
    pub(crate) fn refresh_secrets(&self) {
        let local = self.store.env_changes();
        let fresh =
            |s: &Secrets| s.local == local && s.checked.is_some_and(|t| t.elapsed() < STAMP_EVERY);
        if self.secrets.read().is_ok_and(|s| fresh(&s)) {
            return;
        }
        let stamps = self.store.env_stamps();
        let now = Some(std::time::Instant::now());
        if let Ok(mut s) = self.secrets.write() {
            if s.local == local && s.stamps == stamps {
                s.checked = now;
                return;
            }
        }
        let redactor = Arc::new(self.store.redactor());
        if let Ok(mut s) = self.secrets.write() {
            *s = Secrets {
                stamps,
                local,
                checked: now,
                redactor,
            };
        }
    }

    /// Whether transcript lines should be published now.
    pub(crate) fn publish_lines(&self) -> bool {
        self.wants_lines.load(std::sync::atomic::Ordering::Relaxed)
            && self.events.receiver_count() > 0
    }

    /// Whether streamed text should be published now.
    pub(crate) fn publish_text(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        (self.wants_lines.load(Relaxed) || self.wants_text.load(Relaxed))
            && self.events.receiver_count() > 0
    }
}

impl Event {
    /// The thread the event is about.
    pub fn thread_id(&self) -> &ThreadId {
        match self {
            Event::Started { id, .. }
            | Event::Turn { id, .. }
            | Event::Waiting { id, .. }
            | Event::Status { id, .. }
            | Event::Line { id, .. }
            | Event::Token { id, .. } => id,
            Event::Finished(r) => &r.thread_id,
        }
    }
}

/// Attempts of a terminal registry update. Each waits out registry.db's busy timeout (measured:
/// ~10 s while another process holds the write lock, as BEGIN and the write each wait 5 s).
const STORE_ATTEMPTS: u32 = 4;

/// How often a runtime looks whether another process changed the secrets.
const STAMP_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// The secrets a runtime redacts, and the stamps they were read at.
#[derive(Default)]
pub(crate) struct Secrets {
    /// `FileStore::env_stamps` when `redactor` was built.
    pub stamps: (Option<std::time::SystemTime>, Option<std::time::SystemTime>),
    /// `FileStore::env_changes` when `redactor` was built.
    pub local: u64,
    /// When the stamps were last looked at.
    pub checked: Option<std::time::Instant>,
    /// Every secret this user's key opens.
    pub redactor: Arc<crate::core::redact::Redactor>,
}

/// Starts a thread actor from its arguments, linked under `parent` when given (see
/// `thread::launch`): the spawn stages call it last, without knowing the actor.
pub(crate) type Launch = fn(
    Arc<Ctx>,
    ThreadArgs,
    Option<ractor::ActorCell>,
) -> crate::provider::BoxFuture<Result<ActorRef<ThreadMsg>, String>>;

/// Shared wiring of a runtime, handed to every thread actor.
pub(crate) struct Ctx {
    /// Starts a thread actor (the last spawn stage).
    pub launch: Launch,
    /// Wakes the runtime's scheduled-effects task (a `schedule` call made an effect).
    pub effects_wake: Arc<tokio::sync::Notify>,
    /// What secrets to hide (see [`Ctx::refresh_secrets`]).
    pub secrets: std::sync::RwLock<Secrets>,
    /// Where the project's threads are kept (the one place that knows their paths).
    pub store: Arc<crate::store::FileStore>,
    /// Project paths.
    pub project: Project,
    /// Effective configuration.
    pub config: Config,
    /// This user's key.
    pub signer: Arc<Signer>,
    /// Keys this project accepts.
    pub trust: Trust,
    /// Directive lookup.
    pub library: Library,
    /// The LLM backends, and the rules that pick one per thread.
    pub providers: crate::provider::Providers,
    /// The supervisor (registry owner).
    pub registry: ActorRef<RegistryMsg>,
    /// The ledger.
    pub ledger: ActorRef<LedgerMsg>,
    /// Live events.
    pub events: broadcast::Sender<Event>,
    /// Someone asked for the live events (`Runtime::events`, a handle's `events`):
    /// only then are transcript lines and streamed text published as events (building them
    /// costs ~6% of a large tree's CPU).
    pub wants_lines: std::sync::atomic::AtomicBool,
    /// Someone asked for streamed text but not for lines (`Runtime::progress_and_text_events`:
    /// `weft run`'s live tree on a terminal).
    pub wants_text: std::sync::atomic::AtomicBool,
    /// Threads between their registry row and their running actor (see `spawn`): ending a
    /// subtree without its actors waits for them (a kill must find the actor, and nothing may
    /// write a thread's files after the thread was finalized).
    pub in_spawn: std::sync::Mutex<std::collections::HashSet<ThreadId>>,
    /// Work trees caused outside their actors, with the cancel token it carries.
    pub caused: Arc<super::caused::Caused>,
    /// Which scheduled effects this runtime still claims; held while it claims and starts
    /// them, so a drain never misses one under way (`runtime/effects.rs`).
    pub effects_gate: tokio::sync::Mutex<EffectsGate>,
    /// The project's command tools (`tools/*.yaml`).
    pub commands: crate::tools::CommandTools,
    /// Spawns running their stages at once. A wide tree's parents would otherwise start
    /// children faster than the children can run and end on the same cores: every started
    /// thread then waits its turn behind all the others and lives (and holds its memory) for
    /// seconds. Bounded, new threads start as earlier ones end.
    pub spawn_slots: tokio::sync::Semaphore,
    /// Every thread's duration limit, on one timer task.
    pub deadlines: super::deadlines::Deadlines,
    /// Children placed on other nodes (see `thread/placed.rs`).
    pub placement: super::placer::Placement,
    /// Tool lists offered to threads, shared between threads offered the same.
    pub tool_specs: super::specs::SpecCache,
    /// The MCP tool servers (`mcp_servers:`), started on first use.
    pub mcp: crate::tools::McpHub,
    /// Hooks of layers 0, 2 and 3 (a directive's own join per thread).
    pub hooks: crate::hooks::Hooks,
    /// Thread → the continuation that took over from it (this process's handoffs), so a cancel
    /// naming the first thread of a chain reaches the one running.
    pub successors: std::sync::Mutex<std::collections::HashMap<ThreadId, ThreadId>>,
    /// Cancels a person sent to a thread's actor ([`Ctx::send_cancel`]), until that actor takes
    /// them or stops (then [`Ctx::hand_on_cancel`]).
    pub cancels: std::sync::Mutex<std::collections::HashMap<ThreadId, String>>,
    /// Threads whose actor's start may wait (on an MCP server), and the token that withdraws
    /// it: fired by their own cancel ([`Ctx::send_cancel`]) or by what withdraws their spawn.
    pub starting: std::sync::Mutex<std::collections::HashMap<ThreadId, (u64, CancellationToken)>>,
    /// The tokio runtime the runtime was opened in: work started from a caller outside it (a
    /// cancel from a signal handler's thread) runs there.
    pub tokio: tokio::runtime::Handle,
    /// `.weft/usage.jsonl`, opened (append) on the first usage record and kept.
    pub usage_log: std::sync::Mutex<Option<std::fs::File>>,
    /// Hook commands under way (`Runtime::drain_hooks` waits for them before a process exits).
    pub hook_tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// This process's owner lock on the project (see `runtime/owner.rs`), held while any thread
    /// of this runtime may run.
    pub _owner_lock: Box<dyn std::any::Any + Send + Sync>,
    /// The threads that do an ending thread's blocking writes (its terminal fsyncs, signed
    /// thread.json and anchor line).
    pub writers: crate::record::writers::Writers,
    /// Verified thread.json documents of running parents (see [`Ctx::verified_doc`]).
    pub verified: std::sync::Mutex<
        std::collections::HashMap<ThreadId, (Option<crate::record::place::DocStamp>, ThreadDoc)>,
    >,
}

/// How many verified documents the cache holds before the finished threads' ones are dropped.
const KEPT_DOCS: usize = 16_384;

impl Ctx {
    /// Sends a cancel to `thread`'s actor, noting it until the actor takes it: an actor that
    /// stops with it still queued (it was busy starting its continuation) hands it on
    /// ([`Ctx::hand_on_cancel`]). Whether it was sent.
    pub(crate) fn send_cancel(
        &self,
        thread: &ThreadId,
        actor: &ractor::ActorRef<super::msg::ThreadMsg>,
        reason: &str,
    ) -> bool {
        // Noted for a thread's own actor only (it takes the note, or hands it on as it stops):
        // a placed child's stand-in is not one.
        if actor.get_name().is_some() {
            if let Ok(mut c) = self.cancels.lock() {
                c.insert(thread.clone(), reason.to_string());
            }
        }
        // The message first: a withdrawn start closes the mailbox as it gives up.
        let sent = actor
            .cast(super::msg::ThreadMsg::Cancel {
                reason: reason.to_string(),
            })
            .is_ok();
        let withdrawn = self.withdraw_start(thread);
        if !sent && !withdrawn {
            // Its actor is gone: nobody takes the note but the continuation that took its
            // place, if any (known by now: an actor stops only after its handoff's spawn).
            self.hand_on_cancel(thread);
        }
        sent || withdrawn
    }

    /// Withdraws `thread`'s start if it is under way and may still wait (its token fired).
    /// Whether it was.
    pub(crate) fn withdraw_start(&self, thread: &ThreadId) -> bool {
        let start = self
            .starting
            .lock()
            .ok()
            .and_then(|s| s.get(thread).map(|(_, t)| t.clone()));
        start.map(|t| t.cancel()).is_some()
    }

    /// `thread`'s actor stopped: a cancel it never took goes on to the continuation that took
    /// its place (its mailbox died with it), if any. (A continuation that starts while the
    /// cancel is still noted takes it itself, before its first call: `Thread::start`.)
    pub(crate) fn hand_on_cancel(&self, thread: &ThreadId) {
        let Some(reason) = self.forget_cancel(thread) else {
            return;
        };
        // The last of the chain (a continuation may itself have handed off meanwhile).
        if let Some((next, actor)) = self.current_actor(thread).filter(|(n, _)| n != thread) {
            self.send_cancel(&next, &actor, &reason);
        }
    }

    /// The live actor of `id`'s continuation chain, and the thread it runs: the thread that
    /// took over from it (this process's handoffs, followed to the last), else `id` itself,
    /// if it runs in this process.
    pub(crate) fn current_actor(
        &self,
        id: &ThreadId,
    ) -> Option<(ThreadId, ractor::ActorRef<super::msg::ThreadMsg>)> {
        let last = match self.successors.lock() {
            Ok(m) => last_in_chain(&m, id),
            Err(_) => id.clone(),
        };
        let cell = ractor::registry::where_is(last.to_string())?;
        Some((last, cell.into()))
    }

    /// `id` and every thread that took over from it in this process, in order (bounded as
    /// [`last_in_chain`]): each link of a root's chain is a root of its own.
    pub(crate) fn chain_of(&self, id: &ThreadId) -> Vec<ThreadId> {
        match self.successors.lock() {
            Ok(m) => chain_in(&m, id).into_iter().cloned().collect(),
            Err(_) => vec![id.clone()],
        }
    }

    /// `thread`'s actor stopped, and it is of a continuation chain: once the chain's last
    /// thread has stopped, its links go (a long-lived process keeps none of them; a cancel of a
    /// chain whose threads have all ended has nothing to reach).
    pub(crate) fn end_chain(&self, thread: &ThreadId) {
        let Ok(mut m) = self.successors.lock() else {
            return;
        };
        if m.is_empty() {
            return;
        }
        let last = last_in_chain(&m, thread);
        // It handed off to a continuation still running: that one ends the chain.
        if last != *thread && ractor::registry::where_is(last.to_string()).is_some() {
            return;
        }
        // The links leading to it, found in one pass over the links (not one per step).
        let back: std::collections::HashMap<ThreadId, ThreadId> =
            m.iter().map(|(k, v)| (v.clone(), k.clone())).collect();
        let mut cur = last;
        while let Some(prev) = back.get(&cur) {
            m.remove(prev);
            cur = prev.clone();
        }
    }

    /// Forgets the cancel noted for `thread` (its actor is gone, or took it): its reason.
    pub(crate) fn forget_cancel(&self, thread: &ThreadId) -> Option<String> {
        self.cancels.lock().ok().and_then(|mut c| c.remove(thread))
    }

    /// The reason of the cancel noted for `thread` and not yet taken, if any.
    pub(crate) fn noted_cancel(&self, thread: &ThreadId) -> Option<String> {
        self.cancels
            .lock()
            .ok()
            .and_then(|c| c.get(thread).cloned())
    }

    /// Whether the tree of `root` was told to stop (`Runtime::cancel`): work it caused does
    /// not start.
    pub(crate) fn stopped(&self, root: &ThreadId) -> bool {
        self.caused.stopped(root)
    }

    /// A thread's thread.json, verified against the trust store. The verified document is kept
    /// while the file is unchanged (same mtime and length), so a parent spawning many children is
    /// verified once per transition, not once per child; any change is read and verified again.
    /// (On a database server the stamp is this process's last write of it, which vouches for
    /// a running thread's document only: a finished one another process may rewrite is read.)
    pub(crate) fn verified_doc(&self, id: &ThreadId) -> Result<ThreadDoc, String> {
        let records = self.store.records();
        let stamp = records.doc_stamp(id);
        if let Ok(cache) = self.verified.lock() {
            if let Some((s, d)) = cache.get(id) {
                // A stamp of this process's own writes says nothing of another process's:
                // it vouches only for a running thread's document (its owner alone writes it).
                let own = matches!(stamp, Some(crate::record::place::DocStamp::Written(_)));
                if stamp.is_some() && *s == stamp && !(own && d.status.is_terminal()) {
                    return Ok(d.clone());
                }
            }
        }
        let doc = ThreadDoc::read_verified(records, id, &self.trust).map_err(|e| e.to_string())?;
        // A signature proves who wrote a document, not where it belongs: another thread's
        // signed thread.json copied here must not lend its capabilities and limits.
        if doc.id != *id {
            return Err(format!(
                "{} holds the thread.json of thread {}, not of {id}: refused (restore the thread's own thread.json)",
                records.doc_name(id),
                doc.id
            ));
        }
        if let Ok(mut cache) = self.verified.lock() {
            // A running thread's document is forgotten when its actor stops; a finished one
            // (read to resume, fork or run a scheduled effect: the effects loop reads the same
            // ones every round) is kept, but finished ones go all together past a bound.
            if doc.status.is_terminal() && cache.len() >= KEPT_DOCS {
                cache.retain(|_, (_, d)| !d.status.is_terminal());
            }
            cache.insert(id.clone(), (stamp, doc.clone()));
        }
        Ok(doc)
    }

    /// Stores a row whose loss would leave the registry wrong (a terminal transition): retried
    /// with backoff while registry.db is locked by another process or failing; if it still
    /// fails, the error is logged and the next start's recovery brings the row in line with the
    /// signed thread.json.
    pub(crate) async fn store_row(&self, row: crate::registry::ThreadRow) {
        let mut wait = std::time::Duration::from_millis(100);
        for attempt in 1..=STORE_ATTEMPTS {
            let res = ractor::call!(self.registry, |reply| RegistryMsg::Update {
                row: Box::new(row.clone()),
                reply: Some(reply)
            });
            match res {
                Ok(Ok(())) => return,
                Ok(Err(e)) if attempt < STORE_ATTEMPTS => {
                    tracing::warn!(thread = %row.id, "registry update failed (attempt {attempt}), retrying: {e}");
                }
                other => {
                    tracing::error!(thread = %row.id, "registry update failed for good; the next start repairs the row: {other:?}");
                    return;
                }
            }
            tokio::time::sleep(wait).await;
            wait *= 4;
        }
    }

    /// Keeps `doc`, just signed and written by its own running thread, as its verified
    /// thread.json under the stamp of the file written (`stamp`, read from that file itself):
    /// its children's spawns then need not read and verify what this process signed a moment
    /// ago. A file changed since is read again as always (its stamp differs). Never kept: a
    /// terminal document (see `verified_doc`), or any while this runtime's own key is not in the
    /// trust store (reading it back would refuse it).
    pub(crate) fn vouch_for(&self, doc: &ThreadDoc, stamp: crate::record::place::DocStamp) {
        if doc.status.is_terminal() || !self.trust.holds(&self.signer) {
            return;
        }
        if let Ok(mut cache) = self.verified.lock() {
            cache.insert(doc.id.clone(), (Some(stamp), doc.clone()));
        }
    }

    /// Forgets a finished thread's cached document.
    pub(crate) fn forget(&self, id: &ThreadId) {
        if let Ok(mut cache) = self.verified.lock() {
            cache.remove(id);
        }
    }
}

/// The last thread of `id`'s continuation chain in `successors` (`id` itself when it did not
/// hand off); bounded, so a corrupt map cannot loop.
fn last_in_chain(
    successors: &std::collections::HashMap<ThreadId, ThreadId>,
    id: &ThreadId,
) -> ThreadId {
    chain_in(successors, id)
        .last()
        .copied()
        .unwrap_or(id)
        .clone()
}

/// `id` and the threads that took over from it in `successors`, in order (at most 10,001).
fn chain_in<'a>(
    successors: &'a std::collections::HashMap<ThreadId, ThreadId>,
    id: &'a ThreadId,
) -> Vec<&'a ThreadId> {
    let mut chain = vec![id];
    while let Some(next) = chain.last().and_then(|t| successors.get(*t)) {
        if chain.len() > 10_000 {
            break;
        }
        chain.push(next);
    }
    chain
}

/// A start under way that may wait (on an MCP server): its token in `Ctx::starting` — a child
/// of what withdraws its spawn (its parent's cancel, its tree's), fired too by its own cancel
/// ([`Ctx::send_cancel`], [`Ctx::withdraw_start`]). Dropped, it leaves the map, and a cancel
/// noted for a thread that never ran is forgotten, on every road (an error, a panic, the
/// spawn's future dropped).
pub(crate) struct Starting {
    ctx: Arc<Ctx>,
    id: ThreadId,
    /// Which start of `id` this is: a thread's own start may still be ending as the thread
    /// already starts its continuation under the same id, and each leaves only its own entry.
    serial: u64,
    pub(crate) token: CancellationToken,
    ran: bool,
}

impl Starting {
    /// Registered under `id`: from now on a cancel of `id` withdraws it, and one already noted
    /// for `id` (a thread that is handing off) withdraws it at once.
    pub(crate) fn new(ctx: &Arc<Ctx>, id: &ThreadId, outer: Option<&CancellationToken>) -> Self {
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = outer.map_or_else(CancellationToken::new, CancellationToken::child_token);
        if let Ok(mut s) = ctx.starting.lock() {
            s.insert(id.clone(), (serial, token.clone()));
        }
        // Looked at after the registration: a cancel noted meanwhile finds it (`send_cancel`
        // notes before it withdraws).
        if ctx.noted_cancel(id).is_some() {
            token.cancel();
        }
        Starting {
            ctx: ctx.clone(),
            id: id.clone(),
            serial,
            token,
            ran: false,
        }
    }

    /// Its actor runs: a cancel noted from now on is the actor's.
    pub(crate) fn ran(mut self) {
        self.ran = true;
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Ok(mut s) = self.ctx.starting.lock() {
            if s.get(&self.id).is_some_and(|(n, _)| *n == self.serial) {
                s.remove(&self.id);
            }
        }
        if !self.ran {
            self.ctx.forget_cancel(&self.id);
        }
    }
}
