//! Threads: one actor per thread, owning its conversation, transcript and thread.json, and
//! running the turn loop of SPEC §6 — plus the spawn procedure of SPEC §4 and the services
//! every thread uses ([`Ctx`], [`Event`]).
//!
//! Tree rules enforced here: a thread's subtree never outlives it (live children are cancelled
//! and awaited — bounded by `cancel_grace` — before it finalizes), and every exit path goes
//! through `Thread::finalize`, which settles the ledger exactly once, writes the final registry
//! row and signed thread.json, and tells the parent.
//!
//! Rooms, lowest first (a file names items only of files listed before it; the behaviour files'
//! `impl Thread` methods call one another freely, as one type's methods do):
//! - plain data: `report` (what a thread reports), `msg` (the actor's messages and arguments),
//!   `ctx` (what every thread shares; live events), `spans`, `conversation`.
//! - `spawn/`: the typed spawn stages (plan, ledger account, registry row, files, launch).
//! - `dead`: ending threads whose actor is gone.
//! - `parts/`: the parts a thread is made of (calls, children, tool work, hooks, conversation,
//!   record, lifetime), and `state` (`Thread`: those parts, its records and row).
//! - what a thread does, each an `impl Thread` over one concern: `turn` (the turn loop),
//!   `tool_phase` (the gate, dispatch, results), `builtin/` (weft's own tools), `approval`,
//!   `children`, `messages` (the inbox), `hook_run`, `handoff` (continuation), `finalize`.
//! - `actor`: the actor, routing messages to those methods.

mod actor;
mod approval;
mod builtin;
mod caused;
mod children;
mod conversation;
mod ctx;
mod dead;
mod deadlines;
mod finalize;
mod handoff;
mod hook_run;
mod messages;
mod msg;
mod parts;
pub(crate) mod placed;
pub(crate) mod placer;
mod report;
pub(crate) mod slot;
mod spans;
mod spawn;
mod specs;
mod state;
mod tool_phase;
mod turn;

pub(crate) use actor::launch;
pub(crate) use builtin::reserved_names as builtin_names;
pub(crate) use caused::CANCELLED_AS_IT_STARTED;
pub use conversation::rebuild_conversation;
pub use ctx::Event;
pub(crate) use ctx::{Ctx, EffectsGate};
pub use dead::Recovered;
pub(crate) use dead::{end_subtree, finalize_dead, DeadEnd, DeadKind};
pub(crate) use deadlines::Deadlines;
pub(crate) use msg::ThreadMsg;
pub(crate) use report::StatusSnapshot;
pub use report::ThreadReport;
pub(crate) use spans::TARGET as SPAN_TARGET;
pub use spawn::SpawnError;
pub(crate) use spawn::{
    give_back, spawn, stays_in_tree, ClientBounds, Continuation, Deferred, Origin, Seed,
    SpawnRequest,
};
