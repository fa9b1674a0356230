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
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::Arc;

    /// 999 askers arriving while a read runs share one read after it: two reads in all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn askers_waiting_together_share_one_read() {
        let r = Arc::new(super::SharedRead::default());
        let (started, release) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (s, g) = (started.clone(), release.clone());
        let first = {
            let r = r.clone();
            tokio::spawn(async move {
                r.ask(move || {
                    s.store(true, SeqCst);
                    while !g.load(SeqCst) {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    false
                })
                .await
            })
        };
        while !started.load(SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let rest: Vec<_> = (0..999)
            .map(|_| {
                let r = r.clone();
                tokio::spawn(async move { r.ask(|| true).await })
            })
            .collect();
        // Time for every asker to take its number and queue behind the first read.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        release.store(true, SeqCst);
        assert!(!first.await.unwrap());
        for a in rest {
            assert!(a.await.unwrap(), "the read after their question");
        }
        assert!(r.reads() <= 3, "{} reads for 1,000 questions", r.reads());
    }

    /// A read that panics answers yes: its askers go on to read what they need.
    #[tokio::test]
    async fn a_read_that_panics_answers_yes() {
        let r = super::SharedRead::default();
        assert!(r.ask(|| panic!("the store broke")).await);
        assert!(!r.ask(|| false).await, "the next question reads again");
        assert_eq!(r.reads(), 2);
    }
}
