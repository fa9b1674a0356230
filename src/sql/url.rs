//! Where a project's database is: a `postgres://` URL (or a libpq `key=value` string) whose
//! password is never shown — not by `Display`, not by `Debug`, not in an error.

/// A Postgres connection string. Shown, its password (in the URL's user part, a `password=`
/// query parameter or a `password=` key) is `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

/// Why a connection string is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("database `{shown}`: {why}")]
pub struct BadDatabaseUrl {
    /// The string, password hidden.
    pub shown: String,
    /// What is wrong and what to write instead.
    pub why: String,
}

impl DatabaseUrl {
    /// Checks that `s` names a Postgres database: `postgres://…`, `postgresql://…` or a libpq
    /// `key=value` string with a `host=` or `dbname=`.
    pub fn parse(s: &str) -> Result<DatabaseUrl, BadDatabaseUrl> {
        let s = s.trim();
        let url = DatabaseUrl(s.to_string());
        let refuse = |why: &str| BadDatabaseUrl {
            shown: url.to_string(),
            why: why.into(),
        };
        let is_url = s.starts_with("postgres://") || s.starts_with("postgresql://");
        let is_keys = s.contains('=') && (s.contains("host=") || s.contains("dbname="));
        if s.is_empty() {
            return Err(refuse("empty; write `postgres://USER@HOST:PORT/DB` or remove the key to keep the embedded SQLite"));
        }
        if !is_url && !is_keys {
            return Err(refuse("weft keeps its state in the embedded SQLite (no `database:`) or on PostgreSQL: write `postgres://USER:PASSWORD@HOST:PORT/DB` (or `host=/run/postgresql dbname=DB` for a Unix socket)"));
        }
        if s.contains("sslmode=require") || s.contains("sslmode=verify") {
            return Err(refuse("TLS is not built into this weft; reach the server on a Unix socket, loopback or a private network (sslmode=disable or prefer)"));
        }
        Ok(url)
    }

    /// The string as given, password included: only for connecting.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn secret(&self) -> &str {
        &self.0
    }

    /// The password in the string, if it has one (so the redactor can hide it anywhere).
    pub fn password(&self) -> Option<String> {
        let s = &self.0;
        if let Some((_, rest)) = s.split_once("://") {
            let rest = rest.split(['/', '?']).next().unwrap_or_default();
            let auth = rest.split('@').collect::<Vec<_>>();
            if auth.len() > 1 {
                let user_part = auth[..auth.len() - 1].join("@");
                if let Some((_, pw)) = user_part.split_once(':') {
                    return Some(pw.to_string()).filter(|p| !p.is_empty());
                }
            }
        }
        s.split(['?', '&', ' '])
            .find_map(|kv| kv.strip_prefix("password="))
            .map(|p| p.trim_matches('\'').to_string())
            .filter(|p| !p.is_empty())
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.password() {
            Some(pw) => f.write_str(&self.0.replace(&pw, "***")),
            None => f.write_str(&self.0),
        }
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatabaseUrl({self})")
    }
}

impl<'de> serde::Deserialize<'de> for DatabaseUrl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<DatabaseUrl, D::Error> {
        let s = String::deserialize(d)?;
        DatabaseUrl::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::DatabaseUrl;

    #[test]
    fn the_password_is_never_shown() {
        for (given, shown) in [
            (
                "postgres://weft:s3cr%t@db:5432/weft",
                "postgres://weft:***@db:5432/weft",
            ),
            (
                "postgresql://u@h/d?password=hunter2&x=1",
                "postgresql://u@h/d?password=***&x=1",
            ),
            (
                "host=/tmp dbname=w password='pw9' user=u",
                "host=/tmp dbname=w password='***' user=u",
            ),
            ("postgres://u@h/d", "postgres://u@h/d"),
        ] {
            let u = DatabaseUrl::parse(given).unwrap();
            assert_eq!(u.to_string(), shown);
            assert!(!format!("{u:?}").contains("s3cr") && !format!("{u:?}").contains("hunter2"));
        }
        let e = DatabaseUrl::parse("mysql://u:topsecret@h/d").unwrap_err();
        assert!(!e.to_string().contains("topsecret"), "{e}");
        assert!(e.to_string().contains("postgres://"), "{e}");
    }
}
