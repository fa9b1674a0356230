//! The store's own tables: the full-text index of finished threads' messages (SQLite FTS5
//! ranked by BM25, or a Postgres `tsvector` with a GIN index ranked by `ts_rank_cd`), the
//! tombstones of deleted threads and each thread's key-value store — in store.db beside
//! registry.db, or in the project's Postgres database. Apart from the registry's tables: the
//! registry actor's group commits never wait on an index write, and the index can be dropped
//! and backfilled.

use super::check::{around, terms};
use super::{storage, SearchHit, SearchMessage, SearchQuery, StoreError};
use crate::core::ids::ThreadId;
use crate::sql::{params, DatabaseUrl, Db, Engine, Lock, SqlError, Value as Cell};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Opens (creating) the store's tables: on the Postgres database `url`, or in the file `path`.
pub(super) fn open(url: Option<&DatabaseUrl>, path: &Path) -> Result<Db, StoreError> {
    let mut db = Db::open(url, path, false).map_err(storage)?;
    crate::sql::migrate(&mut db, "store", super::schema::STEPS).map_err(storage)?;
    Ok(db)
}

/// Replaces `thread`'s entries with `msgs`, remembering the transcript head they came from.
pub(super) fn put(
    db: &mut Db,
    thread: &str,
    directive: &str,
    head: i64,
    msgs: &[SearchMessage],
) -> Result<(), StoreError> {
    db.atomic(Lock::Store, |db| {
        // Deleted meanwhile (another process's delete between the caller's check and now).
        if is_deleted(db, thread)? {
            return Ok(());
        }
        remove_in(db, thread)?;
        put_rows(db, &[(thread, directive, head, msgs)])
    })
}

/// [`put`] for many threads that just ended, in one transaction. A thread indexed meanwhile
/// at its queued head or later (an edit, another process's backfill) is left as it is; one
/// indexed at an older head is replaced. Of a thread queued twice, the later head is kept.
pub(super) fn put_many(
    db: &mut Db,
    threads: &[(ThreadId, String, i64, Vec<SearchMessage>)],
) -> Result<(), StoreError> {
    let order = newest(threads);
    db.atomic(Lock::Store, |db| {
        let ids: Vec<&str> = order.iter().map(|&i| threads[i].0.as_str()).collect();
        let (deleted, heads) = known(db, &ids)?;
        let mut fresh = Vec::with_capacity(order.len());
        for &i in &order {
            let (id, directive, head, msgs) = &threads[i];
            // Deleted while it waited in the queue: its tombstone keeps it out (a delete after
            // this commit removes what it wrote).
            if deleted.contains(id.as_str()) {
                continue;
            }
            match heads.get(id.as_str()) {
                Some(at) if at >= head => continue,
                Some(_) => remove_in(db, id.as_str())?,
                None => {}
            }
            fresh.push((id.as_str(), directive.as_str(), *head, msgs.as_slice()));
        }
        put_rows(db, &fresh)
    })
}

/// The positions in `threads` to index, in queue order: of a thread queued more than once,
/// its highest head (the first of equal ones), as indexing them one after the other would
/// leave it. (On Postgres one statement holds many threads' rows and may not hold one twice.)
fn newest(threads: &[(ThreadId, String, i64, Vec<SearchMessage>)]) -> Vec<usize> {
    let mut newest: HashMap<&str, usize> = HashMap::with_capacity(threads.len());
    for (i, (id, _, head, _)) in threads.iter().enumerate() {
        let keep = newest
            .get(id.as_str())
            .is_none_or(|&j| threads[j].2 < *head);
        if keep {
            newest.insert(id.as_str(), i);
        }
    }
    let mut order: Vec<usize> = newest.into_values().collect();
    order.sort_unstable();
    order
}

/// Of `ids`, the deleted ones and the transcript heads the others were indexed at: one query
/// for many ids on Postgres (a round trip each would be the indexer's whole cost), one
/// lookup each on SQLite.
fn known(db: &Db, ids: &[&str]) -> Result<(HashSet<String>, HashMap<String, i64>), StoreError> {
    let mut deleted = HashSet::new();
    let mut heads = HashMap::new();
    if db.engine() == Engine::Sqlite {
        for id in ids {
            if is_deleted(db, id)? {
                deleted.insert(id.to_string());
            } else if let Some(at) = indexed_head(db, id)? {
                heads.insert(id.to_string(), at);
            }
        }
        return Ok((deleted, heads));
    }
    let marks: Vec<String> = (1..=64).map(|i| format!("?{i}")).collect();
    let marks = marks.join(",");
    let chunked = |sql: &str, f: &mut dyn FnMut(&crate::sql::Row) -> Result<(), SqlError>| {
        let sql = format!("{sql} IN ({marks})");
        for chunk in ids.chunks(64) {
            // Padded to 64 with the first id: one prepared statement for any number.
            let values: Vec<Cell> = (0..64)
                .map(|i| Cell::from(*chunk.get(i).unwrap_or(&chunk[0])))
                .collect();
            for row in db.query(&sql, &values)? {
                f(&row)?;
            }
        }
        Ok::<(), SqlError>(())
    };
    chunked("SELECT thread FROM deleted WHERE thread", &mut |r| {
        deleted.insert(r.text(0)?);
        Ok(())
    })
    .and_then(|()| {
        chunked("SELECT thread, head FROM indexed WHERE thread", &mut |r| {
            heads.insert(r.text(0)?, r.int(1)?);
            Ok(())
        })
    })
    .map_err(storage)?;
    Ok((deleted, heads))
}

/// The transcript head `thread` was last indexed at.
fn indexed_head(db: &Db, thread: &str) -> Result<Option<i64>, StoreError> {
    let row = db
        .row("SELECT head FROM indexed WHERE thread=?1", params![thread])
        .map_err(storage)?;
    row.map(|r| r.int(0).map_err(storage)).transpose()
}

/// Inserts the messages and indexed heads of `threads` (thread, directive, head, messages),
/// none of which is indexed now: on Postgres many rows to a statement.
fn put_rows(db: &Db, threads: &[(&str, &str, i64, &[SearchMessage])]) -> Result<(), StoreError> {
    if db.engine() == Engine::Sqlite {
        for (thread, directive, _, msgs) in threads {
            put_fts(db, thread, directive, msgs)?;
        }
    } else {
        let mut rows = Vec::new();
        for (thread, directive, _, msgs) in threads {
            for (n, m) in msgs.iter().enumerate() {
                rows.extend([
                    Cell::from(*thread),
                    Cell::from(*directive),
                    Cell::Int(n as i64),
                    Cell::Int(m.seq),
                    Cell::from(m.role.as_str()),
                    Cell::from(m.text.as_str()),
                    Cell::from(fold(&m.text, FOLDED_MAX)),
                ]);
            }
        }
        db.insert_rows(
            "INSERT INTO msgs(thread, directive, n, seq, role, text, folded)",
            "",
            7,
            &rows,
        )
        .map_err(storage)?;
    }
    let heads: Vec<Cell> = threads
        .iter()
        .flat_map(|(thread, _, head, _)| [Cell::from(*thread), Cell::Int(*head)])
        .collect();
    db.insert_rows(
        "INSERT INTO indexed(thread, head)",
        " ON CONFLICT(thread) DO UPDATE SET head=excluded.head",
        2,
        &heads,
    )
    .map_err(storage)
}

/// One thread's messages into SQLite's `msgs` and its FTS5 table (each row's id links them).
fn put_fts(
    db: &Db,
    thread: &str,
    directive: &str,
    msgs: &[SearchMessage],
) -> Result<(), StoreError> {
    for (n, m) in msgs.iter().enumerate() {
        let (n, role, text) = (n as i64, m.role.as_str(), m.text.as_str());
        db.execute_later(
            "INSERT INTO msgs(thread, directive, n, seq, role, text) VALUES(?1,?2,?3,?4,?5,?6)",
            params![thread, directive, n, m.seq, role, text],
        )
        .map_err(storage)?;
        db.execute(
            "INSERT INTO msgs_fts(rowid, text) VALUES(last_insert_rowid(), ?1)",
            params![text],
        )
        .map_err(storage)?;
    }
    Ok(())
}

fn remove_in(db: &Db, thread: &str) -> Result<(), StoreError> {
    if db.engine() == Engine::Sqlite {
        db.execute(
            "DELETE FROM msgs_fts WHERE rowid IN (SELECT rowid FROM msgs WHERE thread=?1)",
            params![thread],
        )
        .map_err(storage)?;
    }
    for sql in [
        "DELETE FROM msgs WHERE thread=?1",
        "DELETE FROM indexed WHERE thread=?1",
    ] {
        db.execute(sql, params![thread]).map_err(storage)?;
    }
    Ok(())
}

/// Bytes of a message's folded text indexed on Postgres: a tsvector holds at most 1 MiB, and
/// short unique words take up to about three times their bytes in one.
pub(super) const FOLDED_MAX: usize = 256 * 1024;

/// `text` lower-cased with the diacritics of Latin letters removed (as FTS5's unicode61 does
/// for letters that decompose into a base letter and marks), at most `max` bytes.
pub(super) fn fold(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.chars().flat_map(char::to_lowercase) {
        // Words split as `terms` splits a query (and FTS5's unicode61 a text): at every
        // character that is not a letter or digit, so the `simple` parser never sees an
        // e-mail address, a path or a URL as one word.
        let base = match base_letter(c) {
            Some(b) => b,
            None if c.is_alphanumeric() => c,
            None => ' ',
        };
        if out.len() + base.len_utf8() > max {
            break;
        }
        out.push(base);
    }
    out
}

/// The base letter of a lower-case Latin letter with diacritics (Latin-1 and Latin
/// Extended-A), None for any other character.
fn base_letter(c: char) -> Option<char> {
    const LATIN1: &str = "aaaaaa_ceeeeiiii_nooooo__uuuuy_y";
    const EXT_A: &str = "aaaaaaccccccccdd__eeeeeeeeeegggggggghh__iiiiiiiii___jjkk_llllll____nnnnnn___oooooo__rrrrrrsssssssstttt__uuuuuuuuuuuuwwyyyzzzzzz_";
    let pick = |table: &str, i: u32| {
        table
            .as_bytes()
            .get(i as usize)
            .filter(|b| **b != b'_')
            .map(|b| *b as char)
    };
    match c as u32 {
        0xE0..=0xFF => pick(LATIN1, c as u32 - 0xE0),
        0x100..=0x17F => pick(EXT_A, c as u32 - 0x100),
        _ => None,
    }
}

/// Removes `thread`'s entries.
pub(super) fn remove(db: &mut Db, thread: &str) -> Result<(), StoreError> {
    db.atomic(Lock::Store, |db| remove_in(db, thread))
}

/// Every indexed thread with the transcript head it was indexed at.
pub(super) fn heads(db: &Db) -> Result<HashMap<String, i64>, StoreError> {
    db.query("SELECT thread, head FROM indexed", &[])
        .map_err(storage)?
        .iter()
        .map(|r| Ok((r.text(0)?, r.int(1)?)))
        .collect::<Result<_, crate::sql::SqlError>>()
        .map_err(storage)
}

/// Marks `thread` deleted (before anything of it is removed, so a crash mid-delete is finished
/// by the next delete, and nothing recreates it meanwhile).
pub(super) fn tombstone(db: &Db, thread: &str) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO deleted(thread, at) VALUES(?1, ?2) ON CONFLICT(thread) DO NOTHING",
        params![thread, crate::core::ids::now_ts()],
    )
    .map(|_| ())
    .map_err(storage)
}

/// Was `thread` deleted?
pub(super) fn is_deleted(db: &Db, thread: &str) -> Result<bool, StoreError> {
    db.row("SELECT 1 FROM deleted WHERE thread=?1", params![thread])
        .map(|o| o.is_some())
        .map_err(storage)
}

/// Every message matching any word of `words`, best first: (thread, directive, n, score),
/// a higher score better.
fn matches(
    db: &Db,
    words: &[String],
    directive: Option<&str>,
) -> Result<Vec<(String, String, i64, f64)>, StoreError> {
    let rows = match db.engine() {
        // Every word quoted: a query is words, never FTS syntax; any of them may match.
        // SQLite's bm25() is lower for better matches.
        Engine::Sqlite => db.query(
            "SELECT m.thread, m.directive, m.n, -bm25(msgs_fts) AS score FROM msgs_fts
             JOIN msgs m ON m.rowid = msgs_fts.rowid
             WHERE msgs_fts MATCH ?1 AND (?2 IS NULL OR m.directive = ?2)
             ORDER BY score DESC, m.thread, m.n LIMIT 10000",
            params![
                words.iter().map(|w| format!("\"{w}\"")).collect::<Vec<_>>().join(" OR "),
                directive
            ],
        ),
        // Words are letters and digits only (`terms`), each quoted as a tsquery lexeme.
        Engine::Postgres => db.query(
            "SELECT m.thread, m.directive, m.n, CAST(ts_rank_cd(m.words, q) AS DOUBLE PRECISION) AS score
             FROM msgs m, to_tsquery('simple', ?1) q
             WHERE m.words @@ q AND (CAST(?2 AS TEXT) IS NULL OR m.directive = ?2)
             ORDER BY score DESC, m.thread, m.n LIMIT 10000",
            params![
                words
                    .iter()
                    .map(|w| format!("'{}'", fold(w, usize::MAX)))
                    .collect::<Vec<_>>()
                    .join(" | "),
                directive
            ],
        ),
    }
    .map_err(storage)?;
    rows.iter()
        .map(|r| Ok((r.text(0)?, r.text(1)?, r.int(2)?, r.real(3)?)))
        .collect::<Result<_, crate::sql::SqlError>>()
        .map_err(storage)
}

/// Each thread's best message for `q`, best threads first, with context.
pub(super) fn search(db: &Db, q: &SearchQuery) -> Result<Vec<SearchHit>, StoreError> {
    let words = terms(&q.text);
    if words.is_empty() {
        return Ok(vec![]);
    }
    let mut seen = std::collections::HashSet::new();
    let mut best = Vec::new();
    for (thread, directive, n, score) in matches(db, &words, q.directive.as_deref())? {
        if best.len() >= q.limit.max(1) {
            break;
        }
        if seen.insert(thread.clone()) {
            best.push((thread, directive, n, score));
        }
    }
    let mut hits = Vec::new();
    for (thread, directive, n, score) in best {
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
            score,
            context: around(&msgs, at, q.context),
        });
    }
    Ok(hits)
}

fn thread_messages(db: &Db, thread: &str) -> Result<Vec<(i64, SearchMessage)>, StoreError> {
    db.query(
        "SELECT n, seq, role, text FROM msgs WHERE thread=?1 ORDER BY n",
        params![thread],
    )
    .map_err(storage)?
    .iter()
    .map(|r| {
        Ok((
            r.int(0)?,
            SearchMessage {
                seq: r.int(1)?,
                role: r.text(2)?,
                text: r.text(3)?,
            },
        ))
    })
    .collect::<Result<_, crate::sql::SqlError>>()
    .map_err(storage)
}

/// One value of a thread's key-value store.
pub(super) fn kv_get(db: &Db, thread: &str, key: &str) -> Result<Option<Value>, StoreError> {
    let text = db
        .row(
            "SELECT value FROM kv WHERE thread=?1 AND key=?2",
            params![thread, key],
        )
        .map_err(storage)?
        .map(|r| r.text(0))
        .transpose()
        .map_err(storage)?;
    Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
}

/// Sets (None: removes) one value.
pub(super) fn kv_set(
    db: &Db,
    thread: &str,
    key: &str,
    value: Option<&Value>,
) -> Result<(), StoreError> {
    match value {
        Some(v) => db.execute(
            "INSERT INTO kv(thread, key, value, updated_at) VALUES(?1,?2,?3,?4)
             ON CONFLICT(thread, key) DO UPDATE SET value=excluded.value, updated_at=excluded.updated_at",
            params![thread, key, v.to_string(), crate::core::ids::now_ts()],
        ),
        None => db.execute(
            "DELETE FROM kv WHERE thread=?1 AND key=?2",
            params![thread, key],
        ),
    }
    .map(|_| ())
    .map_err(storage)
}

/// Every key and value of a thread's store, by key.
pub(super) fn kv_list(db: &Db, thread: &str) -> Result<Map<String, Value>, StoreError> {
    let mut out = Map::new();
    for r in db
        .query(
            "SELECT key, value FROM kv WHERE thread=?1 ORDER BY key",
            params![thread],
        )
        .map_err(storage)?
    {
        let (k, v) = (r.text(0).map_err(storage)?, r.text(1).map_err(storage)?);
        out.insert(k, serde_json::from_str(&v).unwrap_or(Value::Null));
    }
    Ok(out)
}

/// Removes a thread's whole key-value store (it was deleted).
pub(super) fn kv_clear(db: &Db, thread: &str) -> Result<(), StoreError> {
    db.execute("DELETE FROM kv WHERE thread=?1", params![thread])
        .map(|_| ())
        .map_err(storage)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread queued twice is indexed once, at its higher head, whichever came first.
    #[test]
    fn a_thread_queued_twice_is_indexed_once_at_its_higher_head() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(None, &dir.path().join("store.db")).unwrap();
        let t = ThreadId::parse("twice-1-a").unwrap();
        let said = |head: i64, text: &str| {
            let msg = SearchMessage {
                seq: 1,
                role: "assistant".into(),
                text: text.into(),
            };
            (t.clone(), "d".to_string(), head, vec![msg])
        };
        for batch in [
            [said(3, "osprey high"), said(2, "osprey low")],
            [said(2, "osprey low"), said(3, "osprey high")],
        ] {
            assert_eq!(newest(&batch).len(), 1);
            remove(&mut db, t.as_str()).unwrap();
            put_many(&mut db, &batch).unwrap();
            let hits = search(&db, &SearchQuery::new("osprey")).unwrap();
            let texts: Vec<&str> = hits.iter().map(|h| h.hit.text.as_str()).collect();
            assert_eq!(texts, ["osprey high"]);
            assert_eq!(heads(&db).unwrap().get(t.as_str()), Some(&3));
        }
    }

    /// A thread deleted while it waited for the indexer is not indexed: its messages never
    /// reach search (its tombstone is in the same database, read in the same transaction).
    #[test]
    fn a_thread_deleted_before_its_indexing_is_never_indexed() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(None, &dir.path().join("store.db")).unwrap();
        let said = |text: &str| {
            vec![SearchMessage {
                seq: 1,
                role: "assistant".into(),
                text: text.into(),
            }]
        };
        let (gone, kept) = (
            ThreadId::parse("gone-1-a").unwrap(),
            ThreadId::parse("kept-1-a").unwrap(),
        );
        tombstone(&db, gone.as_str()).unwrap();
        let batch = [
            (gone, "d".to_string(), 2, said("kestrel over the moor")),
            (kept, "d".to_string(), 2, said("kestrel by the sea")),
        ];
        put_many(&mut db, &batch).unwrap();
        let hits = search(&db, &SearchQuery::new("kestrel")).unwrap();
        let threads: Vec<&str> = hits.iter().map(|h| h.thread_id.as_str()).collect();
        assert_eq!(
            threads,
            ["kept-1-a"],
            "only the thread not deleted is found"
        );
    }

    /// A queued thread indexed meanwhile (an edit, another process's backfill) at its queued
    /// head or later is left as it is, and the rest of the batch is indexed in the same
    /// transaction; one indexed at an older head is replaced, not doubled.
    #[test]
    fn a_queued_thread_indexed_meanwhile_is_not_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(None, &dir.path().join("store.db")).unwrap();
        let said = |texts: &[&str]| -> Vec<SearchMessage> {
            texts
                .iter()
                .map(|t| SearchMessage {
                    seq: 1,
                    role: "assistant".into(),
                    text: (*t).into(),
                })
                .collect()
        };
        let (edited, older, fresh) = (
            ThreadId::parse("edited-1-a").unwrap(),
            ThreadId::parse("older-1-a").unwrap(),
            ThreadId::parse("fresh-1-a").unwrap(),
        );
        put(
            &mut db,
            edited.as_str(),
            "d",
            7,
            &said(&["falcon after the edit"]),
        )
        .unwrap();
        put(&mut db, older.as_str(), "d", 1, &said(&["heron", "heron"])).unwrap();
        let batch = [
            (
                edited,
                "d".to_string(),
                5,
                said(&["kestrel before", "kestrel again"]),
            ),
            (older, "d".to_string(), 3, said(&["heron at its end"])),
            (fresh, "d".to_string(), 2, said(&["kestrel fresh"])),
        ];
        put_many(&mut db, &batch).expect("one transaction for the whole batch");
        let found = |q: &str| -> Vec<String> {
            let mut t: Vec<String> = search(&db, &SearchQuery::new(q))
                .unwrap()
                .into_iter()
                .map(|h| h.thread_id.to_string())
                .collect();
            t.sort();
            t
        };
        assert_eq!(
            found("kestrel"),
            ["fresh-1-a"],
            "the edit kept, the fresh one added"
        );
        assert_eq!(found("falcon"), ["edited-1-a"]);
        assert_eq!(found("heron"), ["older-1-a"]);
        let heads = heads(&db).unwrap();
        assert_eq!((heads["edited-1-a"], heads["older-1-a"]), (7, 3));
        let rows = db
            .row(
                "SELECT COUNT(*) FROM msgs WHERE thread='older-1-a'",
                params![],
            )
            .unwrap()
            .unwrap();
        assert_eq!(rows.int(0).unwrap(), 1, "replaced, not doubled");
    }

    #[test]
    fn folding_matches_unicode61_for_latin_letters() {
        for (text, folded) in [
            ("Dvořák", "dvorak"),
            ("šest ŽLUŤOUČKÝ", "sest zlutoucky"),
            ("École ÄPFEL", "ecole apfel"),
            ("łódź Œuvre", "łodz œuvre"),
            (
                "src/main.rs user@example.com",
                "src main rs user example com",
            ),
        ] {
            assert_eq!(super::fold(text, usize::MAX), folded);
        }
        assert_eq!(super::fold("abcdef", 3), "abc");
    }
}
