//! The runtime: one project opened for running threads — the public library API.
//!
//! [`Runtime::builder`] opens a project (config, key, trust store, providers, the registry and
//! ledger actors, crash recovery); [`Runtime::start`] starts a root thread and returns a
//! [`ThreadHandle`]; `resume` continues an ended thread; `recovery` finalizes threads whose
//! process died. Owns the wiring only: it must never keep thread state itself (that belongs to
//! thread actors) and never starts a server (the control endpoint is started by whoever serves).

mod adoption;
mod cancel;
mod doctor;
mod effects;
mod error;
pub(crate) mod fence;
mod fork;
mod handle;
pub(crate) mod node;
pub(crate) mod owner;
pub(crate) mod placement;
mod query;
pub(crate) mod recovery;
mod resume;
mod starts;

pub use crate::thread::Recovered;
pub use doctor::{diagnose, Checkup, Health, Problem};
pub use error::{ControlError, OpenError, QueryError};
pub use fork::Fork;
pub use handle::{SubtreeEvents, ThreadHandle, ThreadStatus};

use crate::core::ids::ThreadId;
use crate::core::limits::LimitSet;
use crate::core::money::Usage;
use crate::directive::Library;
use crate::ledger::{Account, LedgerActor, LedgerMsg};
use crate::project::config::Config;
use crate::project::Project;
use crate::provider::{
    BoxFuture, Choice, ErrorKind, LlmRequest, LlmResponse, Provider, ProviderError, Providers,
};
use crate::record::signing::{Signer, Trust};
use crate::registry::{RegistryActor, Store};
use crate::thread::{spawn, Ctx, Event, Origin, SpawnError, SpawnRequest, ThreadMsg, ThreadReport};
use ractor::{Actor, ActorRef};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;

/// How many spawns run their stages at once (see `Ctx::spawn_slots`). Tree 10×4 on tmpfs: 4 → 3.1–3.3 s,
/// 8 → 2.8–2.9 s, 32 → 2.45–2.5 s, 64 → 2.35 s, 128 → 2.33 s; peak RSS 131–151 MiB throughout
/// (unbounded, before terminal writes moved to writer threads: 2.9–5.5 s, 320 MiB).
const SPAWN_SLOTS: usize = 64;

/// How to open a runtime: which provider every thread uses, if not the configured ones.
#[must_use = "a builder does nothing until `open` is called"]
pub struct RuntimeBuilder {
    project: Project,
    choice: Choice,
    /// A library user's own backend, used for every thread.
    custom: Option<Arc<dyn Provider>>,
    no_provider: bool,
    /// Claims the scheduled effects of no tree until one is added (see
    /// [`Runtime::claim_effects_of`]).
    effects_of_none: bool,
}

impl RuntimeBuilder {
    /// Every thread plays this scripted-provider file (`--script`).
    pub fn script(mut self, path: impl Into<PathBuf>) -> Self {
        self.choice.script = Some(path.into());
        self
    }

    /// Every thread uses the configured provider `name` (`--provider`).
    pub fn provider(mut self, name: impl Into<String>) -> Self {
        self.choice.provider = Some(name.into());
        self
    }

    /// Every thread uses model `model` (`--model`).
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.choice.model = Some(model.into());
        self
    }

    /// Every thread calls `provider`, your own backend. Its models are priced from the config's
    /// `pricing` like any other (a spend-limited thread on an unpriced model is refused).
    pub fn custom_provider(mut self, provider: Arc<dyn Provider>) -> Self {
        self.custom = Some(provider);
        self
    }

    /// Opens without an LLM provider: for commands that start no thread (cancel, recover).
    pub fn without_provider(mut self) -> Self {
        self.no_provider = true;
        self
    }

    /// The runtime claims no scheduled effect of the project from its start, only those of
    /// the trees later added with [`Runtime::claim_effects_of`] (`weft mcp`).
    #[cfg_attr(not(feature = "mcp-server"), allow(dead_code))]
    pub(crate) fn effects_of_none(mut self) -> Self {
        self.effects_of_none = true;
        self
    }

    /// Loads config and key, starts the registry and ledger actors, and runs crash recovery.
    pub async fn open(self) -> Result<Runtime, OpenError> {
        let project = self.project;
        let config = project.config()?;
        let signer = Arc::new(Signer::load_or_create(&crate::project::user_dir())?);
        signer.trust_in(&project.trust_dir())?;
        let (trust, warnings) = Trust::load(&project.trust_dir());
        warnings.iter().for_each(|w| tracing::warn!("{w}"));
        let providers = match (self.custom, self.no_provider) {
            (_, true) => Providers::single("none", Arc::new(NoProvider)),
            (Some(p), false) => {
                let name = p.name().to_string();
                Providers::single(&name, p).with_model(self.choice.model.clone())
            }
            (None, false) => Providers::build(&project.root, &config, &self.choice)
                .map_err(OpenError::Provider)?,
        };
        let st = |e: String| OpenError::Storage(e);
        let owner = owner::acquire(&project.state_dir()).map_err(st)?;
        let first_owner = owner.first;
        // Room for a large tree's bursts (each line an event while someone listens).
        let (events, _) = broadcast::channel(16_384);
        let library = Library::for_project(&project);
        let commands = crate::tools::CommandTools::load(&project, &crate::thread::builtin_names())?;
        let records = open_records(&project, &config)?;
        let writers = match records.on_files() {
            true => Default::default(),
            false => crate::record::writers::Writers::for_server(),
        };
        let store = Arc::new(
            crate::store::FileStore::new(
                project.clone(),
                records,
                signer.clone(),
                trust.clone(),
                config.durability,
                config.checkpoint_every,
            )
            .with_files_root(project.files_root(&config)?),
        );
        let mcp = crate::tools::McpHub::new(
            config.mcp_servers.clone(),
            project.root.clone(),
            Some(store.clone()),
        );
        let hooks = crate::hooks::Hooks::load(
            &crate::project::user_dir(),
            &project.weft(),
            &project.root,
            config.builtin_hooks,
        )?;
        // Last of what can fail: a refused open leaves no actor (nor its owner lock) behind.
        let (registry, ledger) = start_actors(&project, &config).await?;
        let ctx = Arc::new(Ctx {
            launch: crate::thread::launch,
            effects_wake: Default::default(),
            secrets: Default::default(),
            store,
            project,
            config,
            signer,
            trust,
            library,
            providers,
            registry,
            ledger,
            commands,
            mcp,
            hooks,
            hook_tasks: Default::default(),
            successors: Default::default(),
            cancels: Default::default(),
            starting: Default::default(),
            tokio: tokio::runtime::Handle::current(),
            usage_log: Default::default(),
            events,
            wants_lines: Default::default(),
            wants_text: Default::default(),
            in_spawn: Default::default(),
            caused: Default::default(),
            effects_gate: crate::thread::EffectsGate::claiming(self.effects_of_none),
            _owner_lock: Box::new(owner),
            verified: Default::default(),
            writers,
            tool_specs: Default::default(),
            deadlines: crate::thread::Deadlines::start(),
            spawn_slots: tokio::sync::Semaphore::new(SPAWN_SLOTS),
            placement: Default::default(),
        });
        ctx.refresh_secrets();
        let recovered = recovery::recover(&ctx, first_owner).await;
        if !self.no_provider {
            // Before any thread of this process can set a budget aside: what is open unclaimed
            // now was left by an earlier process.
            effects::settle_orphans(&ctx, first_owner).await;
            effects::start(&ctx);
        }
        Ok(Runtime::of(ctx, recovered.into()))
    }
}

/// Opens registry.db and ledger.db (strict durability when configured) and starts their actors.
async fn start_actors(
    project: &Project,
    config: &crate::project::config::Config,
) -> Result<(ActorRef<crate::registry::RegistryMsg>, ActorRef<LedgerMsg>), OpenError> {
    let st = |e: String| OpenError::Storage(e);
    std::fs::create_dir_all(project.state_dir())
        .map_err(|e| st(format!("{}: {e}", project.state_dir().display())))?;
    std::fs::create_dir_all(project.weft().join("threads")).map_err(|e| st(e.to_string()))?;
    let url = config.database.as_ref();
    let mut store = Store::open_at(url, &project.state_dir().join("registry.db"))
        .map_err(|e| st(e.to_string()))?;
    let mut ledger_db = crate::ledger::open_db(url, &project.state_dir().join("ledger.db"))
        .map_err(|e| st(e.to_string()))?;
    if config.durability == crate::project::config::Durability::Strict {
        store.set_strict().map_err(|e| st(e.to_string()))?;
        ledger_db.set_strict().map_err(|e| st(e.to_string()))?;
    }
    let (registry, _) = Actor::spawn(None, RegistryActor, store)
        .await
        .map_err(|e| st(e.to_string()))?;
    let judged = project.clone();
    // The ledger keeps this process's owner lock until it has stopped: until its last fold,
    // no other process may judge it gone and take its trees or fold its journal.
    let held = owner::acquire(&project.state_dir()).map_err(st)?;
    let alive: crate::ledger::Alive = Arc::new(move |o| {
        let _kept = &held;
        owner::owner_alive(&judged, o)
    });
    let journals = url
        .is_none()
        .then(|| project.state_dir().join("ledger.journal"));
    let (ledger, _) = match Actor::spawn(None, LedgerActor, (ledger_db, alive, journals)).await {
        Ok(l) => l,
        Err(e) => {
            registry.stop(None);
            return Err(st(e.to_string()));
        }
    };
    Ok((registry, ledger))
}

/// A project opened for running threads. Cheap to clone: clones share one runtime.
#[derive(Clone)]
pub struct Runtime {
    ctx: Arc<Ctx>,
    recovered: Arc<[Recovered]>,
    /// Withdraws its roots' starts while they may wait ([`Runtime::withdrawn_by`]).
    starts_withdrawn: Option<tokio_util::sync::CancellationToken>,
}

/// A runtime that does not keep it open (see [`Runtime::downgrade`]).
#[derive(Clone)]
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) struct WeakRuntime(std::sync::Weak<Ctx>);

#[cfg_attr(not(feature = "cli"), allow(dead_code))]
impl Runtime {
    /// A handle that does not keep this runtime open.
    pub(crate) fn downgrade(&self) -> WeakRuntime {
        WeakRuntime(Arc::downgrade(&self.ctx))
    }

    /// The runtime of `weak`, while it is open.
    pub(crate) fn upgrade(weak: &WeakRuntime) -> Option<Runtime> {
        Some(Runtime::of(weak.0.upgrade()?, Vec::new().into()))
    }

    fn of(ctx: Arc<Ctx>, recovered: Arc<[Recovered]>) -> Runtime {
        Runtime {
            ctx,
            recovered,
            starts_withdrawn: None,
        }
    }
}

/// The provider of a runtime opened `without_provider`: refuses every call.
struct NoProvider;

impl Provider for NoProvider {
    fn name(&self) -> &str {
        "none"
    }
    fn complete(
        &self,
        _req: LlmRequest,
        _cancel: CancellationToken,
    ) -> BoxFuture<Result<LlmResponse, ProviderError>> {
        Box::pin(async {
            Err(ProviderError {
                kind: ErrorKind::InvalidRequest,
                message: "this runtime was opened without a provider".into(),
                retry_after: None,
                usage: Usage::default(),
                usage_incomplete: false,
            })
        })
    }
}

impl Runtime {
    /// A builder for opening `project`.
    pub fn builder(project: Project) -> RuntimeBuilder {
        RuntimeBuilder {
            project,
            choice: Choice::default(),
            custom: None,
            no_provider: false,
            effects_of_none: false,
        }
    }

    /// Opens `project` with its configured providers.
    pub async fn open(project: Project) -> Result<Runtime, OpenError> {
        Runtime::builder(project).open().await
    }

    /// Threads that recovery finalized when this runtime opened.
    pub fn recovered(&self) -> &[Recovered] {
        &self.recovered
    }

    /// The project's paths.
    pub fn project(&self) -> &Project {
        &self.ctx.project
    }

    /// The effective configuration.
    pub fn config(&self) -> &Config {
        &self.ctx.config
    }

    /// Subscribes to the live events of every thread of this runtime (from then on they include
    /// every transcript line, [`Event::Line`], and streamed text, [`Event::Token`]).
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.ctx
            .wants_lines
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.progress_events()
    }

    /// Subscribes to the progress of every thread of this runtime — started, turns, waiting,
    /// status, finished — without asking for transcript lines or streamed text: for a watcher
    /// that shows progress only (`weft run`), so no thread copies and sends each line for it.
    /// Line and token events still arrive while another subscriber asks for them.
    pub fn progress_events(&self) -> broadcast::Receiver<Event> {
        self.ctx.events.subscribe()
    }

    /// [`Self::progress_events`] and the models' streamed text ([`Event::Token`]), still
    /// without transcript lines: for a watcher that shows what a model is saying (`weft run`'s
    /// live tree on a terminal).
    pub fn progress_and_text_events(&self) -> broadcast::Receiver<Event> {
        self.ctx
            .wants_text
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.progress_events()
    }

    /// Starts a root thread running `directive` (a library name, or a path to a `.md` file).
    pub async fn start(
        &self,
        directive: &str,
        inputs: Map<String, Value>,
        overrides: LimitSet,
    ) -> Result<ThreadHandle, SpawnError> {
        self.start_root(directive, inputs, overrides, None).await
    }

    /// Starts a root thread like [`Runtime::start`], its whole tree on `route`'s provider and
    /// model instead of the runtime's (what `POST /v1/threads` does with `provider`, `model`).
    pub async fn start_on(
        &self,
        directive: &str,
        inputs: Map<String, Value>,
        overrides: LimitSet,
        route: crate::provider::Route,
    ) -> Result<ThreadHandle, SpawnError> {
        self.start_root(directive, inputs, overrides, Some(Arc::new(route)))
            .await
    }

    async fn start_root(
        &self,
        directive: &str,
        inputs: Map<String, Value>,
        overrides: LimitSet,
        route: Option<Arc<crate::provider::Route>>,
    ) -> Result<ThreadHandle, SpawnError> {
        let mut req = SpawnRequest::new(directive, inputs, Origin::Person);
        req.overrides = overrides;
        req.route = route;
        self.spawn_root(req).await
    }

    /// Runs a root thread to its end.
    pub async fn run(
        &self,
        directive: &str,
        inputs: Map<String, Value>,
        overrides: LimitSet,
    ) -> Result<ThreadReport, SpawnError> {
        self.start(directive, inputs, overrides).await?.wait().await
    }

    async fn spawn_root(&self, mut req: SpawnRequest) -> Result<ThreadHandle, SpawnError> {
        if req.withdrawn.is_none() {
            req.withdrawn = self.starts_withdrawn.clone();
        }
        // Subscribed before the actor starts, so the handle's events miss nothing of its tree.
        let events = self.ctx.events.subscribe();
        let (tx, rx) = oneshot::channel();
        let (id, actor) = spawn(&self.ctx, req, Some(tx)).await?;
        Ok(ThreadHandle::new(id, actor, rx, events, self.ctx.clone()))
    }

    /// Cancels a running thread of this runtime (and its subtree). False when no such thread
    /// runs in this process.
    /// A root's cancel stops the whole tree, with the work it caused: deferred children
    /// running without a parent actor (scheduled, hook-spawned) are cancelled too, its pending
    /// effects are cancelled (their budgets given back), and nothing it caused starts later.
    /// A root that has ended is still reached while work it caused runs in this process.
    pub fn cancel(&self, id: &ThreadId, reason: &str) -> bool {
        cancel::thread(&self.ctx, id, reason)
    }

    /// From now on this runtime claims only the scheduled effects of tree `root` (`weft run`
    /// once its tree has ended: it waits for what its tree caused, not for other trees' work).
    pub async fn scope_effects(&self, root: &ThreadId) {
        self.ctx.effects_gate.lock().await.scope = Some([root.clone()].into());
    }

    /// Adds tree `root` to the trees whose scheduled effects this runtime claims, when it
    /// claims only some ([`RuntimeBuilder::effects_of_none`]: `weft mcp` runs what its clients'
    /// trees caused, never other work of the project); a runtime that claims all is unchanged.
    #[cfg_attr(not(feature = "mcp-server"), allow(dead_code))]
    pub(crate) async fn claim_effects_of(&self, root: &ThreadId) {
        if let Some(scope) = self.ctx.effects_gate.lock().await.scope.as_mut() {
            scope.insert(root.clone());
        }
    }

    /// From now on this runtime claims no scheduled effect (it is about to exit: what is not
    /// under way stays in the store, its budget set aside in ledger.db).
    pub async fn close_effects(&self) {
        self.ctx.effects_gate.lock().await.closed = true;
    }

    /// Stops the work the tree of root `root` caused (its deferred children, its pending
    /// effects), after the root itself has ended (`weft run`'s Ctrl-C while it drains).
    pub async fn cancel_caused(&self, root: &ThreadId, reason: &str) {
        self.ctx.caused.cancel(root);
        cancel::caused_work(&self.ctx, root, reason).await;
    }

    /// Whether this runtime runs `id` (or the continuation that took over from it).
    pub fn runs(&self, id: &ThreadId) -> bool {
        self.ctx.current_actor(id).is_some()
    }

    /// The actor running `id`'s chain in this process (the thread, or the continuation that took
    /// over from it).
    fn running(&self, id: &ThreadId) -> Result<ActorRef<ThreadMsg>, ControlError> {
        let running = self.ctx.current_actor(id).map(|(_, a)| a);
        running.ok_or_else(|| ControlError::NotRunning {
            id: id.clone(),
            pid: std::process::id(),
        })
    }

    /// A person's decision on a call of thread `id` (of this runtime) that waits for approval:
    /// approve runs it, deny gives the model an error result with `reason`. `call` None picks
    /// the only waiting call. Returns the call decided.
    pub async fn decide(
        &self,
        id: &ThreadId,
        call: Option<&str>,
        approve: bool,
        reason: Option<&str>,
    ) -> Result<String, ControlError> {
        let actor = self.running(id)?;
        ractor::call!(actor, |reply| {
            ThreadMsg::Decide {
                call: call.map(str::to_string),
                approve,
                reason: reason.map(str::to_string),
                reply,
            }
        })
        .map_err(|e| no_answer(id, e))?
        .map_err(ControlError::Refused)
    }

    /// Queues `text` for thread `id` (of this runtime): delivered as a user message before its
    /// next turn.
    pub async fn inject(&self, id: &ThreadId, text: &str) -> Result<(), ControlError> {
        let actor = self.running(id)?;
        ractor::call!(actor, |reply| {
            ThreadMsg::Inject {
                from: "person".into(),
                text: text.to_string(),
                reply: Some(reply),
            }
        })
        .map_err(|e| no_answer(id, e))?
        .map_err(ControlError::Refused)
    }

    /// Waits for the work a thread leaves behind when it ends: hook commands still running (so
    /// an `after_complete` hook is not cut short) and its messages' search indexing. A process
    /// calls this before it exits.
    pub async fn drain_hooks(&self) {
        loop {
            self.drain_tasks().await;
            // No effect is being claimed and started now (its task tracked when it is).
            let _gate = self.ctx.effects_gate.lock().await;
            if self.ctx.hook_tasks.lock().map_or(true, |t| t.is_empty()) {
                break;
            }
        }
        let store = self.ctx.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.flush_index()).await;
    }

    async fn drain_tasks(&self) {
        loop {
            let tasks: Vec<_> = match self.ctx.hook_tasks.lock() {
                Ok(mut t) => t.drain(..).collect(),
                Err(_) => return,
            };
            if tasks.is_empty() {
                return;
            }
            for t in tasks {
                let _ = t.await;
            }
        }
    }

    /// Ledger audit: (accounts violating the invariant, open reservations).
    pub async fn audit(&self) -> (Vec<Account>, usize) {
        ractor::call!(self.ctx.ledger, |reply| LedgerMsg::Audit { reply }).unwrap_or_default()
    }

    /// A thread's ledger account (while this runtime holds it).
    pub async fn account(&self, id: &ThreadId) -> Option<Account> {
        ractor::call!(self.ctx.ledger, |reply| LedgerMsg::Get {
            id: id.clone(),
            reply
        })
        .ok()
        .flatten()
    }

    /// Stops the registry and ledger actors (after every thread has ended), not waiting: see
    /// [`Runtime::close`]. Threads that ended in the last second may not be in the search index
    /// yet (it is written after a burst of endings); `close` waits for it, and a process that
    /// exits without it leaves them to `weft search --backfill`.
    pub fn shutdown(self) {
        self.ctx.registry.stop(None);
        self.ctx.ledger.stop(None);
    }

    /// [`Runtime::shutdown`], waiting (10 s at most each) until their last changes are stored
    /// and the ledger's journal is folded into ledger.db and removed, and until every thread
    /// that ended is in the search index. The MCP servers it started are closed first (each
    /// gets 3 s to exit on the end of its stdin, its process group then SIGTERM and 2 s, and
    /// what is left is killed).
    pub async fn close(self) {
        self.ctx.mcp.shutdown().await;
        let store = self.ctx.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.flush_index()).await;
        let wait = Some(std::time::Duration::from_secs(10));
        let _ = self.ctx.ledger.stop_and_wait(None, wait).await;
        let _ = self.ctx.registry.stop_and_wait(None, wait).await;
    }

    /// The shared wiring (for the crate's own surfaces and the `internals` module).
    pub(crate) fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }
}

/// For a program that runs many threads (the `weft` binary, the benchmark): its memory in
/// small pages. Without this, the allocator asks for transparent huge pages, so each region it
/// touches costs 2 MiB of zeroed memory at once; a tree of 11,111 threads then peaks ~10 MiB
/// higher (BENCHMARKS.md). Process-wide, and inherited by the tool processes it starts; only a
/// program that asked for huge pages itself notices. A refusal (an old kernel) changes nothing.
pub fn prefer_small_pages() {
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

/// A thread's actor that stopped before answering a call.
fn no_answer(id: &ThreadId, e: impl std::fmt::Display) -> ControlError {
    ControlError::NoAnswer {
        id: id.clone(),
        reason: e.to_string(),
    }
}

/// Where `project` keeps its thread records, record files an older weft left beside a
/// database server moved in first.
fn open_records(
    project: &Project,
    config: &crate::project::config::Config,
) -> Result<crate::record::place::Records, OpenError> {
    let records = crate::record::place::Records::of(project, config);
    crate::record::adopt::adopt_files(&records, project).map_err(|e| {
        OpenError::Storage(format!(
            "moving record files to {}: {e}",
            records.thread_name_all()
        ))
    })?;
    Ok(records)
}
