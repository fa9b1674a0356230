//! The durable, signed records of a thread: the user's key and the trust store (`signing`), the
//! hash-chained transcript (`transcript`) and its lines as types (`line`), thread.json
//! (`thread_doc`), read-only verification (`verify`), lines as people read them (`render`),
//! the group commit shared by the actors that own a database (`batch`), and the threads that
//! do an ending thread's blocking writes (`writers`). Where the records are kept — files, or
//! the project's database server — is `place` (with `log_file`, `server`, `behind` and
//! `tables` below it).
//!
//! Owns file formats and their integrity. Must never decide what a thread does next: it writes
//! what it is given and reads back what is there, naming the file and line of any damage.

pub(crate) mod adopt;
pub(crate) mod anchor_group;
pub(crate) mod anchors;
pub(crate) mod batch;
pub(crate) mod behind;
pub(crate) mod canon;
pub(crate) mod disk;
pub(crate) mod jcs;
pub(crate) mod line;
pub(crate) mod log_file;
pub(crate) mod place;
pub(crate) mod render;
pub(crate) mod server;
pub(crate) mod signing;
pub(crate) mod tables;
pub(crate) mod thread_doc;
pub(crate) mod transcript;
pub(crate) mod verify;
pub(crate) mod writers;
