//! The parts a `Thread` (`state.rs`) is made of, each a plain struct with the
//! methods that only need it: the LLM calls (`call`), children and waits (`kids`), tool work
//! under way (`work`), hook state (`hooks`), the conversation (`talk`), its transcript
//! (`record`) and its lifetime (`life`). A part never writes a record or touches
//! another part: the thread's own methods do that.

mod call;
mod hooks;
mod kids;
mod life;
mod record;
mod talk;
mod work;

pub(crate) use call::{backoff, unique_call_ids, Billed, Call, Calls};
pub(crate) use hooks::HookState;
pub(crate) use kids::Kids;
pub(crate) use life::Life;
pub(crate) use record::Record;
pub(crate) use talk::Talk;
pub(crate) use work::ToolWork;
