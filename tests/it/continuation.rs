//! Continuation (SPEC §7): a thread hands off to a continuation when its context fills or a
//! `limit` hook says `control: handoff`; the chain draws on one budget.

use crate::support::{directive, Fixture};
use serde_json::json;
use weft::Status;

const HANDOFF: &str =
    "hooks:\n  - { id: go_on, event: limit, condition: { path: limit_code, op: eq, value: turns }, action: { control: handoff } }\n";

fn chain_of(fx: &Fixture, first: &str) -> Vec<weft::internals::ThreadRow> {
    let rows = fx.rows();
    let mut chain = vec![rows.iter().find(|r| r.id == first).unwrap().clone()];
    while let Some(next) = rows
        .iter()
        .find(|r| r.continuation_of.as_deref() == Some(chain.last().unwrap().id.as_str()))
    {
        chain.push(next.clone());
    }
    chain
}

/// A chain of three on a turns limit: each thread takes two turns, the last completes; the run's
/// report is the last thread's; the chain's spend is the sum of its threads and within the
/// first thread's cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_limit_hands_off_down_a_chain_of_three() {
    let d = directive(
        "limits: { turns: 2, spend: 0.05 }",
        "Work through the list.",
    );
    let step = "  - tool_calls: [ { name: thread_status, input: { id: nobody-1 } } ]\n    usage: { input_tokens: 1000, output_tokens: 100 }\n";
    let script = format!(
        "d:\n{}  - text: all done\n    usage: {{ input_tokens: 1000, output_tokens: 100 }}\n",
        step.repeat(5)
    );
    let fx = Fixture::new(&[("d", &d)], &script, "");
    let hooks = format!(
        "{HANDOFF}  - {{ id: note, event: thread_continued, action: {{ inject: {{ text: \"You continue {{previous_thread_id}}.\" }} }} }}\n"
    );
    std::fs::write(fx.root().join(".weft/hooks.yaml"), hooks).unwrap();
    let rt = fx.runtime().await;
    let handle = rt
        .start("d", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let first = handle.id().to_string();
    let report = handle.wait().await.unwrap();
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(report.result.as_deref(), Some("all done"));
    // The chain has ended: the runtime keeps none of its links (a long-lived `weft serve`
    // would otherwise grow by one per handoff).
    crate::support::wait_until("the chain's links to go", || {
        weft::internals::successors_kept(&rt) == 0
    })
    .await;
    let chain = chain_of(&fx, &first);
    let statuses: Vec<&str> = chain.iter().map(|r| r.status.as_str()).collect();
    assert_eq!(statuses, ["continued", "continued", "completed"]);
    assert_eq!(report.thread_id.as_str(), chain[2].id);
    let per_call = 1000 * 1_000 + 100 * 4_000;
    let total: i64 = chain.iter().map(|r| r.own_spend_nanos).sum();
    assert_eq!(total, 6 * per_call, "six calls over the chain");
    assert!(total <= 50_000_000);
    let docs: Vec<_> = chain.iter().map(|r| fx.doc(&r.id)).collect();
    assert_eq!(
        docs[0].continued_by.as_ref().map(|i| i.to_string()),
        Some(chain[1].id.to_string())
    );
    // Money never starts afresh: each continuation's cap is what the chain has left.
    assert_eq!(docs[1].limits.spend.0, 50_000_000 - 2 * per_call);
    assert_eq!(docs[2].limits.spend.0, 50_000_000 - 4 * per_call);
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
    // thread_continued fired once in each continuation, with the thread it continues.
    for (i, r) in chain.iter().enumerate().skip(1) {
        let events = fx.events(&r.id);
        let fired: Vec<_> = events
            .iter()
            .filter(|e| e["type"] == "hook_fired" && e["event"] == "thread_continued")
            .collect();
        assert_eq!(fired.len(), 1, "{}", r.id);
        let injected = events.iter().filter(|e| e["type"] == "message").any(|e| {
            e["text"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("You continue {}.", chain[i - 1].id))
        });
        assert!(injected, "{}: {events:?}", r.id);
    }
    assert!(!fx
        .events(&first)
        .iter()
        .any(|e| e["event"] == "thread_continued"));
}

/// A thread whose prompt passes 0.9 of its model's window continues with its conversation
/// trimmed instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filling_context_continues_in_a_new_thread() {
    let d = directive("limits: { turns: 20 }", "Chat.");
    let long = "x".repeat(1500);
    let step = format!("  - text: \"{long}\"\n    tool_calls: [ {{ name: thread_status, input: {{ id: nobody-1 }} }} ]\n");
    let script = format!("d:\n{}  - text: finished\n", step.repeat(12));
    let fx = Fixture::new(
        &[("d", &d)],
        &script,
        "context_window: { scripted: 4000 }\n",
    );
    let rt = fx.runtime().await;
    let handle = rt
        .start("d", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let first = handle.id().to_string();
    let report = handle.wait().await.unwrap();
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let chain = chain_of(&fx, &first);
    assert!(chain.len() >= 2, "{chain:?}");
    assert_eq!(chain[0].status, "continued");
    let filling = fx
        .events(&first)
        .into_iter()
        .find(|e| e["type"] == "context_filling")
        .expect("recorded why it continued");
    assert!(filling["prompt_tokens"].as_u64().unwrap() > 3600);
    // The continuation starts from a trimmed conversation that says so.
    let cont = &chain[1].id;
    let events = fx.events(cont);
    let inherited: String = events
        .iter()
        .filter(|e| e["type"] == "conversation" || e["type"] == "message")
        .take(2)
        .map(|e| e.to_string())
        .collect();
    assert!(
        inherited.contains("were left out to fit the context window"),
        "{inherited}"
    );
    assert!(
        inherited.len() < 6000,
        "trimmed to about half the window: {}",
        inherited.len()
    );
}

/// A child's continuation takes its place: the parent's waiting spawn gets the continuation's
/// result, not "continued".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_continuation_answers_its_parent() {
    let root = directive("permissions: [\"thread.spawn.**\"]", "Delegate.");
    let kid = directive("limits: { turns: 1 }", "Work.");
    let script = r#"
root:
  - tool_calls: [ { name: spawn_thread, input: { directive: kid } } ]
  - text: root done
kid:
  - tool_calls: [ { name: thread_status, input: { id: nobody-1 } } ]
  - text: kid finished after a handoff
"#;
    let fx = Fixture::new(&[("root", &root), ("kid", &kid)], script, "");
    std::fs::write(fx.root().join(".weft/hooks.yaml"), HANDOFF).unwrap();
    let (report, _rt) = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        fx.run("root", json!({})),
    )
    .await
    .expect("the parent is answered (the handoff and the reports may arrive in any order)");
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let events = fx.events(report.thread_id.as_str());
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result" && e["id"] == "call_0_0")
        .unwrap();
    let child: serde_json::Value =
        serde_json::from_str(result["content"].as_str().unwrap()).unwrap();
    assert_eq!(child["status"], "completed", "{child}");
    assert_eq!(child["result"], "kid finished after a handoff");
    let kids: Vec<_> = fx
        .rows()
        .into_iter()
        .filter(|r| r.directive == "kid")
        .collect();
    assert_eq!(kids.len(), 2);
    assert!(kids
        .iter()
        .all(|k| k.parent_id.as_deref() == Some(report.thread_id.as_str())));
    assert!(events.iter().any(|e| e["type"] == "child_continued"));
}

/// Cancelling the chain after a handoff reaches the continuation (a handle, like Ctrl-C in
/// `weft run`, names the first thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_a_handoff_reaches_the_continuation() {
    let d = directive("limits: { turns: 1 }", "Work.");
    let script = "d:\n  - tool_calls: [ { name: thread_status, input: { id: nobody-1 } } ]\n  - text: slow\n    delay: 30s\n";
    let fx = Fixture::new(&[("d", &d)], script, "");
    std::fs::write(fx.root().join(".weft/hooks.yaml"), HANDOFF).unwrap();
    let rt = fx.runtime().await;
    let handle = rt
        .start("d", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let first = handle.id().clone();
    crate::support::wait_until("the first thread handed off", || {
        fx.rows()
            .iter()
            .any(|r| r.id == first.as_str() && r.status == "continued")
    })
    .await;
    assert!(rt.cancel(&first, "stop the chain"));
    let report = tokio::time::timeout(std::time::Duration::from_secs(10), handle.wait())
        .await
        .expect("the continuation was cancelled, not left to its 30 s call")
        .unwrap();
    assert_eq!(report.status, Status::Cancelled);
    assert_ne!(report.thread_id, first);
}

/// `weft verify` checks every link of a chain: a predecessor whose signed thread.json no longer
/// names its continuation is reported on the continuation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_checks_the_links_of_a_chain() {
    let d = directive("limits: { turns: 1 }", "Work.");
    let script = "d:\n  - tool_calls: [ { name: thread_status, input: { id: nobody-1 } } ]\n  - text: done\n";
    let fx = Fixture::new(&[("d", &d)], script, "");
    std::fs::write(fx.root().join(".weft/hooks.yaml"), HANDOFF).unwrap();
    let rt = fx.runtime().await;
    let handle = rt
        .start("d", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let first = handle.id().to_string();
    let report = handle.wait().await.unwrap();
    assert_eq!(report.status, Status::Completed);
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
    // Sign a first thread.json that forgets its continuation (a valid signature, a broken link).
    let signer = weft::internals::Signer::load_or_create(crate::support::weft_home()).unwrap();
    let mut doc = fx.doc(&first);
    doc.continued_by = None;
    doc.write_signed(&fx.records(), &signer, false).unwrap();
    let bad = fx.verify_all();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].id, report.thread_id.as_str());
    assert!(
        bad[0].problems[0].contains("names no thread as its continuation"),
        "{bad:?}"
    );
}

/// A prompt too big from the very first call is not handed on (its continuation would start from
/// the same prompt, and so on without end): the thread fails with a context overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_prompt_past_the_window_fails_instead_of_handing_off_forever() {
    let d = directive("", &"y".repeat(15000));
    let fx = Fixture::new(
        &[("d", &d)],
        "d:\n  - text: never\n",
        "context_window: { scripted: 4000 }\n",
    );
    let (report, _rt) =
        tokio::time::timeout(std::time::Duration::from_secs(20), fx.run("d", json!({})))
            .await
            .expect("no endless chain of continuations");
    assert_eq!(report.status, Status::Error, "{report:?}");
    assert!(report
        .error
        .as_deref()
        .unwrap()
        .contains("context overflow"));
    assert_eq!(fx.rows().len(), 1, "no continuation started");
}

/// A cancel sent while a thread is starting its continuation stops the chain at once, however
/// long that start would take: the start is withdrawn, the thread ends `cancelled` (its
/// continuation's spawn undone), and the root's waiter gets its report. (Found by hostile
/// reviews: first the cancel died with the old actor's mailbox and the continuation ran and
/// spent; then it reached the continuation only once its start had waited out the MCP
/// server it may use — up to the server's 60 s start timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_a_slow_continuation_start_is_not_lost() {
    let marks = tempfile::tempdir().unwrap();
    let d = directive(
        "limits: { turns: 1 }\npermissions: [\"mcp.stuck.*\", \"spawn\"]",
        "Work.",
    );
    let script = "d:\n  - tool_calls: [ { name: thread_status, input: { id: nobody-1 } } ]\n  - text: finished despite the cancel\n";
    let fx = Fixture::new(&[("d", &d)], script, &later_starts_hang(marks.path(), 1));
    std::fs::write(fx.root().join(".weft/hooks.yaml"), HANDOFF).unwrap();
    let rt = fx.runtime().await;
    let handle = rt
        .start("d", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let first = handle.id().clone();
    crate::support::wait_until("the continuation is being started", || {
        fx.rows_so_far()
            .iter()
            .any(|r| r.continuation_of.as_deref() == Some(first.as_str()))
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let asked = std::time::Instant::now();
    assert!(rt.cancel(&first, "stop the chain"));
    let report = tokio::time::timeout(std::time::Duration::from_secs(60), handle.wait())
        .await
        .expect("the chain ends")
        .unwrap();
    let took = asked.elapsed();
    assert_eq!(
        report.status,
        Status::Cancelled,
        "the cancel was lost: {report:?}"
    );
    assert!(
        took < std::time::Duration::from_secs(5),
        "the chain ended {took:?} after the cancel"
    );
    chain_ended_clean(&fx, &rt).await;
    // The withdrawn continuation never ran: the thread can be resumed (the server now fails
    // at once).
    std::fs::remove_file(marks.path().join("hold")).unwrap();
    let resumed = rt
        .resume(&first, "Go on.", weft::LimitSet::default())
        .await
        .expect("the thread whose continuation was withdrawn is resumed");
    let report = resumed.wait().await.unwrap();
    assert_eq!(report.status, Status::Completed, "{report:?}");
}

/// A parent's cancel reaches a child busy starting its continuation (the cascade is noted like
/// any cancel, and withdraws the waiting start): the tree ends at once, not after the cancel
/// grace and the wait for the continuation's spawn. (Before: the cascade's message died in the
/// child's mailbox; the parent waited out its 30 s grace.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parents_cancel_reaches_a_child_starting_its_continuation() {
    let marks = tempfile::tempdir().unwrap();
    let root = directive(
        "permissions: [\"thread.spawn.**\", \"mcp.stuck.*\"]",
        "Delegate.",
    );
    let kid = directive(
        "limits: { turns: 1 }\npermissions: [\"mcp.stuck.*\"]",
        "Work.",
    );
    let script = "root:\n  - tool_calls: [ { name: spawn_thread, input: { directive: kid } } ]\n  - text: root done\nkid:\n  - tool_calls: [ { name: thread_status, input: { id: nobody-1 } } ]\n  - text: kid done\n";
    // The root's start and the kid's fail at once; the kid's continuation's hangs.
    let config = later_starts_hang(marks.path(), 2);
    let fx = Fixture::new(&[("root", &root), ("kid", &kid)], script, &config);
    let path = fx.root().join(".weft/config.yaml");
    let config = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        config.replace("cancel_grace: 2s", "cancel_grace: 30s"),
    )
    .unwrap();
    std::fs::write(fx.root().join(".weft/hooks.yaml"), HANDOFF).unwrap();
    let rt = fx.runtime().await;
    let handle = rt
        .start("root", serde_json::Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let id = handle.id().clone();
    crate::support::wait_until("the kid's continuation is being started", || {
        fx.rows_so_far()
            .iter()
            .any(|r| r.directive == "kid" && r.continuation_of.is_some())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let asked = std::time::Instant::now();
    assert!(rt.cancel(&id, "stop the tree"), "{:#?}", fx.rows_so_far());
    let report = tokio::time::timeout(std::time::Duration::from_secs(90), handle.wait())
        .await
        .expect("the tree ends")
        .unwrap();
    let took = asked.elapsed();
    assert_eq!(report.status, Status::Cancelled, "{report:?}");
    assert!(
        took < std::time::Duration::from_secs(5),
        "the tree ended {took:?} after the cancel"
    );
    chain_ended_clean(&fx, &rt).await;
}

/// Every thread ended cancelled (a continuation withdrawn as it started never ran), no
/// reservation is left open, and `weft verify --all` passes.
async fn chain_ended_clean(fx: &Fixture, rt: &weft::Runtime) {
    crate::support::wait_until("every thread to end", || {
        fx.rows().iter().all(|r| r.status.is_terminal())
    })
    .await;
    for r in fx.rows() {
        assert_eq!(r.status, "cancelled", "{} ({:?})", r.id, r.error);
        if r.continuation_of.is_some() {
            assert_eq!(r.turns, 0, "the withdrawn continuation took a turn");
        }
    }
    let (violations, open) = rt.audit().await;
    assert!(violations.is_empty() && open == 0, "{violations:?} {open}");
    crate::support::verify_cli_clean(fx.root());
}

/// Config of an MCP server `stuck` whose first `fast` starts fail at once and whose later starts
/// hang while `dir` exists (the test's end removes it), then fail.
fn later_starts_hang(dir: &std::path::Path, fast: u32) -> String {
    let (count, hold) = (dir.join("count"), dir.join("hold"));
    std::fs::write(&hold, "").unwrap();
    let sh = format!(
        "n=$(cat {c} 2>/dev/null || echo 0); echo $((n+1)) > {c}; if [ $n -ge {fast} ]; then while [ -e {h} ]; do sleep 0.1; done; fi; exit 1",
        c = count.display(),
        h = hold.display()
    );
    format!(
        "mcp_servers:\n  stuck: {{ command: sh, args: [\"-c\", {}] }}\n",
        json!(sh)
    )
}
