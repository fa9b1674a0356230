//! One SQL connection over SQLite or PostgreSQL: the seam under the registry, the ledger and the
//! store's database. Their SQL is written once, in the dialect both engines share (numbered
//! `?N` parameters, `ON CONFLICT` upserts, recursive CTEs, `CAST(… AS INTEGER)`), and run by
//! [`Db`], which differs per engine in exactly these: how it connects, how a parameter is
//! marked (`$N` on Postgres), the types a column is declared with, and how a writer takes the
//! write lock ([`Db::begin_write`]: SQLite's `BEGIN IMMEDIATE`, or a Postgres transaction that
//! first takes an advisory lock per concern — the same one-writer-at-a-time rule across
//! processes, so the admission and ledger checks that rely on it hold on both). Schema versions
//! and forward migrations are in `migrate.rs`; the URL (whose password is never shown) in
//! `url.rs`. Never decides anything about threads or money.

mod migrate;
#[cfg(feature = "postgres")]
mod pg;
mod sqlite;
mod url;
mod value;
mod workers;

pub(crate) use migrate::{check, migrate, Step};
pub use url::{BadDatabaseUrl, DatabaseUrl};
pub(crate) use value::{Row, SqlError, Value};
pub(crate) use workers::off_workers;

/// Parameters for a statement: `params![a, b]`.
macro_rules! params {
    ($($v:expr),* $(,)?) => { &[$($crate::sql::Value::from($v)),*][..] };
}
pub(crate) use params;

/// Which engine a [`Db`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// SQLite, embedded (a file under `.weft/state/`).
    Sqlite,
    /// A PostgreSQL server.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres,
}

/// What a connection is.
enum Conn {
    Sqlite(rusqlite::Connection),
    #[cfg(feature = "postgres")]
    Postgres(Box<pg::Client>),
}

/// A connection, owned by one actor or one reader, with at most one open write transaction.
pub(crate) struct Db {
    conn: Conn,
    /// A transaction is open ([`Db::begin_write`]).
    in_tx: bool,
    /// Commits reach the disk before they return (`durability: strict`).
    fsyncs: bool,
    /// Savepoints open inside the transaction (their names are numbered).
    depth: u32,
    /// The first statement of the open transaction that failed on Postgres: the server has
    /// aborted the transaction, and its `COMMIT` would quietly roll back, so [`Db::commit`]
    /// fails instead (SQLite undoes only the failed statement).
    poisoned: std::cell::RefCell<Option<SqlError>>,
    /// Row counts of counted statements run at once (SQLite), by ticket.
    counts: std::cell::RefCell<std::collections::HashMap<u64, u64>>,
    /// The next ticket of a counted statement.
    next_ticket: std::cell::Cell<u64>,
}

/// Write locks, one per concern: writers of one concern take turns; different concerns never
/// wait for each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    /// The thread registry.
    Registry,
    /// The thread store's own tables (index, KV, env values, scheduled effects, tombstones).
    Store,
    /// The budget ledger.
    Ledger,
    /// Schema migrations.
    Schema,
    /// The thread records' own log (the anchor log's chain, on a database server).
    Records,
}

impl Lock {
    /// The Postgres advisory lock key (a constant per concern, "weft" in its high bytes).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn key(self) -> i64 {
        0x7765_6674_0000_0000
            + match self {
                Lock::Registry => 1,
                Lock::Ledger => 2,
                Lock::Store => 3,
                Lock::Schema => 4,
                Lock::Records => 5,
            }
    }
}

impl Db {
    fn with(conn: Conn) -> Db {
        Db {
            conn,
            in_tx: false,
            fsyncs: false,
            depth: 0,
            poisoned: Default::default(),
            counts: Default::default(),
            next_ticket: Default::default(),
        }
    }

    /// An open SQLite connection (its pragmas already set).
    pub(crate) fn sqlite(conn: rusqlite::Connection) -> Db {
        Db::with(Conn::Sqlite(conn))
    }

    /// Wakes the returned `Notify` at each Postgres notification on `channels` (`NOTIFY`,
    /// `pg_notify`) — see `pg::listen`. Only on Postgres.
    pub(crate) fn listen(
        url: &DatabaseUrl,
        channels: &[String],
    ) -> Result<std::sync::Arc<tokio::sync::Notify>, SqlError> {
        #[cfg(feature = "postgres")]
        {
            pg::listen(url, channels)
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = channels;
            Err(SqlError(format!(
                "{url}: notifications need the `postgres` feature"
            )))
        }
    }

    /// Sends a notification on `channel` (Postgres; what [`Db::listen`] wakes on). Outside a
    /// transaction it is sent at once; inside one, at its commit.
    pub(crate) fn notify(&self, channel: &str) -> Result<(), SqlError> {
        self.execute("SELECT pg_notify(?1, '')", params![channel])
            .map(|_| ())
    }

    /// Connects to the Postgres server at `url`.
    pub(crate) fn postgres(url: &DatabaseUrl) -> Result<Db, SqlError> {
        #[cfg(feature = "postgres")]
        {
            Ok(Db::with(Conn::Postgres(Box::new(pg::Client::connect(
                url,
            )?))))
        }
        #[cfg(not(feature = "postgres"))]
        {
            Err(SqlError(format!(
                "{url}: this weft was built without the `postgres` feature; rebuild with it or remove `database:` from the config"
            )))
        }
    }

    /// Opens the database `url` names, or the SQLite file `file` when it names none.
    pub(crate) fn open(
        url: Option<&DatabaseUrl>,
        file: &std::path::Path,
        read_only: bool,
    ) -> Result<Db, SqlError> {
        match url {
            Some(url) => Db::postgres(url),
            None => sqlite::open(file, read_only).map(Db::sqlite),
        }
    }

    /// Parameter `n` as a text value that compares like a text column (for the first term of
    /// a recursive query, whose column type both terms must share): `?n` on SQLite, a cast with
    /// the columns' byte-wise collation on Postgres.
    pub(crate) fn text_param(&self, n: usize) -> String {
        match self.engine() {
            Engine::Sqlite => format!("?{n}"),
            Engine::Postgres => format!("CAST(?{n} AS TEXT) COLLATE \"C\""),
        }
    }

    /// The database server this connection is to (None: an SQLite file).
    pub(crate) fn url(&self) -> Option<&DatabaseUrl> {
        match &self.conn {
            Conn::Sqlite(_) => None,
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => Some(c.url()),
        }
    }

    /// The engine.
    pub(crate) fn engine(&self) -> Engine {
        match &self.conn {
            Conn::Sqlite(_) => Engine::Sqlite,
            #[cfg(feature = "postgres")]
            Conn::Postgres(_) => Engine::Postgres,
        }
    }

    /// The SQLite connection, for what only SQLite has (FTS5, pragmas, VACUUM).
    #[cfg(test)]
    pub(crate) fn as_sqlite(&self) -> Option<&rusqlite::Connection> {
        match &self.conn {
            Conn::Sqlite(c) => Some(c),
            #[cfg(feature = "postgres")]
            Conn::Postgres(_) => None,
        }
    }

    /// `durability: strict`: every commit reaches the disk before it returns.
    pub(crate) fn set_strict(&mut self) -> Result<(), SqlError> {
        match &self.conn {
            Conn::Sqlite(c) => c
                .execute_batch("PRAGMA synchronous=FULL")
                .map_err(SqlError::new)?,
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => c.set_strict()?,
        }
        self.fsyncs = true;
        Ok(())
    }

    /// Whether commits reach the disk before they return (`durability: strict`).
    pub(crate) fn fsyncs(&self) -> bool {
        self.fsyncs
    }

    /// A session setting (`SET …`), kept on a Postgres connection made again.
    pub(crate) fn set_session(&mut self, sql: &'static str) -> Result<(), SqlError> {
        match &self.conn {
            Conn::Sqlite(c) => c.execute_batch(sql).map_err(SqlError::new),
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => c.set_session(sql),
        }
    }

    /// Opens a transaction without a concern's write lock (for rows no other writer
    /// touches), running `then` (its settings) with the `BEGIN`; a no-op if one is open.
    pub(crate) fn begin_unlocked(&mut self, then: &str) -> Result<(), SqlError> {
        if self.in_tx {
            return Ok(());
        }
        match &self.conn {
            Conn::Sqlite(c) => c
                .execute_batch(&format!("BEGIN; {then}"))
                .map_err(SqlError::new)?,
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => c.begin(then)?,
        }
        self.in_tx = true;
        Ok(())
    }

    /// Runs one statement; returns the rows it changed.
    pub(crate) fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, SqlError> {
        match &self.conn {
            Conn::Sqlite(c) => sqlite::execute(c, sql, params),
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => self.noted(c.execute(sql, params)),
        }
    }

    /// `r`, remembered when it is the first failure of an open Postgres transaction.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn noted<T>(&self, r: Result<T, SqlError>) -> Result<T, SqlError> {
        if let Err(e) = &r {
            let mut p = self.poisoned.borrow_mut();
            if self.in_tx && p.is_none() {
                *p = Some(e.clone());
            }
        }
        r
    }

    /// Runs a statement of the open write transaction whose result nobody reads: at once on
    /// SQLite; on Postgres queued and sent with the next statement or the commit, pipelined
    /// (a batch of N statements costs one round trip, not N). Outside a transaction it runs
    /// at once.
    pub(crate) fn execute_later(&self, sql: &str, params: &[Value]) -> Result<(), SqlError> {
        match &self.conn {
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) if self.in_tx => self.noted(c.defer(sql, params, None)),
            _ => self.execute(sql, params).map(|_| ()),
        }
    }

    /// `head VALUES (…),(…)… tail` for `values`, `cols` of them to a row, as
    /// [`Db::execute_later`], in statements of many rows ([`Db::rows_later`]).
    pub(crate) fn insert_rows(
        &self,
        head: &str,
        tail: &str,
        cols: usize,
        values: &[Value],
    ) -> Result<(), SqlError> {
        self.rows_later(cols, values, |n| rows_sql(head, tail, cols, n))
    }

    /// `DELETE FROM table WHERE (k1=? AND k2=?…) OR (…)…` for `values`, one value of each of
    /// `keys` to a row, as [`Db::execute_later`], in statements of many rows ([`Db::rows_later`]).
    pub(crate) fn delete_rows(
        &self,
        table: &str,
        keys: &[&str],
        values: &[Value],
    ) -> Result<(), SqlError> {
        self.rows_later(keys.len(), values, |n| delete_sql(table, keys, n))
    }

    /// Runs `sql(n)`, a statement of `n` rows, over `values`, `cols` of them to a row: on
    /// Postgres many rows to a statement ([`rows_per_statement`]), on SQLite one row at a
    /// time, which costs no more there and keeps its statement cache small.
    pub(crate) fn rows_later(
        &self,
        cols: usize,
        values: &[Value],
        sql: impl Fn(usize) -> String,
    ) -> Result<(), SqlError> {
        if cols == 0 || !values.len().is_multiple_of(cols) {
            return Err(SqlError(format!(
                "{} values are not whole rows of {cols}",
                values.len()
            )));
        }
        let mut rest = values;
        // The text of the last size used: built once for all of SQLite's one-row statements.
        let mut built: Option<(usize, String)> = None;
        while !rest.is_empty() {
            let n = match self.engine() {
                Engine::Sqlite => 1,
                Engine::Postgres => rows_per_statement(rest.len() / cols),
            };
            if built.as_ref().is_none_or(|(at, _)| *at != n) {
                built = Some((n, sql(n)));
            }
            let (now, later) = rest.split_at(n * cols);
            if let Some((_, text)) = &built {
                self.execute_later(text, now)?;
            }
            rest = later;
        }
        Ok(())
    }

    /// As [`Db::execute_later`], but the rows the statement changed are kept under the
    /// returned ticket until [`Db::take_counts`] (after the commit, on Postgres; at once on
    /// SQLite or outside a transaction).
    pub(crate) fn execute_counted(&self, sql: &str, params: &[Value]) -> Result<u64, SqlError> {
        // Not inside a savepoint: one undone would leave a count for a statement undone.
        debug_assert_eq!(self.depth, 0, "a counted statement inside a savepoint");
        let ticket = self.next_ticket.get();
        self.next_ticket.set(ticket + 1);
        match &self.conn {
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) if self.in_tx => self.noted(c.defer(sql, params, Some(ticket)))?,
            _ => {
                let n = self.execute(sql, params)?;
                self.counts.borrow_mut().insert(ticket, n);
            }
        }
        Ok(ticket)
    }

    /// The row counts of [`Db::execute_counted`] statements sent so far, by ticket (and
    /// forgets them).
    pub(crate) fn take_counts(&self) -> std::collections::HashMap<u64, u64> {
        let counts = std::mem::take(&mut *self.counts.borrow_mut());
        match &self.conn {
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => counts.into_iter().chain(c.take_counts()).collect(),
            _ => counts,
        }
    }

    /// Runs a query; returns every row.
    pub(crate) fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, SqlError> {
        match &self.conn {
            Conn::Sqlite(c) => sqlite::query(c, sql, params),
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => self.noted(c.query(sql, params)),
        }
    }

    /// Runs a query; returns its first row, if any.
    pub(crate) fn row(&self, sql: &str, params: &[Value]) -> Result<Option<Row>, SqlError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    /// Runs statements without parameters (DDL), separated by `;`.
    pub(crate) fn batch(&self, sql: &str) -> Result<(), SqlError> {
        match &self.conn {
            Conn::Sqlite(c) => c.execute_batch(sql).map_err(SqlError::new),
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => self.noted(c.batch(sql)),
        }
    }

    /// Rewrites `tables` compactly (after deletes): the whole file on SQLite, which also
    /// empties its write-ahead log; only weft's `tables` on Postgres (a shared server's other
    /// tables are not weft's to vacuum). Never inside a transaction.
    pub(crate) fn vacuum(&self, tables: &[&str]) -> Result<(), SqlError> {
        match self.engine() {
            Engine::Sqlite => self.batch("VACUUM; PRAGMA wal_checkpoint(TRUNCATE);"),
            Engine::Postgres => self.batch(&format!("VACUUM {}", tables.join(", "))),
        }
    }

    /// Whether a write transaction is open.
    pub(crate) fn in_tx(&self) -> bool {
        self.in_tx
    }

    /// Opens a write transaction holding `lock` (a no-op if one is open): only one writer of a
    /// concern at a time, across every process on the database.
    pub(crate) fn begin_write(&mut self, lock: Lock) -> Result<(), SqlError> {
        if self.in_tx {
            return Ok(());
        }
        match &self.conn {
            Conn::Sqlite(c) => sqlite::begin_immediate(c).map_err(SqlError::new)?,
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => c.begin_locked(lock.key())?,
        }
        let _ = lock;
        self.in_tx = true;
        Ok(())
    }

    /// Commits the open transaction (a no-op if none); on failure it is rolled back.
    pub(crate) fn commit(&mut self) -> Result<(), SqlError> {
        if !self.in_tx {
            return Ok(());
        }
        self.in_tx = false;
        self.depth = 0;
        if let Some(e) = self.poisoned.borrow_mut().take() {
            self.abandon();
            return Err(SqlError(format!(
                "not committed: a statement of the transaction failed: {e}"
            )));
        }
        let done = match &self.conn {
            Conn::Sqlite(c) => sqlite::commit(c, self.fsyncs).map_err(SqlError::new),
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => c.commit(),
        };
        if done.is_err() {
            self.abandon();
        }
        done
    }

    /// Rolls the open transaction back (a no-op if none).
    pub(crate) fn rollback(&mut self) {
        if self.in_tx {
            self.in_tx = false;
            self.depth = 0;
            self.poisoned.borrow_mut().take();
            self.abandon();
        }
    }

    /// `ROLLBACK TO SAVEPOINT name` and its release, dropping statements queued since.
    fn rollback_to(&self, name: &str) -> Result<(), SqlError> {
        let sql = format!("ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}");
        match &self.conn {
            Conn::Sqlite(c) => c.execute_batch(&sql).map_err(SqlError::new),
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => c.discard_then(&sql),
        }
    }

    /// Sends what a Postgres transaction has queued (a no-op on SQLite).
    pub(crate) fn flush(&self) -> Result<(), SqlError> {
        match &self.conn {
            Conn::Sqlite(_) => Ok(()),
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => self.noted(c.flush()),
        }
    }

    /// `ROLLBACK`, dropping what was queued (errors ignored: no transaction may be open).
    fn abandon(&self) {
        match &self.conn {
            Conn::Sqlite(c) => {
                let _ = c.execute_batch("ROLLBACK");
            }
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => c.rollback(),
        }
    }

    /// Runs `f` atomically: inside the open transaction as a savepoint (undone alone if `f`
    /// fails), or in a write transaction of its own holding `lock`.
    pub(crate) fn atomic<T, E: From<SqlError>>(
        &mut self,
        lock: Lock,
        f: impl FnOnce(&mut Db) -> Result<T, E>,
    ) -> Result<T, E> {
        if self.in_tx {
            let before = self.poisoned.borrow().clone();
            self.batch(&format!("SAVEPOINT weft_sp{}", self.depth + 1))?;
            self.depth += 1;
            let name = format!("weft_sp{}", self.depth);
            let out = f(self);
            let ended = match &out {
                Ok(_) => self.batch(&format!("RELEASE SAVEPOINT {name}")),
                // What `f` queued and did not send is dropped; what it sent is undone.
                Err(_) => self.rollback_to(&name),
            };
            if out.is_err() && ended.is_ok() {
                // Undone to the savepoint: the transaction is whole again.
                *self.poisoned.borrow_mut() = before;
            }
            self.depth -= 1;
            let out = out?;
            ended?;
            Ok(out)
        } else {
            self.begin_write(lock)?;
            match f(self) {
                Ok(v) => {
                    self.commit()?;
                    Ok(v)
                }
                Err(e) => {
                    self.rollback();
                    Err(e)
                }
            }
        }
    }
}

/// `head VALUES (?1,…,?cols),(…)… tail` for `n` rows.
fn rows_sql(head: &str, tail: &str, cols: usize, n: usize) -> String {
    use std::fmt::Write;
    let mut sql = String::with_capacity(head.len() + tail.len() + 10 + n * cols * 5);
    sql.push_str(head);
    sql.push_str(" VALUES ");
    for r in 0..n {
        sql.push_str(if r == 0 { "(" } else { ",(" });
        for c in 1..=cols {
            let sep = if c == 1 { "" } else { "," };
            let _ = write!(sql, "{sep}?{}", r * cols + c);
        }
        sql.push(')');
    }
    sql.push_str(tail);
    sql
}

/// How many of `left` rows (at least 1) the next Postgres statement takes: all of 8 or fewer,
/// else 256, 64, 16 or 8. A statement costs the server about as much as a row, and these
/// eleven sizes (eleven prepared statements) cover any count.
fn rows_per_statement(left: usize) -> usize {
    match left {
        0..=8 => left.max(1),
        _ => [256, 64, 16, 8]
            .into_iter()
            .find(|n| *n <= left)
            .unwrap_or(8),
    }
}

/// `DELETE FROM table WHERE (k1=?1 AND k2=?2) OR (…)…` for `n` rows.
fn delete_sql(table: &str, keys: &[&str], n: usize) -> String {
    use std::fmt::Write;
    let mut sql = format!("DELETE FROM {table} WHERE ");
    for r in 0..n {
        sql.push_str(if r == 0 { "(" } else { " OR (" });
        for (c, key) in keys.iter().enumerate() {
            let and = if c == 0 { "" } else { " AND " };
            let _ = write!(sql, "{and}{key}=?{}", r * keys.len() + c + 1);
        }
        sql.push(')');
    }
    sql
}

#[cfg(test)]
mod tests {
    #[test]
    fn rows_are_numbered_row_by_row() {
        assert_eq!(
            super::rows_sql("INSERT INTO t(a,b)", " ON CONFLICT DO NOTHING", 2, 3),
            "INSERT INTO t(a,b) VALUES (?1,?2),(?3,?4),(?5,?6) ON CONFLICT DO NOTHING"
        );
        assert_eq!(
            super::delete_sql("t", &["a", "b"], 2),
            "DELETE FROM t WHERE (a=?1 AND b=?2) OR (a=?3 AND b=?4)"
        );
    }

    /// Every count of rows is split into statements of the eleven sizes, all rows taken.
    #[test]
    fn any_count_of_rows_takes_a_few_statement_sizes() {
        let mut sizes = std::collections::BTreeSet::new();
        for count in 1..=2000 {
            let (mut left, mut statements) = (count, 0);
            while left > 0 {
                let n = super::rows_per_statement(left);
                assert!((1..=left).contains(&n), "{n} of {left}");
                sizes.insert(n);
                left -= n;
                statements += 1;
            }
            assert!(count > 8 || statements == 1, "{count} rows in {statements}");
        }
        let want: Vec<usize> = (1..=8).chain([16, 64, 256]).collect();
        assert_eq!(sizes.into_iter().collect::<Vec<_>>(), want);
    }

    /// On SQLite every row goes in on its own and all of them land; values that are not
    /// whole rows are refused, nothing written.
    #[test]
    fn every_row_is_inserted() {
        let tmp = tempfile::tempdir().unwrap();
        let mut db = super::Db::open(None, &tmp.path().join("x.db"), false).unwrap();
        db.execute("CREATE TABLE t(a INTEGER, b TEXT)", &[])
            .unwrap();
        let values: Vec<super::Value> = (0..40)
            .flat_map(|i| [super::Value::Int(i), super::Value::Text(format!("r{i}"))])
            .collect();
        db.atomic(super::Lock::Store, |db| {
            db.insert_rows("INSERT INTO t(a,b)", "", 2, &values)
        })
        .unwrap();
        let n = db
            .row("SELECT COUNT(*), SUM(a) FROM t", &[])
            .unwrap()
            .unwrap();
        assert_eq!((n.int(0).unwrap(), n.int(1).unwrap()), (40, 780));
    }
}
