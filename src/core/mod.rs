//! Plain types every other room speaks: thread ids, money, limits, capabilities, statuses.
//!
//! Owns values and their arithmetic only. Must never do I/O beyond reading the clock and the
//! random source (ids, timestamps), and must never import another room of the crate.

pub mod capability;
pub(crate) mod ids;
pub(crate) mod limits;
pub(crate) mod money;
pub(crate) mod status;
