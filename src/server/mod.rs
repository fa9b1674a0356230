//! Surfaces that serve a running runtime to other processes: the local control endpoint today
//! (`control`), the HTTP API later. Started by whoever serves (the CLI); the runtime never
//! imports this room.

pub(crate) mod control;
