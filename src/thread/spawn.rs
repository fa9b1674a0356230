//! The spawn procedure of SPEC §4, the one way a thread starts (root, child or continuation):
//! resolve the parent, load and validate, resolve limits, open the ledger account, admit and
//! register, write the first records and start the actor. On any failure nothing is left running,
//! reserved or half-written.

use super::{Ctx, ThreadActor, ThreadArgs, ThreadMsg, ThreadReport};
use crate::core::ids::{now_ts, ThreadId};
use crate::core::limits::LimitSet;
use crate::core::money::{Nanos, Price, Usage};
use crate::core::status::Status;
use crate::directive::DirectiveError;
use crate::ledger::{LedgerError, LedgerMsg};
use crate::record::thread_doc::{Cost, ThreadDoc, Transition};
use crate::record::transcript::TranscriptWriter;
use crate::registry::{Admission, RegistryError, RegistryMsg, ThreadRow};
use ractor::{Actor, ActorCell, ActorRef};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use tokio::sync::oneshot;

/// Why a thread could not be started. Nothing is left behind when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The directive or its inputs are invalid.
    #[error(transparent)]
    Directive(#[from] DirectiveError),
    /// A limit refuses the spawn (depth, spawns, concurrency, spend).
    #[error("{0}")]
    Limit(String),
    /// The parent may not spawn this directive (checked on the name it resolves to).
    #[error("{0}")]
    Denied(String),
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
            RegistryError::Spawns { .. }
            | RegistryError::Concurrency { .. }
            | RegistryError::Continued { .. } => SpawnError::Limit(e.to_string()),
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

/// Where a new thread hangs in the tree.
pub(crate) struct ParentLink {
    /// Parent id.
    pub id: ThreadId,
    /// Parent actor (for reports and linking).
    pub actor: ActorRef<ThreadMsg>,
}

/// Everything needed to start one thread.
pub(crate) struct SpawnRequest {
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
    /// Set when the thread starts from a copy of another's conversation (`weft fork`).
    pub seed: Option<Seed>,
    /// Limits a root is capped by as if they were its parent's (a scheduled effect runs under
    /// its scheduling thread's).
    pub cap: Option<crate::core::limits::Limits>,
    /// Paths in the parent's file area copied into the child's at the same paths.
    pub attach: Vec<String>,
    /// The tree's provider and model, over the runtime's (children inherit it).
    pub route: Option<Arc<crate::provider::Route>>,
    /// The span the thread's span goes under (the parent's `spawn_thread` call).
    pub parent_span: Option<tracing::Span>,
}

/// What a continuation starts from (see [`Runtime::resume`]).
pub(crate) struct Continuation {
    /// The verified thread.json of the thread continued.
    pub of: ThreadDoc,
    /// Its conversation, rebuilt from its transcript, plus the new user message.
    pub messages: Vec<crate::provider::Message>,
    /// LLM calls (attempts included) it made: the scripted provider plays on from there.
    pub calls_made: u64,
    /// Children it spawned (counted against the chain's `spawns`).
    pub spawn_count: u64,
}

/// What a fork starts from (see [`Runtime::fork`]): a new root with its own budget.
pub(crate) struct Seed {
    /// The conversation copied, ending with a user message.
    pub messages: Vec<crate::provider::Message>,
    /// LLM calls the copied part made (the scripted provider plays on from there).
    pub calls_made: u64,
    /// The source thread and the last seq copied.
    pub from: crate::record::thread_doc::ForkedFrom,
}

/// Output tokens of the smallest call worth making.
pub(crate) const MIN_OUTPUT_TOKENS: u64 = 16;

/// SPEC §4 steps 1–6: resolve the parent, load and validate, resolve limits, admit, open the
/// ledger account, register, write the first signed thread.json and start the actor.
/// On any failure nothing is left running, reserved or half-written.
pub(crate) async fn spawn(
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
    // A child's directive comes from a model: a library name only, and the parent must hold the
    // capability for the name it resolves to (front matter may rename a file).
    let directive = match &parent_doc {
        Some(p) => {
            let d = ctx.library.load_name(&req.directive)?;
            let cap = crate::tools::spawn_capability(&d.name);
            crate::tools::check(&p.capabilities, &cap, p.id.as_str())
                .map_err(SpawnError::Denied)?;
            d
        }
        None => ctx.library.load(&req.directive)?,
    };
    let (inputs, prompt) = match (&req.continuation, &req.seed) {
        (None, None) => {
            let inputs = directive.validate_inputs(&req.inputs)?;
            let prompt = directive.render(&inputs)?;
            (inputs, prompt)
        }
        _ => (Map::new(), String::new()),
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
            let limits = crate::core::limits::resolve(
                &ctx.config.default_limits,
                &directive.limits,
                &req.overrides,
                parent_doc.as_ref().map(|d| &d.limits).or(req.cap.as_ref()),
            );
            let caps = match &parent_doc {
                Some(p) => {
                    crate::core::capability::attenuate(&directive.permissions, &p.capabilities)
                }
                None => directive.permissions.clone(),
            };
            (limits, caps, None)
        }
    };
    let (provider, provider_name, selected) = ctx
        .providers
        .select(&ctx.config, &directive, req.route.as_deref())
        .map_err(SpawnError::Config)?;
    // A continuation keeps its chain's model unless the runtime was told another.
    let model = match model {
        Some(m) if provider.name() != "scripted" => m,
        _ => selected,
    };
    crate::core::limits::check_depth(&limits, &directive.name).map_err(SpawnError::Limit)?;
    let continuation_of = req.continuation.as_ref().map(|c| c.of.id.clone());
    let chain_root = req
        .continuation
        .as_ref()
        .map(|c| c.of.chain_root.clone().unwrap_or_else(|| c.of.id.clone()));
    let price: Price = ctx
        .config
        .price(&model)
        .map_err(|e| SpawnError::Config(e.to_string()))?;
    let hooks = ctx
        .hooks
        .with_directive(
            directive.hooks.as_ref(),
            &directive.source,
            &ctx.project.root,
        )
        .map_err(|e| SpawnError::Config(e.to_string()))?;
    let id = ThreadId::generate(&directive.name);
    // A continuation of a thread that ran as a child stays in its tree: it is registered with the
    // tree's root and its account opens under the first thread of its chain's parent (closed
    // accounts opened again from ledger.db), so every ancestor's cap still bounds the chain.
    let chain_parent = match &req.continuation {
        Some(c) => continued_parent(ctx, c)?,
        None => None,
    };
    let root_id = match (&parent_doc, &req.continuation, &chain_parent) {
        (Some(d), _, _) => d.root_id.clone(),
        (None, Some(c), Some(_)) => c.of.root_id.clone(),
        _ => id.clone(),
    };
    // 5. Ledger account (before admission so a refusal there can be undone by closing it).
    let min_first_call = price.cost(&Usage {
        input_tokens: (prompt.len() as u64).div_ceil(3),
        output_tokens: MIN_OUTPUT_TOKENS,
        cache_read_tokens: 0,
    });
    let parent_id = req.parent.as_ref().map(|p| p.id.clone());
    let undo_ledger = |ctx: &Arc<Ctx>, id: &ThreadId| {
        let ledger = ctx.ledger.clone();
        let id = id.clone();
        async move {
            let _ = ractor::call!(ledger, |reply| LedgerMsg::Close { id, reply });
        }
    };
    if let Some(p) = &chain_parent {
        ractor::call!(ctx.ledger, |reply| LedgerMsg::Reopen {
            id: p.clone(),
            reply
        })
        .map_err(|e| SpawnError::Storage(format!("ledger: {e}")))?
        .map_err(|e| {
            SpawnError::Storage(format!(
                "the ledger account of {p}, under which this chain draws, cannot be read: {e}"
            ))
        })?;
    }
    let opened = ractor::call!(ctx.ledger, |reply| LedgerMsg::Open {
        id: id.clone(),
        parent: parent_id.clone().or_else(|| chain_parent.clone()),
        max: limits.spend,
        guarantee: req.reserve,
        min_first_call,
        reply
    });
    match opened {
        Ok(Ok(())) => crate::core::failpoint::hit("spawn.ledger"),
        // Whatever went wrong, no account of this id may stay open holding the parent's
        // guarantee (closing an account that was never opened changes nothing).
        Ok(Err(e)) => {
            undo_ledger(ctx, &id).await;
            return Err(e.into());
        }
        Err(e) => {
            undo_ledger(ctx, &id).await;
            return Err(SpawnError::Storage(format!("ledger: {e}")));
        }
    }
    // 4 + 6. Admission and registration in one registry transaction.
    let now = now_ts();
    let row = ThreadRow {
        directive: directive.name.clone(),
        parent_id: parent_id.clone(),
        created_at: now.clone(),
        updated_at: now.clone(),
        model: model.clone(),
        owner_pid: std::process::id(),
        forked_from: req.seed.as_ref().map(|s| s.from.thread.clone()),
        continuation_of: continuation_of.clone(),
        chain_root: chain_root.clone(),
        ..ThreadRow::new(id.clone(), root_id.clone(), Status::Created)
    };
    // A continuation takes its predecessor's place: it is not a new spawn of the parent.
    let admit = parent_doc
        .as_ref()
        .filter(|_| req.continuation.is_none())
        .zip(parent_id.as_ref())
        .map(|(d, pid)| Admission {
            parent: pid.clone(),
            spawns: d.limits.spawns,
            concurrency: d.limits.concurrency,
        });
    // From its row to its running actor, the thread is `in_spawn` (see `Ctx::in_spawn`).
    let _in_spawn = InSpawn::mark(ctx, &id);
    let registered = ractor::call!(ctx.registry, |reply| RegistryMsg::Register {
        row: Box::new(row.clone()),
        admit,
        reply
    });
    match registered {
        Ok(Ok(())) => {
            crate::core::failpoint::hit("spawn.registered");
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
            row.status = Status::Error;
            row.error = Some(msg.clone());
            row.updated_at = now_ts();
            ctx.store_row(row).await;
            let _ = ractor::call!(ctx.ledger, |reply| LedgerMsg::Close {
                id: id.clone(),
                reply
            });
            // No half-written files behind: the thread never ran.
            let _ = std::fs::remove_dir_all(ctx.store.thread_dir(&id));
            SpawnError::Storage(msg)
        }
    };
    let store = &ctx.store;
    let dir = store.thread_dir(&id);
    if let Err(e) = std::fs::create_dir(&dir) {
        return Err(fail(format!("{}: {e}", dir.display())).await);
    }
    if let Some(p) = &parent_id {
        let from = ctx.store.files_dir(p);
        for rel in &req.attach {
            if let Err(e) = crate::tools::copy_between(&from, rel, &store.files_dir(&id), rel) {
                return Err(fail(format!("attaching `{rel}`: {e}")).await);
            }
        }
    }
    let durability = ctx.config.durability;
    let mut transcript = match TranscriptWriter::create(
        &store.transcript_path(&id),
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
    crate::core::failpoint::hit("spawn.transcript");
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
        forked_from: req.seed.as_ref().map(|s| s.from.clone()),
        imported: None,
    };
    // The first signed thread.json (history: created, running) is written by the actor as it
    // starts, one file write instead of two; a crash before that leaves a registry row that
    // recovery completes from the registry and the ledger.
    let (messages, calls_made) = match (req.continuation, req.seed) {
        (Some(c), _) => (c.messages, c.calls_made),
        (None, Some(s)) => (s.messages, s.calls_made),
        (None, None) => (vec![crate::provider::Message::user(prompt)], 0),
    };
    let span = super::spans::thread(
        req.parent_span.as_ref(),
        &id,
        &directive.name,
        req.parent.as_ref().map(|p| &p.id),
        &provider_name,
        &model,
    );
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
        hooks,
        inputs: Value::Object(inputs.clone()),
        route: req.route.clone(),
        span,
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
/// The parent of the first thread of `c`'s chain, if that thread ran as a child: the account a
/// continuation draws under.
fn continued_parent(ctx: &Arc<Ctx>, c: &Continuation) -> Result<Option<ThreadId>, SpawnError> {
    match (&c.of.parent_id, &c.of.chain_root) {
        (Some(p), _) => Ok(Some(p.clone())),
        (None, Some(first)) if *first != c.of.id => {
            let path = ctx.store.doc_path(first);
            let doc = ThreadDoc::read_verified(&path, &ctx.trust)
                .map_err(|e| SpawnError::Untrusted(e.to_string()))?;
            Ok(doc.parent_id)
        }
        _ => Ok(None),
    }
}

fn continuation_limits(c: &Continuation, overrides: &LimitSet) -> crate::core::limits::Limits {
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

/// Marks a thread as being spawned while it lives (see [`Ctx::in_spawn`]).
struct InSpawn<'a> {
    ctx: &'a Ctx,
    id: ThreadId,
}

impl<'a> InSpawn<'a> {
    fn mark(ctx: &'a Ctx, id: &ThreadId) -> InSpawn<'a> {
        if let Ok(mut s) = ctx.in_spawn.lock() {
            s.insert(id.clone());
        }
        InSpawn {
            ctx,
            id: id.clone(),
        }
    }
}

impl Drop for InSpawn<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.ctx.in_spawn.lock() {
            s.remove(&self.id);
        }
    }
}
