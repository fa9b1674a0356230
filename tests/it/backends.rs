//! The same state on SQLite and on PostgreSQL: the registry's contract on both, schema
//! versions, a project whose config names a Postgres database (nothing of its state in files,
//! `weft` commands answering from the server, the URL's password never shown), and two
//! processes against one tree on one database.

use crate::support::{directive, exits_within, spawn_run, weft_cmd, Backend, Fixture, BACKENDS};
use weft::internals::{Admission, RegistryError, Store, ThreadRow};
use weft::{DatabaseUrl, Status, ThreadId};

fn id(s: &str) -> ThreadId {
    ThreadId::parse(s).unwrap()
}

/// Where a registry on `backend` lives: a fresh database (Some(Some(url))), or a file (Some(None));
/// None without a Postgres server.
fn database(backend: Backend) -> Option<Option<DatabaseUrl>> {
    match backend {
        Backend::Sqlite => Some(None),
        Backend::Postgres => Some(Some(
            DatabaseUrl::parse(&crate::pg::fresh_database()?).unwrap(),
        )),
    }
}

/// A writable registry on `backend` (a fresh database, or a file in `dir`).
fn registry(backend: Backend, dir: &std::path::Path) -> Option<Store> {
    let url = database(backend)?;
    Some(Store::open_at(url.as_ref(), &dir.join("registry.db")).unwrap())
}

fn row(i: &str, parent: Option<&str>, root: &str, status: Status, at: &str) -> ThreadRow {
    ThreadRow {
        directive: "d".into(),
        parent_id: parent.map(id),
        created_at: at.into(),
        updated_at: at.into(),
        model: "m".into(),
        owner_pid: 7,
        ..ThreadRow::new(id(i), id(root), status)
    }
}

#[test]
fn the_registry_keeps_its_contract_on_both_backends() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().unwrap();
        let Some(mut s) = registry(backend, dir.path()) else {
            return;
        };
        let at = |n: u32| format!("2026-11-25T00:00:{n:02}Z");
        s.register(&row("r", None, "r", Status::Running, &at(1)), None)
            .unwrap();
        let admit = Admission {
            parent: id("r"),
            spawns: 3,
            concurrency: 2,
        };
        for (n, kid) in ["a", "b"].iter().enumerate() {
            let r = row(kid, Some("r"), "r", Status::Running, &at(2 + n as u32));
            s.register(&r, Some(&admit)).unwrap();
        }
        let third = row("c", Some("r"), "r", Status::Running, &at(5));
        assert!(
            matches!(
                s.register(&third, Some(&admit)),
                Err(RegistryError::Concurrency {
                    live: 2,
                    max: 2,
                    ..
                })
            ),
            "{backend:?}: the concurrency limit"
        );
        let mut done = s.get("a").unwrap().unwrap();
        done.status = Status::Completed;
        done.own_spend_nanos = 1_234_567_890_123;
        done.outputs = Some(serde_json::json!({"n": 1}));
        s.update(&done).unwrap();
        s.register(&third, Some(&admit)).unwrap();
        let fourth = row("d", Some("r"), "r", Status::Running, &at(6));
        assert!(
            matches!(
                s.register(&fourth, Some(&admit)),
                Err(RegistryError::Spawns {
                    used: 3,
                    max: 3,
                    ..
                })
            ),
            "{backend:?}: the spawns limit"
        );
        // A terminal row never changes again.
        let mut back = done.clone();
        back.status = Status::Running;
        s.update(&back).unwrap();
        assert_eq!(s.get("a").unwrap().unwrap(), done, "{backend:?}");
        let ids = |rows: Vec<ThreadRow>| {
            rows.into_iter()
                .map(|r| r.id.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            ids(s.tree("r").unwrap()),
            ["r", "a", "b", "c"],
            "{backend:?}"
        );
        assert_eq!(
            ids(s.list(true, 10).unwrap()),
            ["c", "b", "r"],
            "{backend:?}"
        );
        assert_eq!(ids(s.subtree("r").unwrap()).len(), 4);
        assert_eq!(
            ids(s.unfinished_subtree("r").unwrap()),
            ["b", "c", "r"],
            "{backend:?}"
        );
        let f = weft::ThreadFilter {
            status: vec!["completed".into()],
            limit: Some(5),
            ..Default::default()
        };
        assert_eq!(ids(s.query(&f).unwrap()), ["a"], "{backend:?}");
        assert!(s.is_descendant("r", "c").unwrap() && !s.is_descendant("c", "r").unwrap());
        assert_eq!(s.count(Status::Running).unwrap(), 3, "{backend:?}");
        assert!(s.claim("b", 7, 9).unwrap(), "{backend:?}: one claimer");
        assert!(!s.claim("b", 7, 10).unwrap(), "{backend:?}: not twice");
        assert!(s.set_meta("a", &serde_json::json!({"title": "t"})).unwrap());
        // A continuation of a finished root's thread: linked, and only once.
        let mut cont = row("a2", Some("r"), "r", Status::Running, &at(7));
        cont.continuation_of = Some(id("a"));
        s.register(&cont, None).unwrap();
        s.link_continuation("a", "a2", "a").unwrap();
        assert_eq!(ids(s.chain("a2").unwrap()), ["a", "a2"], "{backend:?}");
        cont.id = id("a3");
        assert!(matches!(
            s.register(&cont, None),
            Err(RegistryError::Continued { .. })
        ));
        assert_eq!(
            s.delete_finished(&["a", "b"]).unwrap(),
            1,
            "{backend:?}: finished only"
        );
        assert!(s.get("a").unwrap().is_none());
        s.vacuum().unwrap();
    }
}

/// A batch's row updates land as they would one by one (on Postgres they are held and
/// written many to a statement): never out of a terminal state, whatever follows in the same
/// batch; seen by a read, by a child's admission and by the commit.
#[test]
fn a_batchs_row_updates_land_as_one_by_one_on_both_backends() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().unwrap();
        let Some(url) = database(backend) else {
            return;
        };
        let path = dir.path().join("registry.db");
        let mut s = Store::open_at(url.as_ref(), &path).unwrap();
        let at = |n: u32| format!("2026-11-25T00:00:{n:02}Z");
        s.register(&row("r", None, "r", Status::Running, &at(1)), None)
            .unwrap();
        let admit = Admission {
            parent: id("r"),
            spawns: 10,
            concurrency: 1,
        };
        let with_turns = |i: &str, status, n: u32, turns| ThreadRow {
            turns,
            ..row(i, Some("r"), "r", status, &at(n))
        };
        s.begin_batch().unwrap();
        s.register(&with_turns("a", Status::Running, 2, 0), Some(&admit))
            .unwrap();
        // Three updates of one thread, nothing between them: the one that ends it stays.
        for (status, n, turns) in [
            (Status::Running, 3, 1),
            (Status::Completed, 4, 4),
            (Status::Running, 5, 5),
        ] {
            s.update(&with_turns("a", status, n, turns)).unwrap();
        }
        s.update(&row("r", None, "r", Status::Running, &at(5)))
            .unwrap();
        let seen = s.get("a").unwrap().unwrap();
        assert_eq!(
            (seen.status, seen.turns),
            (Status::Completed, 4),
            "{backend:?}"
        );
        // a's slot is free for b; a late update of a changes nothing.
        s.register(&with_turns("b", Status::Running, 6, 0), Some(&admit))
            .unwrap();
        s.update(&with_turns("a", Status::Running, 6, 6)).unwrap();
        s.commit_batch().unwrap();
        // b ends and c takes its slot, nothing read between them; then the commit with an
        // update still held.
        s.begin_batch().unwrap();
        s.update(&with_turns("b", Status::Completed, 7, 2)).unwrap();
        s.register(&with_turns("c", Status::Running, 8, 0), Some(&admit))
            .unwrap();
        s.update(&row("r", None, "r", Status::Running, &at(9)))
            .unwrap();
        s.commit_batch().unwrap();
        assert!(
            s.take_refused().is_empty(),
            "{backend:?}: b and c were admitted"
        );
        // Read by another connection: nothing this store still holds can be written now.
        let other = Store::open_at(url.as_ref(), &path).unwrap();
        let get = |i: &str| other.get(i).unwrap().unwrap();
        assert_eq!((get("a").status, get("a").turns), (Status::Completed, 4));
        assert_eq!((get("b").status, get("b").turns), (Status::Completed, 2));
        assert_eq!(get("c").status, Status::Running);
        assert_eq!(
            get("r").updated_at,
            at(9),
            "{backend:?}: the update held at the commit"
        );
    }
}

/// #24: a batch's row updates on Postgres find their rows by key once a tree has grown the
/// table, whatever plan the server made while it was small. The server keeps a statement's
/// plan for its connection: one made while `threads` was a few rows (a whole-table scan, the
/// table never analyzed, or vacuumed small as `weft gc` does) stayed as a tree grew the table,
/// ~1 ms an update batch at 11,111 rows. The server counts the rows its sequential scans read.
#[test]
fn a_growing_registrys_row_updates_on_postgres_find_rows_by_key() {
    for vacuumed_small in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let Some((mut s, _, name)) = pg_registry(dir.path()) else {
            return;
        };
        let server = crate::pg::server().unwrap();
        let at = "2026-11-25T00:00:00Z";
        let batch = |s: &mut Store, rows: &[ThreadRow], update: bool| {
            s.begin_batch().unwrap();
            for r in rows {
                match update {
                    true => s.update(r).unwrap(),
                    false => s.register(r, None).unwrap(),
                }
            }
            s.commit_batch().unwrap();
        };
        let rows = |from: usize, n: usize| -> Vec<ThreadRow> {
            let ids = (from..from + n).map(|i| format!("t{i}"));
            ids.map(|i| row(&i, None, &i, Status::Running, at))
                .collect()
        };
        // Two rows, updated two at a time often enough for the server to keep one plan; then
        // the table grows a thousandfold and the same updates go on.
        let (before, after) = (8, 20);
        batch(&mut s, &rows(0, 2), false);
        if vacuumed_small {
            // What `weft gc` runs on Postgres (its row counts go to the planner's statistics).
            server.psql(&name, "VACUUM threads");
        }
        for _ in 0..before {
            batch(&mut s, &rows(0, 2), true);
        }
        batch(&mut s, &rows(2, 2000), false);
        for _ in 0..after {
            batch(&mut s, &rows(0, 2), true);
        }
        let updated = 2 * (before + after);
        // The server's counts of a connection are complete once it has ended.
        drop(s);
        let sql = "SELECT n_tup_upd, seq_tup_read FROM pg_stat_user_tables WHERE relname='threads'";
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let counts = loop {
            let out = server.psql(&name, sql);
            let counts: Vec<u64> = out.split('|').filter_map(|v| v.parse().ok()).collect();
            if counts.first() == Some(&updated) || std::time::Instant::now() > deadline {
                break counts;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        assert_eq!(counts.first(), Some(&updated), "rows updated: {counts:?}");
        // The small table's scans read two rows each; one scan of the grown table reads 2,002.
        let read = counts.get(1).copied().unwrap_or(u64::MAX);
        assert!(
            read < 2002,
            "vacuumed while small: {vacuumed_small}: sequential scans read {read} rows: an \
             update batch of two rows read the whole grown table"
        );
    }
}

/// A database whose schema a newer weft wrote is refused, naming both versions, and left as
/// it is.
#[test]
fn a_database_newer_than_this_weft_is_refused_naming_both_versions() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().unwrap();
        let Some(url) = database(backend) else {
            return;
        };
        let file = dir.path().join("registry.db");
        drop(Store::open_at(url.as_ref(), &file).unwrap());
        let bump = "UPDATE weft_schema SET version = 99 WHERE concern = 'registry'";
        match &url {
            None => {
                rusqlite::Connection::open(&file)
                    .unwrap()
                    .execute_batch(bump)
                    .unwrap();
            }
            Some(u) => {
                let name = u.to_string().rsplit("dbname=").next().unwrap().to_string();
                crate::pg::server().unwrap().psql(&name, bump);
            }
        }
        let err = Store::open_at(url.as_ref(), &file)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("version 99") && err.contains("(1)") && err.contains("upgrade weft"),
            "{backend:?}: {err}"
        );
    }
}

/// Two rows of one tree, one root's chain running.
fn small_tree() -> (String, String, String) {
    let r = directive(
        "limits: { spend: 0.01 }\npermissions: [\"thread.spawn.**\"]",
        "Root.",
    );
    let k = directive("", "Kid.");
    let script = r#"r:
  - tool_calls: [ { name: spawn_thread, input: { directive: k } } ]
    usage: { input_tokens: 100, output_tokens: 10 }
  - text: done
    usage: { input_tokens: 200, output_tokens: 20 }
k:
  - text: kid
    usage: { input_tokens: 50, output_tokens: 5 }
"#;
    (r, k, script.to_string())
}

/// A project with [`small_tree`]'s directives and script, and `config`.
fn tree_fixture(config: &str) -> Fixture {
    let (r, k, script) = small_tree();
    Fixture::new(&[("r", &r), ("k", &k)], &script, config)
}

/// Runs the tree's root `r` in its own process; it must end well (`what` names the run).
#[cfg(feature = "cli")]
fn ran_tree(fx: &Fixture, what: &str) -> std::process::Output {
    let out = exits_within(spawn_run(fx, "r"), 60, what);
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A project whose config names a Postgres database keeps its registry, ledger and thread
/// records there: no registry.db, ledger.db, transcript or thread.json file appears, `weft
/// threads` and `weft verify` answer from the server (and catch records changed there), the
/// spend is exact, and the password in the URL is never printed or written.
#[cfg(feature = "cli")]
#[test]
fn a_project_on_postgres_keeps_its_state_and_records_on_the_server() {
    let Some(server) = crate::pg::server() else {
        return;
    };
    let db = server.database();
    let name = db.rsplit("dbname=").next().unwrap().to_string();
    // Trust authentication ignores the password, so a made-up one connects and must still
    // never be shown.
    let url = format!(
        "postgres://weft:Hunter2Secret@127.0.0.1:{}/{name}",
        server.port
    );
    let fx = tree_fixture(&format!(
        "database: \"{url}\"
"
    ));
    let out = ran_tree(&fx, "the tree on postgres");
    let state = fx.root().join(".weft/state");
    for f in ["registry.db", "ledger.db"] {
        assert!(
            !state.join(f).exists(),
            "{f} was made beside a Postgres database"
        );
    }
    assert_eq!(
        server.psql(
            &name,
            "SELECT COUNT(*) FROM threads WHERE status='completed'"
        ),
        "2"
    );
    assert_eq!(
        server.psql(&name, "SELECT COUNT(*) FROM accounts WHERE closed=0"),
        "0"
    );
    assert_eq!(server.psql(&name, "SELECT COUNT(*) FROM reservations"), "0");
    let spent: i64 = server
        .psql(&name, "SELECT spend FROM threads WHERE parent IS NULL")
        .parse()
        .unwrap();
    assert_eq!(
        spent,
        (100 + 200 + 50) * 1000 + (10 + 20 + 5) * 4000,
        "exact spend"
    );
    let listed = crate::support::rows_json(fx.root());
    assert_eq!(
        listed.len(),
        2,
        "weft threads answers from the server: {listed:?}"
    );
    let verify = weft_cmd(fx.root())
        .args(["verify", "--all"])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    // A wrong port: the error names the database, never its password.
    let bad = format!("postgres://weft:Hunter2Secret@127.0.0.1:1/{name}");
    let refused = weft_cmd(fx.root())
        .args(["--database", &bad, "threads"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("127.0.0.1:1"),
        "{said}"
    );
    let mut seen = vec![
        out.stdout,
        out.stderr,
        verify.stdout,
        verify.stderr,
        refused.stderr,
    ];
    // Everything weft wrote (the config is the user's own file).
    for f in walk(&fx.root().join(".weft"))
        .into_iter()
        .filter(|f| !f.ends_with("config.yaml"))
    {
        seen.push(std::fs::read(&f).unwrap_or_default());
    }
    for bytes in seen {
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains("Hunter2Secret"),
            "the password was shown: {text}"
        );
    }
    records_are_on_the_server(&fx, server, &name);
}

/// The thread records of a finished tree on Postgres are on the server, not in files, and
/// `weft verify` judges them as it judges files: an edited line breaks the chain, a line
/// removed from the end no longer matches the signed head.
#[cfg(feature = "cli")]
fn records_are_on_the_server(fx: &Fixture, server: &crate::pg::Server, name: &str) {
    let files: Vec<_> = walk(&fx.root().join(".weft"))
        .into_iter()
        .filter(|f| {
            let n = f.file_name().unwrap().to_string_lossy();
            n.starts_with("transcript") || n.starts_with("thread.json") || n.starts_with("anchors")
        })
        .collect();
    assert!(files.is_empty(), "record files beside Postgres: {files:?}");
    assert_eq!(server.psql(name, "SELECT COUNT(*) FROM thread_docs"), "2");
    assert_eq!(server.psql(name, "SELECT COUNT(*) FROM anchor_lines"), "1");
    let rows = crate::support::rows_json(fx.root());
    let id_of = |d: &str| {
        rows.iter().find(|r| r["directive"] == d).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (root, kid) = (id_of("r"), id_of("k"));
    let lines: usize = server
        .psql(
            name,
            &format!("SELECT COUNT(*) FROM transcript_lines WHERE thread='{root}'"),
        )
        .parse()
        .unwrap();
    assert_eq!(lines, fx.events(&root).len(), "one row per transcript line");
    let verify = || {
        let out = weft_cmd(fx.root())
            .args(["verify", "--all"])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    // Each change made on the server is caught: `verify` fails naming the thread and what.
    let caught = |sql: String, thread: &str, says: &str| {
        server.psql(name, &sql);
        let (ok, said) = verify();
        assert!(
            !ok && said.contains(thread) && said.contains(says),
            "{says}: {said}"
        );
    };
    // An edited line (its time changed) breaks the chain at the line after it.
    caught(
        format!("UPDATE transcript_lines SET line = convert_to(replace(convert_from(line, 'UTF8'), '\"ts\":\"2', '\"ts\":\"1'), 'UTF8') WHERE thread='{root}' AND seq=1"),
        &root,
        "broken chain",
    );
    // The child's last line removed: its signed thread.json names a head that is gone.
    caught(
        format!("DELETE FROM transcript_lines WHERE thread='{kid}' AND seq=(SELECT MAX(seq) FROM transcript_lines WHERE thread='{kid}')"),
        &kid,
        "head mismatch",
    );
    // Every record of the child gone from the server: the registry still names it.
    caught(
        format!("DELETE FROM transcript_lines WHERE thread='{kid}'; DELETE FROM thread_docs WHERE thread='{kid}'"),
        &kid,
        "missing",
    );
    // A forged anchor line whose head is not a hash: reported, never a crash.
    let forged = format!("{{\"thread\":\"{root}\",\"head\":\"aaaaaaaaaaaé\"}}");
    server.psql(
        name,
        &format!("INSERT INTO anchor_lines(n, line) VALUES(2, convert_to('{forged}', 'UTF8'))"),
    );
    let out = weft_cmd(fx.root())
        .args(["verify", "--all"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("anchors") || said.contains("anchor log"),
        "{said}"
    );
}

/// A checkpoint and a thread's end on a database server wait for the server's disk: under
/// `durability: normal` lines commit without waiting for the WAL flush, so those commits
/// write a row of their own (`record_syncs`) with `synchronous_commit = on` — a commit that
/// writes nothing would not flush.
#[cfg(feature = "cli")]
#[test]
fn a_thread_on_postgres_syncs_its_records_to_the_servers_disk() {
    let Some(server) = crate::pg::server() else {
        return;
    };
    let url = server.database();
    let name = url.rsplit("dbname=").next().unwrap().to_string();
    let fx = tree_fixture(&format!(
        "database: \"{url}\"
"
    ));
    ran_tree(&fx, "the tree on postgres");
    let syncs: i64 = server
        .psql(&name, "SELECT COALESCE(SUM(n), 0) FROM record_syncs")
        .parse()
        .unwrap();
    assert!(syncs >= 2, "each thread's end waited for the disk: {syncs}");
}

/// Record files an older weft left beside a database server (it kept them in files) move
/// into the server when the project is next opened, and are set aside, not deleted: `weft
/// verify --all` then checks them on the server.
#[cfg(feature = "cli")]
#[test]
fn record_files_left_beside_a_database_move_into_it() {
    let Some(server) = crate::pg::server() else {
        return;
    };
    let fx = tree_fixture("");
    ran_tree(&fx, "the tree on SQLite");
    let url = server.database();
    let name = url.rsplit("dbname=").next().unwrap().to_string();
    let copy = weft_cmd(fx.root())
        .args(["copy", "--to", &url])
        .output()
        .unwrap();
    assert!(
        copy.status.success(),
        "{}",
        String::from_utf8_lossy(&copy.stderr)
    );
    // As the earlier weft left it: rows on the server, records only in files.
    server.psql(
        &name,
        "DELETE FROM transcript_lines; DELETE FROM thread_docs; DELETE FROM anchor_lines",
    );
    let verify = weft_cmd(fx.root())
        .args(["--database", &url, "verify", "--all"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "{said}");
    assert_eq!(server.psql(&name, "SELECT COUNT(*) FROM thread_docs"), "2");
    assert_eq!(server.psql(&name, "SELECT COUNT(*) FROM anchor_lines"), "1");
    let moved = fx.root().join(".weft/records-moved");
    assert_eq!(
        crate::support::files_with_ext(&moved, "jsonl").len(),
        3,
        "two transcripts and the anchor log set aside"
    );
    assert!(crate::support::files_with_ext(&fx.root().join(".weft/threads"), "jsonl").is_empty());
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// `weft copy --to` moves a project's history from its SQLite files into an empty Postgres
/// database: the same rows, `weft verify --all` passes on the copy, search finds what it found,
/// and the copied ledger carries the tree on (a resume there is within the tree's cap); a
/// second copy into the same database is refused.
#[cfg(feature = "cli")]
#[test]
fn weft_copy_moves_a_projects_history_into_postgres() {
    let Some(server) = crate::pg::server() else {
        return;
    };
    let (r, k, script) = small_tree();
    // The root's third turn is its resume's.
    let script = script.replace(
        "k:\n",
        "  - text: resumed\n    usage: { input_tokens: 300, output_tokens: 30 }\nk:\n",
    );
    let fx = Fixture::new(&[("r", &r), ("k", &k)], &script, "");
    ran_tree(&fx, "the tree on SQLite");
    let before = crate::support::rows_json(fx.root());
    let url = server.database();
    let copy = weft_cmd(fx.root())
        .args(["copy", "--to", &url, "--json"])
        .output()
        .unwrap();
    assert!(
        copy.status.success(),
        "{}",
        String::from_utf8_lossy(&copy.stderr)
    );
    let copied: serde_json::Value = serde_json::from_slice(&copy.stdout).unwrap();
    let count = |table: &str| {
        copied["tables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t[0] == table)
            .map(|t| t[1].as_u64().unwrap())
    };
    assert_eq!(count("threads"), Some(2), "{copied}");
    assert_eq!(count("accounts"), Some(2), "{copied}");
    assert!(
        count("msgs").unwrap() > 0,
        "the search index is copied: {copied}"
    );
    let on_pg = |args: &[&str]| {
        weft_cmd(fx.root())
            .arg("--database")
            .arg(&url)
            .args(args)
            .output()
            .unwrap()
    };
    let listed: Vec<serde_json::Value> =
        serde_json::from_slice(&on_pg(&["threads", "--json"]).stdout).unwrap();
    assert_eq!(listed, before, "the same rows, field for field");
    let verify = on_pg(&["verify", "--all"]);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let found = on_pg(&["search", "kid", "--json"]);
    assert!(
        String::from_utf8_lossy(&found.stdout).contains("kid"),
        "{}",
        String::from_utf8_lossy(&found.stdout)
    );
    let root = before.iter().find(|r| r["directive"] == "r").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The records are the same bytes: an export from the copy is the export from the files,
    // and with the files moved away the copy still verifies (it reads the server).
    let export = |on: &dyn Fn(&[&str]) -> std::process::Output| {
        let out = on(&["export", &root, "--format", "nova"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let on_files = |args: &[&str]| weft_cmd(fx.root()).args(args).output().unwrap();
    assert_eq!(
        export(&on_files),
        export(&on_pg),
        "the export reads the same records"
    );
    let threads = fx.root().join(".weft/threads");
    let aside = fx.root().join("threads-aside");
    std::fs::rename(&threads, &aside).unwrap();
    let anchors = fx.root().join(".weft/state/anchors.jsonl");
    std::fs::rename(&anchors, aside.join("anchors.jsonl")).unwrap();
    let verify = on_pg(&["verify", "--all"]);
    assert!(
        verify.status.success() && String::from_utf8_lossy(&verify.stdout).contains(&root),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let resumed = on_pg(&[
        "resume",
        &root,
        "--json",
        "--script",
        fx.root().join("script.yaml").to_str().unwrap(),
    ]);
    assert!(
        resumed.status.success(),
        "{} {}",
        String::from_utf8_lossy(&resumed.stdout),
        String::from_utf8_lossy(&resumed.stderr)
    );
    let name = url.rsplit("dbname=").next().unwrap();
    let spent: i64 = server
        .psql(name, "SELECT SUM(own_spend) FROM threads")
        .parse()
        .unwrap();
    let first = (100 + 200 + 50) * 1000 + (10 + 20 + 5) * 4000;
    assert_eq!(
        spent,
        first + 300 * 1000 + 30 * 4000,
        "the resume ran on the copied ledger"
    );
    assert!(spent <= 10_000_000, "within the tree's cap");
    let again = weft_cmd(fx.root())
        .args(["copy", "--to", &url])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && said.contains("already holds rows"),
        "{said}"
    );
}

/// A registry on the test server's fresh database: the store and its database's name.
fn pg_registry(dir: &std::path::Path) -> Option<(Store, String, String)> {
    let url = crate::pg::fresh_database()?;
    let name = url.rsplit("dbname=").next().unwrap().to_string();
    let store =
        Store::open_at(Some(&DatabaseUrl::parse(&url).unwrap()), &dir.join("r.db")).unwrap();
    Some((store, url, name))
}

/// Review of #25: on Postgres a failed statement aborts the whole transaction and its COMMIT
/// quietly rolls back; a batch must then fail, never report rows as stored that are not. On
/// both backends: a write reported stored is stored. A NUL in text (which SQLite keeps and
/// Postgres refuses) never fails a batch.
#[test]
fn a_batch_never_reports_a_write_it_did_not_store() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().unwrap();
        let Some(mut s) = registry(backend, dir.path()) else {
            return;
        };
        let at = "2026-11-25T00:00:00Z";
        s.begin_batch().unwrap();
        let first = s.register(&row("b", None, "b", Status::Running, at), None);
        let again = s.register(&row("b", None, "b", Status::Running, at), None);
        let committed = s.commit_batch();
        let stored = s.get("b").unwrap().is_some();
        assert!(
            again.is_err() || committed.is_err(),
            "{backend:?}: a duplicate id was reported stored"
        );
        if first.is_ok() && committed.is_ok() {
            assert!(stored, "{backend:?}: reported stored, not stored");
        }
        if committed.is_err() {
            assert!(!stored, "{backend:?}: a failed batch left rows");
        }
        // A NUL in a thread's result.
        s.begin_batch().unwrap();
        s.register(&row("n", None, "n", Status::Running, at), None)
            .unwrap();
        let mut nul = s
            .get("n")
            .unwrap()
            .unwrap_or_else(|| row("n", None, "n", Status::Running, at));
        nul.status = Status::Completed;
        nul.result = Some("a\0b".into());
        s.update(&nul).unwrap();
        s.commit_batch().unwrap();
        let kept = s.get("n").unwrap().unwrap().result.unwrap();
        assert!(
            kept == "a\0b" || kept == "a\u{FFFD}b",
            "{backend:?}: {kept:?}"
        );
    }
}

/// Review of #25: a connection the server dropped is made again (outside a transaction)
/// instead of failing every later call.
#[test]
fn a_dropped_connection_is_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let Some((mut s, _, name)) = pg_registry(dir.path()) else {
        return;
    };
    s.register(
        &row("a", None, "a", Status::Running, "2026-11-25T00:00:00Z"),
        None,
    )
    .unwrap();
    let server = crate::pg::server().unwrap();
    server.psql(
        "postgres",
        &format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"),
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    // The first call may still see the old connection fail; the next ones work.
    let _ = s.get("a");
    assert!(s.get("a").unwrap().is_some(), "the registry reconnects");
    s.register(
        &row("b", None, "b", Status::Running, "2026-11-25T00:00:01Z"),
        None,
    )
    .unwrap();
}

/// Review of #25: a write lock another process holds is waited for at most about 5 s (as
/// SQLite's busy timeout), then the write fails and can be tried again — never a hang.
#[test]
fn a_held_write_lock_fails_a_write_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let Some((mut s, url, _)) = pg_registry(dir.path()) else {
        return;
    };
    let server = crate::pg::server().unwrap();
    let name = url.rsplit("dbname=").next().unwrap().to_string();
    // The registry's advisory lock key ("weft" + 1), held for 9 s by another session.
    let holder = std::thread::spawn({
        let name = name.clone();
        move || {
            crate::pg::server().unwrap().psql(
                &name,
                "BEGIN; SELECT pg_advisory_xact_lock(8603395311563440129); SELECT pg_sleep(9); COMMIT;",
            )
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(700));
    let t = std::time::Instant::now();
    let waited = s.begin_batch();
    let took = t.elapsed();
    assert!(waited.is_err(), "the lock was taken while held");
    assert!(
        took >= std::time::Duration::from_secs(4) && took < std::time::Duration::from_secs(8),
        "waited {took:?}"
    );
    holder.join().unwrap();
    s.begin_batch().unwrap();
    s.register(
        &row("a", None, "a", Status::Running, "2026-11-25T00:00:00Z"),
        None,
    )
    .unwrap();
    s.commit_batch().unwrap();
    let _ = server;
}

/// Review of #25: a role that may only read and write rows (PostgreSQL 15 lets no other role
/// create tables in `public`) opens a database whose schema its owner set up.
#[test]
fn a_role_without_ddl_rights_opens_an_up_to_date_database() {
    let dir = tempfile::tempdir().unwrap();
    let Some((s, url, name)) = pg_registry(dir.path()) else {
        return;
    };
    drop(s);
    let server = crate::pg::server().unwrap();
    let role = format!("dml_{name}");
    server.psql(
        &name,
        &format!(
            "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA public TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
             REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
        ),
    );
    let as_role = url.replace("user=weft", &format!("user={role}"));
    let mut s = Store::open_at(
        Some(&DatabaseUrl::parse(&as_role).unwrap()),
        &dir.path().join("r.db"),
    )
    .expect("opened without DDL");
    s.register(
        &row("a", None, "a", Status::Running, "2026-11-25T00:00:00Z"),
        None,
    )
    .unwrap();
}

/// Review of #25: search finds words whatever their case or diacritics, as FTS5's unicode61
/// does, on both backends (and whatever the database's locale).
#[test]
fn search_folds_case_and_diacritics_on_both_backends() {
    use weft::ThreadStore;
    for backend in BACKENDS {
        let Some(fx) = Fixture::on(backend, &[], "", "") else {
            return;
        };
        let store = weft::FileStore::open(&fx.project()).unwrap();
        store
            .create(weft::NewThread {
                directive: "d".into(),
                model: "m".into(),
                status: "completed".into(),
                events: vec![serde_json::json!({"type": "message", "role": "user", "text": "École ÄPFEL Smørrebrød"})],
                ..Default::default()
            })
            .unwrap();
        for q in ["ecole", "äpfel", "apfel", "ÉCOLE"] {
            let hits = store.search(&weft::SearchQuery::new(q)).unwrap();
            assert_eq!(hits.len(), 1, "{backend:?}: `{q}` finds the message");
        }
    }
}

/// Review of #25: `weft doctor` on a Postgres project reads the registry and ledger there
/// (not files that do not exist): every thread counted, no folder taken for an orphan.
#[cfg(feature = "cli")]
#[test]
fn weft_doctor_reads_a_postgres_project_from_the_server() {
    let (r, k, script) = small_tree();
    let Some(fx) = Fixture::on(Backend::Postgres, &[("r", &r), ("k", &k)], &script, "") else {
        return;
    };
    ran_tree(&fx, "the tree on postgres");
    let doc = weft_cmd(fx.root())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&doc.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&doc.stderr)));
    assert!(v["broken"].as_array().is_none_or(|b| b.is_empty()), "{v}");
    assert!(v["problems"].as_array().is_none_or(|p| p.is_empty()), "{v}");
    assert_eq!(v["health"]["threads"], 2, "{v}");
}

/// `files_root:` puts threads' file areas under one folder (one several machines can share),
/// not in each thread's own folder; deleting a thread removes its area there too.
#[cfg(feature = "cli")]
#[test]
fn files_root_holds_the_file_areas() {
    let d = directive("permissions: [\"fs.write\", \"fs.read\"]", "Write.");
    let script = r#"w:
  - tool_calls: [ { name: file_write, input: { path: notes.txt, content: hello } } ]
  - tool_calls: [ { name: file_read, input: { path: notes.txt } } ]
  - text: done
"#;
    let fx = Fixture::new(&[("w", &d)], script, "files_root: shared-area\n");
    let out = exits_within(spawn_run(&fx, "w"), 60, "the writer");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = fx.id_of("w");
    let area = fx.root().join("shared-area").join(&id).join("files");
    assert_eq!(
        std::fs::read_to_string(area.join("notes.txt")).unwrap(),
        "hello"
    );
    assert!(!fx
        .root()
        .join(".weft/threads")
        .join(&id)
        .join("files")
        .exists());
    let read = fx
        .events(&id)
        .into_iter()
        .filter(|e| e["type"] == "tool_result")
        .nth(1)
        .unwrap();
    assert!(
        read["content"].as_str().unwrap().contains("hello"),
        "{read}"
    );
    let del = weft_cmd(fx.root()).args(["delete", &id]).output().unwrap();
    assert!(
        del.status.success(),
        "{}",
        String::from_utf8_lossy(&del.stderr)
    );
    assert!(
        !fx.root().join("shared-area").join(&id).exists(),
        "deleted with its thread"
    );
}

/// Second review of #25: a value Postgres cannot take (SQLite's loose types: text in an
/// integer column) fails `weft copy` as a whole — nothing of it committed, the target still
/// empty for the next try — never a commit of everything else.
#[cfg(feature = "cli")]
#[test]
fn a_copy_with_a_value_postgres_refuses_commits_nothing() {
    let Some(server) = crate::pg::server() else {
        return;
    };
    let fx = tree_fixture("");
    ran_tree(&fx, "the tree on SQLite");
    let registry = fx.root().join(".weft/state/registry.db");
    let db = rusqlite::Connection::open(&registry).unwrap();
    db.execute_batch("UPDATE threads SET turns = 'many' WHERE directive = 'k'")
        .unwrap();
    let url = server.database();
    let name = url.rsplit("dbname=").next().unwrap().to_string();
    let copy = weft_cmd(fx.root())
        .args(["copy", "--to", &url])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&copy.stderr);
    assert!(!copy.status.success() && said.contains("many"), "{said}");
    for table in ["threads", "accounts", "msgs"] {
        assert_eq!(
            server.psql(&name, &format!("SELECT COUNT(*) FROM {table}")),
            "0",
            "{table}: nothing of a failed copy is committed"
        );
    }
    db.execute_batch("UPDATE threads SET turns = 2 WHERE directive = 'k'")
        .unwrap();
    let again = weft_cmd(fx.root())
        .args(["copy", "--to", &url])
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

/// Second review of #25: `files_root:` inside `.weft/` (where it could lie within a thread's
/// own area) or climbing with `..` is refused with a clear error.
#[cfg(feature = "cli")]
#[test]
fn a_files_root_inside_weft_is_refused() {
    let d = directive("", "Hi.");
    for root in [".weft/threads/x", "areas/../.weft/y"] {
        let fx = Fixture::new(
            &[("d", &d)],
            "d:\n  - text: hi\n",
            &format!("files_root: {root}\n"),
        );
        let out = exits_within(spawn_run(&fx, "d"), 30, "the refused run");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains("files_root"),
            "{root}: {said}"
        );
    }
}

/// Spawn admission inside one batch: on SQLite each registration is checked as it comes; on
/// Postgres the commit decides (one conditional insert per child, no round trip per spawn).
/// Either way, of three children asked at once under `concurrency: 2`, exactly two are
/// stored and the third is refused naming the limit.
#[test]
fn admission_in_one_batch_takes_exactly_the_free_slots() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().unwrap();
        let Some(mut s) = registry(backend, dir.path()) else {
            return;
        };
        let at = "2026-11-25T00:00:00Z";
        s.register(&row("p", None, "p", Status::Running, at), None)
            .unwrap();
        let admit = Admission {
            parent: id("p"),
            spawns: 10,
            concurrency: 2,
        };
        s.begin_batch().unwrap();
        let mut refused: Vec<(String, RegistryError)> = Vec::new();
        for kid in ["a", "b", "c"] {
            if let Err(e) = s.register(&row(kid, Some("p"), "p", Status::Running, at), Some(&admit))
            {
                refused.push((kid.to_string(), e));
            }
        }
        s.commit_batch().unwrap();
        refused.extend(
            s.take_refused()
                .into_iter()
                .map(|(k, e)| (k.to_string(), e)),
        );
        assert_eq!(refused.len(), 1, "{backend:?}: {refused:?}");
        assert_eq!(refused[0].0, "c", "{backend:?}");
        assert!(
            matches!(
                refused[0].1,
                RegistryError::Concurrency {
                    live: 2,
                    max: 2,
                    ..
                }
            ),
            "{backend:?}: {:?}",
            refused[0].1
        );
        assert!(
            s.get("c").unwrap().is_none(),
            "{backend:?}: the refused row is not stored"
        );
        assert_eq!(s.get("p").unwrap().unwrap().spawn_count, 2, "{backend:?}");
    }
}

/// A line the server refuses (its seq taken by another writer) fails its thread's records on
/// Postgres: the next wait says so, and nothing after it is stored — no gap in the chain, no
/// thread.json signing lines that are not there.
#[test]
fn a_refused_line_fails_its_thread_and_nothing_after_it_lands() {
    let Some(fx) = Fixture::on(crate::support::Backend::Postgres, &[], "", "") else {
        return;
    };
    let server = crate::pg::server().unwrap();
    let records = fx.records();
    let id = weft::ThreadId::parse("notes.gap-1795720504897-fe5f40270004").unwrap();
    let signer = std::sync::Arc::new(
        weft::internals::Signer::load_or_create(crate::support::weft_home()).unwrap(),
    );
    let mut w = weft::internals::TranscriptWriter::create(
        &records,
        &id,
        signer,
        weft::Durability::Normal,
        1000,
    )
    .unwrap();
    let url = fx.database.clone().unwrap();
    let name = url.rsplit("dbname=").next().unwrap().to_string();
    w.append("note", serde_json::json!({"text": "zero"}))
        .unwrap();
    w.checkpoint().unwrap();
    server.psql(
        &name,
        &format!("INSERT INTO transcript_lines(thread, seq, line) VALUES('{id}', 2, convert_to('taken', 'UTF8'))"),
    );
    for text in ["two", "three", "four"] {
        let _ = w.append("note", serde_json::json!({ "text": text }));
    }
    let failed = w.checkpoint();
    assert!(
        failed.is_err(),
        "the refused line fails the thread's records"
    );
    assert!(
        w.append("note", serde_json::json!({"text": "five"}))
            .is_err(),
        "nothing more is queued for it"
    );
    let seqs = server.psql(
        &name,
        &format!("SELECT string_agg(CAST(seq AS TEXT), ',' ORDER BY seq) FROM transcript_lines WHERE thread='{id}'"),
    );
    assert!(
        !seqs.contains('3') && !seqs.contains('4'),
        "no line after the refused one: {seqs}"
    );
}

/// weft's Postgres calls block their thread; made many times from inside one async task
/// without it yielding (an actor's long handler, an async test polling the registry), they
/// once spent the task's cooperative budget, and the next call's wake-up was deferred to a
/// scheduler that never ran again: the thread waited forever.
#[test]
fn many_postgres_calls_inside_one_async_task_never_hang() {
    let Some(fx) = Fixture::on(Backend::Postgres, &[], "", "") else {
        return;
    };
    let fx = std::sync::Arc::new(fx);
    let (tx, rx) = std::sync::mpsc::channel();
    let f2 = fx.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            for _ in 0..300 {
                let _ = f2.rows_so_far();
            }
        });
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(std::time::Duration::from_secs(60)).is_ok(),
        "300 registry reads from one async task did not end within a minute"
    );
}

/// Nodes wake on Postgres notifications (a queued child, a relayed request): a session that
/// listens on a channel is woken by a `pg_notify` another session sends — also by one sent
/// while nobody waited (kept for the next wait) — and not by one on another channel.
#[test]
fn a_notification_wakes_its_listener() {
    let Some(fx) = Fixture::on(Backend::Postgres, &[], "", "") else {
        return;
    };
    let url = fx.database.clone().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wake = weft::internals::listen(&url, "weft_test_channel").unwrap();
    let within = std::time::Duration::from_secs(5);
    rt.block_on(async {
        fx.query("registry.db", "SELECT pg_notify('weft_other_channel', '')");
        let other = tokio::time::timeout(std::time::Duration::from_millis(500), wake.notified());
        assert!(
            other.await.is_err(),
            "woken by another channel's notification"
        );
        // Sent as nodes send it, while nobody waits: the next wait returns at once.
        weft::internals::notify(&url, "weft_test_channel").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let woken = tokio::time::timeout(within, wake.notified()).await;
        assert!(woken.is_ok(), "not woken within {within:?}");
    });
}
