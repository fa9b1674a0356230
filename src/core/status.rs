//! Thread states (SPEC §4): a plain type shared by the records, the registry and the API.

use serde::{Deserialize, Serialize};

/// Thread states (SPEC §4). Nothing leaves a terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Registered, not yet running.
    Created,
    /// Running its turn loop.
    Running,
    /// Finished with a result.
    Completed,
    /// Finished with an error.
    Error,
    /// Cancelled.
    Cancelled,
    /// Goes on in a continuation thread.
    Continued,
}

impl Status {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Running => "running",
            Status::Completed => "completed",
            Status::Error => "error",
            Status::Cancelled => "cancelled",
            Status::Continued => "continued",
        }
    }
    /// The state named `name` (lower-case), if there is one.
    pub fn parse(name: &str) -> Option<Status> {
        [
            Status::Created,
            Status::Running,
            Status::Completed,
            Status::Error,
            Status::Cancelled,
            Status::Continued,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
    /// Is it terminal?
    pub fn is_terminal(self) -> bool {
        !matches!(self, Status::Created | Status::Running)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl PartialEq<str> for Status {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<Status> for &str {
    fn eq(&self, other: &Status) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<&str> for Status {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}
