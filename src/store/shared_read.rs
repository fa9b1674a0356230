//! A yes-or-no read asked by many at once (a burst of cancels, each asking whether any
//! effect is pending before it reads its tree's): every asker gets the answer of a read that
//! started after it asked, and the askers that waited together share one read, instead of
//! one read — and one blocking thread — each.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// One shared read (see the module comment).
#[derive(Default)]
pub(crate) struct SharedRead {
    /// Reads started so far.
    started: AtomicU64,
    /// The number and answer of the last read done (held while a read runs).
    done: tokio::sync::Mutex<(u64, bool)>,
}

impl SharedRead {
    /// The answer of `read` run after this call began: by this caller, on a blocking thread,
    /// or by another caller whose read started later. A read that panics answers yes (the
    /// safe side for its askers: they go on to read what they need).
    pub(crate) async fn ask(&self, read: impl FnOnce() -> bool + Send + 'static) -> bool {
        // A read numbered past this one starts after this call.
        let after = self.started.load(SeqCst) + 1;
        let mut done = self.done.lock().await;
        if done.0 >= after {
            return done.1;
        }
        let n = self.started.fetch_add(1, SeqCst) + 1;
        let answer = tokio::task::spawn_blocking(read).await.unwrap_or(true);
        *done = (n, answer);
        answer
    }

    /// Reads started so far.
    #[cfg(test)]
    pub(crate) fn reads(&self) -> u64 {
        self.started.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    /// A read that panics answers yes: its askers go on to read what they need.
    #[tokio::test]
    async fn a_read_that_panics_answers_yes() {
        let r = super::SharedRead::default();
        assert!(r.ask(|| panic!("the store broke")).await);
        assert!(!r.ask(|| false).await, "the next question reads again");
        assert_eq!(r.reads(), 2);
    }
}
