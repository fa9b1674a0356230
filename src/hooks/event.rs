//! The moments of a thread a hook may name (SPEC §9), spelled as hook files, hook contexts and
//! transcripts spell them.

use serde::Serialize;

/// An event hooks fire on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HookEvent {
    /// A thread started (not a continuation).
    ThreadStarted,
    /// A continuation started.
    ThreadContinued,
    /// An LLM call was recorded and settled.
    AfterStep,
    /// A child ended.
    ChildFinished,
    /// A limit was hit.
    Limit,
    /// The thread is failing.
    Error,
    /// The thread ended (before its `thread_finished` line).
    AfterComplete,
    /// Rye's: before each call, when the model's window is known.
    ContextWindowPressure,
    /// Rye's: a valid `directive_return`.
    DirectiveReturn,
}

impl HookEvent {
    /// Every event, in the order errors list them.
    pub(crate) const ALL: [HookEvent; 9] = [
        HookEvent::ThreadStarted,
        HookEvent::ThreadContinued,
        HookEvent::AfterStep,
        HookEvent::ChildFinished,
        HookEvent::Limit,
        HookEvent::Error,
        HookEvent::AfterComplete,
        HookEvent::ContextWindowPressure,
        HookEvent::DirectiveReturn,
    ];

    /// Its name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HookEvent::ThreadStarted => "thread_started",
            HookEvent::ThreadContinued => "thread_continued",
            HookEvent::AfterStep => "after_step",
            HookEvent::ChildFinished => "child_finished",
            HookEvent::Limit => "limit",
            HookEvent::Error => "error",
            HookEvent::AfterComplete => "after_complete",
            HookEvent::ContextWindowPressure => "context_window_pressure",
            HookEvent::DirectiveReturn => "directive_return",
        }
    }

    /// The event named `name`, if there is one.
    pub(crate) fn parse(name: &str) -> Option<HookEvent> {
        HookEvent::ALL.into_iter().find(|e| e.as_str() == name)
    }
}

impl std::fmt::Display for HookEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::HookEvent;

    #[test]
    fn an_event_is_named_as_it_is_serialized_and_parsed() {
        for e in HookEvent::ALL {
            assert_eq!(serde_json::to_value(e).unwrap(), e.as_str());
            assert_eq!(HookEvent::parse(e.as_str()), Some(e));
        }
        assert_eq!(HookEvent::parse("after_everything"), None);
    }
}
