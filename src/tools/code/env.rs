//! What a script may reach ([`CodeEnv`]): plain data below `code.rs` and its engine.

use crate::core::ids::ThreadId;
use crate::store::FileStore;
use crate::tools::files::FileLimits;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What a script may reach, and where.
// Read only by the engine: a weft built without `js` fills it in and refuses the call.
#[cfg_attr(not(feature = "js"), allow(dead_code))]
pub(crate) struct CodeEnv {
    /// The thread running it (its key-value store).
    pub thread: ThreadId,
    /// The store holding it.
    pub store: Arc<FileStore>,
    /// The thread's file area.
    pub area: PathBuf,
    /// File area bounds.
    pub limits: FileLimits,
    /// Which helpers the thread's capabilities allow: (`kv`, `fs.read`, `fs.write`).
    pub allowed: (bool, bool, bool),
    /// The thread's cancel.
    pub cancel: CancellationToken,
}
