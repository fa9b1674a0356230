//! The runtime: one project opened for running threads — the public library API ([`Runtime`])
//! and the spawn procedure of SPEC §4 shared by roots and children.
//!
//! Owns the wiring (supervisor, ledger, signer, provider, directive library) in [`Ctx`].
//! Must never keep thread state itself: that belongs to thread actors.

use crate::config::{Config, Durability};
use crate::directive::{Directive, DirectiveError, Library};
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
    /// The LLM backend.
    pub provider: Arc<dyn Provider>,
    /// Provider name in config.
    pub provider_name: String,
    /// The supervisor (registry owner).
    pub registry: ActorRef<RegistryMsg>,
    /// The ledger.
    pub ledger: ActorRef<LedgerMsg>,
    /// Live events.
    pub events: broadcast::Sender<Event>,
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
}

/// Options for opening a runtime.
#[derive(Default, Clone)]
pub struct RuntimeOptions {
    /// Scripted provider file (overrides config).
    pub script: Option<PathBuf>,
}

/// A project opened for running threads.
pub struct Runtime {
    ctx: Arc<Ctx>,
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
        let (provider, provider_name) = build_provider(&project, &config, opts.script.as_deref())?;
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
        Ok(Runtime {
            ctx: Arc::new(Ctx {
                project,
                config,
                signer,
                trust,
                library,
                provider,
                provider_name,
                registry,
                ledger,
                events,
            }),
        })
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
    ) -> Result<
        (
            ThreadId,
            ActorRef<ThreadMsg>,
            oneshot::Receiver<ThreadReport>,
        ),
        SpawnError,
    > {
        let (tx, rx) = oneshot::channel();
        let req = SpawnRequest {
            directive: directive.into(),
            inputs,
            overrides,
            reserve: Nanos::ZERO,
            parent: None,
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

    /// Stops the supervisor and the ledger (after every thread has ended).
    pub fn shutdown(self) {
        self.ctx.registry.stop(None);
        self.ctx.ledger.stop(None);
    }
}

fn build_provider(
    project: &Project,
    config: &Config,
    script: Option<&Path>,
) -> Result<(Arc<dyn Provider>, String), OpenError> {
    if let Some(s) = script {
        let p = crate::provider::scripted::Scripted::load(s).map_err(OpenError::Provider)?;
        return Ok((Arc::new(p), "scripted".into()));
    }
    let name = config.default_provider.clone();
    let pc = config.providers.get(&name).ok_or_else(|| {
        OpenError::Provider(format!("defaults.provider is `{name}` but no `providers.{name}` is configured in .weft/config.yaml"))
    })?;
    match pc.kind.as_str() {
        "scripted" => {
            let file = pc.script.as_ref().ok_or_else(|| {
                OpenError::Provider(format!("provider `{name}` is scripted but has no script: pass --script FILE or set providers.{name}.script"))
            })?;
            let p = crate::provider::scripted::Scripted::load(&project.root.join(file)).map_err(OpenError::Provider)?;
            Ok((Arc::new(p), name))
        }
        kind => Err(OpenError::Provider(format!(
            "provider `{name}` has kind `{kind}`, which this build cannot call yet (only `scripted`); use --script FILE"
        ))),
    }
}

/// The model id a directive runs on under the current provider.
pub fn model_for(ctx: &Ctx, d: &Directive) -> String {
    if ctx.provider.name() == "scripted" {
        return "scripted".into();
    }
    let pc = ctx.config.providers.get(&ctx.provider_name);
    match (&d.model.id, &d.model.tier) {
        (Some(id), _) => id.clone(),
        (None, Some(t)) => pc
            .and_then(|p| p.tiers.get(t))
            .cloned()
            .unwrap_or_else(|| t.clone()),
        (None, None) => pc
            .and_then(|p| p.tiers.get("default").or_else(|| p.tiers.values().next()))
            .cloned()
            .unwrap_or_default(),
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
        Some(p) => {
            let path = ctx.project.thread_dir(&p.id).join("thread.json");
            Some(
                ThreadDoc::read_verified(&path, &ctx.trust)
                    .map_err(|e| SpawnError::Untrusted(e.to_string()))?,
            )
        }
        None => None,
    };
    // 2. Directive and inputs.
    let directive = ctx.library.load(&req.directive)?;
    let inputs = directive.validate_inputs(&req.inputs)?;
    let prompt = directive.render(&inputs)?;
    // 3. Limits and capabilities.
    let limits = crate::limits::resolve(
        &ctx.config.default_limits,
        &directive.limits,
        &req.overrides,
        parent_doc.as_ref().map(|d| &d.limits),
    );
    crate::limits::check_depth(&limits, &directive.name).map_err(SpawnError::Limit)?;
    let caps = match &parent_doc {
        Some(p) => crate::capability::attenuate(&directive.permissions, &p.capabilities),
        None => directive.permissions.clone(),
    };
    let model = model_for(ctx, &directive);
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
        Ok(Ok(())) => {}
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
            let _ = ractor::call!(ctx.ledger, |reply| LedgerMsg::Close { id, reply });
            SpawnError::Storage(msg)
        }
    };
    let dir = ctx.project.thread_dir(&id);
    if let Err(e) = std::fs::create_dir_all(dir.join("files")) {
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
        "parent": parent_id, "root": root_id, "model": model, "provider": ctx.provider.name(),
        "limits": limits, "capabilities": caps, "inputs": inputs, "reserve_nanos": req.reserve,
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
        provider: ctx.provider.name().into(),
        limits: limits.clone(),
        capabilities: caps.clone(),
        cost: Cost::default(),
        outputs: None,
        result: None,
        error: None,
        continuation_of: None,
        chain_root: None,
        transcript_head: transcript.head().clone(),
    };
    if let Err(e) = doc.write_signed(
        &dir.join("thread.json"),
        &ctx.signer,
        durability == Durability::Strict,
    ) {
        return Err(fail(format!("thread.json: {e}")).await);
    }
    let args = ThreadArgs {
        ctx: ctx.clone(),
        directive: Arc::new(directive),
        prompt,
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
