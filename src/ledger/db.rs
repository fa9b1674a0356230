//! The ledger's tables (ledger.db, or the project's Postgres database): their schema, loading
//! what earlier processes left open, and reading the rows of a chain.

use super::{Account, Book, LedgerError, Reservation};
use crate::core::ids::ThreadId;
use crate::core::money::Nanos;
use crate::sql::{params, DatabaseUrl, Db, Row, SqlError, Step, Value};
use std::path::Path;

pub(super) fn st(e: SqlError) -> LedgerError {
    LedgerError::Storage(e.to_string())
}

impl From<SqlError> for LedgerError {
    fn from(e: SqlError) -> Self {
        st(e)
    }
}

/// The ledger's schema, step by step (see `sql/migrate.rs`).
const SCHEMA: &[Step] = &[
    Step {
        sql:
            "CREATE TABLE IF NOT EXISTS accounts(
           id TEXT PRIMARY KEY, parent TEXT, max INTEGER NOT NULL, spent INTEGER NOT NULL,
           own_spent INTEGER NOT NULL, inflight INTEGER NOT NULL, guaranteed INTEGER NOT NULL,
           pool_left INTEGER NOT NULL, closed INTEGER NOT NULL, owner INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS reservations(
           id INTEGER NOT NULL, thread TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY(thread, id));",
        postgres: None,
    },
    // A subtree placed on another node (see `Account::placed`).
    Step {
        sql: "ALTER TABLE accounts ADD COLUMN placed INTEGER NOT NULL DEFAULT 0",
        postgres: None,
    },
    // How far each runtime's write-ahead journal is folded into these tables (see
    // `journal.rs`; SQLite only, unused on a server).
    Step {
        sql: "CREATE TABLE IF NOT EXISTS journal_folds(name TEXT PRIMARY KEY, folded INTEGER NOT NULL)",
        postgres: None,
    },
];

/// Stores `accounts` as they are now (inside the caller's transaction); of an id given more
/// than once, the last one.
pub(super) fn put_accounts(db: &Db, accounts: &[&Account]) -> Result<(), LedgerError> {
    db.insert_rows(
        "INSERT INTO accounts(id,parent,max,spent,own_spent,inflight,guaranteed,pool_left,closed,owner,placed)",
        " ON CONFLICT(id) DO UPDATE SET parent=excluded.parent, max=excluded.max,
           spent=excluded.spent, own_spent=excluded.own_spent, inflight=excluded.inflight,
           guaranteed=excluded.guaranteed, pool_left=excluded.pool_left,
           closed=excluded.closed, owner=excluded.owner, placed=excluded.placed",
        11,
        &account_rows(accounts),
    )
    .map_err(st)
}

/// The rows of `accounts`, 11 values each, one per id (the last given): a Postgres upsert of
/// many rows may not change one row twice.
fn account_rows(accounts: &[&Account]) -> Vec<Value> {
    let mut seen = std::collections::HashSet::new();
    let mut values = Vec::with_capacity(accounts.len() * 11);
    for a in accounts.iter().rev().filter(|a| seen.insert(&a.id)) {
        values.extend([
            Value::from(a.id.as_str()),
            Value::from(a.parent.as_ref().map(ThreadId::as_str)),
            Value::Int(a.max.0),
            Value::Int(a.spent.0),
            Value::Int(a.own_spent.0),
            Value::Int(a.inflight.0),
            Value::Int(a.guaranteed.0),
            Value::Int(a.pool_left.0),
            Value::from(a.closed),
            Value::from(a.owner),
            Value::from(a.placed),
        ]);
    }
    values
}

/// Whether reservation `r`, read from a file, has the shape the book settles: a chain, and one
/// edge per step up it.
pub(super) fn well_formed(r: &Reservation) -> bool {
    !r.chain.is_empty() && r.edges.len() + 1 == r.chain.len()
}

/// Stores open reservations `rs` (inside the caller's transaction); of one given more than
/// once, the last.
pub(super) fn put_reservations(db: &Db, rs: &[&Reservation]) -> Result<(), LedgerError> {
    db.insert_rows(
        "INSERT INTO reservations(id,thread,body)",
        " ON CONFLICT(thread, id) DO UPDATE SET body=excluded.body",
        3,
        &reservation_rows(rs),
    )
    .map_err(st)
}

/// The rows of `rs`, 3 values each, one per (thread, id) (the last given).
fn reservation_rows(rs: &[&Reservation]) -> Vec<Value> {
    let mut seen = std::collections::HashSet::new();
    let mut values = Vec::with_capacity(rs.len() * 3);
    for r in rs.iter().rev() {
        let Some(thread) = r.chain.first() else {
            continue;
        };
        if seen.insert((thread, r.id.0)) {
            let body = serde_json::to_string(r).unwrap_or_default();
            values.extend([
                Value::from(r.id.0),
                Value::from(thread.as_str()),
                Value::from(body),
            ]);
        }
    }
    values
}

/// Deletes settled or released reservations, each (thread, id) (inside the caller's
/// transaction).
pub(super) fn drop_reservations<'a>(
    db: &Db,
    ids: impl Iterator<Item = (&'a ThreadId, super::ReservationId)>,
) -> Result<(), LedgerError> {
    let values: Vec<Value> = ids
        .flat_map(|(t, id)| [Value::from(t.as_str()), Value::from(id.0)])
        .collect();
    db.delete_rows("reservations", &["thread", "id"], &values)
        .map_err(st)
}

/// Opens (creating) the ledger: on the Postgres database `url`, or in the file `path` (WAL
/// mode) when `url` is None; brings its schema up to date.
pub(crate) fn open_db(url: Option<&DatabaseUrl>, path: &Path) -> Result<Db, LedgerError> {
    let mut db = Db::open(url, path, false).map_err(st)?;
    crate::sql::migrate(&mut db, "ledger", SCHEMA).map_err(st)?;
    Ok(db)
}

const ACCOUNT_COLS: &str =
    "id,parent,max,spent,own_spent,inflight,guaranteed,pool_left,closed,owner,placed";

/// An `accounts` row read with [`ACCOUNT_COLS`].
fn account_of(r: &Row) -> Result<Option<Account>, SqlError> {
    let Ok(id) = ThreadId::parse(&r.text(0)?) else {
        return Ok(None);
    };
    let owner = r.int(9)?;
    Ok(Some(Account {
        id,
        parent: r.opt_text(1)?.and_then(|p| ThreadId::parse(&p).ok()),
        max: Nanos(r.int(2)?),
        spent: Nanos(r.int(3)?),
        own_spent: Nanos(r.int(4)?),
        inflight: Nanos(r.int(5)?),
        guaranteed: Nanos(r.int(6)?),
        pool_left: Nanos(r.int(7)?),
        closed: r.flag(8)?,
        owner: u32::try_from(owner).unwrap_or(0),
        placed: r.flag(10)?,
    }))
}

pub(super) fn account(db: &Db, id: &ThreadId) -> Result<Option<Account>, LedgerError> {
    let row = db
        .row(
            &format!("SELECT {ACCOUNT_COLS} FROM accounts WHERE id=?1"),
            params![id.as_str()],
        )
        .map_err(st)?;
    row.map(|r| account_of(&r))
        .transpose()
        .map(Option::flatten)
        .map_err(st)
}

/// The final rows of closed account `id` and its ancestors, nearest first (empty if `id` has
/// none).
pub(crate) fn closed_chain(db: &Db, id: &ThreadId) -> Result<Vec<Account>, LedgerError> {
    let mut out: Vec<Account> = Vec::new();
    let mut next = Some(id.clone());
    while let Some(id) = next.take() {
        if out.len() > 10_000 || out.iter().any(|a| a.id == id) {
            break;
        }
        let Some(mut a) = account(db, &id)? else {
            break;
        };
        next = a.parent.clone();
        // What a closed account still holds: the budgets of deferred children set aside below
        // it (held as its guarantee and in flight above it).
        a.pool_left = Nanos::ZERO;
        out.push(a);
    }
    Ok(out)
}

/// Loads into `book` the open accounts of the ledger (of tree `top` only, when given), their
/// ancestors, and their open reservations, as they were stored. Neither crosses a placed
/// account: the subtree below one is its holder's, and the chain above one is its parent's
/// node's (a tree's placed accounts themselves are loaded with it: its holder settles them).
pub(crate) fn load_open(
    db: &Db,
    book: &mut Book,
    top: Option<&ThreadId>,
) -> Result<(), LedgerError> {
    let (scope, open, args) = match top {
        Some(t) => (
            format!(
                "WITH RECURSIVE down(id, placed, n) AS (SELECT {}, 0, 0
                   UNION SELECT a.id, CASE WHEN a.placed = 0 THEN 0 ELSE 1 END, d.n + 1
                   FROM accounts a JOIN down d ON a.parent=d.id
                   WHERE d.n < 10000 AND d.placed = 0),",
                db.text_param(1)
            ),
            "closed=0 AND id IN (SELECT id FROM down)",
            params![t.as_str()].to_vec(),
        ),
        None => ("WITH RECURSIVE".to_string(), "closed=0", Vec::new()),
    };
    let rows = db
        .query(
            &format!(
                "{scope} keep(id) AS (
                   SELECT id FROM accounts WHERE {open}
                   UNION SELECT a.parent FROM accounts a JOIN keep k ON a.id=k.id
                   WHERE a.parent IS NOT NULL AND a.placed = 0)
                 SELECT {ACCOUNT_COLS} FROM accounts WHERE id IN (SELECT id FROM keep)"
            ),
            &args,
        )
        .map_err(st)?;
    let mut loaded = std::collections::HashSet::new();
    // Placed children of the tree run by another node: held as their parent's node sees them;
    // their reservations are their holder's.
    let mut viewed = std::collections::HashSet::new();
    let me = crate::core::owner::me();
    for row in rows {
        if let Some(mut a) = account_of(&row).map_err(st)? {
            if a.placed && !a.closed && a.owner != me && Some(&a.id) != top {
                parent_view(&mut a);
                viewed.insert(a.id.clone());
            }
            if !book.accounts.contains_key(&a.id) {
                loaded.insert(a.id.clone());
                book.accounts.insert(a.id.clone(), a);
            }
        }
    }
    // Each loaded account counts under its parent, and so does an account the book held
    // already under a parent loaded now (a placed top held here, its parent's tree adopted).
    let under_loaded: Vec<ThreadId> = book
        .accounts
        .values()
        .filter(|a| loaded.contains(&a.id) || a.parent.as_ref().is_some_and(|p| loaded.contains(p)))
        .filter_map(|a| a.parent.clone())
        .collect();
    for p in under_loaded {
        *book.children.entry(p).or_default() += 1;
    }
    for row in db.query("SELECT body FROM reservations", &[]).map_err(st)? {
        let body = row.text(0).map_err(st)?;
        match serde_json::from_str::<Reservation>(&body) {
            Ok(r)
                if r.chain.first().is_none_or(|t| !loaded.contains(t))
                    || r.chain.iter().any(|a| viewed.contains(a))
                    || book.reservations.contains_key(&r.id) => {}
            Ok(r) if well_formed(&r) && r.chain.iter().all(|a| book.accounts.contains_key(a)) => {
                book.next_id = book.next_id.max(r.id.0);
                book.by_thread
                    .entry(r.chain[0].clone())
                    .or_default()
                    .push(r.id);
                book.reservations.insert(r.id, r);
            }
            _ => tracing::warn!("ledger: unreadable reservation left as is: {body}"),
        }
    }
    Ok(())
}

/// Placed account `a` as its parent's node holds it, whatever the node that runs it stored: a
/// guarantee of its whole cap, open, nothing settled against it yet (that happens once, at its
/// end: `Book::settle_placed`).
pub(crate) fn parent_view(a: &mut Account) {
    // Owner 0, as `defer` made it: settled, it is stored closed with owner 0 (settled on the
    // parent's side), so a repeated end is never settled twice.
    a.owner = 0;
    a.spent = Nanos::ZERO;
    a.own_spent = Nanos::ZERO;
    a.inflight = Nanos::ZERO;
    a.guaranteed = Nanos::ZERO;
    a.pool_left = a.max;
    a.closed = false;
}

/// Loads into `book`, from ledger.db, account `id` and those of its ancestors the book does not
/// hold, as they were stored (a deferred child's account another process set aside).
pub(crate) fn load_chain(db: &Db, book: &mut Book, id: &ThreadId) -> Result<(), LedgerError> {
    let mut next = Some(id.clone());
    let mut n = 0;
    while let Some(id) = next.take() {
        n += 1;
        if n > 10_000 || book.accounts.contains_key(&id) {
            break;
        }
        let Some(a) = account(db, &id)? else {
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
    pub(crate) fn load(db: &Db) -> Result<Book, LedgerError> {
        let mut book = Book::default();
        load_open(db, &mut book, None)?;
        // Ids continue after any earlier process's, with room so two processes rarely meet.
        let mut rnd = [0u8; 3];
        let _ = getrandom::fill(&mut rnd);
        book.next_id +=
            1 + (u64::from(rnd[0]) << 32 | u64::from(rnd[1]) << 24 | u64::from(rnd[2]) << 16);
        Ok(book)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::core::ids::ReservationId;

    /// An open top account `id` that spent `spent` of 1,000.
    pub(in crate::ledger) fn account(id: &ThreadId, spent: i64) -> Account {
        Account {
            id: id.clone(),
            parent: None,
            max: Nanos(1_000),
            spent: Nanos(spent),
            own_spent: Nanos(spent),
            inflight: Nanos::ZERO,
            guaranteed: Nanos::ZERO,
            pool_left: Nanos::ZERO,
            closed: false,
            owner: 7,
            placed: false,
        }
    }

    /// A batch naming an account or a reservation twice gives one row of each, the last
    /// (a Postgres upsert of many rows fails if it would change one row twice).
    #[test]
    fn a_row_named_twice_is_written_once_as_last_given() {
        let (t, u) = (ThreadId::generate("t"), ThreadId::generate("u"));
        let rows = account_rows(&[&account(&t, 1), &account(&u, 3), &account(&t, 2)]);
        let spent: Vec<(Value, Value)> = rows
            .chunks(11)
            .map(|r| (r[0].clone(), r[3].clone()))
            .collect();
        assert_eq!(spent.len(), 2, "{spent:?}");
        assert!(spent.contains(&(Value::from(t.as_str()), Value::Int(2))));
        let r = |amount| Reservation {
            id: ReservationId(1),
            chain: vec![t.clone()],
            amount: Nanos(amount),
            edges: vec![],
        };
        let rows = reservation_rows(&[&r(10), &r(99)]);
        assert_eq!(rows.len(), 3);
        assert!(
            matches!(&rows[2], Value::Text(b) if b.contains("99")),
            "{rows:?}"
        );
    }
}
