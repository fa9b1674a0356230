//! The thread store (SPEC §10, issue 13): one contract, run against both implementations
//! (`FileStore` on a real project, `MemoryStore`), then what only the files can show — threads
//! indexed as they end, signatures still verifying after an edit, delete and fork of real runs,
//! resume honouring edits, a fork on the real llama server — and the CLI.

use crate::support::{directive, weft_cmd, Fixture};
use serde_json::{json, Map, Value};
use weft::{
    FileStore, MemoryStore, NewThread, SearchQuery, Status, StoreError, ThreadId, ThreadStore,
};

fn new_thread(directive: &str, events: Vec<Value>) -> NewThread {
    NewThread {
        directive: directive.into(),
        model: "m".into(),
        status: "completed".into(),
        events,
        ..Default::default()
    }
}

fn user(text: &str) -> Value {
    json!({ "type": "message", "role": "user", "text": text })
}

fn assistant(text: &str) -> Value {
    json!({ "type": "assistant_text", "text": text })
}

fn rule(e: StoreError) -> &'static str {
    match e {
        StoreError::Invalid { rule, .. } => rule,
        other => panic!("expected a broken rule, got {other:?}"),
    }
}

fn query(text: &str, context: usize) -> SearchQuery {
    SearchQuery {
        context,
        ..SearchQuery::new(text)
    }
}

/// The contract: what any `ThreadStore` does, asserted the same way for both.
fn contract(store: &dyn ThreadStore, name: &str) {
    // Create, get, load in pages, list by directive.
    let birds = store
        .create(NewThread {
            meta: json!({ "title": "birds" }).as_object().cloned().unwrap(),
            ..new_thread(
                "notes/birds",
                vec![
                    user("Which bird hovers over the field?"),
                    assistant("The kestrel hovers; a kestrel hunts voles, kestrel after kestrel."),
                    user("What about falcons?"),
                    assistant("Falcons stoop from a height."),
                ],
            )
        })
        .unwrap();
    let view = store.get(&birds).unwrap().expect("created thread is there");
    assert_eq!(view.row.status, "completed", "{name}");
    assert_eq!(view.row.meta.as_ref().unwrap()["title"], "birds", "{name}");
    assert!(view.verified, "{name}: {:?}", view.problem);
    let first = store.load(&birds, None, 2).unwrap();
    assert_eq!(first.lines.len(), 2, "{name}");
    assert_eq!(first.lines[0]["text"], "Which bird hovers over the field?");
    let rest = store.load(&birds, first.next, 100).unwrap();
    assert!(
        rest.lines
            .iter()
            .any(|l| l["text"] == "Falcons stoop from a height."),
        "{name}"
    );
    let long = "The garden had many visitors this year: sparrows, robins, a heron at the pond, \
        starlings in the evening, and once a kestrel on the fence post by the old shed.";
    let garden = store
        .create(new_thread("notes/garden", vec![user(long)]))
        .unwrap();
    let only = weft::ThreadFilter {
        directive: Some("notes/garden".into()),
        ..Default::default()
    };
    let listed: Vec<String> = store
        .list(&only)
        .unwrap()
        .into_iter()
        .map(|r| r.id.to_string())
        .collect();
    assert_eq!(listed, [garden.to_string()], "{name}");

    // Validation names the rule that failed.
    let bad = |events: Vec<Value>| rule(store.create(new_thread("x", events)).unwrap_err());
    assert_eq!(
        bad(vec![json!({ "type": "bogus" })]),
        "event.type",
        "{name}"
    );
    assert_eq!(
        bad(vec![
            json!({ "type": "message", "role": "robot", "text": "hi" })
        ]),
        "event.role"
    );
    assert_eq!(
        bad(vec![json!({ "type": "assistant_text" })]),
        "event.field"
    );
    assert_eq!(
        bad(vec![json!({ "type": "note", "text": "t", "seq": 9 })]),
        "event.reserved"
    );
    assert_eq!(bad(vec![json!("just text")]), "event.object");
    assert_eq!(
        bad(vec![
            user("a"),
            json!({ "type": "message_deleted", "target": 7 })
        ]),
        "event.target"
    );
    let running = NewThread {
        status: "running".into(),
        ..new_thread("x", vec![])
    };
    assert_eq!(
        rule(store.create(running).unwrap_err()),
        "thread.status",
        "{name}"
    );
    let meta = |k: &str| json!({ k: 1 }).as_object().cloned().unwrap();
    assert_eq!(
        rule(store.update_metadata(&birds, &meta("a b")).unwrap_err()),
        "metadata.key"
    );

    // Search: each thread's best message, ranked; context around it; scoped by directive;
    // a query is words, never search syntax.
    let hits = store.search(&query("kestrel", 1)).unwrap();
    let ids: Vec<&ThreadId> = hits.iter().map(|h| &h.thread_id).collect();
    assert_eq!(
        ids,
        [&birds, &garden],
        "{name}: one hit per thread, the denser one first"
    );
    assert_eq!(hits[0].hit.role, "assistant", "{name}");
    assert!(hits[0].score > hits[1].score, "{name}");
    let ctx: Vec<&str> = hits[0].context.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(
        ctx,
        [
            "Which bird hovers over the field?",
            hits[0].hit.text.as_str(),
            "What about falcons?"
        ],
        "{name}: ±1 message of context"
    );
    let scoped = SearchQuery {
        directive: Some("notes/garden".into()),
        ..query("kestrel", 0)
    };
    let scoped = store.search(&scoped).unwrap();
    assert_eq!(scoped.len(), 1, "{name}");
    assert_eq!(scoped[0].thread_id, garden);
    assert!(
        store.search(&query("kestrel\" OR (NEAR", 0)).is_ok(),
        "{name}"
    );
    assert!(
        store.search(&query("albatross", 3)).unwrap().is_empty(),
        "{name}"
    );

    // Edits are events: the conversation and the index read them; the lines stay.
    let falcons = rest
        .lines
        .iter()
        .chain(&first.lines)
        .find(|l| l["text"] == "What about falcons?")
        .and_then(|l| l["seq"].as_i64())
        .unwrap();
    let stoop = falcons + 1;
    store
        .append(
            &birds,
            vec![
                json!({ "type": "message_edited", "target": falcons, "text": "What about owls?" }),
                json!({ "type": "message_deleted", "target": stoop }),
            ],
        )
        .unwrap();
    assert_eq!(
        store.search(&query("owls", 0)).unwrap()[0].thread_id,
        birds,
        "{name}"
    );
    assert!(
        store.search(&query("stoop falcons", 0)).unwrap().is_empty(),
        "{name}"
    );
    let all = store.load(&birds, None, 1000).unwrap().lines;
    assert!(
        all.iter().any(|l| l["text"] == "What about falcons?"),
        "{name}: the original stays"
    );
    let read: Vec<Value> = weft::apply_edits(&all)
        .into_iter()
        .filter(|l| l["type"] == "message" || l["type"] == "assistant_text")
        .map(|l| l["text"].clone())
        .collect();
    assert_eq!(read.len(), 3, "{name}: {read:?}");
    assert_eq!(read[2], "What about owls?");
    let twice = json!({ "type": "message_deleted", "target": stoop });
    assert_eq!(
        rule(store.append(&birds, vec![twice]).unwrap_err()),
        "event.target"
    );

    // Metadata merges; null removes.
    let patch = json!({ "title": null, "tag": "field" })
        .as_object()
        .cloned()
        .unwrap();
    assert_eq!(
        Value::Object(store.update_metadata(&birds, &patch).unwrap()),
        json!({ "tag": "field" })
    );

    // The key-value store: JSON values, null deletes, keys and sizes checked.
    store
        .kv_set(&birds, "plan", Some(json!({ "steps": [1, 2] })))
        .unwrap();
    store.kv_set(&birds, "n", Some(json!(3))).unwrap();
    assert_eq!(
        store.kv_get(&birds, "plan").unwrap(),
        Some(json!({ "steps": [1, 2] })),
        "{name}"
    );
    store.kv_set(&birds, "n", None).unwrap();
    assert_eq!(store.kv_get(&birds, "n").unwrap(), None, "{name}");
    assert_eq!(
        Value::Object(store.kv_list(&birds).unwrap()),
        json!({ "plan": { "steps": [1, 2] } })
    );
    assert_eq!(
        store.kv_list(&garden).unwrap().len(),
        0,
        "{name}: per thread"
    );
    assert_eq!(
        rule(store.kv_set(&birds, "", Some(json!(1))).unwrap_err()),
        "kv.key"
    );
    let big = json!("x".repeat(70_000));
    assert_eq!(
        rule(store.kv_set(&birds, "big", Some(big)).unwrap_err()),
        "kv.value"
    );

    // Backfill is idempotent.
    store.backfill().unwrap();
    assert_eq!(
        store.backfill().unwrap(),
        weft::Backfill::default(),
        "{name}"
    );

    // Delete: gone everywhere, idempotent, never recreated.
    let gone = store.delete(&birds, false).unwrap();
    assert_eq!(gone.threads, std::slice::from_ref(&birds), "{name}");
    assert!(store.get(&birds).unwrap().is_none(), "{name}");
    assert!(
        store.search(&query("owls", 0)).unwrap().is_empty(),
        "{name}"
    );
    assert!(store.delete(&birds, false).unwrap().already, "{name}");
    assert_eq!(
        store.append(&birds, vec![user("late")]).unwrap_err(),
        StoreError::Deleted(birds.clone()),
        "{name}: a late append cannot recreate a deleted thread"
    );
    assert!(store.get(&birds).unwrap().is_none(), "{name}");
    assert_eq!(
        store.kv_get(&birds, "plan").unwrap_err(),
        StoreError::Deleted(birds.clone())
    );
    let nobody = ThreadId::parse("nobody-1-00000000").unwrap();
    assert_eq!(
        store.load(&nobody, None, 1).unwrap_err(),
        StoreError::NotFound(nobody.clone())
    );
    assert_eq!(
        store.delete(&nobody, false).unwrap_err(),
        StoreError::NotFound(nobody)
    );
}

#[test]
fn the_store_contract_holds_in_memory() {
    contract(&MemoryStore::new(), "memory");
    // What only a store holding a running thread can show: it is not the store's to change.
    let store = MemoryStore::new();
    let live_id = weft::ThreadId::parse("live-1-00000000").unwrap();
    let live = weft::ThreadRow::new(live_id.clone(), live_id, weft::Status::Running);
    store.insert(live, vec![user("hi")]);
    let id = ThreadId::parse("live-1-00000000").unwrap();
    assert_eq!(
        store.append(&id, vec![user("x")]).unwrap_err(),
        StoreError::Running(id.clone())
    );
    assert_eq!(
        store.delete(&id, false).unwrap_err(),
        StoreError::Running(id)
    );
}

/// The file store, its registry, index, KV and tombstones in SQLite files and on Postgres.
#[test]
fn the_store_contract_holds_on_files() {
    for backend in crate::support::BACKENDS {
        let Some(fx) = Fixture::on(backend, &[], "", "") else {
            return;
        };
        let store = FileStore::open(&fx.project()).unwrap();
        contract(&store, &format!("files on {backend:?}"));
        // The appended edits are chained and signed like every line: the project still verifies.
        assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
        // Nothing of the deleted thread is left on disk or on the server.
        let dirs = std::fs::read_dir(fx.root().join(".weft/threads"))
            .map(|d| d.count())
            .unwrap_or(0);
        let kept = fx.records().thread_ids().unwrap();
        assert_eq!(
            kept.len(),
            1,
            "only the garden thread's records are left: {kept:?}"
        );
        if backend == crate::support::Backend::Postgres {
            let state = fx.root().join(".weft/state");
            for f in ["registry.db", "store.db", "ledger.db", "anchors.jsonl"] {
                assert!(!state.join(f).exists(), "{f} beside a Postgres database");
            }
            // The records are on the server: no transcript or thread.json file anywhere.
            let files = crate::support::files_with_ext(&fx.root().join(".weft"), "jsonl").len()
                + crate::support::files_with_ext(&fx.root().join(".weft"), "json").len();
            assert_eq!(files, 0, "record files beside a Postgres database");
        } else {
            assert_eq!(dirs, 1, "only the garden thread's folder is left");
        }
    }
}

const SCRIPT: &str = "chat:\n  - text: The capital of Norway is Oslo.\n  - text: Bergen is on the west coast.\n  - text: Trondheim was the old capital.\n";

fn chat() -> String {
    directive("limits: { turns: 2 }", "Tell me about Norway's cities.")
}

/// The indexer waits for threads to stop ending before it indexes them (store/later.rs), yet
/// a search finds every thread that ended before it; and a thread nobody searches for is
/// indexed on its own within about a second (another process's search, which cannot wait for
/// this one's queue, finds it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_finds_a_thread_that_just_ended_and_the_indexer_catches_up_alone() {
    let fx = Fixture::new(&[("chat", &chat())], SCRIPT, "");
    let (first, rt) = fx.run("chat", json!({})).await;
    let hits = rt.search(&SearchQuery::new("Oslo capital")).unwrap();
    assert_eq!(hits.len(), 1, "found as soon as it ended: {hits:?}");
    assert_eq!(hits[0].thread_id, first.thread_id);

    let second = rt
        .run("chat", Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let elsewhere = FileStore::open(&fx.project()).unwrap();
    let t0 = std::time::Instant::now();
    let found = loop {
        let hits = elsewhere.search(&SearchQuery::new("Oslo capital")).unwrap();
        if hits.iter().any(|h| h.thread_id == second.thread_id) || t0.elapsed().as_secs() >= 10 {
            break hits;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(found.len(), 2, "indexed without a search asking: {found:?}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "indexed {:?} after it ended (at most a second of waiting is promised)",
        t0.elapsed()
    );
    rt.shutdown();
}

/// Threads are indexed as they end; an edit re-indexes and keeps the project verifying; fork
/// copies the conversation (edits honoured) into a new root with its own budget and leaves
/// the source untouched; resume honours edits too; delete refuses a tree without --subtree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_searchable_editable_forkable_and_deletable() {
    let fx = Fixture::new(&[("chat", &chat())], SCRIPT, "");
    let (report, rt) = fx.run("chat", json!({})).await;
    assert_eq!(report.status, Status::Completed);
    rt.drain_hooks().await;
    let src = report.thread_id.clone();
    let hits = rt.search(&SearchQuery::new("Oslo capital")).unwrap();
    assert_eq!(hits.len(), 1, "indexed as it ended: {hits:?}");
    assert_eq!(hits[0].thread_id, src);

    // Edit the prompt of the ended thread through the store.
    let lines = rt.transcript(&src, None, 1000).unwrap().lines;
    let prompt = lines.iter().find(|l| l["type"] == "message").unwrap()["seq"]
        .as_i64()
        .unwrap();
    let edit = json!({ "type": "message_edited", "target": prompt, "text": "Tell me about Sweden's cities." });
    rt.store().append(&src, vec![edit]).unwrap();
    assert!(fx.verify_all().is_empty(), "{:?}", fx.verify_all());
    assert_eq!(
        rt.search(&SearchQuery::new("Sweden")).unwrap().len(),
        1,
        "re-indexed"
    );
    let before = std::fs::read(
        fx.root()
            .join(format!(".weft/threads/{src}/transcript.jsonl")),
    )
    .unwrap();

    // Fork with a new message: a new root, its own budget, the edited conversation copied.
    let fork = weft::Fork {
        message: Some("And Bergen?".into()),
        ..Default::default()
    };
    let forked = rt.fork(&src, fork).await.unwrap().wait().await.unwrap();
    assert_eq!(forked.status, Status::Completed, "{forked:?}");
    let f = forked.thread_id.to_string();
    let doc = fx.doc(&f);
    assert_eq!(
        doc.forked_from.as_ref().map(|x| x.thread.clone()),
        Some(src.clone())
    );
    assert_eq!(doc.root_id.to_string(), f, "a root of its own");
    assert!(doc.parent_id.is_none());
    let row = fx.rows().into_iter().find(|r| r.id == f).unwrap();
    assert_eq!(row.forked_from.as_deref(), Some(src.as_str()));
    let fork_lines = fx.events(&f);
    let copied = fork_lines
        .iter()
        .find(|l| l["type"] == "conversation")
        .expect("the copy is recorded");
    let copied = copied["messages"].to_string();
    assert!(
        copied.contains("Sweden") && !copied.contains("Norway's"),
        "edits honoured: {copied}"
    );
    assert!(
        copied.contains("Oslo"),
        "the source's answer is copied: {copied}"
    );
    let asked: Vec<&Value> = fork_lines
        .iter()
        .filter(|l| l["type"] == "message")
        .collect();
    assert_eq!(asked.last().unwrap()["text"], "And Bergen?");
    let after = std::fs::read(
        fx.root()
            .join(format!(".weft/threads/{src}/transcript.jsonl")),
    )
    .unwrap();
    assert_eq!(before, after, "the source is untouched");

    // Fork --at the prompt, no message: the prompt is answered afresh.
    let at = weft::Fork {
        at: Some(prompt),
        ..Default::default()
    };
    let again = rt.fork(&src, at).await.unwrap().wait().await.unwrap();
    let again_lines = fx.events(again.thread_id.as_str());
    assert!(
        again_lines.iter().all(|l| l["type"] != "conversation"),
        "only the prompt was copied"
    );
    let first_msg = again_lines.iter().find(|l| l["type"] == "message").unwrap();
    assert_eq!(first_msg["text"], "Tell me about Sweden's cities.");
    let out_of_range = weft::Fork {
        at: Some(10_000),
        ..Default::default()
    };
    let err = match rt.fork(&src, out_of_range).await {
        Err(e) => e.to_string(),
        Ok(h) => panic!("forked past the end as {}", h.id()),
    };
    assert!(
        err.contains("--at 10000") && err.contains("weft log"),
        "{err}"
    );

    // Resume honours the edit as well.
    let resumed = rt
        .resume(&src, "Go on.", weft::LimitSet::default())
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    let conv = fx.events(resumed.thread_id.as_str());
    let conv = conv.iter().find(|l| l["type"] == "conversation").unwrap()["messages"].to_string();
    assert!(
        conv.contains("Sweden") && !conv.contains("Norway's"),
        "{conv}"
    );
    rt.shutdown();
}

const TREE_SCRIPT: &str = "parent:\n  - tool_calls: [ { name: spawn_thread, input: { directive: kid, wait: true } } ]\n  - text: done\nkid:\n  - text: kid done\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_takes_a_tree_only_whole_and_never_a_running_thread() {
    let parent = directive("permissions: [ \"thread.spawn.kid\" ]", "Spawn the kid.");
    let kid = directive("limits: { turns: 1 }", "Say done.");
    let slow = directive("limits: { turns: 1 }", "Wait.");
    let script = format!("{TREE_SCRIPT}slow:\n  - text: late\n    delay: 30s\n");
    let fx = Fixture::new(
        &[("parent", &parent), ("kid", &kid), ("slow", &slow)],
        &script,
        "",
    );
    let (report, rt) = fx.run("parent", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    rt.drain_hooks().await;
    let root = report.thread_id.clone();
    let kid_id = fx.id_of("kid");
    let store = rt.store();
    assert_eq!(
        store.delete(&root, false).unwrap_err(),
        StoreError::HasChildren {
            id: root.clone(),
            children: 1
        }
    );
    let live = rt
        .start("slow", Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    let live_id = live.id().clone();
    wait_running(&rt, &live_id).await;
    assert_eq!(
        store.delete(&live_id, false).unwrap_err(),
        StoreError::Running(live_id.clone())
    );
    assert_eq!(
        store.append(&live_id, vec![user("x")]).unwrap_err(),
        StoreError::Running(live_id.clone())
    );
    let gone = store.delete(&root, true).unwrap();
    assert_eq!(gone.threads.len(), 2);
    assert!(!fx.root().join(format!(".weft/threads/{root}")).exists());
    assert!(!fx.root().join(format!(".weft/threads/{kid_id}")).exists());
    assert!(fx
        .rows()
        .iter()
        .all(|r| r.id != root.as_str() && r.id != kid_id));
    assert!(rt.search(&SearchQuery::new("kid done")).unwrap().is_empty());
    rt.cancel(&live_id, "test over");
    live.wait().await.unwrap();
    rt.shutdown();
}

async fn wait_running(rt: &weft::Runtime, id: &ThreadId) {
    for _ in 0..200 {
        if rt
            .get(id)
            .unwrap()
            .is_some_and(|v| v.row.status == "running")
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{id} never ran");
}

fn weft_json(fx: &Fixture, args: &[&str]) -> Value {
    let out = weft_cmd(fx.root())
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "weft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "weft {args:?}: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The commands: search (and backfill after the index is lost), message edit, fork, delete.
#[test]
fn the_cli_searches_edits_forks_and_deletes() {
    let fx = Fixture::new(&[("chat", &chat())], SCRIPT, "");
    let script = fx.root().join("script.yaml");
    let script = script.to_str().unwrap();
    let run = weft_json(&fx, &["run", "chat", "--script", script]);
    let id = run["thread_id"].as_str().unwrap().to_string();
    let hits = weft_json(&fx, &["search", "oslo"]);
    assert_eq!(hits[0]["thread_id"], id.as_str(), "{hits}");
    assert_eq!(hits[0]["hit"]["role"], "assistant");
    // The index is a cache: lost, it is rebuilt, and a second backfill finds nothing to do.
    std::fs::remove_file(fx.root().join(".weft/state/store.db")).unwrap();
    let _ = std::fs::remove_file(fx.root().join(".weft/state/store.db-wal"));
    let _ = std::fs::remove_file(fx.root().join(".weft/state/store.db-shm"));
    assert_eq!(
        weft_json(&fx, &["search", "--backfill"]),
        json!({ "indexed": 1, "removed": 0 })
    );
    assert_eq!(
        weft_json(&fx, &["search", "--backfill"]),
        json!({ "indexed": 0, "removed": 0 })
    );
    let human = weft_cmd(fx.root())
        .args(["search", "oslo"])
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout).to_string();
    assert!(
        human.contains(&id) && human.contains("> ") && human.contains("Oslo"),
        "{human}"
    );

    let prompt = fx
        .events(&id)
        .iter()
        .find(|l| l["type"] == "message")
        .unwrap()["seq"]
        .to_string();
    let edited = weft_json(
        &fx,
        &[
            "message",
            &id,
            "edit",
            &prompt,
            "Tell me about Danish cities.",
        ],
    );
    assert!(edited["seq"].as_i64().unwrap() > 2, "{edited}");
    let bad = weft_cmd(fx.root())
        .args(["message", &id, "delete", "999"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("999"),
        "names the line"
    );

    let forked = weft_json(&fx, &["fork", &id, "-m", "And Aarhus?", "--script", script]);
    assert_eq!(forked["status"], "completed", "{forked}");
    let fid = forked["thread_id"].as_str().unwrap();
    let shown = weft_json(&fx, &["show", fid]);
    assert_eq!(shown["row"]["forked_from"], id.as_str(), "{shown}");

    let gone = weft_json(&fx, &["delete", &id]);
    assert_eq!(gone["threads"], json!([id]), "{gone}");
    assert_eq!(weft_json(&fx, &["delete", &id])["already"], true);
    let late = weft_cmd(fx.root())
        .args(["message", &id, "delete", &prompt])
        .output()
        .unwrap();
    assert_eq!(late.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&late.stderr).contains("deleted"));
    assert_eq!(
        weft_json(&fx, &["search", "--backfill"])["removed"],
        0,
        "delete removed its entries"
    );
}

/// A fork on the real llama server: the fork's first call carries the copied conversation
/// (more prompt tokens than the source's first call, as the server counted them), and it is
/// paid from its own budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_sends_the_copied_conversation_to_a_real_model() {
    let Some(url) = crate::e2e_llm::server() else {
        return;
    };
    let _serial = crate::e2e_llm::SERIAL.lock().await;
    let d = directive(
        "model: { tier: fast }\nlimits: { turns: 1 }",
        "Name a colour.",
    );
    let fx = Fixture::raw(
        &[("colour", &d)],
        "",
        &crate::e2e_llm::config("openai", &url, 24),
    );
    let rt = fx.runtime_configured().await;
    let src = rt
        .run("colour", Map::new(), weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(src.status, Status::Completed, "{src:?}");
    let fork = weft::Fork {
        message: Some("Name another one.".into()),
        ..Default::default()
    };
    let forked = rt
        .fork(&src.thread_id, fork)
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(forked.status, Status::Completed, "{forked:?}");
    let first_in = |id: &ThreadId| {
        fx.events(id.as_str())
            .iter()
            .find(|l| l["type"] == "llm_call")
            .and_then(|l| l["usage"]["input_tokens"].as_u64())
            .unwrap()
    };
    assert!(
        first_in(&forked.thread_id) > first_in(&src.thread_id) + 3,
        "the fork's prompt holds the copied question and answer"
    );
    let src_row = rt.get(&src.thread_id).unwrap().unwrap().row;
    let fork_row = rt.get(&forked.thread_id).unwrap().unwrap().row;
    assert_eq!(
        src_row.spend_nanos, src_row.own_spend_nanos,
        "the source's spend is its own"
    );
    assert!(fork_row.spend_nanos > 0 && fork_row.root_id == forked.thread_id.as_str());
    rt.shutdown();
}

/// Two writers (two stores, as two processes would be) appending to one finished thread at
/// the same moment, on both backends: every append that reported success is in the signed
/// lines a resume reads, in one chain, and the project verifies — the thread's lock holds on
/// a database server as on a file.
#[test]
fn appends_from_two_writers_to_one_thread_all_land_signed() {
    for backend in crate::support::BACKENDS {
        let Some(fx) = Fixture::on(backend, &[], "", "") else {
            return;
        };
        let store = FileStore::open(&fx.project()).unwrap();
        let id = store
            .create(new_thread("notes/both", vec![user("Start.")]))
            .unwrap();
        let landed: Vec<String> = std::thread::scope(|s| {
            let writers: Vec<_> = ["a", "b"]
                .into_iter()
                .map(|w| {
                    let (project, id) = (fx.project(), id.clone());
                    s.spawn(move || {
                        let store = FileStore::open(&project).unwrap();
                        let mut ok = Vec::new();
                        for n in 0..15 {
                            let text = format!("{w}{n}");
                            if store.append(&id, vec![user(&text)]).is_ok() {
                                ok.push(text);
                            }
                        }
                        ok
                    })
                })
                .collect();
            writers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect()
        });
        assert!(
            landed.len() >= 15,
            "{backend:?}: most appends land: {landed:?}"
        );
        let (trust, _) = weft::internals::Trust::load(&fx.project().trust_dir());
        let verdict = weft::internals::verify_thread(&fx.records(), &trust, &id);
        assert!(verdict.ok, "{backend:?}: {verdict:?}");
        let page = store.load(&id, None, 1000).unwrap();
        let texts: Vec<&str> = page
            .lines
            .iter()
            .filter_map(|l| l["text"].as_str())
            .collect();
        for t in &landed {
            assert!(
                texts.contains(&t.as_str()),
                "{backend:?}: `{t}` reported stored but missing: {texts:?}"
            );
        }
    }
}
