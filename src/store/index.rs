//! `store.db`: the full-text index of finished threads' messages (SQLite FTS5, ranked by BM25)
//! and the tombstones of deleted threads. Beside registry.db, not in it: the registry actor's
//! group commits never wait on an index write, and the index can be dropped and backfilled.

use super::check::{around, terms};
use super::{storage, SearchHit, SearchMessage, SearchQuery, StoreError};
use crate::core::ids::ThreadId;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::Path;

/// Opens (creating) store.db.
pub(super) fn open(path: &Path) -> Result<Connection, StoreError> {
    let db = Connection::open(path).map_err(|e| storage(format!("{}: {e}", path.display())))?;
    crate::sql::setup_with_retry(&db, |db| {
        db.execute_batch(
            "PRAGMA busy_timeout=5000; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS msgs(
               thread TEXT NOT NULL, directive TEXT NOT NULL, n INTEGER NOT NULL,
               seq INTEGER NOT NULL, role TEXT NOT NULL, text TEXT NOT NULL,
               PRIMARY KEY(thread, n));
             CREATE VIRTUAL TABLE IF NOT EXISTS msgs_fts USING fts5(text, tokenize='unicode61', detail='column');
             CREATE TABLE IF NOT EXISTS indexed(thread TEXT PRIMARY KEY, head INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS deleted(thread TEXT PRIMARY KEY, at TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS kv(thread TEXT NOT NULL, key TEXT NOT NULL,
               value TEXT NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY(thread, key));",
        )
    })
    .map_err(|e| storage(format!("{}: {e}", path.display())))?;
    Ok(db)
}

/// Replaces `thread`'s entries with `msgs`, remembering the transcript head they came from.
pub(super) fn put(
    db: &mut Connection,
    thread: &str,
    directive: &str,
    head: i64,
    msgs: &[SearchMessage],
) -> Result<(), StoreError> {
    let tx = db.transaction().map_err(storage)?;
    remove_in(&tx, thread)?;
    put_in(&tx, thread, directive, head, msgs)?;
    tx.commit().map_err(storage)
}

/// [`put`] for many threads that just ended (never indexed before: nothing to replace), in
/// one transaction.
pub(super) fn put_many(
    db: &mut Connection,
    threads: &[(ThreadId, String, i64, Vec<SearchMessage>)],
) -> Result<(), StoreError> {
    let tx = db.transaction().map_err(storage)?;
    for (id, directive, head, msgs) in threads {
        put_in(&tx, id.as_str(), directive, *head, msgs)?;
    }
    tx.commit().map_err(storage)
}

fn put_in(
    tx: &Connection,
    thread: &str,
    directive: &str,
    head: i64,
    msgs: &[SearchMessage],
) -> Result<(), StoreError> {
    for (n, m) in msgs.iter().enumerate() {
        tx.prepare_cached(
            "INSERT INTO msgs(thread, directive, n, seq, role, text) VALUES(?1,?2,?3,?4,?5,?6)",
        )
        .map_err(storage)?
        .execute(params![thread, directive, n as i64, m.seq, m.role, m.text])
        .map_err(storage)?;
        tx.prepare_cached("INSERT INTO msgs_fts(rowid, text) VALUES(last_insert_rowid(), ?1)")
            .map_err(storage)?
            .execute([&m.text])
            .map_err(storage)?;
    }
    tx.prepare_cached("INSERT OR REPLACE INTO indexed(thread, head) VALUES(?1, ?2)")
        .map_err(storage)?
        .execute(params![thread, head])
        .map_err(storage)?;
    Ok(())
}

fn remove_in(tx: &Connection, thread: &str) -> Result<(), StoreError> {
    tx.prepare_cached(
        "DELETE FROM msgs_fts WHERE rowid IN (SELECT rowid FROM msgs WHERE thread=?1)",
    )
    .map_err(storage)?
    .execute([thread])
    .map_err(storage)?;
    tx.prepare_cached("DELETE FROM msgs WHERE thread=?1")
        .map_err(storage)?
        .execute([thread])
        .map_err(storage)?;
    tx.prepare_cached("DELETE FROM indexed WHERE thread=?1")
        .map_err(storage)?
        .execute([thread])
        .map_err(storage)?;
    Ok(())
}

/// Removes `thread`'s entries.
pub(super) fn remove(db: &mut Connection, thread: &str) -> Result<(), StoreError> {
    let tx = db.transaction().map_err(storage)?;
    remove_in(&tx, thread)?;
    tx.commit().map_err(storage)
}

/// Every indexed thread with the transcript head it was indexed at.
pub(super) fn heads(db: &Connection) -> Result<HashMap<String, i64>, StoreError> {
    let mut stmt = db
        .prepare("SELECT thread, head FROM indexed")
        .map_err(storage)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(storage)?;
    rows.collect::<Result<_, _>>().map_err(storage)
}

/// Marks `thread` deleted (before anything of it is removed, so a crash mid-delete is finished
/// by the next delete, and nothing recreates it meanwhile).
pub(super) fn tombstone(db: &Connection, thread: &str) -> Result<(), StoreError> {
    db.execute(
        "INSERT OR IGNORE INTO deleted(thread, at) VALUES(?1, ?2)",
        params![thread, crate::core::ids::now_ts()],
    )
    .map(|_| ())
    .map_err(storage)
}

/// Was `thread` deleted?
pub(super) fn is_deleted(db: &Connection, thread: &str) -> Result<bool, StoreError> {
    db.prepare_cached("SELECT 1 FROM deleted WHERE thread=?1")
        .map_err(storage)?
        .query_row([thread], |_| Ok(()))
        .optional()
        .map(|o| o.is_some())
        .map_err(storage)
}

/// Each thread's best message for `q` (BM25), best threads first, with context.
pub(super) fn search(db: &Connection, q: &SearchQuery) -> Result<Vec<SearchHit>, StoreError> {
    let words = terms(&q.text);
    if words.is_empty() {
        return Ok(vec![]);
    }
    // Every word quoted: a query is words, never FTS syntax; any of them may match.
    let expr = words
        .iter()
        .map(|w| format!("\"{w}\""))
        .collect::<Vec<_>>()
        .join(" OR ");
    let mut stmt = db
        .prepare_cached(
            "SELECT m.thread, m.directive, m.n, bm25(msgs_fts) AS rank FROM msgs_fts
             JOIN msgs m ON m.rowid = msgs_fts.rowid
             WHERE msgs_fts MATCH ?1 AND (?2 IS NULL OR m.directive = ?2)
             ORDER BY rank, m.thread, m.n LIMIT 10000",
        )
        .map_err(storage)?;
    let rows = stmt
        .query_map(params![expr, q.directive], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, f64>(3)?,
            ))
        })
        .map_err(storage)?;
    let mut seen = std::collections::HashSet::new();
    let mut best = Vec::new();
    for row in rows {
        let (thread, directive, n, rank) = row.map_err(storage)?;
        if best.len() >= q.limit.max(1) {
            break;
        }
        if seen.insert(thread.clone()) {
            best.push((thread, directive, n, rank));
        }
    }
    let mut hits = Vec::new();
    for (thread, directive, n, rank) in best {
        let Ok(id) = ThreadId::parse(&thread) else {
            continue;
        };
        let all = thread_messages(db, &thread)?;
        let Some(at) = all.iter().position(|(i, _)| *i == n) else {
            continue;
        };
        let msgs: Vec<SearchMessage> = all.into_iter().map(|(_, m)| m).collect();
        hits.push(SearchHit {
            thread_id: id,
            directive,
            hit: msgs[at].clone(),
            // SQLite's bm25() is lower for better matches; the contract says higher is better.
            score: -rank,
            context: around(&msgs, at, q.context),
        });
    }
    Ok(hits)
}

fn thread_messages(db: &Connection, thread: &str) -> Result<Vec<(i64, SearchMessage)>, StoreError> {
    let mut stmt = db
        .prepare_cached("SELECT n, seq, role, text FROM msgs WHERE thread=?1 ORDER BY n")
        .map_err(storage)?;
    let rows = stmt
        .query_map([thread], |r| {
            Ok((
                r.get(0)?,
                SearchMessage {
                    seq: r.get(1)?,
                    role: r.get(2)?,
                    text: r.get(3)?,
                },
            ))
        })
        .map_err(storage)?;
    rows.collect::<Result<_, _>>().map_err(storage)
}

/// One value of a thread's key-value store.
pub(super) fn kv_get(
    db: &Connection,
    thread: &str,
    key: &str,
) -> Result<Option<Value>, StoreError> {
    let text: Option<String> = db
        .prepare_cached("SELECT value FROM kv WHERE thread=?1 AND key=?2")
        .map_err(storage)?
        .query_row([thread, key], |r| r.get(0))
        .optional()
        .map_err(storage)?;
    Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
}

/// Sets (None: removes) one value.
pub(super) fn kv_set(
    db: &Connection,
    thread: &str,
    key: &str,
    value: Option<&Value>,
) -> Result<(), StoreError> {
    match value {
        Some(v) => db
            .prepare_cached(
                "INSERT OR REPLACE INTO kv(thread, key, value, updated_at) VALUES(?1,?2,?3,?4)",
            )
            .map_err(storage)?
            .execute(params![
                thread,
                key,
                v.to_string(),
                crate::core::ids::now_ts()
            ]),
        None => db
            .prepare_cached("DELETE FROM kv WHERE thread=?1 AND key=?2")
            .map_err(storage)?
            .execute([thread, key]),
    }
    .map(|_| ())
    .map_err(storage)
}

/// Every key and value of a thread's store, by key.
pub(super) fn kv_list(db: &Connection, thread: &str) -> Result<Map<String, Value>, StoreError> {
    let mut stmt = db
        .prepare_cached("SELECT key, value FROM kv WHERE thread=?1 ORDER BY key")
        .map_err(storage)?;
    let rows = stmt
        .query_map([thread], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .map_err(storage)?;
    let mut out = Map::new();
    for row in rows {
        let (k, v) = row.map_err(storage)?;
        out.insert(k, serde_json::from_str(&v).unwrap_or(Value::Null));
    }
    Ok(out)
}

/// Removes a thread's whole key-value store (it was deleted).
pub(super) fn kv_clear(db: &Connection, thread: &str) -> Result<(), StoreError> {
    db.execute("DELETE FROM kv WHERE thread=?1", [thread])
        .map(|_| ())
        .map_err(storage)
}
