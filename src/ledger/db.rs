//! ledger.db: its schema, loading what earlier processes left open, and persisting a batch.

use super::{Account, Book, LedgerError, Reservation};
use crate::core::ids::ThreadId;
use crate::core::money::Nanos;
use rusqlite::{Connection, OptionalExtension};
use std::path::Path;

/// Opens (creating) `ledger.db` in WAL mode.
pub(crate) fn open_db(path: &Path) -> Result<Connection, LedgerError> {
    let db = Connection::open(path)
        .map_err(|e| LedgerError::Storage(format!("{}: {e}", path.display())))?;
    crate::record::batch::setup_with_retry(&db, |db| {
        db.execute_batch(
        "PRAGMA busy_timeout=5000; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
         CREATE TABLE IF NOT EXISTS accounts(
           id TEXT PRIMARY KEY, parent TEXT, max INTEGER NOT NULL, spent INTEGER NOT NULL,
           own_spent INTEGER NOT NULL, inflight INTEGER NOT NULL, guaranteed INTEGER NOT NULL,
           pool_left INTEGER NOT NULL, closed INTEGER NOT NULL, owner INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS reservations(
           id INTEGER NOT NULL, thread TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY(thread, id));",
        )
    })
    .map_err(|e| LedgerError::Storage(e.to_string()))?;
    Ok(db)
}

/// The final rows of closed account `id` and its ancestors, nearest first (empty if `id` has
/// none).
pub(crate) fn closed_chain(db: &Connection, id: &ThreadId) -> Result<Vec<Account>, LedgerError> {
    let st = |e: rusqlite::Error| LedgerError::Storage(e.to_string());
    let mut out: Vec<Account> = Vec::new();
    let mut next = Some(id.clone());
    while let Some(id) = next.take() {
        if out.len() > 10_000 || out.iter().any(|a| a.id == id) {
            break;
        }
        let row = db
            .query_row(
                "SELECT parent,max,spent,own_spent,inflight,guaranteed,closed,owner FROM accounts WHERE id=?1",
                [id.as_str()],
                |r| {
                    Ok((
                        r.get::<_, Option<String>>(0)?,
                        [r.get::<_, i64>(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?],
                        r.get::<_, bool>(6)?,
                        r.get::<_, u32>(7)?,
                    ))
                },
            )
            .optional()
            .map_err(st)?;
        let Some((parent, n, closed, owner)) = row else {
            break;
        };
        let parent = parent.and_then(|p| ThreadId::parse(&p).ok());
        next = parent.clone();
        out.push(Account {
            id,
            parent,
            max: Nanos(n[0]),
            spent: Nanos(n[1]),
            own_spent: Nanos(n[2]),
            // What a closed account still holds: the budgets of deferred children set aside
            // below it (held as its guarantee and in flight above it).
            inflight: Nanos(n[3]),
            guaranteed: Nanos(n[4]),
            pool_left: Nanos::ZERO,
            closed,
            owner,
        });
    }
    Ok(out)
}

/// Loads into `book`, from ledger.db, account `id` and those of its ancestors the book does not
/// hold, as they were stored (a deferred child's account another process set aside).
pub(crate) fn load_chain(
    db: &Connection,
    book: &mut Book,
    id: &ThreadId,
) -> Result<(), LedgerError> {
    let st = |e: rusqlite::Error| LedgerError::Storage(e.to_string());
    let mut next = Some(id.clone());
    let mut n = 0;
    while let Some(id) = next.take() {
        n += 1;
        if n > 10_000 || book.accounts.contains_key(&id) {
            break;
        }
        let a = db
            .query_row(
                "SELECT parent,max,spent,own_spent,inflight,guaranteed,pool_left,closed,owner FROM accounts WHERE id=?1",
                [id.as_str()],
                |r| {
                    Ok(Account {
                        id: id.clone(),
                        parent: r
                            .get::<_, Option<String>>(0)?
                            .and_then(|p| ThreadId::parse(&p).ok()),
                        max: Nanos(r.get(1)?),
                        spent: Nanos(r.get(2)?),
                        own_spent: Nanos(r.get(3)?),
                        inflight: Nanos(r.get(4)?),
                        guaranteed: Nanos(r.get(5)?),
                        pool_left: Nanos(r.get(6)?),
                        closed: r.get(7)?,
                        owner: r.get(8)?,
                    })
                },
            )
            .optional()
            .map_err(st)?;
        let Some(a) = a else {
            return Err(LedgerError::Unknown(id));
        };
        if let Some(p) = &a.parent {
            *book.children.entry(p.clone()).or_default() += 1;
            next = Some(p.clone());
        }
        book.accounts.insert(id, a);
    }
    Ok(())
}

impl Book {
    /// Loads what an earlier process left open in ledger.db: every open account, the ancestors
    /// of those, and every open reservation (so recovery can release them exactly once).
    pub fn load(db: &Connection) -> Result<Book, LedgerError> {
        let st = |e: rusqlite::Error| LedgerError::Storage(e.to_string());
        let mut book = Book::default();
        let mut stmt = db
            .prepare(
                "WITH RECURSIVE keep(id) AS (
                   SELECT id FROM accounts WHERE closed=0
                   UNION SELECT a.parent FROM accounts a JOIN keep k ON a.id=k.id WHERE a.parent IS NOT NULL)
                 SELECT id,parent,max,spent,own_spent,inflight,guaranteed,pool_left,closed,owner
                 FROM accounts WHERE id IN keep",
            )
            .map_err(st)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    [
                        r.get::<_, i64>(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                    ],
                    r.get::<_, bool>(8)?,
                    r.get::<_, u32>(9)?,
                ))
            })
            .map_err(st)?;
        for row in rows {
            let (id, parent, n, closed, owner) = row.map_err(st)?;
            let (Ok(id), parent) = (
                ThreadId::parse(&id),
                parent.and_then(|p| ThreadId::parse(&p).ok()),
            ) else {
                continue;
            };
            book.accounts.insert(
                id.clone(),
                Account {
                    id,
                    parent,
                    max: Nanos(n[0]),
                    spent: Nanos(n[1]),
                    own_spent: Nanos(n[2]),
                    inflight: Nanos(n[3]),
                    guaranteed: Nanos(n[4]),
                    pool_left: Nanos(n[5]),
                    closed,
                    owner,
                },
            );
        }
        for a in book.accounts.values() {
            if let Some(p) = &a.parent {
                *book.children.entry(p.clone()).or_default() += 1;
            }
        }
        let mut stmt = db.prepare("SELECT body FROM reservations").map_err(st)?;
        let bodies = stmt.query_map([], |r| r.get::<_, String>(0)).map_err(st)?;
        for body in bodies {
            let body = body.map_err(st)?;
            match serde_json::from_str::<Reservation>(&body) {
                Ok(r) if r.chain.iter().all(|a| book.accounts.contains_key(a)) => {
                    book.next_id = book.next_id.max(r.id.0);
                    book.by_thread
                        .entry(r.chain[0].clone())
                        .or_default()
                        .push(r.id);
                    book.reservations.insert(r.id, r);
                }
                _ => tracing::warn!("ledger.db: unreadable reservation left as is: {body}"),
            }
        }
        // Ids continue after any earlier process's, with room so two processes rarely meet.
        let mut rnd = [0u8; 3];
        let _ = getrandom::fill(&mut rnd);
        book.next_id +=
            1 + (u64::from(rnd[0]) << 32 | u64::from(rnd[1]) << 24 | u64::from(rnd[2]) << 16);
        Ok(book)
    }
}
