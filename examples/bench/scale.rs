//! `bench scale`: 10⁵ live threads in one process (root → 10 → 100 → 100,000 leaves, each leaf
//! waiting on an hour-long scripted call): peak RSS and RSS per live thread, the spawn rate while
//! the tree grows, the time until every thread is live, then the root's cancel until every
//! thread is finalized, and the audit after it (nothing left running, no open reservation).

use super::{cpu_s, open, perf_ctl, rss_kib, tree_project_widths};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};
use weft::LimitSet;

/// Threads in a tree whose level `l` threads each have `widths[l]` children.
fn tree_size(widths: &[usize]) -> usize {
    let mut level = 1;
    let mut n = 1;
    for w in widths {
        level *= w;
        n += level;
    }
    n
}

/// Rows of registry.db in one of `statuses`, counted by its status index (a full read of 10⁵
/// rows every poll would cost more than what it measures).
pub(super) fn count(db: &rusqlite::Connection, statuses: &str) -> usize {
    let sql = format!("SELECT COUNT(*) FROM threads WHERE status IN ({statuses})");
    db.query_row(&sql, [], |r| r.get::<_, i64>(0)).unwrap_or(0) as usize
}

/// When the live count first reached `frac` of `n`, from the samples (seconds, live).
fn reached(samples: &[(f64, usize)], n: usize, frac: f64) -> f64 {
    let want = (n as f64 * frac).ceil() as usize;
    samples
        .iter()
        .find(|(_, live)| *live >= want)
        .map_or(f64::NAN, |(t, _)| *t)
}

pub(super) async fn bench_scale(widths: &[usize]) -> Value {
    let p = tree_project_widths(widths, false, Some("1h"));
    let rt = open(&p).await;
    let n = tree_size(widths);
    let db = rusqlite::Connection::open_with_flags(
        p.root.join(".weft/state/registry.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, before) = rss_kib();
    let t0 = Instant::now();
    let handle = rt
        .start("l0", Map::new(), LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().clone();
    let done = handle.wait();
    let mut samples = vec![(0.0, 0)];
    loop {
        let live = count(&db, "'running'");
        samples.push((t0.elapsed().as_secs_f64(), live));
        if live == n {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1800),
            "tree never fully live ({live}/{n})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let live_s = t0.elapsed().as_secs_f64();
    let (t10, t90) = (reached(&samples, n, 0.1), reached(&samples, n, 0.9));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, live_rss) = rss_kib();
    let (t, cpu) = (Instant::now(), cpu_s());
    perf_ctl("enable");
    rt.cancel(&id, "bench");
    let report = done.await.unwrap();
    let cancel_s = t.elapsed().as_secs_f64();
    perf_ctl("disable");
    let cancel_cpu_s = cpu_s() - cpu;
    assert_eq!(report.status, weft::Status::Cancelled);
    let left = count(&db, "'created', 'running'");
    let (violations, open) = rt.audit().await;
    let (peak, _) = rss_kib();
    rt.shutdown();
    json!({ "threads": n, "widths": widths, "all_live_after_s": live_s,
            "spawn_rate_per_s": n as f64 / live_s,
            // A tree that grew between two polls has no 10–90% span: the overall rate stands in.
            "sustained_spawn_rate_per_s": if t90 > t10 { 0.8 * n as f64 / (t90 - t10) } else { n as f64 / live_s },
            "rss_before_mib": before as f64 / 1024.0, "rss_live_mib": live_rss as f64 / 1024.0,
            "peak_rss_mib": peak as f64 / 1024.0,
            "kib_per_live_thread": live_rss.saturating_sub(before) as f64 / n as f64,
            "cancel_to_all_finalized_s": cancel_s, "cancel_cpu_s": cancel_cpu_s,
            "left_running": left, "ledger_violations": violations.len(), "open_reservations": open })
}
