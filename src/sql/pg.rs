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
    let mut f = std::pin::pin!(f);
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

/// One connection and its prepared statements.
pub(super) struct Client {
    client: tokio_postgres::Client,
    prepared: RefCell<HashMap<String, tokio_postgres::Statement>>,
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

impl Client {
    /// Connects (at most 10 s; TCP keepalives so a vanished server is noticed).
    pub(super) fn connect(url: &DatabaseUrl) -> Result<Client, SqlError> {
        let mut config: tokio_postgres::Config = url
            .secret()
            .parse()
            .map_err(|e| SqlError(format!("{url}: not a Postgres connection string: {e}")))?;
        config
            .connect_timeout(Duration::from_secs(10))
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .application_name("weft");
        let handle = driver()?;
        let connecting = handle.spawn(async move { config.connect(tokio_postgres::NoTls).await });
        let (client, connection) = block_on(connecting)
            .map_err(|e| SqlError(format!("{url}: {e}")))?
            .map_err(|e| SqlError(format!("{url}: cannot connect: {}", pg_error(e))))?;
        let shown = url.to_string();
        handle.spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!("postgres connection to {shown} ended: {e}");
            }
        });
        let c = Client {
            client,
            prepared: RefCell::new(HashMap::new()),
        };
        // weft's SQL compares and orders text byte-wise, as SQLite does.
        c.batch("SET client_min_messages = warning")?;
        Ok(c)
    }

    fn statement(&self, sql: &str) -> Result<tokio_postgres::Statement, SqlError> {
        if let Some(s) = self.prepared.borrow().get(sql) {
            return Ok(s.clone());
        }
        let st = block_on(self.client.prepare(&numbered(sql))).map_err(pg_error)?;
        self.prepared
            .borrow_mut()
            .insert(sql.to_string(), st.clone());
        Ok(st)
    }

    pub(super) fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, SqlError> {
        let st = self.statement(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        block_on(self.client.execute(&st, &refs)).map_err(pg_error)
    }

    pub(super) fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, SqlError> {
        let st = self.statement(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        let rows = block_on(self.client.query(&st, &refs)).map_err(pg_error)?;
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
        block_on(self.client.batch_execute(sql)).map_err(pg_error)
    }

    /// `BEGIN`, then the concern's advisory lock (held until the transaction ends): taken at
    /// once when free; when another process holds it, the wait leaves the async workers free.
    pub(super) fn begin_locked(&self, key: i64) -> Result<(), SqlError> {
        self.batch("BEGIN")?;
        let got = self
            .query("SELECT pg_try_advisory_xact_lock(?1)", &[Value::Int(key)])
            .and_then(|rows| match rows.first() {
                Some(r) => r.flag(0),
                None => Ok(false),
            });
        let locked = match got {
            Ok(true) => Ok(()),
            Ok(false) => {
                let st = self.statement("SELECT pg_advisory_xact_lock(?1)")?;
                wait(self.client.query(&st, &[&key]))
                    .map(|_| ())
                    .map_err(pg_error)
            }
            Err(e) => Err(e),
        };
        if locked.is_err() {
            let _ = self.batch("ROLLBACK");
        }
        locked
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
