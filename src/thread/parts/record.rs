//! A thread's own records as it writes them: the transcript writer, the messages said so far
//! (for the search index when it ends), and the first append that failed.

use crate::record::transcript::TranscriptWriter;
use crate::store::SearchMessage;

/// A thread's transcript and what it has logged.
pub(crate) struct Record {
    /// The hash-chained transcript, opened.
    pub(crate) transcript: TranscriptWriter,
    /// The user and assistant messages logged so far, for the search index when it ends.
    pub(crate) said: Vec<SearchMessage>,
    /// The first append that failed: the thread ends `error` with it (a signed record never
    /// silently loses a line).
    pub(crate) failed: Option<String>,
}

impl Record {
    /// A transcript nothing has been logged to by the actor yet.
    pub(crate) fn new(transcript: TranscriptWriter) -> Record {
        Record {
            transcript,
            said: Vec::new(),
            failed: None,
        }
    }

    /// The seq the next line gets.
    pub(crate) fn next_seq(&self) -> i64 {
        self.transcript.head().seq + 1
    }
}
