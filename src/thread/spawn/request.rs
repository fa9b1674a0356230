//! What a caller asks for when it starts a thread: [`SpawnRequest`], and where the thread comes
//! from ([`Origin`]): a person, a running parent ([`ParentLink`]), work a thread caused for
//! later ([`Deferred`]), an ended thread it continues ([`Continuation`]) or a conversation it
//! copies ([`Seed`]). The spawn stages derive from the origin, and only from it, which account
//! the thread draws on, its limit caps, its depth, its capabilities and its approval list.

use crate::core::ids::ThreadId;
use crate::core::limits::LimitSet;
use crate::core::money::Nanos;
use crate::provider::{Message, Route};
use crate::record::thread_doc::{ForkedFrom, ThreadDoc};
use crate::thread::msg::ThreadMsg;
use ractor::ActorRef;
use serde_json::{Map, Value};
use std::sync::Arc;

/// Where a new thread hangs in the tree.
pub(crate) struct ParentLink {
    /// Parent id.
    pub id: ThreadId,
    /// Parent actor (for reports and linking).
    pub actor: ActorRef<ThreadMsg>,
}

/// Where a thread comes from: the one thing every road into the runtime states, and from
/// which the spawn stages derive its account, caps, depth, capabilities and approval list.
pub(crate) enum Origin {
    /// A person starts a root (`weft run`, the API, the control socket): the directive's own
    /// limits, which the person's `--limit` may raise; a budget of its own.
    Person,
    /// An outside client starts a root (an MCP client of `weft mcp`): a library name only, one
    /// its bounds open; the directive's own limits, which the client may only lower, its spend
    /// at most the bounds' `max_spend`; a budget of its own.
    #[cfg_attr(not(feature = "mcp-server"), allow(dead_code))]
    Client(ClientBounds),
    /// A running thread starts a child (`spawn_thread`, a hook on it): limits only lower,
    /// capabilities attenuated, approval inherited, depth − 1, drawing on the parent's account.
    Child(ParentLink),
    /// Work a thread caused to start later (a scheduled directive, an `after_complete` hook's
    /// spawn): a child of a thread that may have ended, drawing on the account set aside from
    /// that thread's tree when the work was caused.
    Deferred(Deferred),
    /// An ended thread's continuation (`weft resume`, a handoff): its chain's limits,
    /// capabilities and approval, drawing on its chain's account; linked to its parent when
    /// that runs.
    Continue(Box<Continuation>, Option<ParentLink>),
    /// A person's fork: a new root with a budget of its own, from a copy of a conversation.
    Fork(Seed),
}

/// What an outside client may start (see [`Origin::Client`]; `mcp_server:` of the config).
#[derive(Debug, Clone)]
pub(crate) struct ClientBounds {
    /// Who asks, named in refusals (`MCP clients`).
    pub who: &'static str,
    /// Directive-name patterns it may start.
    pub directives: Vec<String>,
    /// The most its tree may spend.
    pub max_spend: Nanos,
}

impl ClientBounds {
    /// Whether `name` (as the directive resolves, front matter included) is open to it.
    pub(crate) fn opens(&self, name: &str) -> bool {
        self.directives
            .iter()
            .any(|p| crate::tools::glob_matches(p, name))
    }
}

/// A deferred child (see [`Origin::Deferred`]).
pub(crate) struct Deferred {
    /// The thread it hangs under (the scheduling thread; a hooked thread's root).
    pub parent: ThreadId,
    /// Its id, whose account holds what was set aside for it; None while it is being set aside
    /// (see `spawn::defer`).
    pub id: Option<ThreadId>,
}

/// Everything needed to start one thread.
pub(crate) struct SpawnRequest {
    /// Directive name (or, for a person's root, a path).
    pub directive: String,
    /// Inputs as given.
    pub inputs: Map<String, Value>,
    /// Limit overrides: a person's (may raise a root's own), or a model's (only lower).
    pub overrides: LimitSet,
    /// Guarantee asked of the parent.
    pub reserve: Nanos,
    /// Where the thread comes from.
    pub origin: Origin,
    /// The hook whose `spawn` starts it: it and everything below it never fire that hook again.
    pub hook: Option<String>,
    /// Paths in the parent's file area copied into the child's at the same paths.
    pub attach: Vec<String>,
    /// The tree's provider and model, over the runtime's (children inherit it).
    pub route: Option<Arc<Route>>,
    /// The span the thread's span goes under (the parent's `spawn_thread` call).
    pub parent_span: Option<tracing::Span>,
    /// Cancelled, it withdraws the request while it waits for a spawn slot (the parent was
    /// cancelled: the child is not started only to be cancelled).
    pub withdrawn: Option<tokio_util::sync::CancellationToken>,
    /// A deferred child placed here by its parent's node (`thread/placed.rs`): it takes its
    /// placed account over and reports its end to its parent's node.
    pub placed: bool,
    /// Its place among this runtime's threads, when taken before the spawn (see
    /// `placer::Slot`); else the spawn takes one.
    pub slot: Option<crate::thread::slot::Slot>,
}

impl SpawnRequest {
    /// A request to start `directive` with `inputs` from `origin`, nothing else set.
    pub(crate) fn new(
        directive: impl Into<String>,
        inputs: Map<String, Value>,
        origin: Origin,
    ) -> SpawnRequest {
        SpawnRequest {
            directive: directive.into(),
            inputs,
            overrides: LimitSet::default(),
            reserve: Nanos::ZERO,
            origin,
            hook: None,
            attach: Vec::new(),
            route: None,
            parent_span: None,
            withdrawn: None,
            placed: false,
            slot: None,
        }
    }

    /// The running parent, if any.
    pub(crate) fn parent_link(&self) -> Option<&ParentLink> {
        match &self.origin {
            Origin::Child(p) | Origin::Continue(_, Some(p)) => Some(p),
            _ => None,
        }
    }

    /// The parent the thread hangs under (running or not).
    pub(crate) fn parent_id(&self) -> Option<&ThreadId> {
        match &self.origin {
            Origin::Deferred(d) => Some(&d.parent),
            _ => self.parent_link().map(|p| &p.id),
        }
    }

    /// The thread it continues.
    pub(crate) fn continuation(&self) -> Option<&Continuation> {
        match &self.origin {
            Origin::Continue(c, _) => Some(c),
            _ => None,
        }
    }

    /// The conversation it copies.
    pub(crate) fn seed(&self) -> Option<&Seed> {
        match &self.origin {
            Origin::Fork(s) => Some(s),
            _ => None,
        }
    }
}

/// What a continuation starts from (see `Runtime::resume`).
pub(crate) struct Continuation {
    /// The verified thread.json of the thread continued.
    pub of: ThreadDoc,
    /// Its conversation, rebuilt from its transcript, plus the new user message.
    pub messages: Vec<Message>,
    /// LLM calls (attempts included) it made: the scripted provider plays on from there.
    pub calls_made: u64,
    /// Children it spawned (counted against the chain's `spawns`).
    pub spawn_count: u64,
}

/// What a fork starts from (see `Runtime::fork`): a new root with its own budget.
pub(crate) struct Seed {
    /// The conversation copied, ending with a user message.
    pub messages: Vec<Message>,
    /// LLM calls the copied part made (the scripted provider plays on from there).
    pub calls_made: u64,
    /// The source thread and the last seq copied.
    pub from: ForkedFrom,
}
