//! The PostgreSQL side of `Db` (`sql/mod.rs`), on `tokio-postgres`. Every connection of the process is
//! driven by one background thread of its own (a current-thread tokio runtime that only moves
//! bytes), so a [`Client`] can be used from plain blocking code and from inside the actors'
//! async handlers alike: a call sends its request to that thread and waits for the answer, and
//! nothing here ever needs the caller's runtime (no "runtime inside a runtime").
//!
//! Statements are prepared once per connection and kept; `?N` parameters become `$N`. Values
//! adapt to the type the server inferred for each parameter (an integer to INT4 or BOOL, text
//! to BIGINT…), so the shared SQL needs no casts for them.

use super::url::DatabaseUrl;
use super::value::{Row, SqlError, Value};
use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type};

/// The runtime that drives every Postgres connection of the process.
fn driver() -> Result<&'static tokio::runtime::Handle, SqlError> {
    static DRIVER: OnceLock<Result<tokio::runtime::Handle, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name("weft-postgres")
                .build()
                .map_err(|e| format!("cannot start the Postgres driver thread: {e}"))?;
            let handle = rt.handle().clone();
            std::thread::Builder::new()
                .name("weft-postgres".into())
                .spawn(move || rt.block_on(std::future::pending::<()>()))
                .map_err(|e| format!("cannot start the Postgres driver thread: {e}"))?;
            Ok(handle)
        })
        .as_ref()
        .map_err(|e| SqlError(e.clone()))
}

/// Waits for `f` on this thread (the work itself happens on the driver thread).
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    // Outside tokio's cooperative budget: called from inside a task (an actor's handler, an
    // async test) whose budget has run out, a tokio future (the driver's join handle) would
    // defer its wake-up until that task yields to its scheduler — which this thread, parked
    // here, never does: it would wait forever.
    let mut f = std::pin::pin!(tokio::task::unconstrained(f));
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Blocking work that may wait on another process (a lock) leaves the async workers free.
fn wait<F: Future>(f: F) -> F::Output {
    super::workers::off_workers(|| block_on(f))
}

/// A queued statement, its values, and the ticket its row count is kept under, if any.
type Deferred = (tokio_postgres::Statement, Vec<Value>, Option<u64>);

/// One connection (made again when the server dropped it) and its prepared statements.
pub(super) struct Client {
    url: DatabaseUrl,
    client: RefCell<tokio_postgres::Client>,
    prepared: RefCell<HashMap<String, tokio_postgres::Statement>>,
    /// Statements of the open transaction not sent yet ([`Client::defer`]): sent together,
    /// pipelined, before the next statement that reads or at the commit.
    deferred: RefCell<Vec<Deferred>>,
    /// Rows changed by counted deferred statements, by their ticket ([`Client::defer`]).
    counts: RefCell<HashMap<u64, u64>>,
    /// A transaction is open on this connection (a lost connection then fails it; outside one
    /// the next call connects again).
    in_tx: std::cell::Cell<bool>,
    /// `durability: strict` (`synchronous_commit = on`), set again on a new connection.
    strict: std::cell::Cell<bool>,
    /// Session settings of this connection's owner, set again on a new connection.
    session: RefCell<Vec<&'static str>>,
}

fn pg_error(e: tokio_postgres::Error) -> SqlError {
    match e.as_db_error() {
        Some(db) => SqlError(format!(
            "postgres: {} ({}){}",
            db.message(),
            db.code().code(),
            db.detail().map(|d| format!(": {d}")).unwrap_or_default()
        )),
        None => SqlError(format!("postgres: {e}")),
    }
}

/// Every session's settings: waits bounded like SQLite's busy timeout (a lock another process
/// holds for more than 5 s fails the commit, which its actor retries; a process that stops
/// mid-transaction releases its locks after 60 s; no statement runs past 5 minutes).
const SESSION: &str = "SET client_min_messages = warning; SET lock_timeout = '5s';
    SET idle_in_transaction_session_timeout = '60s'; SET statement_timeout = '300s'";

/// `durability: strict`: a commit returns once the server has it on disk.
const STRICT: &str = "SET synchronous_commit = on";

/// Connects (at most 10 s; TCP keepalives so a vanished server is noticed).
fn connect(url: &DatabaseUrl) -> Result<tokio_postgres::Client, SqlError> {
    let mut config: tokio_postgres::Config =
        url.secret().parse().map_err(|e: tokio_postgres::Error| {
            SqlError(format!(
                "{url}: not a Postgres connection string: {}",
                url.scrub(&e.to_string())
            ))
        })?;
    config
        .connect_timeout(Duration::from_secs(10))
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .application_name("weft");
    let handle = driver()?;
    let connecting = handle.spawn(async move { config.connect(tokio_postgres::NoTls).await });
    let (client, connection) = block_on(connecting)
        .map_err(|e| SqlError(format!("{url}: {e}")))?
        .map_err(|e| {
            SqlError(format!(
                "{url}: cannot connect: {}",
                url.scrub(&pg_error(e).0)
            ))
        })?;
    let shown = url.to_string();
    handle.spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!("postgres connection to {shown} ended: {e}");
        }
    });
    block_on(client.batch_execute(SESSION)).map_err(pg_error)?;
    if let (Some(owner), Some(idle)) = (
        crate::core::owner::node(),
        crate::core::owner::node_idle_ms(),
    ) {
        // The node's fence (see `runtime/fence.rs`): every write of this session is checked
        // against the lease of owner `owner`; a transaction it leaves idle ends sooner.
        block_on(client.batch_execute(&format!(
            "SET weft.owner = '{owner}'; SET idle_in_transaction_session_timeout = '{idle}ms'"
        )))
        .map_err(pg_error)?;
    }
    Ok(client)
}

/// A session that LISTENs on `channels`: each notification on any of them wakes the returned
/// [`tokio::sync::Notify`] (one stored permit when nobody waits, so a wake between two waits is
/// not lost). When the session ends (the server restarted or dropped it) nothing wakes it any
/// more: its users poll as well, since notifications can also be lost.
pub(super) fn listen(
    url: &DatabaseUrl,
    channels: &[String],
) -> Result<Arc<tokio::sync::Notify>, SqlError> {
    let mut config: tokio_postgres::Config = url
        .secret()
        .parse()
        .map_err(|e: tokio_postgres::Error| SqlError(url.scrub(&e.to_string())))?;
    config
        .connect_timeout(Duration::from_secs(10))
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .application_name("weft-listen");
    let wake = Arc::new(tokio::sync::Notify::new());
    let listen: String = channels
        .iter()
        .map(|c| format!("LISTEN \"{}\";", c.replace('"', "")))
        .collect();
    let (shown, woken) = (url.to_string(), wake.clone());
    let listening = async move {
        let (client, mut conn) = config.connect(tokio_postgres::NoTls).await?;
        let session = tokio::spawn(async move {
            while let Some(m) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                match m {
                    Ok(tokio_postgres::AsyncMessage::Notification(_)) => woken.notify_one(),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!("postgres notifications from {shown} ended: {e}");
                        return;
                    }
                }
            }
        });
        client.batch_execute(&listen).await?;
        // The session lives while its connection does.
        tokio::spawn(async move {
            let _ = session.await;
            drop(client);
        });
        Ok::<(), tokio_postgres::Error>(())
    };
    // The timer is made on the driver's runtime (this thread may have none).
    let started = driver()?
        .spawn(async move { tokio::time::timeout(Duration::from_secs(10), listening).await });
    block_on(started)
        .map_err(|e| SqlError(format!("{url}: {e}")))?
        .map_err(|_| SqlError(format!("{url}: cannot listen: no answer within 10 s")))?
        .map_err(|e| {
            SqlError(format!(
                "{url}: cannot listen: {}",
                url.scrub(&pg_error(e).0)
            ))
        })?;
    Ok(wake)
}

impl Client {
    /// Connects to `url`.
    pub(super) fn connect(url: &DatabaseUrl) -> Result<Client, SqlError> {
        Ok(Client {
            client: RefCell::new(connect(url)?),
            url: url.clone(),
            prepared: RefCell::new(HashMap::new()),
            deferred: RefCell::new(Vec::new()),
            counts: RefCell::new(HashMap::new()),
            in_tx: std::cell::Cell::new(false),
            strict: std::cell::Cell::new(false),
            session: RefCell::new(Vec::new()),
        })
    }

    /// The connection; made again (its statements prepared again) when the server dropped it
    /// outside a transaction. Inside one, the transaction is lost: the error says so.
    fn live(&self) -> Result<std::cell::Ref<'_, tokio_postgres::Client>, SqlError> {
        if self.client.borrow().is_closed() {
            if self.in_tx.get() {
                return Err(SqlError(format!(
                    "{}: the connection was lost during a transaction; it was not committed",
                    self.url
                )));
            }
            // Connecting may wait up to its timeout: off the async workers.
            let fresh = super::workers::off_workers(|| connect(&self.url))?;
            if self.strict.get() {
                block_on(fresh.batch_execute(STRICT)).map_err(pg_error)?;
            }
            for sql in self.session.borrow().iter() {
                block_on(fresh.batch_execute(sql)).map_err(pg_error)?;
            }
            *self.client.borrow_mut() = fresh;
            self.prepared.borrow_mut().clear();
        }
        Ok(self.client.borrow())
    }

    fn statement(&self, sql: &str) -> Result<tokio_postgres::Statement, SqlError> {
        let client = self.live()?;
        if let Some(s) = self.prepared.borrow().get(sql) {
            return Ok(s.clone());
        }
        let st = block_on(client.prepare(&numbered(sql))).map_err(pg_error)?;
        self.prepared
            .borrow_mut()
            .insert(sql.to_string(), st.clone());
        Ok(st)
    }

    pub(super) fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, SqlError> {
        self.flush()?;
        let st = self.statement(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        block_on(self.live()?.execute(&st, &refs)).map_err(pg_error)
    }

    /// The database.
    pub(super) fn url(&self) -> &DatabaseUrl {
        &self.url
    }

    /// A session setting, on this connection and every later one.
    pub(super) fn set_session(&self, sql: &'static str) -> Result<(), SqlError> {
        self.session.borrow_mut().push(sql);
        self.batch(sql)
    }

    /// `BEGIN` and `then` (settings of the transaction) in one round trip; no lock.
    pub(super) fn begin(&self, then: &str) -> Result<(), SqlError> {
        block_on(self.live()?.batch_execute(&format!("BEGIN; {then}"))).map_err(pg_error)?;
        self.in_tx.set(true);
        Ok(())
    }

    /// `durability: strict`, on this connection and every later one.
    pub(super) fn set_strict(&self) -> Result<(), SqlError> {
        self.strict.set(true);
        self.batch(STRICT)
    }

    /// Queues a statement of the open transaction whose result nobody reads: the queue goes
    /// out in one pipelined burst (one round trip, not one per statement), in order, before
    /// anything else on this connection. Its values are encoded now, so a value the server
    /// could not take fails here — a statement never silently missing from a burst whose
    /// `COMMIT` goes out.
    /// With a `ticket`, the rows it changes are kept for [`Client::take_counts`].
    pub(super) fn defer(
        &self,
        sql: &str,
        params: &[Value],
        ticket: Option<u64>,
    ) -> Result<(), SqlError> {
        let st = self.statement(sql)?;
        if st.params().len() != params.len() {
            return Err(SqlError(format!(
                "{} values for {} parameters in `{sql}`",
                params.len(),
                st.params().len()
            )));
        }
        let mut scratch = bytes::BytesMut::new();
        for (value, ty) in params.iter().zip(st.params()) {
            scratch.clear();
            value
                .to_sql_checked(ty, &mut scratch)
                .map_err(|e| SqlError(format!("a value for `{sql}`: {e}")))?;
        }
        self.deferred
            .borrow_mut()
            .push((st, params.to_vec(), ticket));
        Ok(())
    }

    /// The row counts of the counted statements sent so far (and forgets them).
    pub(super) fn take_counts(&self) -> HashMap<u64, u64> {
        std::mem::take(&mut *self.counts.borrow_mut())
    }

    /// Sends the queued statements (and `then`, a simple query such as `COMMIT`, in the same
    /// burst); the first failure is the result (Postgres then ignores the rest of the
    /// transaction, and a `COMMIT` of it rolls back — the caller, `Db`, fails it).
    fn send(&self, then: Option<&str>) -> Result<(), SqlError> {
        let queued = std::mem::take(&mut *self.deferred.borrow_mut());
        if queued.is_empty() && then.is_none() {
            return Ok(());
        }
        let client = self.live()?;
        let sent: Vec<_> = queued
            .iter()
            .map(|(st, params, _)| {
                let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
                let client = &*client;
                async move { client.execute(st, &refs).await }
            })
            .collect();
        let last = async {
            match then {
                Some(sql) => client.batch_execute(sql).await,
                None => Ok(()),
            }
        };
        let (results, last) = block_on(InOrder::new(sent, last));
        for (r, (_, _, ticket)) in results.into_iter().zip(&queued) {
            let n = r.map_err(pg_error)?;
            if let Some(t) = ticket {
                self.counts.borrow_mut().insert(*t, n);
            }
        }
        last.map_err(pg_error)
    }

    /// Sends what is queued.
    pub(super) fn flush(&self) -> Result<(), SqlError> {
        self.send(None)
    }

    /// Sends what is queued and commits, in one burst.
    pub(super) fn commit(&self) -> Result<(), SqlError> {
        let done = self.send(Some("COMMIT"));
        self.in_tx.set(false);
        done
    }

    /// Drops what is queued, then runs `sql` (a `ROLLBACK TO SAVEPOINT`: what was queued
    /// since the savepoint is undone by not sending it).
    pub(super) fn discard_then(&self, sql: &str) -> Result<(), SqlError> {
        self.deferred.borrow_mut().clear();
        block_on(self.live()?.batch_execute(sql)).map_err(pg_error)
    }

    /// Drops what is queued and rolls back.
    pub(super) fn rollback(&self) {
        self.deferred.borrow_mut().clear();
        self.counts.borrow_mut().clear();
        self.in_tx.set(false);
        if let Ok(c) = self.live() {
            let _ = block_on(c.batch_execute("ROLLBACK"));
        }
    }

    pub(super) fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, SqlError> {
        self.flush()?;
        let st = self.statement(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        let rows = block_on(self.live()?.query(&st, &refs)).map_err(pg_error)?;
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| r.try_get::<_, Value>(i).map_err(pg_error))
                    .collect::<Result<Vec<Value>, SqlError>>()
                    .map(Row)
            })
            .collect()
    }

    pub(super) fn batch(&self, sql: &str) -> Result<(), SqlError> {
        self.flush()?;
        block_on(self.live()?.batch_execute(sql)).map_err(pg_error)
    }

    /// `BEGIN`, then the concern's advisory lock (held until the transaction ends): taken at
    /// once when free; when another process holds it, the wait (at most `lock_timeout`) leaves
    /// the async workers free.
    pub(super) fn begin_locked(&self, key: i64) -> Result<(), SqlError> {
        let st = self.statement("SELECT pg_try_advisory_xact_lock(?1)")?;
        let wait_st = self.statement("SELECT pg_advisory_xact_lock(?1)")?;
        let client = self.live()?;
        // BEGIN and the try-lock in one burst.
        let (begun, got) = block_on(futures_util::future::join(
            client.batch_execute("BEGIN"),
            client.query_one(&st, &[&key]),
        ));
        let locked = begun.map_err(pg_error).and_then(|()| {
            let got: bool = got.map_err(pg_error)?.try_get(0).map_err(pg_error)?;
            if got {
                return Ok(());
            }
            wait(client.query(&wait_st, &[&key]))
                .map(|_| ())
                .map_err(pg_error)
        });
        match &locked {
            Ok(()) => self.in_tx.set(true),
            Err(_) => {
                let _ = block_on(client.batch_execute("ROLLBACK"));
            }
        }
        locked
    }
}

/// Every future of `first` polled once, in order — so each sends its request before the next,
/// and all before `then` is polled at all — then each in turn until it is done (the server
/// answers in order, so a later one is never done before an earlier one), and `then`; ready
/// with all outputs. O(n) polls for n statements. (`join_all` may stop polling part-way
/// through a long list, which could send a `COMMIT` ahead of the statements it commits.)
struct InOrder<F: Future, G: Future> {
    first: Vec<std::pin::Pin<Box<futures_util::future::MaybeDone<F>>>>,
    then: std::pin::Pin<Box<futures_util::future::MaybeDone<G>>>,
    /// Every future was polled once (every request sent).
    started: bool,
    /// The first of `first` not known done.
    next: usize,
}

impl<F: Future, G: Future> InOrder<F, G> {
    fn new(first: Vec<F>, then: G) -> Self {
        InOrder {
            first: first
                .into_iter()
                .map(|f| Box::pin(futures_util::future::maybe_done(f)))
                .collect(),
            then: Box::pin(futures_util::future::maybe_done(then)),
            started: false,
            next: 0,
        }
    }
}

impl<F: Future, G: Future> Future for InOrder<F, G> {
    type Output = (Vec<F::Output>, G::Output);

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let me = &mut *self;
        if !me.started {
            for f in me.first.iter_mut() {
                let _ = f.as_mut().poll(cx);
            }
            me.started = true;
        }
        while me.next < me.first.len() && me.first[me.next].as_mut().poll(cx).is_ready() {
            me.next += 1;
        }
        let then_done = me.then.as_mut().poll(cx).is_ready();
        if me.next < me.first.len() || !then_done {
            return Poll::Pending;
        }
        let first = me
            .first
            .iter_mut()
            .filter_map(|f| f.as_mut().take_output())
            .collect();
        match me.then.as_mut().take_output() {
            Some(then) => Poll::Ready((first, then)),
            None => Poll::Pending,
        }
    }
}

/// `?N` → `$N` outside quoted text (the shared SQL marks parameters the SQLite way).
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quoted = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            quoted = !quoted;
        }
        if c == '?' && !quoted && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

type BoxError = Box<dyn std::error::Error + Sync + Send>;

impl ToSql for Value {
    fn to_sql(&self, ty: &Type, out: &mut bytes::BytesMut) -> Result<IsNull, BoxError> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(v) => int_to_sql(*v, ty, out),
            Value::Real(v) => match *ty {
                Type::FLOAT4 => (*v as f32).to_sql(ty, out),
                _ => v.to_sql(ty, out),
            },
            Value::Text(t) => match *ty {
                Type::INT8 | Type::INT4 | Type::INT2 => {
                    let v: i64 = t.parse().map_err(|_| format!("`{t}` is not an integer"))?;
                    int_to_sql(v, ty, out)
                }
                Type::BYTEA => t.as_bytes().to_sql(ty, out),
                // Postgres text cannot hold NUL (SQLite's can): stored as U+FFFD, so a model's
                // output with a NUL never fails a whole batch.
                _ if t.contains('\0') => t
                    .replace('\0', "\u{FFFD}")
                    .as_str()
                    .to_sql(&Type::TEXT, out),
                _ => t.as_str().to_sql(&Type::TEXT, out),
            },
            Value::Blob(b) => b.as_slice().to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

fn int_to_sql(v: i64, ty: &Type, out: &mut bytes::BytesMut) -> Result<IsNull, BoxError> {
    match *ty {
        Type::INT4 => i32::try_from(v)?.to_sql(ty, out),
        Type::INT2 => i16::try_from(v)?.to_sql(ty, out),
        Type::BOOL => (v != 0).to_sql(ty, out),
        Type::FLOAT8 => (v as f64).to_sql(ty, out),
        Type::TEXT | Type::VARCHAR | Type::UNKNOWN => {
            v.to_string().as_str().to_sql(&Type::TEXT, out)
        }
        _ => v.to_sql(&Type::INT8, out),
    }
}

impl<'a> FromSql<'a> for Value {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Value, BoxError> {
        Ok(match *ty {
            Type::INT8 => Value::Int(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Int(i64::from(i32::from_sql(ty, raw)?)),
            Type::INT2 => Value::Int(i64::from(i16::from_sql(ty, raw)?)),
            Type::BOOL => Value::Int(i64::from(bool::from_sql(ty, raw)?)),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Real(f64::from(f32::from_sql(ty, raw)?)),
            Type::BYTEA => Value::Blob(raw.to_vec()),
            Type::TEXT | Type::VARCHAR | Type::NAME | Type::BPCHAR | Type::UNKNOWN | Type::JSON => {
                Value::Text(String::from_utf8(raw.to_vec())?)
            }
            _ => {
                return Err(format!(
                    "a column of type {ty} (weft reads only integers, floats, text and bytes)"
                )
                .into())
            }
        })
    }

    fn from_sql_null(_: &Type) -> Result<Value, BoxError> {
        Ok(Value::Null)
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parameters_are_numbered_the_postgres_way_outside_quotes() {
        assert_eq!(
            super::numbered("SELECT ?1, '?2', ?12 WHERE a=?3"),
            "SELECT $1, '?2', $12 WHERE a=$3"
        );
    }
}
