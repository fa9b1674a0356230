//! What a caller asks for when it starts a thread: [`SpawnRequest`], and where the new thread
//! hangs ([`ParentLink`]) or what it starts from ([`Continuation`], [`Seed`]).

use crate::core::ids::ThreadId;
use crate::core::limits::{LimitSet, Limits};
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
    pub cap: Option<Limits>,
    /// Paths in the parent's file area copied into the child's at the same paths.
    pub attach: Vec<String>,
    /// The tree's provider and model, over the runtime's (children inherit it).
    pub route: Option<Arc<Route>>,
    /// The span the thread's span goes under (the parent's `spawn_thread` call).
    pub parent_span: Option<tracing::Span>,
}

impl SpawnRequest {
    /// A request to start `directive` with `inputs` and nothing else set.
    pub(crate) fn new(directive: impl Into<String>, inputs: Map<String, Value>) -> SpawnRequest {
        SpawnRequest {
            directive: directive.into(),
            inputs,
            overrides: LimitSet::default(),
            reserve: Nanos::ZERO,
            parent: None,
            continuation: None,
            seed: None,
            cap: None,
            attach: Vec::new(),
            route: None,
            parent_span: None,
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
