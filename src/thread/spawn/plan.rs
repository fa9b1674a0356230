//! SPEC §4 steps 1–3, which change nothing anywhere: the parent from its verified
//! thread.json, the directive and its inputs, the limits and capabilities, the provider,
//! model and price, the hooks, and the new thread's place in its tree. A [`Plan`] is what
//! the stages that do change something (`stages.rs`) act on.

use super::error::SpawnError;
use super::request::{Continuation, Origin, SpawnRequest};
use crate::core::ids::ThreadId;
use crate::core::limits::{LimitSet, Limits};
use crate::core::money::{Nanos, Price};
use crate::directive::Directive;
use crate::hooks::Hook;
use crate::provider::Provider;
use crate::record::thread_doc::{SignatureCheck, ThreadDoc};
use crate::thread::ctx::Ctx;
use serde_json::{Map, Value};
use std::sync::Arc;

/// Everything resolved about a thread before anything of it exists.
pub(crate) struct Plan {
    /// Its id (generated from the directive's name).
    pub id: ThreadId,
    /// When it was created (its row's and its thread.json's `created_at`).
    pub created_at: String,
    /// Its parent's id (None for a root).
    pub parent_id: Option<ThreadId>,
    /// Its parent's verified thread.json.
    pub parent_doc: Option<ThreadDoc>,
    /// The root of its tree.
    pub root_id: ThreadId,
    /// The directive, loaded and checked.
    pub directive: Directive,
    /// The inputs, validated (empty for a continuation or a fork).
    pub inputs: Map<String, Value>,
    /// The rendered prompt (empty for a continuation or a fork).
    pub prompt: String,
    /// Resolved limits.
    pub limits: Limits,
    /// Capabilities (attenuated by the parent's).
    pub caps: Vec<String>,
    /// What waits for a person: its directive's `approval:` list and every ancestor's.
    pub approval: Vec<String>,
    /// The provider, its name and the model it calls.
    pub provider: Arc<dyn Provider>,
    /// The provider's name.
    pub provider_name: String,
    /// The model.
    pub model: String,
    /// The model's price.
    pub price: Price,
    /// The hooks it runs (every layer, the directive's included).
    pub hooks: Vec<Hook>,
    /// The thread it continues.
    pub continuation_of: Option<ThreadId>,
    /// The first thread of its chain (a continuation).
    pub chain_root: Option<ThreadId>,
    /// The account a continuation of a child draws under (the chain's first thread's parent).
    pub chain_parent: Option<ThreadId>,
    /// The hooks whose spawns led to it (it never fires them).
    pub caused_by: Vec<String>,
    /// Its directive file's signature, checked (recorded in its thread.json).
    pub signature: Option<Box<SignatureCheck>>,
}

impl Plan {
    /// Resolves `req` (SPEC §4 steps 1–3).
    pub(crate) fn make(ctx: &Arc<Ctx>, req: &SpawnRequest) -> Result<Plan, SpawnError> {
        let parent_doc = match req.parent_id() {
            Some(p) => Some(ctx.verified_doc(p).map_err(SpawnError::Untrusted)?),
            None => None,
        };
        let directive = load(ctx, req, parent_doc.as_ref())?;
        let signature = signature_check(ctx, &directive)?;
        let (inputs, prompt) = match &req.origin {
            Origin::Continue(..) | Origin::Fork(_) => (Map::new(), String::new()),
            _ => {
                let inputs = directive.validate_inputs(&req.inputs)?;
                // An input may carry a secret: the model is never sent it in clear.
                let prompt = directive.render(&inputs)?;
                let clean = match ctx.redactor().redact(&prompt) {
                    std::borrow::Cow::Owned(c) => Some(c),
                    std::borrow::Cow::Borrowed(_) => None,
                };
                (inputs, clean.unwrap_or(prompt))
            }
        };
        let (limits, caps, kept_model) =
            limits_and_caps(ctx, req, &directive, parent_doc.as_ref())?;
        let (provider, provider_name, selected) = ctx
            .providers
            .select(&ctx.config, &directive, req.route.as_deref())
            .map_err(SpawnError::Config)?;
        // A continuation keeps its chain's model unless the runtime was told another.
        let model = match kept_model {
            Some(m) if provider.name() != "scripted" => m,
            _ => selected,
        };
        crate::core::limits::check_depth(&limits, &directive.name).map_err(SpawnError::Limit)?;
        let price = ctx
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
        let approval = approval_of(req, &directive, parent_doc.as_ref());
        let caused_by = caused_by(req, parent_doc.as_ref());
        let id = match &req.origin {
            Origin::Deferred(d) => d.id.clone(),
            _ => None,
        }
        .unwrap_or_else(|| ThreadId::generate(&directive.name));
        let chain = Chain::of(ctx, req.continuation())?;
        let root_id = match (&parent_doc, req.continuation(), chain.in_tree) {
            (Some(d), _, _) => d.root_id.clone(),
            (None, Some(c), true) => c.of.root_id.clone(),
            _ => id.clone(),
        };
        if matches!(req.origin, Origin::Deferred(_)) && ctx.stopped(&root_id) {
            return Err(SpawnError::Denied(format!(
                "the tree of {root_id} was cancelled: work it caused does not start"
            )));
        }
        Ok(Plan {
            created_at: crate::core::ids::now_ts(),
            parent_id: req.parent_id().cloned(),
            parent_doc,
            root_id,
            id,
            directive,
            inputs,
            prompt,
            limits,
            caps,
            approval,
            provider,
            provider_name,
            model,
            price,
            hooks,
            continuation_of: chain.of,
            chain_root: chain.root,
            chain_parent: chain.parent,
            caused_by,
            signature,
        })
    }
}

/// The directive file's RyeOS signature, checked against the signers trusted for directives
/// (`.weft/trust/ryeos/*.pub`, apart from the keys that sign weft's own records): a file a
/// trusted signer signed that does not verify as it is — the directive's, or one it extends —
/// starts nothing; otherwise the directive file's status is recorded: `verified` only when
/// every file of its chain verifies.
fn signature_check(ctx: &Ctx, d: &Directive) -> Result<Option<Box<SignatureCheck>>, SpawnError> {
    let chain = std::iter::once((&d.source, &d.signature))
        .chain(d.extends_signatures.iter().map(|(s, g)| (s, g)));
    if chain.clone().all(|(_, g)| g.is_none()) {
        return Ok(None);
    }
    let (signers, _) = crate::record::signing::Trust::load(&ctx.project.trust_dir().join("ryeos"));
    let mut all_verified = true;
    for (source, sig) in chain {
        let Some(sig) = sig else {
            all_verified = false;
            continue;
        };
        match signers.by_fingerprint(&sig.signer) {
            Some(key) if sig.verified_by(key) => {}
            Some(_) => {
                return Err(SpawnError::Untrusted(format!(
                    "{source}: its RyeOS signature by trusted signer {} does not verify ({}): the file was changed after it was signed, or the signature is forged; sign it again or remove the line",
                    sig.signer,
                    if sig.unchanged { "bad signature" } else { "content hash differs" }
                )))
            }
            None => all_verified = false,
        }
    }
    let Some(own) = &d.signature else {
        return Ok(None);
    };
    let status = match (signers.by_fingerprint(&own.signer).is_some(), all_verified) {
        (true, true) => "verified",
        (true, false) => "verified, but a file it extends is not",
        (false, _) if own.unchanged => "signer not trusted",
        (false, _) => "signer not trusted, content hash differs",
    };
    Ok(Some(Box::new(SignatureCheck {
        scheme: "ryeos".into(),
        signer: own.signer.clone(),
        signed_at: own.signed_at.clone(),
        status: status.into(),
    })))
}

/// The hooks whose spawns led here: the parent's (or the chain's) and the one starting it.
fn caused_by(req: &SpawnRequest, parent: Option<&ThreadDoc>) -> Vec<String> {
    let mut out = match (req.continuation(), parent) {
        (Some(c), _) => c.of.caused_by.clone(),
        (None, Some(p)) => p.caused_by.clone(),
        (None, None) => Vec::new(),
    };
    if let Some(h) = &req.hook {
        if !out.contains(h) {
            out.push(h.clone());
        }
    }
    out
}

/// An outside client's root: the directive's own limits lowered by what it asks, its spend at
/// most its bounds' `max_spend`.
fn client_limits(ctx: &Ctx, req: &SpawnRequest, directive: &Directive) -> Limits {
    let own = crate::core::limits::resolve(
        &ctx.config.default_limits,
        &directive.limits,
        &LimitSet::default(),
        None,
    );
    let mut l = crate::core::limits::lowered(own, &req.overrides);
    if let Origin::Client(b) = &req.origin {
        l.spend = l.spend.min(b.max_spend);
    }
    l
}

/// A child's directive comes from a model: a library name only, and the parent must hold the
/// capability for the name it resolves to (front matter may rename a file).
fn load(
    ctx: &Ctx,
    req: &SpawnRequest,
    parent: Option<&ThreadDoc>,
) -> Result<Directive, SpawnError> {
    if let Origin::Client(b) = &req.origin {
        // The name asked for, before any file is read (a refusal tells nothing of the library),
        // and the name it resolves to (front matter may rename a file): both must be open.
        let closed = |name: &str| {
            SpawnError::Denied(format!(
                "directive `{name}` is not open to {} (mcp_server.directives in .weft/config.yaml: {:?}); add a pattern that matches it",
                b.who, b.directives
            ))
        };
        let named = crate::directive::valid_name(&req.directive) && !req.directive.ends_with(".md");
        if !named {
            ctx.library.load_name(&req.directive)?; // refused for what it is, reading nothing
        }
        if !b.opens(&req.directive) {
            return Err(closed(&req.directive));
        }
        let d = ctx.library.load_name(&req.directive)?;
        if !b.opens(&d.name) {
            return Err(closed(&d.name));
        }
        return Ok(d);
    }
    let Some(p) = parent else {
        return Ok(ctx.library.load(&req.directive)?);
    };
    let d = ctx.library.load_name(&req.directive)?;
    let cap = crate::tools::spawn_capability(&d.name);
    crate::tools::check(&p.capabilities, &cap, p.id.as_str()).map_err(SpawnError::Denied)?;
    Ok(d)
}

/// The approval list travels with the capabilities: a child's is its parent's with its own
/// added (a child cannot drop what its parent must ask a person for); a continuation keeps its
/// chain's.
fn approval_of(
    req: &SpawnRequest,
    directive: &Directive,
    parent: Option<&ThreadDoc>,
) -> Vec<String> {
    let mut out = match (req.continuation(), parent) {
        (Some(c), _) => c.of.approval.clone(),
        (None, Some(p)) => p.approval.clone(),
        (None, None) => Vec::new(),
    };
    for a in &directive.approval {
        if !out.contains(a) {
            out.push(a.clone());
        }
    }
    out
}

/// Limits, capabilities and (for a continuation) the chain's model.
fn limits_and_caps(
    ctx: &Ctx,
    req: &SpawnRequest,
    directive: &Directive,
    parent: Option<&ThreadDoc>,
) -> Result<(Limits, Vec<String>, Option<String>), SpawnError> {
    if let Some(c) = req.continuation() {
        let limits = continuation_limits(c, &req.overrides);
        if limits.spend <= Nanos::ZERO {
            return Err(SpawnError::Limit(format!(
                "limit exceeded: spend — the chain of {} has spent its whole budget ({})",
                c.of.id, c.of.limits.spend
            )));
        }
        return Ok((limits, c.of.capabilities.clone(), Some(c.of.model.clone())));
    }
    // A person's `--limit` on a root may raise the directive's own limits; a child's (a
    // model's `spawn_thread {limits}`, a hook's, a deferred child's) only lower them:
    // min(own, asked, parent's), depth − 1.
    let limits = match parent {
        None if matches!(req.origin, Origin::Client(_)) => client_limits(ctx, req, directive),
        None => crate::core::limits::resolve(
            &ctx.config.default_limits,
            &directive.limits,
            &req.overrides,
            None,
        ),
        Some(p) => crate::core::limits::lowered(
            crate::core::limits::resolve(
                &ctx.config.default_limits,
                &directive.limits,
                &LimitSet::default(),
                Some(&p.limits),
            ),
            &req.overrides,
        ),
    };
    let caps = match parent {
        // `permissions: []` written out is no capability at all; none written, the parent's.
        Some(_) if directive.declared.permissions && directive.permissions.is_empty() => Vec::new(),
        Some(p) => crate::core::capability::attenuate(&directive.permissions, &p.capabilities),
        None => directive.permissions.clone(),
    };
    Ok((limits, caps, None))
}

/// A continuation's links: the thread it continues, its chain's first thread, and the account
/// it draws under.
struct Chain {
    of: Option<ThreadId>,
    root: Option<ThreadId>,
    /// The account the continuation draws under.
    parent: Option<ThreadId>,
    /// The chain ran as a child: the continuation stays in its tree.
    in_tree: bool,
}

impl Chain {
    fn of(ctx: &Ctx, c: Option<&Continuation>) -> Result<Chain, SpawnError> {
        let Some(c) = c else {
            return Ok(Chain {
                of: None,
                root: None,
                parent: None,
                in_tree: false,
            });
        };
        let first = c.of.chain_root.clone().unwrap_or_else(|| c.of.id.clone());
        let tree_parent = continued_parent(ctx, c)?;
        Ok(Chain {
            of: Some(c.of.id.clone()),
            in_tree: tree_parent.is_some(),
            // A chain that ran as a root draws under its first thread's account: every
            // continuation of any thread of a tree draws on that tree's one budget (the root's
            // signed spend never counts what its children's continuations spent since).
            parent: tree_parent.or_else(|| Some(first.clone())),
            root: Some(first),
        })
    }
}

/// The parent of the first thread of `c`'s chain, if that thread ran as a child: the account a
/// continuation draws under. A continuation of a thread that ran as a child stays in its tree:
/// it is registered with the tree's root and its account opens under that parent (closed
/// accounts opened again from ledger.db), so every ancestor's cap still bounds the chain.
fn continued_parent(ctx: &Ctx, c: &Continuation) -> Result<Option<ThreadId>, SpawnError> {
    tree_parent(ctx, &c.of)
}

/// Whether a continuation of `of` stays in `of`'s tree (its chain ran as a child), so that it
/// runs under `of.root_id`; a continuation of a chain that ran as a root is a root of its own.
pub(crate) fn stays_in_tree(ctx: &Ctx, of: &ThreadDoc) -> Result<bool, SpawnError> {
    Ok(tree_parent(ctx, of)?.is_some())
}

/// The parent of the first thread of `of`'s chain, if that thread ran as a child.
fn tree_parent(ctx: &Ctx, of: &ThreadDoc) -> Result<Option<ThreadId>, SpawnError> {
    match (&of.parent_id, &of.chain_root) {
        (Some(p), _) => Ok(Some(p.clone())),
        (None, Some(first)) if *first != of.id => {
            let doc = ThreadDoc::read_verified(ctx.store.records(), first, &ctx.trust)
                .map_err(|e| SpawnError::Untrusted(e.to_string()))?;
            Ok(doc.parent_id)
        }
        _ => Ok(None),
    }
}

/// A continuation's limits: its predecessor's resolved limits with the chain's remaining spend
/// and spawns, each further capped by `overrides`.
fn continuation_limits(c: &Continuation, overrides: &LimitSet) -> Limits {
    let mut l = c.of.limits.clone();
    l.spend = l.spend.minus(Nanos(c.of.cost.spend_nanos));
    l.spawns = l.spawns.saturating_sub(c.spawn_count);
    crate::core::limits::lowered(l, overrides)
}
