//! The runtime: one project opened for running threads — the public library API ([`Runtime`])
//! and the spawn procedure of SPEC §4 shared by roots and children.
//!
//! Owns the wiring (supervisor, ledger, signer, provider, directive library) in [`Ctx`].
//! Must never keep thread state itself: that belongs to thread actors.

use crate::config::Config;
use crate::directive::{DirectiveError, Library};
use crate::ids::ThreadId;
use crate::ledger::{LedgerActor, LedgerError, LedgerMsg};
use crate::limits::LimitSet;
use crate::money::{Nanos, Price, Usage};
use crate::provider::Provider;
use crate::registry::{Admission, RegistryError, RegistryMsg, Store, Supervisor, ThreadRow};
use crate::signing::{Signer, Trust};
use crate::state::{Cost, Status, ThreadDoc, Transition};
use crate::thread::{ThreadActor, ThreadArgs, ThreadMsg, ThreadReport};
use crate::transcript::{now_ts, TranscriptWriter};
use ractor::{Actor, ActorCell, ActorRef};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::{broadcast, oneshot};

/// Why a thread could not be started. Nothing is left behind when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The directive or its inputs are invalid.
    #[error(transparent)]
    Directive(#[from] DirectiveError),
    /// A limit refuses the spawn (depth, spawns, concurrency, spend).
    #[error("{0}")]
    Limit(String),
    /// The parent's thread.json failed verification.
    #[error("parent thread.json not trusted: {0}")]
    Untrusted(String),
    /// Configuration problem (model, price, provider).
    #[error("{0}")]
    Config(String),
    /// Storage failed.
    #[error("{0}")]
    Storage(String),
}

impl From<RegistryError> for SpawnError {
    fn from(e: RegistryError) -> SpawnError {
        match e {
            RegistryError::Spawns { .. } | RegistryError::Concurrency { .. } => {
                SpawnError::Limit(e.to_string())
            }
            other => SpawnError::Storage(other.to_string()),
        }
    }
}

impl From<LedgerError> for SpawnError {
    fn from(e: LedgerError) -> SpawnError {
        match e {
            LedgerError::Insufficient { .. } => SpawnError::Limit(e.to_string()),
            other => SpawnError::Storage(other.to_string()),
        }
    }
}

/// Paths of a project.
#[derive(Debug, Clone)]
pub struct Project {
    /// The folder holding `.weft/`.
    pub root: PathBuf,
}

impl Project {
    /// Walks up from `start` to the first folder holding `.weft/`.
    pub fn find(start: &Path) -> Option<Project> {
        start
            .ancestors()
            .find(|d| d.join(".weft").is_dir())
            .map(|d| Project {
                root: d.to_path_buf(),
            })
    }
    /// `.weft/`.
    pub fn weft(&self) -> PathBuf {
        self.root.join(".weft")
    }
    /// `.weft/state/`.
    pub fn state_dir(&self) -> PathBuf {
        self.weft().join("state")
    }
    /// `.weft/threads/<id>/`.
    pub fn thread_dir(&self, id: &ThreadId) -> PathBuf {
        self.weft().join("threads").join(id.as_str())
    }
    /// `.weft/trust/`.
    pub fn trust_dir(&self) -> PathBuf {
        self.weft().join("trust")
    }
    /// The directive library: project → user → built-in.
    pub fn library(&self) -> Library {
        Library {
            project_dir: Some(self.root.join("directives")),
            user_dir: Some(crate::signing::user_dir().join("directives")),
            cache: Default::default(),
        }
    }
    /// Effective config (user file, then project file).
    pub fn config(&self) -> Result<Config, crate::config::ConfigError> {
        Config::load(
            Some(&crate::signing::user_dir().join("config.yaml")),
            Some(&self.weft().join("config.yaml")),
        )
    }
}

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
    /// A thread reached a terminal state.
    Finished(Box<ThreadReport>),
}

/// Shared wiring of a runtime, handed to every thread actor.
pub struct Ctx {
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
    /// Verified thread.json documents of running parents (see [`Ctx::verified_doc`]).
    pub verified: std::sync::Mutex<
        std::collections::HashMap<ThreadId, (crate::directive::FileStamp, ThreadDoc)>,
    >,
}

impl Ctx {
    /// A thread's thread.json, verified against the trust store. The verified document is kept
    /// while the file is unchanged (same mtime and length), so a parent spawning many children is
    /// verified once per transition, not once per child; any change is read and verified again.
    pub fn verified_doc(&self, id: &ThreadId) -> Result<ThreadDoc, String> {
        let path = self.project.thread_dir(id).join("thread.json");
        let stamp = std::fs::metadata(&path)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())));
        if let Ok(cache) = self.verified.lock() {
            if let Some((s, d)) = cache.get(id) {
                if stamp.is_some() && *s == stamp {
                    return Ok(d.clone());
                }
            }
        }
        let doc = ThreadDoc::read_verified(&path, &self.trust).map_err(|e| e.to_string())?;
        if let Ok(mut cache) = self.verified.lock() {
            cache.insert(id.clone(), (stamp, doc.clone()));
        }
        Ok(doc)
    }

    /// Forgets a finished thread's cached document.
    pub fn forget(&self, id: &ThreadId) {
        if let Ok(mut cache) = self.verified.lock() {
            cache.remove(id);
        }
    }
}

/// Where a new thread hangs in the tree.
pub struct ParentLink {
    /// Parent id.
    pub id: ThreadId,
    /// Parent actor (for reports and linking).
    pub actor: ActorRef<ThreadMsg>,
}

/// Everything needed to start one thread.
pub struct SpawnRequest {
    /// Directive name or path.
    pub directive: String,
    /// Inputs as given.
    pub inputs: Map<String, Value>,
    /// Caller's limit overrides.
    pub overrides: LimitSet,
    /// Guarantee asked of the parent.
    pub reserve: Nanos,
    /// None for a root.
    pub parent: Option<ParentLink>,
    /// Set when the thread continues an ended one (`weft resume`).
    pub continuation: Option<Continuation>,
}

/// Options for opening a runtime.
#[derive(Default, Clone)]
pub struct RuntimeOptions {
    /// Scripted provider file: every thread plays it (overrides config).
    pub script: Option<PathBuf>,
    /// Provider (config name) for every thread (`--provider`).
    pub provider: Option<String>,
    /// Model id for every thread (`--model`).
    pub model: Option<String>,
    /// Open without an LLM provider (commands that start no thread: cancel, recover).
    pub no_provider: bool,
    /// Do not listen on the control socket.
    pub no_control: bool,
}

/// A started root thread: its id, its actor, and where its report arrives when it ends.
pub type Started = (
    ThreadId,
    ActorRef<ThreadMsg>,
    oneshot::Receiver<ThreadReport>,
);

/// A project opened for running threads.
pub struct Runtime {
    ctx: Arc<Ctx>,
    #[cfg(unix)]
    control: Option<crate::control::ControlEndpoint>,
    recovered: Vec<crate::recovery::Recovered>,
}

/// What a continuation starts from (see [`Runtime::resume`]).
pub struct Continuation {
    /// The verified thread.json of the thread continued.
    pub of: ThreadDoc,
    /// Its conversation, rebuilt from its transcript, plus the new user message.
    pub messages: Vec<crate::provider::Message>,
    /// LLM calls (attempts included) it made: the scripted provider plays on from there.
    pub calls_made: u64,
    /// Children it spawned (counted against the chain's `spawns`).
    pub spawn_count: u64,
}

/// The provider of a runtime opened with `no_provider`: refuses every call.
struct NoProvider;

impl Provider for NoProvider {
    fn name(&self) -> &str {
        "none"
    }
    fn complete(
        &self,
        _req: crate::provider::LlmRequest,
        _cancel: tokio_util::sync::CancellationToken,
    ) -> crate::provider::BoxFuture<
        Result<crate::provider::LlmResponse, crate::provider::ProviderError>,
    > {
        Box::pin(async {
            Err(crate::provider::ProviderError {
                kind: crate::provider::ErrorKind::InvalidRequest,
                message: "this runtime was opened without a provider".into(),
                retry_after: None,
                usage: Usage::default(),
            })
        })
    }
}

/// Errors opening a runtime.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Bad config.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Bad key or trust store.
    #[error(transparent)]
    Signing(#[from] crate::signing::SigningError),
    /// Provider problem.
    #[error("{0}")]
    Provider(String),
    /// Storage problem.
    #[error("{0}")]
    Storage(String),
}

impl Runtime {
    /// Opens `project`: loads config and key, starts the supervisor and the ledger.
    pub async fn open(project: Project, opts: RuntimeOptions) -> Result<Runtime, OpenError> {
        let config = project.config()?;
        let signer = Arc::new(Signer::load_or_create(&crate::signing::user_dir())?);
        signer.trust_in(&project.trust_dir())?;
        let (trust, warnings) = Trust::load(&project.trust_dir());
        for w in warnings {
            tracing::warn!("{w}");
        }
        let providers = if opts.no_provider {
            crate::provider::Providers::single("none", Arc::new(NoProvider))
        } else {
            let choice = crate::provider::Choice {
                script: opts.script.clone(),
                provider: opts.provider.clone(),
                model: opts.model.clone(),
            };
            crate::provider::Providers::build(&project.root, &config, &choice)
                .map_err(OpenError::Provider)?
        };
        let st = |e: String| OpenError::Storage(e);
        std::fs::create_dir_all(project.state_dir())
            .map_err(|e| st(format!("{}: {e}", project.state_dir().display())))?;
        std::fs::create_dir_all(project.weft().join("threads")).map_err(|e| st(e.to_string()))?;
        let store =
            Store::open(&project.state_dir().join("registry.db")).map_err(|e| st(e.to_string()))?;
        let ledger_db = crate::ledger::open_db(&project.state_dir().join("ledger.db"))
            .map_err(|e| st(e.to_string()))?;
        let (registry, _) = Actor::spawn(None, Supervisor, store)
            .await
            .map_err(|e| st(e.to_string()))?;
        let (ledger, _) = Actor::spawn(None, LedgerActor, ledger_db)
            .await
            .map_err(|e| st(e.to_string()))?;
        let (events, _) = broadcast::channel(4096);
        let library = project.library();
        let ctx = Arc::new(Ctx {
            project,
            config,
            signer,
            trust,
            library,
            providers,
            registry,
            ledger,
            events,
            verified: Default::default(),
        });
        let recovered = crate::recovery::recover(&ctx).await;
        crate::control::remove_stale(&ctx.project);
        #[cfg(unix)]
        let control = if opts.no_control {
            None
        } else {
            match crate::control::listen(&ctx.project) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(
                        "control socket unavailable ({e}); `weft cancel` cannot reach this process"
                    );
                    None
                }
            }
        };
        Ok(Runtime {
            ctx,
            #[cfg(unix)]
            control,
            recovered,
        })
    }

    /// The control socket this runtime listens on, if any.
    pub fn control_socket(&self) -> Option<&Path> {
        #[cfg(unix)]
        return self.control.as_ref().map(|c| c.path());
        #[cfg(not(unix))]
        None
    }

    /// Threads that recovery finalized when this runtime opened.
    pub fn recovered(&self) -> &[crate::recovery::Recovered] {
        &self.recovered
    }

    /// The shared context.
    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// Subscribes to live events.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.ctx.events.subscribe()
    }

    /// Starts a root thread; the receiver yields its report when it ends.
    pub async fn start(
        &self,
        directive: &str,
        inputs: Map<String, Value>,
        overrides: LimitSet,
    ) -> Result<Started, SpawnError> {
        let (tx, rx) = oneshot::channel();
        let req = SpawnRequest {
            directive: directive.into(),
            inputs,
            overrides,
            reserve: Nanos::ZERO,
            parent: None,
            continuation: None,
        };
        let (id, actor) = spawn(&self.ctx, req, Some(tx)).await?;
        Ok((id, actor, rx))
    }

    /// Runs a root thread to its end.
    pub async fn run(
        &self,
        directive: &str,
        inputs: Map<String, Value>,
        overrides: LimitSet,
    ) -> Result<ThreadReport, SpawnError> {
        let (id, _, rx) = self.start(directive, inputs, overrides).await?;
        rx.await
            .map_err(|_| SpawnError::Storage(format!("thread {id} stopped without a report")))
    }

    /// Cancels a running thread of this runtime (and its subtree).
    pub fn cancel(&self, id: &ThreadId, reason: &str) -> bool {
        match ractor::registry::where_is(id.to_string()) {
            Some(cell) => ActorRef::<ThreadMsg>::from(cell)
                .cast(ThreadMsg::Cancel {
                    reason: reason.into(),
                })
                .is_ok(),
            None => false,
        }
    }

    /// Ledger audit: (accounts violating the invariant, open reservations).
    pub async fn audit(&self) -> (Vec<crate::ledger::Account>, usize) {
        ractor::call!(self.ctx.ledger, |reply| LedgerMsg::Audit { reply }).unwrap_or_default()
    }

    /// A ledger account.
    pub async fn account(&self, id: &ThreadId) -> Option<crate::ledger::Account> {
        ractor::call!(self.ctx.ledger, |reply| LedgerMsg::Get {
            id: id.clone(),
            reply
        })
        .ok()
        .flatten()
    }

    /// Continues an ended thread as a new continuation thread (SPEC §7 `weft resume`): same
    /// directive and capabilities, conversation rebuilt from the transcript plus `message`, the
    /// chain's remaining spend and spawns; turns, tokens and duration start afresh from the old
    /// thread's resolved limits (capped further by `overrides`).
    pub async fn resume(
        &self,
        id: &ThreadId,
        message: &str,
        overrides: LimitSet,
    ) -> Result<Started, SpawnError> {
        let dir = self.ctx.project.thread_dir(id);
        let of = ThreadDoc::read_verified(&dir.join("thread.json"), &self.ctx.trust)
            .map_err(|e| SpawnError::Untrusted(e.to_string()))?;
        if !of.status.is_terminal() {
            return Err(SpawnError::Limit(format!(
                "thread {id} is still {}; cancel it first or wait for it to end",
                of.status.as_str()
            )));
        }
        if let Some(next) = &of.continued_by {
            return Err(SpawnError::Limit(format!(
                "thread {id} was already continued by {next}; resume that one"
            )));
        }
        let report = crate::transcript::read(
            &dir.join("transcript.jsonl"),
            id.as_str(),
            Some(&self.ctx.trust),
        )
        .map_err(|e| SpawnError::Storage(format!("{}: {e}", dir.display())))?;
        if let Some((line, m)) = report.broken {
            return Err(SpawnError::Untrusted(format!(
                "{}/transcript.jsonl:{line}: {m}",
                dir.display()
            )));
        }
        let (mut messages, calls_made) = crate::thread::rebuild_conversation(&report.events);
        messages.push(crate::provider::Message::user(message));
        let row = ractor::call!(self.ctx.registry, |reply| RegistryMsg::Get {
            id: id.clone(),
            reply
        })
        .map_err(|e| SpawnError::Storage(e.to_string()))??;
        let spawn_count = row.map_or(0, |r| r.spawn_count);
        let (tx, rx) = oneshot::channel();
        let req = SpawnRequest {
            directive: of.directive.clone(),
            inputs: Map::new(),
            overrides,
            reserve: Nanos::ZERO,
            parent: None,
            continuation: Some(Continuation {
                of: of.clone(),
                messages,
                calls_made,
                spawn_count,
            }),
        };
        let (new_id, actor) = spawn(&self.ctx, req, Some(tx)).await?;
        let mut old = of;
        old.continued_by = Some(new_id.clone());
        old.updated_at = now_ts();
        old.write_signed(&dir.join("thread.json"), &self.ctx.signer, true)
            .map_err(|e| SpawnError::Storage(e.to_string()))?;
        Ok((new_id, actor, rx))
    }

    /// Stops the supervisor and the ledger (after every thread has ended).
    pub fn shutdown(self) {
        self.ctx.registry.stop(None);
        self.ctx.ledger.stop(None);
    }
}

/// Output tokens of the smallest call worth making.
pub const MIN_OUTPUT_TOKENS: u64 = 16;

/// SPEC §4 steps 1–6: resolve the parent, load and validate, resolve limits, admit, open the
/// ledger account, register, write the first signed thread.json and start the actor.
/// On any failure nothing is left running, reserved or half-written.
pub async fn spawn(
    ctx: &Arc<Ctx>,
    req: SpawnRequest,
    on_finish: Option<oneshot::Sender<ThreadReport>>,
) -> Result<(ThreadId, ActorRef<ThreadMsg>), SpawnError> {
    // 1. The parent, from its verified thread.json.
    let parent_doc = match &req.parent {
        Some(p) => Some(ctx.verified_doc(&p.id).map_err(SpawnError::Untrusted)?),
        None => None,
    };
    // 2. Directive and inputs (a continuation keeps its predecessor's conversation instead).
    let directive = ctx.library.load(&req.directive)?;
    let (inputs, prompt) = match &req.continuation {
        None => {
            let inputs = directive.validate_inputs(&req.inputs)?;
            let prompt = directive.render(&inputs)?;
            (inputs, prompt)
        }
        Some(_) => (Map::new(), String::new()),
    };
    // 3. Limits and capabilities.
    let (limits, caps, model) = match &req.continuation {
        Some(c) => {
            let limits = continuation_limits(c, &req.overrides);
            if limits.spend <= Nanos::ZERO {
                return Err(SpawnError::Limit(format!(
                    "limit exceeded: spend — the chain of {} has spent its whole budget ({})",
                    c.of.id, c.of.limits.spend
                )));
            }
            (limits, c.of.capabilities.clone(), Some(c.of.model.clone()))
        }
        None => {
            let limits = crate::limits::resolve(
                &ctx.config.default_limits,
                &directive.limits,
                &req.overrides,
                parent_doc.as_ref().map(|d| &d.limits),
            );
            let caps = match &parent_doc {
                Some(p) => crate::capability::attenuate(&directive.permissions, &p.capabilities),
                None => directive.permissions.clone(),
            };
            (limits, caps, None)
        }
    };
    let (provider, provider_name, selected) = ctx
        .providers
        .select(&ctx.config, &directive)
        .map_err(SpawnError::Config)?;
    // A continuation keeps its chain's model unless the runtime was told another.
    let model = match model {
        Some(m) if provider.name() != "scripted" => m,
        _ => selected,
    };
    crate::limits::check_depth(&limits, &directive.name).map_err(SpawnError::Limit)?;
    let continuation_of = req.continuation.as_ref().map(|c| c.of.id.clone());
    let chain_root = req
        .continuation
        .as_ref()
        .map(|c| c.of.chain_root.clone().unwrap_or_else(|| c.of.id.clone()));
    let price: Price = ctx.config.price(&model).map_err(SpawnError::Config)?;
    let id = ThreadId::generate(&directive.name);
    let root_id = parent_doc
        .as_ref()
        .map_or(id.clone(), |d| d.root_id.clone());
    // 5. Ledger account (before admission so a refusal there can be undone by closing it).
    let min_first_call = price.cost(&Usage {
        input_tokens: (prompt.len() as u64).div_ceil(3),
        output_tokens: MIN_OUTPUT_TOKENS,
        cache_read_tokens: 0,
    });
    let parent_id = req.parent.as_ref().map(|p| p.id.clone());
    ractor::call!(ctx.ledger, |reply| LedgerMsg::Open {
        id: id.clone(),
        parent: parent_id.clone(),
        max: limits.spend,
        guarantee: req.reserve,
        min_first_call,
        reply
    })
    .map_err(|e| SpawnError::Storage(format!("ledger: {e}")))??;
    let undo_ledger = |ctx: &Arc<Ctx>, id: &ThreadId| {
        let ledger = ctx.ledger.clone();
        let id = id.clone();
        async move {
            let _ = ractor::call!(ledger, |reply| LedgerMsg::Close { id, reply });
        }
    };
    // 4 + 6. Admission and registration in one registry transaction.
    let now = now_ts();
    let row = ThreadRow {
        id: id.to_string(),
        directive: directive.name.clone(),
        parent_id: parent_id.as_ref().map(ToString::to_string),
        root_id: root_id.to_string(),
        status: "created".into(),
        created_at: now.clone(),
        updated_at: now.clone(),
        model: model.clone(),
        owner_pid: std::process::id(),
        continuation_of: continuation_of.as_ref().map(ToString::to_string),
        chain_root: chain_root.as_ref().map(ToString::to_string),
        ..Default::default()
    };
    let admit = parent_doc
        .as_ref()
        .zip(parent_id.as_ref())
        .map(|(d, pid)| Admission {
            parent: pid.clone(),
            spawns: d.limits.spawns,
            concurrency: d.limits.concurrency,
        });
    let registered = ractor::call!(ctx.registry, |reply| RegistryMsg::Register {
        row: Box::new(row.clone()),
        admit,
        reply
    });
    match registered {
        Ok(Ok(())) => {
            if let (Some(old), Some(root)) = (&continuation_of, &chain_root) {
                let linked = ractor::call!(ctx.registry, |reply| RegistryMsg::LinkContinuation {
                    old: old.clone(),
                    new: id.clone(),
                    chain_root: root.clone(),
                    reply
                });
                if !matches!(linked, Ok(Ok(()))) {
                    tracing::warn!(thread = %id, "could not link continuation in the registry: {linked:?}");
                }
            }
        }
        Ok(Err(e)) => {
            undo_ledger(ctx, &id).await;
            return Err(e.into());
        }
        Err(e) => {
            undo_ledger(ctx, &id).await;
            return Err(SpawnError::Storage(format!("registry: {e}")));
        }
    }
    // 6. Files, first signed thread.json, the actor.
    let fail = |msg: String| {
        let ctx = ctx.clone();
        let id = id.clone();
        let mut row = row.clone();
        async move {
            row.status = "error".into();
            row.error = Some(msg.clone());
            row.updated_at = now_ts();
            let _ = ractor::call!(ctx.registry, |reply| RegistryMsg::Update {
                row: Box::new(row),
                reply: Some(reply)
            });
            let _ = ractor::call!(ctx.ledger, |reply| LedgerMsg::Close {
                id: id.clone(),
                reply
            });
            // No half-written files behind: the thread never ran.
            let _ = std::fs::remove_dir_all(ctx.project.thread_dir(&id));
            SpawnError::Storage(msg)
        }
    };
    let dir = ctx.project.thread_dir(&id);
    if let Err(e) = std::fs::create_dir(&dir) {
        return Err(fail(format!("{}: {e}", dir.display())).await);
    }
    let durability = ctx.config.durability;
    let mut transcript = match TranscriptWriter::create(
        &dir.join("transcript.jsonl"),
        id.as_str(),
        ctx.signer.clone(),
        durability,
        ctx.config.checkpoint_every,
    ) {
        Ok(t) => t,
        Err(e) => return Err(fail(format!("transcript: {e}")).await),
    };
    let started = json!({
        "directive": directive.name, "directive_hash": directive.content_hash, "source": directive.source,
        "parent": parent_id, "root": root_id, "model": model, "provider": provider_name,
        "limits": limits, "capabilities": caps, "inputs": inputs, "reserve_nanos": req.reserve,
        "continuation_of": continuation_of,
    });
    if let Err(e) = transcript.append("thread_started", started) {
        return Err(fail(format!("transcript: {e}")).await);
    }
    let doc = ThreadDoc {
        version: 1,
        id: id.clone(),
        directive: directive.name.clone(),
        directive_hash: directive.content_hash.clone(),
        parent_id: parent_id.clone(),
        root_id: root_id.clone(),
        status: Status::Created,
        history: vec![Transition {
            status: Status::Created,
            at: now.clone(),
        }],
        created_at: now.clone(),
        updated_at: now,
        model: model.clone(),
        provider: provider_name.clone(),
        limits: limits.clone(),
        capabilities: caps.clone(),
        cost: Cost::default(),
        outputs: None,
        result: None,
        error: None,
        error_kind: None,
        continuation_of: continuation_of.clone(),
        continued_by: None,
        chain_root: chain_root.clone(),
        transcript_head: transcript.head().clone(),
    };
    // The first signed thread.json (history: created, running) is written by the actor as it
    // starts, one file write instead of two; a crash before that leaves a registry row that
    // recovery completes from the registry and the ledger.
    let (messages, calls_made) = match req.continuation {
        Some(c) => (c.messages, c.calls_made),
        None => (vec![crate::provider::Message::user(prompt)], 0),
    };
    let args = ThreadArgs {
        ctx: ctx.clone(),
        provider,
        directive: Arc::new(directive),
        messages,
        calls_made,
        parent: req.parent.as_ref().map(|p| (p.id.clone(), p.actor.clone())),
        limits,
        price,
        doc,
        transcript,
        on_finish,
    };
    let spawned = match &req.parent {
        Some(p) => {
            let cell: ActorCell = p.actor.get_cell();
            Actor::spawn_linked(Some(id.to_string()), ThreadActor, args, cell).await
        }
        None => Actor::spawn(Some(id.to_string()), ThreadActor, args).await,
    };
    match spawned {
        Ok((actor, _)) => Ok((id, actor)),
        Err(e) => Err(fail(format!("cannot start the thread actor: {e}")).await),
    }
}

/// A continuation's limits: its predecessor's resolved limits with the chain's remaining spend
/// and spawns, each further capped by `overrides`.
fn continuation_limits(c: &Continuation, overrides: &LimitSet) -> crate::limits::Limits {
    let mut l = c.of.limits.clone();
    l.spend = l.spend.minus(Nanos(c.of.cost.spend_nanos));
    l.spawns = l.spawns.saturating_sub(c.spawn_count);
    let cap = |v: &mut u64, o: Option<u64>| *v = o.map_or(*v, |o| o.min(*v));
    cap(&mut l.turns, overrides.turns);
    cap(&mut l.tokens, overrides.tokens);
    cap(&mut l.spawns, overrides.spawns);
    cap(&mut l.concurrency, overrides.concurrency);
    cap(
        &mut l.duration_ms,
        overrides.duration.map(|d| d.as_millis() as u64),
    );
    if let Some(sp) = overrides.spend {
        l.spend = l.spend.min(sp);
    }
    if let Some(d) = overrides.depth {
        l.depth = l.depth.min(d);
    }
    l
}
