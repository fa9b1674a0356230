//! weft's promises under hostile input and faults: what a model sends is untrusted.

use crate::support::{directive, tool_results, wait_until, Fixture};
use serde_json::json;
use weft::Status;

/// Runs a root whose one turn asks for `requested` children and returns (the tool results, the
/// directives that ran as children).
async fn spawn_requests(
    requested: &[&str],
    extra: &[(&str, &str)],
    perms: &str,
) -> (Vec<serde_json::Value>, Vec<String>) {
    let calls: Vec<String> = requested
        .iter()
        .map(|d| {
            format!(
                "      - {{ name: spawn_thread, input: {{ directive: {} }} }}",
                json!(d)
            )
        })
        .collect();
    let script = format!(
        "root:\n  - tool_calls:\n{}\n  - text: done\ndefault:\n  - text: child ran\n",
        calls.join("\n")
    );
    let root = directive(&format!("permissions: {perms}"), "Spawn.");
    let mut dirs = vec![("root", root.as_str())];
    dirs.extend_from_slice(extra);
    let fx = Fixture::new(&dirs, &script, "");
    let (report, _rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let root_id = report.thread_id.to_string();
    // Results in the order the calls were made (they are recorded as they complete).
    let events = fx.events(&root_id);
    let results = events
        .iter()
        .filter(|e| e["type"] == "tool_use")
        .filter_map(|u| {
            events
                .iter()
                .find(|r| r["type"] == "tool_result" && r["id"] == u["id"])
                .cloned()
        })
        .collect();
    let children = fx
        .rows()
        .into_iter()
        .filter(|r| r.id != root_id)
        .map(|r| r.directive)
        .collect();
    (results, children)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_can_spawn_library_names_only_never_a_file() {
    let outside = tempfile::tempdir().unwrap();
    let notes = outside.path().join("notes.md");
    std::fs::write(&notes, directive("description: private", "SECRET BODY")).unwrap();
    let leaf = directive("", "Leaf.");
    let absolute = notes.display().to_string();
    let requested = [
        absolute.as_str(),
        "directives/../../outside/notes.md",
        "leaf.md",
        "../leaf",
        "a//leaf",
        "/leaf",
        "",
        "leaf",
    ];
    let (results, children) =
        spawn_requests(&requested, &[("leaf", &leaf)], "[\"thread.spawn.**\"]").await;
    assert_eq!(results.len(), requested.len(), "{results:#?}");
    for (asked, r) in requested.iter().zip(&results).take(requested.len() - 1) {
        assert_eq!(r["is_error"], true, "{asked}: {r}");
        let content = r["content"].as_str().unwrap();
        assert!(
            content.contains("not a directive name"),
            "{asked}: a clear refusal, got {content}"
        );
    }
    assert_eq!(
        results.last().unwrap()["is_error"],
        false,
        "a plain name still works"
    );
    assert_eq!(children, vec!["leaf".to_string()], "only `leaf` ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spawn_capability_is_checked_on_the_name_a_directive_resolves_to() {
    // `innocent.md` renames itself in its front matter: holding `thread.spawn.innocent` does
    // not grant what it really is.
    let renamed = directive("name: admin/nuke", "Dangerous.");
    let (results, children) = spawn_requests(
        &["innocent"],
        &[("innocent", &renamed)],
        "[\"thread.spawn.innocent\"]",
    )
    .await;
    assert_eq!(results[0]["is_error"], true, "{results:?}");
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .contains("thread.spawn.admin.nuke"),
        "{results:?}"
    );
    assert!(children.is_empty(), "{children:?}");
}

/// A provider that claims a small prompt bound and bills far beyond it (a broken tokenizer
/// assumption): SPEC §5's one way past the cap. The overrun is settled, recorded, and the
/// thread makes no further call.
struct Overbiller;

impl weft::Provider for Overbiller {
    fn name(&self) -> &str {
        "overbiller"
    }
    fn prompt_token_bound(&self, _req: &weft::LlmRequest, _overhead: u64) -> u64 {
        10
    }
    fn complete(
        &self,
        _req: weft::LlmRequest,
        _cancel: weft::CancellationToken,
    ) -> weft::BoxFuture<Result<weft::LlmResponse, weft::ProviderError>> {
        Box::pin(async {
            Ok(weft::LlmResponse {
                text: String::new(),
                tool_calls: vec![weft::ToolCall {
                    id: "c1".into(),
                    name: "thread_status".into(),
                    input: json!({ "id": "x-1-1" }),
                }],
                usage: weft::Usage {
                    input_tokens: 1_000_000,
                    output_tokens: 1,
                    cache_read_tokens: 0,
                    cache_write_tokens: 0,
                },
                stop_reason: "tool_use".into(),
                ..Default::default()
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_billing_past_its_reservation_is_recorded_and_stopped() {
    let d = directive("limits: { turns: 5, spend: 0.50 }", "Go.");
    let fx = Fixture::raw(
        &[("greedy", &d)],
        "",
        "pricing:\n  m1: { input: 1.00, output: 1.00 }\n",
    );
    let rt = weft::Runtime::builder(fx.project())
        .custom_provider(std::sync::Arc::new(Overbiller))
        .model("m1")
        .open()
        .await
        .unwrap();
    let report = rt
        .run("greedy", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(report.status, Status::Error, "{report:?}");
    assert!(
        report
            .error
            .as_deref()
            .unwrap_or("")
            .contains("spend overrun"),
        "{report:?}"
    );
    let events = fx.events(report.thread_id.as_str());
    let calls = events.iter().filter(|e| e["type"] == "llm_call").count();
    assert_eq!(calls, 1, "no call after the overrun");
    let overrun = events
        .iter()
        .find(|e| e["type"] == "spend_overrun")
        .expect("the overrun is in the transcript");
    assert!(overrun["overrun_nanos"].as_i64().unwrap() > 0);
    assert_eq!(
        report.overrun_nanos.0,
        overrun["overrun_nanos"].as_i64().unwrap()
    );
    assert_eq!(
        report.spend_nanos.0, 1_000_001_000,
        "the actual cost was settled"
    );
    assert_eq!(
        fx.doc(report.thread_id.as_str()).cost.overrun_nanos,
        report.overrun_nanos.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_spawn_leaves_the_registry_writable_by_other_processes() {
    // The parent may spawn nothing: its one spawn is refused in the registry's transaction;
    // its next call then thinks for a while, and meanwhile another process must be able to write.
    let script = "root:\n  - tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]\n  - text: done\n    delay: 3s\nleaf:\n  - text: leaf\n";
    let root = directive(
        "permissions: [\"thread.spawn.**\"]\nlimits: { spawns: 0 }",
        "Spawn.",
    );
    let leaf = directive("", "Leaf.");
    let fx = Fixture::new(&[("root", &root), ("leaf", &leaf)], script, "");
    let (rt, handle, id) = fx.start("root").await;
    wait_until("the refusal", || {
        fx.events(&id).iter().any(|e| e["type"] == "tool_result")
    })
    .await;
    let refusal = fx
        .events(&id)
        .into_iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap();
    assert!(
        refusal["content"].as_str().unwrap().contains("spawns"),
        "{refusal}"
    );
    writable(&fx);
    // The same, deterministically: a refusal reaching an idle registry actor (in the run above,
    // a commit already queued for an earlier write may close the transaction by luck).
    let (registry, _) = weft::internals::actors(&rt);
    let row = weft::internals::ThreadRow {
        directive: "leaf".into(),
        ..weft::internals::ThreadRow::new(
            weft::ThreadId::parse("leaf-1-1").unwrap(),
            weft::ThreadId::parse(&id).unwrap(),
            Status::Created,
        )
    };
    let refused = ractor::call!(registry, |reply| weft::internals::RegistryMsg::Register {
        row: Box::new(row),
        admit: Some(weft::internals::Admission {
            parent: weft::ThreadId::parse(&id).unwrap(),
            spawns: 0,
            concurrency: 5,
        }),
        reply
    })
    .unwrap();
    assert!(refused.is_err());
    writable(&fx);
    let report = handle.wait().await.unwrap();
    assert_eq!(report.status, Status::Completed);
}

/// A running thread's row waits in the registry actor's memory for its lag (100 ms), even while
/// other threads register and end meanwhile: a thread that ends within it writes only its
/// terminal row (the running one was written at the next message of any kind). An attempt the
/// machine stalled past the lag proves nothing and is made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_row_superseded_within_its_lag_is_never_written() {
    let fx = Fixture::new(&[], "", "");
    let rt = fx.runtime().await;
    let (registry, _) = weft::internals::actors(&rt);
    let db = rusqlite::Connection::open(fx.root().join(".weft/state/registry.db")).unwrap();
    db.execute_batch(
        "CREATE TABLE written(id TEXT, status TEXT);
         CREATE TRIGGER noted AFTER UPDATE ON threads BEGIN
           INSERT INTO written VALUES(new.id, new.status); END;",
    )
    .unwrap();
    for n in 1..=10 {
        let (x, y) = (format!("x-1-{n}"), format!("y-1-{n}"));
        let took = within_the_lag(&registry, &x, &y, &format!("z-1-{n}")).await;
        if took >= std::time::Duration::from_millis(80) {
            continue;
        }
        let written: Vec<(String, String)> = db
            .prepare("SELECT id, status FROM written WHERE id IN (?1, ?2) ORDER BY rowid")
            .unwrap()
            .query_map([&x, &y], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let want = [(y, "completed".to_string()), (x, "completed".to_string())];
        assert_eq!(written, want, "only the terminal rows are written");
        return;
    }
    panic!("ten attempts each took 80 ms or more: the machine is too loaded to tell");
}

/// The other side of the lag: a running row that nothing supersedes is written when its lag
/// is over, with no other message to carry it (`weft status` from another process sees it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_running_row_is_written_when_its_lag_is_over() {
    use weft::internals::{RegistryMsg, ThreadRow};
    let fx = Fixture::new(&[], "", "");
    let rt = fx.runtime().await;
    let (registry, _) = weft::internals::actors(&rt);
    let id = weft::ThreadId::parse("w-1-a").unwrap();
    let row = |status| {
        Box::new(ThreadRow {
            directive: "w".into(),
            ..ThreadRow::new(id.clone(), id.clone(), status)
        })
    };
    ractor::call!(registry, |reply| RegistryMsg::Register {
        row: row(Status::Created),
        admit: None,
        reply
    })
    .unwrap()
    .unwrap();
    registry
        .cast(RegistryMsg::Update {
            row: row(Status::Running),
            reply: None,
        })
        .unwrap();
    let db = rusqlite::Connection::open(fx.root().join(".weft/state/registry.db")).unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let status: String = db
            .query_row("SELECT status FROM threads WHERE id='w-1-a'", [], |r| {
                r.get(0)
            })
            .unwrap();
        if status == "running" {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "the running row was never written (still {status})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// x runs; meanwhile z registers and y ends; then x ends. Returns how long it took.
async fn within_the_lag(
    registry: &ractor::ActorRef<weft::internals::RegistryMsg>,
    x: &str,
    y: &str,
    z: &str,
) -> std::time::Duration {
    use weft::internals::{RegistryMsg, ThreadRow};
    let row = |s: &str, status| {
        let id = weft::ThreadId::parse(s).unwrap();
        Box::new(ThreadRow {
            directive: "x".into(),
            ..ThreadRow::new(id.clone(), id, status)
        })
    };
    for s in [x, y] {
        ractor::call!(registry, |reply| RegistryMsg::Register {
            row: row(s, Status::Created),
            admit: None,
            reply
        })
        .unwrap()
        .unwrap();
    }
    let t0 = std::time::Instant::now();
    registry
        .cast(RegistryMsg::Update {
            row: row(x, Status::Running),
            reply: None,
        })
        .unwrap();
    let (z, y, x) = tokio::join!(
        async {
            ractor::call!(registry, |reply| RegistryMsg::Register {
                row: row(z, Status::Created),
                admit: None,
                reply
            })
        },
        async {
            ractor::call!(registry, |reply| RegistryMsg::Update {
                row: row(y, Status::Completed),
                reply: Some(reply)
            })
        },
        async {
            ractor::call!(registry, |reply| RegistryMsg::Update {
                row: row(x, Status::Completed),
                reply: Some(reply)
            })
        },
    );
    let took = t0.elapsed();
    for r in [z, y, x] {
        r.unwrap().unwrap();
    }
    took
}

/// Another process can take registry.db's write lock within half a second.
fn writable(fx: &Fixture) {
    let db = rusqlite::Connection::open(fx.root().join(".weft/state/registry.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_millis(500))
        .unwrap();
    db.execute_batch("BEGIN IMMEDIATE; COMMIT;")
        .expect("another process can write registry.db");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_row_is_stored_even_when_another_process_holds_the_registry_past_its_timeout() {
    let script = "root:\n  - text: done\n    delay: 300ms\n";
    let fx = Fixture::new(&[("root", &directive("", "Hi."))], script, "");
    let (_rt, handle, id) = fx.start("root").await;
    wait_until("the thread running", || {
        fx.rows()
            .iter()
            .any(|r| r.id == id && r.status == "running")
    })
    .await;
    // Another process holds the write lock longer than the registry's 5 s busy timeout.
    let path = fx.root().join(".weft/state/registry.db");
    let holder = std::thread::spawn(move || {
        let db = rusqlite::Connection::open(path).unwrap();
        db.execute_batch("BEGIN IMMEDIATE").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(12_000));
        db.execute_batch("COMMIT").unwrap();
    });
    let report = handle.wait().await.unwrap();
    holder.join().unwrap();
    assert_eq!(report.status, Status::Completed);
    let row = fx.rows().into_iter().find(|r| r.id == id).unwrap();
    assert_eq!(
        row.status, "completed",
        "the final update was retried, not dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_thread_json_copied_into_another_thread_lends_it_nothing() {
    // A generous thread, finished, whose signed thread.json is valid under the same key.
    let rich = directive(
        "permissions: [\"thread.spawn.**\", \"fs.**\"]\nlimits: { spend: 5 }",
        "Rich.",
    );
    // A narrow parent that may spawn `leaf` only; while it thinks, the rich document is copied
    // over its own.
    let narrow = directive("permissions: [\"thread.spawn.leaf\"]", "Narrow.");
    let leaf = directive("permissions: [\"thread.spawn.**\"]", "Leaf.");
    let script = "rich:\n  - text: rich done\nnarrow:\n  - text: thinking\n    delay: 600ms\n    tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]\n  - text: narrow done\nleaf:\n  - text: leaf done\n";
    let fx = Fixture::new(
        &[("rich", &rich), ("narrow", &narrow), ("leaf", &leaf)],
        script,
        "",
    );
    let (rich_report, rt) = fx.run("rich", json!({})).await;
    assert_eq!(rich_report.status, Status::Completed);
    let handle = rt
        .start("narrow", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let narrow_id = handle.id().to_string();
    let threads = fx.root().join(".weft/threads");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    std::fs::copy(
        threads
            .join(rich_report.thread_id.as_str())
            .join("thread.json"),
        threads.join(&narrow_id).join("thread.json"),
    )
    .unwrap();
    let report = handle.wait().await.unwrap();
    let result = fx
        .events(&narrow_id)
        .into_iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap();
    assert_eq!(result["is_error"], true, "{result}");
    assert!(
        result["content"].as_str().unwrap().contains("not of"),
        "the spawn names the misplaced document: {result}"
    );
    assert!(
        fx.rows().iter().all(|r| r.directive != "leaf"),
        "no child ran on borrowed capabilities"
    );
    assert_eq!(report.status, Status::Completed);
}

/// Holds registry.db's or ledger.db's write lock from another connection (as another process
/// writing would) until dropped.
struct WriteLock {
    _held: rusqlite::Connection,
}

impl WriteLock {
    fn take(db: &std::path::Path) -> WriteLock {
        let c = rusqlite::Connection::open(db).unwrap();
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        WriteLock { _held: c }
    }
}

/// ledger.db's row of one account: (guaranteed, spent, closed), if it has one.
fn ledger_row(fx: &Fixture, id: &weft::ThreadId) -> Option<(i64, i64, bool)> {
    let db = rusqlite::Connection::open(fx.root().join(".weft/state/ledger.db")).unwrap();
    db.query_row(
        "SELECT guaranteed, spent, closed FROM accounts WHERE id=?1",
        [id.as_str()],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .ok()
}

fn ledger_reservations(fx: &Fixture) -> i64 {
    let db = rusqlite::Connection::open(fx.root().join(".weft/state/ledger.db")).unwrap();
    db.query_row("SELECT count(*) FROM reservations", [], |r| r.get(0))
        .unwrap()
}

/// Opens an account in `ledger` through its actor (`max` and `guarantee` in nanos).
async fn open_account(
    ledger: &ractor::ActorRef<weft::internals::LedgerMsg>,
    id: &weft::ThreadId,
    parent: Option<&weft::ThreadId>,
    max: i64,
    guarantee: i64,
) -> Result<(), weft::internals::LedgerError> {
    ractor::call!(ledger, |reply| weft::internals::LedgerMsg::Open {
        id: id.clone(),
        parent: parent.cloned(),
        max: weft::Nanos(max),
        guarantee: weft::Nanos(guarantee),
        min_first_call: weft::Nanos(1),
        reply
    })
    .unwrap()
}

/// Reserves a 10-token prompt and up to 10 output tokens at 1 nano-USD a token for `id`.
async fn reserve_small(
    ledger: &ractor::ActorRef<weft::internals::LedgerMsg>,
    id: &weft::ThreadId,
) -> Result<weft::internals::Grant, weft::internals::LedgerError> {
    let price = weft::Price {
        input: 1_000_000_000,
        output: 1_000_000_000,
        cache_read: 0,
        cache_write: 0,
    };
    ractor::call!(ledger, |reply| weft::internals::LedgerMsg::Reserve {
        id: id.clone(),
        price,
        prompt_tokens: 10,
        want_output: 10,
        min_output: 1,
        reply
    })
    .unwrap()
}

/// A ledger.db commit that fails (here: another process holds the write lock past the busy
/// timeout) must leave memory and ledger.db alike: a refused decision (a budget set aside) is
/// not left holding the parent's budget, and a settlement and a close, which are facts, still
/// reach ledger.db once it can be written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_ledger_commit_leaves_memory_and_ledger_db_alike() {
    use weft::internals::LedgerMsg;
    use weft::{Nanos, ThreadId};
    let fx = Fixture::new(&[("root", &directive("", "Hi."))], "default: []\n", "");
    let rt = fx.runtime().await;
    let (_, ledger) = weft::internals::actors(&rt);
    let db = fx.root().join(".weft/state/ledger.db");
    let open = |id: &ThreadId, parent: Option<&ThreadId>, guarantee: i64| {
        let (id, parent, ledger) = (id.clone(), parent.cloned(), ledger.clone());
        async move { open_account(&ledger, &id, parent.as_ref(), 1_000_000, guarantee).await }
    };
    let parent = ThreadId::generate("parent");
    open(&parent, None, 0).await.unwrap();

    // 900,000 of the parent's 1,000,000 set aside (for a scheduled directive) while ledger.db
    // cannot be written: a budget set aside is read by other processes, so it must commit.
    let refused = ThreadId::generate("refused");
    let lock = WriteLock::take(&db);
    let err = ractor::call!(ledger, |reply| LedgerMsg::Defer {
        id: refused.clone(),
        parent: parent.clone(),
        want: Nanos(900_000),
        whole: true,
        min_first_call: Nanos(1),
        reply
    })
    .unwrap();
    assert!(
        matches!(err, Err(weft::internals::LedgerError::Storage(_))),
        "the commit could not happen, so the budget is not set aside: {err:?}"
    );
    drop(lock);
    // Nothing of it stays: a child gets the same guarantee.
    let next = ThreadId::generate("next");
    open(&next, Some(&parent), 900_000)
        .await
        .expect("the refused budget was given back");
    assert_eq!(
        ledger_row(&fx, &refused),
        None,
        "no trace of the refused account"
    );
    let held = ractor::call!(ledger, |reply| LedgerMsg::Get {
        id: parent.clone(),
        reply
    })
    .unwrap()
    .unwrap();
    assert_eq!(held.guaranteed, Nanos(900_000));
    let _ = ractor::call!(ledger, |reply| LedgerMsg::Close {
        id: next.clone(),
        reply
    });

    // A call reserved and settled while ledger.db is locked: both are written ahead to the
    // runtime's journal (SPEC §5), so neither waits on the lock nor is refused.
    let lock = WriteLock::take(&db);
    let grant = reserve_small(&ledger, &parent)
        .await
        .expect("a reservation is journaled, not committed: the lock does not refuse it");
    let settled = ractor::call!(ledger, |reply| LedgerMsg::Settle {
        reservation: grant.reservation,
        actual: Nanos(7_000),
        reply: Some(reply)
    })
    .unwrap();
    assert!(settled.is_ok(), "a settlement is a fact: {settled:?}");
    // A child's start and end in a held tree (its top stored open) are written ahead too.
    let child = ThreadId::generate("child");
    open(&child, Some(&parent), 10_000)
        .await
        .expect("a child's open is journaled: the lock does not refuse it");
    let closed = ractor::call!(ledger, |reply| LedgerMsg::Close {
        id: child.clone(),
        reply
    })
    .unwrap();
    assert!(closed.is_ok(), "{closed:?}");
    // Closing the account must commit, and cannot: a fact, answered, kept and retried. It
    // reaches ledger.db with the journaled settlement once the lock is gone.
    let closed = ractor::call!(ledger, |reply| LedgerMsg::Close {
        id: parent.clone(),
        reply
    })
    .unwrap();
    assert!(closed.is_ok(), "a close is a fact: {closed:?}");
    drop(lock);
    wait_until("the settlement and the close reach ledger.db", || {
        ledger_reservations(&fx) == 0 && ledger_row(&fx, &parent) == Some((0, 7_000, true))
    })
    .await;
    let (violations, open_now) = rt.audit().await;
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(open_now, 0);
}

/// A child's account opens and closes in the runtime's journal while its tree runs (the tree's
/// top is stored open, so every other process sees the tree held), and the close that finishes
/// the tree commits: once the root has ended, ledger.db holds every account of the tree closed,
/// with no stop of the runtime needed (another process may then take the finished tree).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_account_is_journaled_and_a_finished_tree_is_stored_at_once() {
    let root = directive(
        "limits: { spend: 1.0 }\npermissions: [\"thread.spawn.**\"]",
        "Spawn.",
    );
    let kid = directive("", "Kid.");
    let script = r#"
root:
  - tool_calls: [ { name: spawn_thread, input: { directive: kid } } ]
  - tool_calls: [ { name: wait_threads, input: {} } ]
  - text: done
    delay: 1s
kid:
  - text: kid done
"#;
    let fx = Fixture::new(&[("root", &root), ("kid", &kid)], script, "");
    let rt = fx.runtime().await;
    let running = rt
        .start("root", Default::default(), Default::default())
        .await
        .unwrap();
    let root_id = running.id().clone();
    wait_until("the kid has ended", || {
        let rows = fx.rows_so_far();
        rows.iter()
            .any(|r| r.directive == "kid" && r.status.is_terminal())
    })
    .await;
    let kid_id = weft::ThreadId::parse(&fx.id_of("kid")).unwrap();
    assert_eq!(
        ledger_row(&fx, &root_id).map(|r| r.2),
        Some(false),
        "the running tree's top is stored open"
    );
    assert_eq!(
        ledger_row(&fx, &kid_id),
        None,
        "the kid's account opened and closed in the journal"
    );
    let report = running.wait().await.unwrap();
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(ledger_row(&fx, &root_id).map(|r| r.2), Some(true));
    assert_eq!(ledger_row(&fx, &kid_id).map(|r| r.2), Some(true));
    let open: i64 = rusqlite::Connection::open(fx.root().join(".weft/state/ledger.db"))
        .unwrap()
        .query_row("SELECT count(*) FROM accounts WHERE closed=0", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(
        open, 0,
        "every account of the finished tree is stored closed"
    );
    assert_eq!(ledger_reservations(&fx), 0);
}

/// A busy turn loop's reservations and settlements are journaled, not committed, yet ledger.db
/// never lags the ledger by more than 256 journal records: the journal is folded into it as it
/// goes, and emptied each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_db_lags_a_turn_loop_by_at_most_256_journal_records() {
    use weft::internals::LedgerMsg;
    use weft::{Nanos, ThreadId};
    let fx = Fixture::new(&[("root", &directive("", "Hi."))], "default: []\n", "");
    let rt = fx.runtime().await;
    let (_, ledger) = weft::internals::actors(&rt);
    let id = ThreadId::generate("looper");
    open_account(&ledger, &id, None, 1_000_000_000, 0)
        .await
        .unwrap();
    // One turn: a reservation and its settlement, each answered after its own journal record.
    let turn = || async {
        let grant = reserve_small(&ledger, &id).await.unwrap();
        ractor::call!(ledger, |reply| LedgerMsg::Settle {
            reservation: grant.reservation,
            actual: Nanos(7_000),
            reply: Some(reply)
        })
        .unwrap()
        .unwrap();
    };
    let journal_bytes = || {
        std::fs::read_dir(fx.root().join(".weft/state/ledger.journal"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.metadata().unwrap().len())
                    .sum::<u64>()
            })
            .unwrap_or(0)
    };
    for _ in 0..100 {
        turn().await;
    }
    assert_eq!(
        ledger_row(&fx, &id).map(|r| r.1),
        Some(0),
        "200 records: still only in the journal"
    );
    assert!(journal_bytes() > 0);
    for _ in 100..300 {
        turn().await;
    }
    // 600 records: folded at the 256th and the 512th.
    let stored = ledger_row(&fx, &id).map_or(0, |r| r.1);
    assert_eq!(
        stored,
        256 * 7_000,
        "ledger.db holds what the 512th record left"
    );
    let held = rt.account(&id).await.unwrap().spent.0;
    assert_eq!(held, 300 * 7_000);
    assert!(
        journal_bytes() < 100 * 1_024,
        "emptied at each fold: {} bytes",
        journal_bytes()
    );
    assert_eq!(ledger_reservations(&fx), 0);
}

/// A database locked by another process (or a slow disk) stalls the actor waiting on it, never
/// the async workers: while the registry, then the ledger, waits on a locked database through a
/// runtime's only worker, other tasks still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_locked_database_stalls_its_actor_not_the_workers() {
    use weft::internals::{LedgerMsg, RegistryMsg, ThreadRow};
    use weft::{Nanos, ThreadId};
    let fx = Fixture::new(&[("root", &directive("", "Hi."))], "default: []\n", "");
    let rt = fx.runtime().await;
    let (registry, ledger) = weft::internals::actors(&rt);
    let state = fx.root().join(".weft/state");
    /// How long a 200 ms sleep and an unrelated 20 ms task take while `db` is locked and `wait` waits on it.
    async fn unrelated_task_while(
        db: std::path::PathBuf,
        wait: impl FnOnce(),
    ) -> std::time::Duration {
        let lock = WriteLock::take(&db);
        let started = std::time::Instant::now();
        wait();
        // The actor is now inside its commit, waiting out the busy timeout (5 s).
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        tokio::spawn(tokio::time::sleep(std::time::Duration::from_millis(20)))
            .await
            .unwrap();
        let took = started.elapsed();
        drop(lock);
        took
    }
    let took = unrelated_task_while(state.join("registry.db"), || {
        registry
            .cast(RegistryMsg::Update {
                row: Box::new(ThreadRow::new(
                    weft::ThreadId::parse("nobody-1").unwrap(),
                    weft::ThreadId::parse("nobody-1").unwrap(),
                    Status::Created,
                )),
                reply: None,
            })
            .unwrap();
    })
    .await;
    assert!(
        took < std::time::Duration::from_secs(2),
        "220 ms of unrelated work took {took:?} while registry.db was locked"
    );
    let took = unrelated_task_while(state.join("ledger.db"), || {
        let ledger = ledger.clone();
        tokio::spawn(async move {
            ractor::call!(ledger, |reply| LedgerMsg::Open {
                id: ThreadId::generate("waits"),
                parent: None,
                max: Nanos(1),
                guarantee: Nanos::ZERO,
                min_first_call: Nanos::ZERO,
                reply
            })
        });
    })
    .await;
    assert!(
        took < std::time::Duration::from_secs(2),
        "220 ms of unrelated work took {took:?} while ledger.db was locked"
    );
}

/// A running thread that may spawn keeps the thread.json it just signed as verified, so its
/// children's spawns do not read and verify it again; a file changed since (here a signed
/// document edited to lift a limit) is read again and refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parents_own_signed_state_is_kept_but_an_edited_file_is_read_again() {
    let root = directive(
        "permissions: [\"thread.spawn.**\"]\nlimits: { spawns: 3 }",
        "Spawn.",
    );
    let leaf = directive("", "Leaf.");
    let script = "root:\n  - tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]\n    delay: 2s\n  - text: done\nleaf:\n  - text: leaf\n";
    let fx = Fixture::new(&[("root", &root), ("leaf", &leaf)], script, "");
    let (rt, handle, id) = fx.start("root").await;
    let doc = fx.root().join(format!(".weft/threads/{id}/thread.json"));
    wait_until("the running thread.json", || {
        std::fs::read_to_string(&doc).is_ok_and(|t| t.contains("\"running\""))
    })
    .await;
    assert_eq!(
        weft::internals::verified_cached(&rt),
        1,
        "the running parent's own signed state is kept before any child reads it"
    );
    let text = std::fs::read_to_string(&doc).unwrap();
    let edited = text.replacen("\"spawns\": 3", "\"spawns\": 300", 1);
    assert_ne!(edited, text, "the limit to edit is in thread.json");
    std::fs::write(&doc, edited).unwrap();
    let report = handle.wait().await.unwrap();
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let results = tool_results(&fx, &id);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(
        results[0].1 && results[0].0.contains("not trusted"),
        "the edited parent's spawn is refused: {results:?}"
    );
    assert_eq!(fx.rows().len(), 1, "no child started");
}

/// What a long-lived runtime keeps of a finished tree: nothing. The ledger drops closed accounts
/// once nothing below them is open, and the verified-document cache forgets ended threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_tree_leaves_nothing_in_memory() {
    let root = directive(
        "limits: { spend: 1.0, spawns: 10, concurrency: 10 }\npermissions: [\"thread.spawn.**\"]",
        "Fan out.",
    );
    let mid = directive("permissions: [\"thread.spawn.**\"]", "Mid.");
    let leaf = directive("", "Leaf.");
    let script = r#"
root:
  - tool_calls:
      - { name: spawn_thread, input: { directive: mid, wait: false } }
      - { name: spawn_thread, input: { directive: mid, wait: false } }
  - tool_calls: [ { name: wait_threads, input: {} } ]
  - text: done
mid:
  - tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]
  - text: done
leaf:
  - text: leaf answer
"#;
    let fx = Fixture::new(
        &[("root", &root), ("mid", &mid), ("leaf", &leaf)],
        script,
        "",
    );
    let (report, rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(fx.rows().len(), 5);
    let (_, ledger) = weft::internals::actors(&rt);
    let held = ractor::call!(ledger, |reply| weft::internals::LedgerMsg::Held { reply }).unwrap();
    assert_eq!(
        held, 0,
        "accounts the ledger still holds after the tree ended"
    );
    assert_eq!(weft::internals::verified_cached(&rt), 0);
    // Dropped from memory, kept in ledger.db: each account's final row, closed.
    let db = rusqlite::Connection::open(fx.root().join(".weft/state/ledger.db")).unwrap();
    let closed: i64 = db
        .query_row("SELECT count(*) FROM accounts WHERE closed=1", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(closed, 5);
}

/// A tree with more live threads than the process may open files: each live thread used to hold
/// its transcript open, so under the common soft limit of 1,024 a 10k tree met EMFILE. Here: 150
/// live leaves under a limit of 96 descriptors, through the real binary.
#[cfg(feature = "cli")]
#[test]
fn more_live_threads_than_open_files_allowed() {
    let root = directive(
        "limits: { spend: 10.0, spawns: 200, concurrency: 200, turns: 5 }\npermissions: [\"thread.spawn.**\"]",
        "Fan out.",
    );
    let leaf = directive("", "Leaf.");
    let spawns: Vec<String> = (0..150)
        .map(|_| "      - { name: spawn_thread, input: { directive: leaf, wait: false } }".into())
        .collect();
    let script = format!(
        "root:\n  - tool_calls:\n{}\n  - tool_calls: [ {{ name: wait_threads, input: {{}} }} ]\n  - text: done\nleaf:\n  - text: leaf answer\n    delay: 1500ms\n",
        spawns.join("\n")
    );
    let fx = Fixture::new(&[("root", &root), ("leaf", &leaf)], "default: []\n", "");
    let script_path = fx.root().join("script.yaml");
    std::fs::write(&script_path, script).unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -n 96 && exec "$@""#)
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_weft"))
        .args(["run", "root", "--json", "--script"])
        .arg(&script_path)
        .arg("--project")
        .arg(fx.root())
        .env("WEFT_HOME", crate::support::weft_home())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = fx.rows();
    assert_eq!(rows.len(), 151);
    let failed: Vec<_> = rows.iter().filter(|r| r.status != "completed").collect();
    assert!(
        failed.is_empty(),
        "{} thread(s) did not complete, e.g. {:?}",
        failed.len(),
        failed.first().map(|r| &r.error)
    );
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
}

/// A chain draws on one budget. Two resumes of one thread at once: one continues it, the other is
/// refused (each used to get the chain's whole remaining budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_resumes_of_one_thread_at_once_one_is_refused() {
    let root = directive("limits: { spend: 1.0 }", "Hi.");
    let script = "root:\n  - text: first\n  - text: second\n    delay: 200ms\n  - text: third\n    delay: 200ms\n";
    let fx = Fixture::new(&[("root", &root)], script, "");
    let (report, rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed);
    let id = report.thread_id.clone();
    let (a, b) = tokio::join!(
        rt.resume(&id, "go on", Default::default()),
        rt.resume(&id, "go on", Default::default())
    );
    let (ok, refused): (Vec<_>, Vec<_>) = [a, b].into_iter().partition(Result::is_ok);
    let errors: Vec<String> = refused
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    assert_eq!(ok.len(), 1, "exactly one continuation: {errors:?}");
    // Refused by the registry (both raced to it) or, if one finished first, by its signed
    // thread.json naming the continuation.
    assert!(
        errors[0].contains("cannot be continued") || errors[0].contains("already continued by"),
        "{errors:?}"
    );
    let report = ok
        .into_iter()
        .next()
        .unwrap()
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let continuations = fx
        .rows()
        .iter()
        .filter(|r| r.continuation_of.as_deref() == Some(id.as_str()))
        .count();
    assert_eq!(continuations, 1);
}

/// A root capped at 0.02 USD that may spawn, and a kid whose own cap (1 USD) is larger.
fn capped_root_and_kid() -> (String, String) {
    let root = directive(
        "limits: { spend: 0.02 }\npermissions: [\"thread.spawn.**\"]",
        "Spawn.",
    );
    (root, directive("limits: { spend: 1.0 }", "Kid."))
}

/// Resuming a thread that ran as a child keeps it under its tree's caps: the root of the tree
/// has 2,000,000 nanos left of its 0.02 USD, so the continuation cannot spend the 3,000,000 its
/// call costs, although the child alone would still allow 11,000,000 (it used to run as a new
/// root with that budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_a_child_stays_within_its_trees_cap() {
    let (root, kid) = capped_root_and_kid();
    let script = r#"
root:
  - tool_calls: [ { name: spawn_thread, input: { directive: kid } } ]
    usage: { input_tokens: 0, output_tokens: 0 }
  - text: done
    usage: { input_tokens: 9000, output_tokens: 0 }
kid:
  - text: kid done
    usage: { input_tokens: 5000, output_tokens: 1000 }
  - text: kid again
    usage: { input_tokens: 3000, output_tokens: 0 }
"#;
    let fx = Fixture::new(&[("root", &root), ("kid", &kid)], script, "");
    let (report, rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(report.spend_nanos.0, 18_000_000);
    let kid_id = fx
        .rows()
        .into_iter()
        .find(|r| r.directive == "kid")
        .unwrap()
        .id;
    let kid_id = weft::ThreadId::parse(&kid_id).unwrap();
    let resumed = match rt.resume(&kid_id, "again", Default::default()).await {
        Ok(h) => Some(h.wait().await.unwrap()),
        Err(e) => {
            assert!(e.to_string().contains("limit exceeded"), "{e}");
            None
        }
    };
    let tree_spend: i64 = fx.rows().iter().map(|r| r.own_spend_nanos).sum();
    assert!(
        tree_spend <= 20_000_000,
        "the tree spent {tree_spend} nanos of its 20,000,000 cap (resumed: {resumed:?})"
    );
    let row = rusqlite::Connection::open(fx.root().join(".weft/state/ledger.db"))
        .unwrap()
        .query_row(
            "SELECT spent, max, closed FROM accounts WHERE id=?1",
            [report.thread_id.as_str()],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, bool>(2)?,
                ))
            },
        )
        .unwrap();
    assert!(row.0 <= row.1 && row.2, "root account {row:?}");
    let (violations, open) = rt.audit().await;
    assert!(violations.is_empty() && open == 0, "{violations:?} {open}");
}

/// A chain draws on one pool (#22 finding 3): after `resume <child>` spent from the tree's
/// budget, `resume <root>` cannot spend that budget again — every continuation of any thread of
/// a tree draws on the tree's account, so the tree's total stays within the root's cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_the_root_after_a_child_cannot_spend_the_tree_twice() {
    let (root, kid) = capped_root_and_kid();
    let script = r#"
root:
  - tool_calls: [ { name: spawn_thread, input: { directive: kid } } ]
    usage: { input_tokens: 0, output_tokens: 0 }
  - text: done
    usage: { input_tokens: 1000, output_tokens: 0 }
  - text: root again
    usage: { input_tokens: 15000, output_tokens: 0 }
kid:
  - text: kid done
    usage: { input_tokens: 1000, output_tokens: 0 }
  - text: kid again
    usage: { input_tokens: 8000, output_tokens: 0 }
"#;
    let fx = Fixture::new(&[("root", &root), ("kid", &kid)], script, "");
    let (report, rt) = fx.run("root", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let kid_id = weft::ThreadId::parse(&fx.id_of("kid")).unwrap();
    let kid_again = rt.resume(&kid_id, "again", Default::default()).await;
    if let Ok(h) = kid_again {
        h.wait().await.unwrap();
    }
    let root_again = rt
        .resume(&report.thread_id, "again", Default::default())
        .await;
    let outcome = match root_again {
        Ok(h) => format!("{:?}", h.wait().await.unwrap()),
        Err(e) => e.to_string(),
    };
    let tree_spend: i64 = fx.rows().iter().map(|r| r.own_spend_nanos).sum();
    assert!(
        tree_spend <= 20_000_000,
        "the tree spent {tree_spend} nanos of its 20,000,000 cap ({outcome})"
    );
    let (violations, open) = rt.audit().await;
    assert!(violations.is_empty() && open == 0, "{violations:?} {open}");
}

/// Two runtimes in one process keep two books of one tree, but only one holds it: a second
/// runtime of the same process that resumes a thread of a tree the first is still running is
/// refused by the ledger before it opens anything (it took the tree, its pid being the
/// holder's, reopened its own stale copy of the root, and when the registry then refused the
/// resume, its unwind stored that copy closed over the running tree), and may resume it once
/// the tree has finished, within the tree's cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_runtime_in_one_process_cannot_resume_into_a_tree_the_first_runs() {
    let (root, kid) = capped_root_and_kid();
    let script = r#"
root:
  - tool_calls: [ { name: spawn_thread, input: { directive: kid } } ]
    usage: { input_tokens: 0, output_tokens: 0 }
  - tool_calls: [ { name: wait_threads, input: {} } ]
    usage: { input_tokens: 0, output_tokens: 0 }
  - text: done
    delay: 1500ms
    usage: { input_tokens: 9000, output_tokens: 0 }
kid:
  - text: kid done
    usage: { input_tokens: 5000, output_tokens: 1000 }
  - text: kid again
    usage: { input_tokens: 3000, output_tokens: 0 }
"#;
    let fx = Fixture::new(&[("root", &root), ("kid", &kid)], script, "");
    let first = fx.runtime().await;
    let second = fx.runtime().await;
    let running = first
        .start("root", Default::default(), Default::default())
        .await
        .unwrap();
    // The kid has finished; the root's last call (reserved in the first runtime's book) runs.
    let kid_row = loop {
        let rows = fx.rows_so_far();
        if let Some(k) = rows
            .iter()
            .find(|r| r.directive == "kid" && r.status.is_terminal())
        {
            break k.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let kid_id = weft::ThreadId::parse(&kid_row.id).unwrap();
    let resumed = second.resume(&kid_id, "again", Default::default()).await;
    let refusal = match resumed {
        Ok(h) => format!("resumed: {:?}", h.wait().await.unwrap().status),
        Err(e) => e.to_string(),
    };
    // Nothing of the refused resume reached ledger.db: the running tree's top is stored open
    // (the second runtime's unwind stored its stale copy of it closed over the running tree).
    let root_id = running.id().clone();
    assert_eq!(
        ledger_row(&fx, &root_id).map(|r| r.2),
        Some(false),
        "the running tree's top stays open in ledger.db ({refusal})"
    );
    let report = running.wait().await.unwrap();
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let tree_spend: i64 = fx.rows().iter().map(|r| r.own_spend_nanos).sum();
    assert!(
        tree_spend <= 20_000_000,
        "the tree spent {tree_spend} nanos of its 20,000,000 cap ({refusal})"
    );
    assert!(
        refusal.contains("another runtime of one"),
        "the second runtime is refused while the first holds the tree: {refusal}"
    );
    // Once the first runtime's tree has finished, the second may take it (here the tree's
    // cap leaves no room for the kid's call: a limit, not a refusal to take the tree).
    match second.resume(&kid_id, "again", Default::default()).await {
        Ok(h) => drop(h.wait().await.unwrap()),
        Err(e) => assert!(!e.to_string().contains("another runtime of one"), "{e}"),
    }
    let tree_spend: i64 = fx.rows().iter().map(|r| r.own_spend_nanos).sum();
    assert!(tree_spend <= 20_000_000, "{tree_spend}");
    for rt in [&first, &second] {
        let (violations, open) = rt.audit().await;
        assert!(violations.is_empty() && open == 0, "{violations:?} {open}");
    }
}
