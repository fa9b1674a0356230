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

    /// Whether the string is a URL (`scheme://…`: the `://` comes before any `=` or space),
    /// not a libpq `key=value` string (whose values may hold a `://`).
    fn is_url(&self) -> bool {
        let s = &self.0;
        match s.find("://") {
            Some(i) => !s[..i].contains(|c: char| c == '=' || c.is_whitespace()),
            None => false,
        }
    }

    /// The byte ranges of the string that hold a password (in the URL's user part, a
    /// `password` query parameter, or a `password` key of the `key=value` form), as the
    /// connector reads them; over-wide rather than short.
    fn secret_spans(&self) -> Vec<std::ops::Range<usize>> {
        let s = &self.0;
        if !self.is_url() {
            return key_value_passwords(s);
        }
        let start = s.find("://").map_or(0, |i| i + 3);
        let rest = &s[start..];
        let mut spans = Vec::new();
        // The user part: from its `:` to an `@` (the connector takes the first; the last one
        // hides a raw `@` in a password too).
        if let (Some(colon), Some(at)) = (rest.find(':'), rest.rfind('@')) {
            if colon < at {
                spans.push(start + colon + 1..start + at);
            }
        }
        // Query parameters anywhere after the scheme whose key decodes to `password`.
        let mut i = start;
        for part in rest.split(['?', '&']) {
            if let Some((key, value)) = part.split_once('=') {
                if percent_decode(key) == "password" {
                    let at = i + key.len() + 1;
                    spans.push(at..at + value.len());
                }
            }
            i += part.len() + 1;
        }
        spans
    }

    /// Every password in the string, as the server would receive it (so the redactor can
    /// hide each anywhere).
    pub fn passwords(&self) -> Vec<String> {
        let url = self.is_url();
        self.secret_spans()
            .into_iter()
            .map(|span| {
                let raw = &self.0[span];
                if url {
                    percent_decode(raw)
                } else {
                    unquote(raw)
                }
            })
            .filter(|p| !p.is_empty())
            .collect()
    }

    /// The password the connector uses (the last one given), if any.
    pub fn password(&self) -> Option<String> {
        self.passwords().pop()
    }

    /// `text` with this URL's password (raw or decoded) replaced by `***`: for messages that
    /// might quote the connection string.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for span in self.secret_spans() {
            let raw = &self.0[span];
            for form in [raw.to_string(), percent_decode(raw), unquote(raw)] {
                if !form.is_empty() {
                    out = out.replace(&form, "***");
                }
            }
        }
        out
    }
}

/// The value spans of `password` keys in a libpq `key = value` string: a value is quoted
/// (`'…'`, with `\'` and `\\`) or runs to the next space.
fn key_value_passwords(s: &str) -> Vec<std::ops::Range<usize>> {
    let b = s.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    let skip_space = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    while i < b.len() {
        skip_space(&mut i);
        let key_start = i;
        while i < b.len() && b[i] != b'=' && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &s[key_start..i];
        skip_space(&mut i);
        if i >= b.len() || b[i] != b'=' {
            continue;
        }
        i += 1;
        skip_space(&mut i);
        let value_start = i;
        let quoted = i < b.len() && b[i] == b'\'';
        if quoted {
            i += 1;
        }
        while i < b.len()
            && !(if quoted {
                b[i] == b'\''
            } else {
                b[i].is_ascii_whitespace()
            })
        {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        if quoted && i < b.len() {
            i += 1;
        }
        i = i.min(b.len());
        if key == "password" {
            spans.push(value_start..i);
        }
    }
    spans
}

/// A `key=value` value as libpq reads it: quotes removed, backslash escapes resolved.
fn unquote(raw: &str) -> String {
    let inner = raw
        .strip_prefix('\'')
        .and_then(|r| r.strip_suffix('\''))
        .unwrap_or(raw);
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.extend(chars.next());
        } else {
            out.push(c);
        }
    }
    out
}

/// `%XX` sequences decoded (invalid ones kept as they are).
fn percent_decode(raw: &str) -> String {
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let hex = |c: u8| (c as char).to_digit(16);
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut spans = self.secret_spans();
        spans.sort_by_key(|r| r.start);
        let mut at = 0;
        for span in spans {
            if span.start < at {
                continue;
            }
            f.write_str(&self.0[at..span.start])?;
            f.write_str("***")?;
            at = span.end;
        }
        f.write_str(&self.0[at..])
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
        for (given, shown, password) in [
            (
                "postgres://weft:s3cr%t@db:5432/weft",
                "postgres://weft:***@db:5432/weft",
                "s3cr%t",
            ),
            (
                "postgres://weft:ab/cd+ef@db/weft",
                "postgres://weft:***@db/weft",
                "ab/cd+ef",
            ),
            ("postgres://u:p?q=1@h/d", "postgres://u:***@h/d", "p?q=1"),
            ("postgres://u:p%40ss@h/d", "postgres://u:***@h/d", "p@ss"),
            (
                "postgresql://u@h/d?password=hunter2&x=1",
                "postgresql://u@h/d?password=***&x=1",
                "hunter2",
            ),
            (
                "host=/tmp dbname=w password='pw 9' user=u",
                "host=/tmp dbname=w password=*** user=u",
                "pw 9",
            ),
            (
                "host=/tmp password = xyzzy1 user=u",
                "host=/tmp password = *** user=u",
                "xyzzy1",
            ),
            (
                r"host=/tmp password=pass\ word user=u",
                "host=/tmp password=*** user=u",
                "pass word",
            ),
        ] {
            let u = DatabaseUrl::parse(given).unwrap();
            assert_eq!(u.to_string(), shown, "{given}");
            assert_eq!(u.password().as_deref(), Some(password), "{given}");
            assert!(!format!("{u:?}").contains(password), "{given}");
            let quoted = format!("error connecting to {given}: refused ({password})");
            assert!(!u.scrub(&quoted).contains(password), "{}", u.scrub(&quoted));
        }
        let plain = DatabaseUrl::parse("postgres://u@h/d").unwrap();
        assert_eq!(plain.to_string(), "postgres://u@h/d");
        assert_eq!(plain.password(), None);
        let two = DatabaseUrl::parse("postgres://u:first1@h/d?password=second2").unwrap();
        assert_eq!(two.passwords(), ["first1", "second2"]);
        let e = DatabaseUrl::parse("mysql://u:topsecret@h/d").unwrap_err();
        assert!(!e.to_string().contains("topsecret"), "{e}");
        assert!(e.to_string().contains("postgres://"), "{e}");
    }
}
