//! What goes into and comes out of a statement, whichever the engine: [`Value`], [`Row`] and
//! [`SqlError`].

/// A value going into or coming out of a statement.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// SQL NULL.
    Null,
    /// An integer (SQLite INTEGER, Postgres BIGINT/INT/SMALLINT/BOOLEAN).
    Int(i64),
    /// A float (search ranks).
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes (SQLite BLOB, Postgres BYTEA).
    Blob(Vec<u8>),
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Value {
        Value::Text(v.clone())
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(i64::from(v))
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Int(i64::from(v))
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Value {
        Value::Blob(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::Null, Into::into)
    }
}

/// A database failure, with the engine's message (never the URL's password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SqlError(pub(crate) String);

impl SqlError {
    pub(crate) fn new(e: impl std::fmt::Display) -> SqlError {
        SqlError(e.to_string())
    }
}

/// One row of a result.
#[derive(Debug, Clone)]
pub(crate) struct Row(pub(crate) Vec<Value>);

impl Row {
    fn at(&self, i: usize) -> Result<&Value, SqlError> {
        self.0
            .get(i)
            .ok_or_else(|| SqlError(format!("column {i} is not in the result")))
    }

    /// Column `i` as bytes.
    pub(crate) fn blob(&self, i: usize) -> Result<Vec<u8>, SqlError> {
        match self.at(i)? {
            Value::Blob(b) => Ok(b.clone()),
            Value::Text(t) => Ok(t.clone().into_bytes()),
            other => Err(SqlError(format!(
                "column {i}: expected bytes, found {other:?}"
            ))),
        }
    }

    /// Column `i` as an integer.
    pub(crate) fn int(&self, i: usize) -> Result<i64, SqlError> {
        self.opt_int(i)?
            .ok_or_else(|| SqlError(format!("column {i} is NULL, an integer was expected")))
    }

    /// Column `i` as an integer or NULL.
    pub(crate) fn opt_int(&self, i: usize) -> Result<Option<i64>, SqlError> {
        match self.at(i)? {
            Value::Null => Ok(None),
            Value::Int(v) => Ok(Some(*v)),
            Value::Real(v) => Ok(Some(*v as i64)),
            Value::Text(t) => t
                .parse()
                .map(Some)
                .map_err(|_| SqlError(format!("column {i} holds `{t}`, an integer was expected"))),
            Value::Blob(_) => Err(SqlError(format!("column {i} holds bytes, not an integer"))),
        }
    }

    /// Column `i` as an unsigned integer (a negative value is an error).
    pub(crate) fn uint(&self, i: usize) -> Result<u64, SqlError> {
        let v = self.int(i)?;
        u64::try_from(v).map_err(|_| SqlError(format!("column {i} holds {v}, not a count")))
    }

    /// Column `i` as a float.
    pub(crate) fn real(&self, i: usize) -> Result<f64, SqlError> {
        match self.at(i)? {
            Value::Real(v) => Ok(*v),
            Value::Int(v) => Ok(*v as f64),
            other => Err(SqlError(format!(
                "column {i} holds {other:?}, not a number"
            ))),
        }
    }

    /// Column `i` as text (NULL is an error).
    pub(crate) fn text(&self, i: usize) -> Result<String, SqlError> {
        self.opt_text(i)?
            .ok_or_else(|| SqlError(format!("column {i} is NULL, text was expected")))
    }

    /// Column `i` as text or NULL.
    pub(crate) fn opt_text(&self, i: usize) -> Result<Option<String>, SqlError> {
        match self.at(i)? {
            Value::Null => Ok(None),
            Value::Text(t) => Ok(Some(t.clone())),
            Value::Int(v) => Ok(Some(v.to_string())),
            Value::Real(v) => Ok(Some(v.to_string())),
            Value::Blob(b) => String::from_utf8(b.clone())
                .map(Some)
                .map_err(|_| SqlError(format!("column {i} holds bytes that are not UTF-8"))),
        }
    }

    /// Column `i` as a flag (non-zero integer).
    pub(crate) fn flag(&self, i: usize) -> Result<bool, SqlError> {
        Ok(self.int(i)? != 0)
    }
}
