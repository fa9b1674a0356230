//! The LLM calls of a thread: the one under way, what the last one's prompt was billed, the
//! retries of the current turn, and the thread's own usage and spend so far.

use crate::core::money::{Nanos, Usage};
use crate::ledger::ReservationId;
use crate::provider::ToolCall;
use std::time::Duration;

/// The LLM call under way: what was reserved for it and what its prompt was.
pub(crate) struct Call {
    /// The ledger reservation it runs under.
    pub(crate) reservation: ReservationId,
    /// What that reservation holds.
    pub(crate) reserved: Nanos,
    /// The prompt's size in bytes (for the next call's bound).
    pub(crate) prompt_bytes: u64,
    /// Messages in its prompt.
    pub(crate) messages: usize,
    /// The prompt-token bound reserved: what a call whose bill the provider did not report is
    /// settled at.
    pub(crate) prompt_tokens: u64,
    /// The output tokens granted.
    pub(crate) max_output: u64,
}

impl Call {
    /// What a call the provider did not fully report may have been billed: the prompt tokens
    /// it reported, else the prompt bound (every one of them perhaps a cache write, the dearest);
    /// and every output token granted.
    pub(crate) fn upper_bound(&self, reported: Usage) -> Usage {
        let prompt_reported = reported.input_tokens + reported.cache_read_tokens > 0;
        let (input_tokens, cache_write_tokens) = if prompt_reported {
            (reported.input_tokens, reported.cache_write_tokens)
        } else {
            (self.prompt_tokens, self.prompt_tokens)
        };
        Usage {
            input_tokens,
            output_tokens: reported.output_tokens.max(self.max_output),
            cache_read_tokens: reported.cache_read_tokens,
            cache_write_tokens,
        }
    }
}

/// What the last successful call's prompt was billed, for a tighter bound on the next one.
#[derive(Clone, Copy)]
pub(crate) struct Billed {
    /// Prompt tokens billed (input and cache reads).
    pub(crate) prompt_tokens: u64,
    /// That prompt's size in bytes.
    pub(crate) prompt_bytes: u64,
    /// Messages in that prompt.
    pub(crate) messages: usize,
}

/// A thread's LLM calls.
pub(crate) struct Calls {
    /// The call under way, if any.
    pub(crate) current: Option<Call>,
    /// The last successful call's billed prompt.
    pub(crate) billed: Option<Billed>,
    /// Retries used for the current turn's call.
    pub(crate) attempt: u32,
    /// LLM calls made, attempts included (a continuation's scripted turns play on from there).
    pub(crate) made: u64,
    /// Tokens of the thread's own calls.
    pub(crate) usage: Usage,
    /// The thread's own spend.
    pub(crate) own_spend: Nanos,
    /// The `chat` span of the call under way.
    pub(crate) span: Option<tracing::Span>,
}

impl Calls {
    /// No call made yet (`made`: calls a continuation's chain made before it).
    pub(crate) fn new(made: u64) -> Calls {
        Calls {
            current: None,
            billed: None,
            attempt: 0,
            made,
            usage: Usage::default(),
            own_spend: Nanos::ZERO,
            span: None,
        }
    }

    /// Counts one call that used `usage` and cost `cost`.
    pub(crate) fn count(&mut self, usage: &Usage, cost: Nanos) {
        self.made += 1;
        add_usage(&mut self.usage, usage);
        self.own_spend = self.own_spend.plus(cost);
    }

    /// Every token the thread's calls used.
    pub(crate) fn tokens_used(&self) -> u64 {
        self.usage.input_tokens + self.usage.output_tokens + self.usage.cache_read_tokens
    }
}

/// Adds `u` to `total`.
fn add_usage(total: &mut Usage, u: &Usage) {
    total.input_tokens += u.input_tokens;
    total.output_tokens += u.output_tokens;
    total.cache_read_tokens += u.cache_read_tokens;
    total.cache_write_tokens += u.cache_write_tokens;
}

/// Exponential backoff with jitter: 250 ms × 2^n (±25 %), capped at 30 s.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let base = 250u64.saturating_mul(1 << attempt.min(7)).min(30_000);
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    let jitter = u64::from(u16::from_le_bytes(b)) % (base / 2 + 1);
    Duration::from_millis(base - base / 4 + jitter)
}

/// Gives every tool call of one response its own id: a model (or server) that repeats an id or
/// sends none would otherwise leave one call without its result, and the thread waiting for it.
/// A renamed id is what the transcript and the conversation carry from then on.
pub(crate) fn unique_call_ids(calls: &mut [ToolCall]) {
    let mut seen = std::collections::HashSet::new();
    for (i, c) in calls.iter_mut().enumerate() {
        if c.id.is_empty() || seen.contains(&c.id) {
            let base = if c.id.is_empty() { "call" } else { &c.id };
            let mut n = i + 1;
            let mut id = format!("{base}_{n}");
            while seen.contains(&id) {
                n += 1;
                id = format!("{base}_{n}");
            }
            c.id = id;
        }
        seen.insert(c.id.clone());
    }
}
