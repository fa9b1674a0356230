//! Plain types every other room speaks: thread ids, money, limits, capabilities, statuses.
//!
//! Owns values and their arithmetic only. Must never do I/O beyond reading the clock and the
//! random source (ids, timestamps), and must never import another room of the crate. One
//! exception, for the fault tests: `failpoint` reads `WEFT_FAILPOINT` and may abort the process.

pub mod capability;
pub(crate) mod failpoint;
pub(crate) mod ids;
pub(crate) mod limits;
pub(crate) mod money;
pub(crate) mod owner;
pub(crate) mod redact;
pub(crate) mod status;
