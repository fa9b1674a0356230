//! Why a thread could not start ([`SpawnError`]): the refusal or failure itself, with the ledger
//! and registry errors kept as they came, so a caller picks what to do by variant.

use crate::directive::DirectiveError;
use crate::ledger::LedgerError;
use crate::registry::RegistryError;

/// Why a thread could not be started. Nothing is left behind when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The directive or its inputs are invalid.
    #[error(transparent)]
    Directive(#[from] DirectiveError),
    /// A limit refuses the spawn (depth; a chain or fork with no budget left).
    #[error("{0}")]
    Limit(String),
    /// The parent may not spawn this directive (checked on the name it resolves to).
    #[error("{0}")]
    Denied(String),
    /// The parent's thread.json failed verification.
    #[error("parent thread.json not trusted: {0}")]
    Untrusted(String),
    /// Configuration problem (model, price, provider, hooks).
    #[error("{0}")]
    Config(String),
    /// The ledger refused (not enough budget up the chain) or failed.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The registry refused (spawns, concurrency, one continuation at a time) or failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Storage failed: the thread's files, or a runtime actor that did not answer.
    #[error("{0}")]
    Storage(String),
    /// Withdrawn before it started: whoever asked for it was cancelled meanwhile.
    #[error("withdrawn: {0}")]
    Withdrawn(String),
    /// A resume into a tree still stopping after its cancel: asking again once the tree has
    /// ended succeeds.
    #[error("{0}")]
    Stopping(String),
}

impl SpawnError {
    /// Whether a limit refused the spawn (the tree may not have what was asked): a depth,
    /// spawns or concurrency limit, or not enough budget up the chain.
    pub fn is_limit(&self) -> bool {
        match self {
            SpawnError::Limit(_) => true,
            SpawnError::Ledger(e) => {
                matches!(e, LedgerError::Insufficient { .. } | LedgerError::Placed(_))
            }
            SpawnError::Registry(e) => matches!(
                e,
                RegistryError::Spawns { .. }
                    | RegistryError::Concurrency { .. }
                    | RegistryError::Continued { .. }
            ),
            _ => false,
        }
    }

    /// Whether the runtime failed, not the request (storage, a database, an actor): retrying
    /// later may succeed; nothing about the request needs to change.
    pub fn is_internal(&self) -> bool {
        match self {
            SpawnError::Storage(_) => true,
            SpawnError::Ledger(_) | SpawnError::Registry(_) => !self.is_limit(),
            _ => false,
        }
    }
}
