//! Environment values (SPEC §10): set per thread, per project (`store.db`) or per user
//! (`<user config dir>/env.db`), resolved thread → parent chain → project → user. A secret is
//! kept encrypted (ChaCha20-Poly1305, a random nonce per value, the scope and name as
//! associated data) with a key in the user's config dir (`secrets.key`, 0600): a copied project
//! holds no secret in clear, and a value moved to another slot does not decrypt.

use super::{storage, FileStore, StoreError};
use crate::core::ids::ThreadId;
use crate::core::redact::{Redactor, MIN_SECRET_LEN};
use crate::sql::{params, Db};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use std::collections::BTreeMap;
use std::path::Path;

/// Where a value is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The user's own, for every project.
    User,
    /// The project's.
    Project,
    /// One thread's (and, by resolution, its descendants').
    Thread(ThreadId),
}

impl Scope {
    fn key(&self) -> String {
        match self {
            Scope::User => "user".into(),
            Scope::Project => "project".into(),
            Scope::Thread(id) => format!("thread:{id}"),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::User => write!(f, "the user (every project)"),
            Scope::Project => write!(f, "the project"),
            Scope::Thread(id) => write!(f, "thread {id} and its descendants"),
        }
    }
}

/// One value as listed or resolved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EnvValue {
    /// The variable.
    pub name: String,
    /// `user`, `project` or `thread:<id>`.
    pub scope: String,
    /// A secret (its value is never shown).
    pub secret: bool,
    /// The value; for a secret in a listing, None.
    pub value: Option<String>,
}

fn check_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        return Ok(());
    }
    Err(StoreError::Invalid {
        rule: "env.name",
        detail: format!(
            "`{name}` is not a variable name: letters, digits and `_`, not starting with a digit"
        ),
    })
}

/// The user's secrets key, made on first use (written aside, then renamed into place).
fn secrets_key(user_dir: &Path) -> Result<ChaCha20Poly1305, StoreError> {
    let path = user_dir.join("secrets.key");
    let hex = match std::fs::read_to_string(&path) {
        Ok(h) => h,
        Err(_) => {
            let mut k = [0u8; 32];
            getrandom::fill(&mut k).map_err(storage)?;
            let hex = crate::core::ids::hex(&k);
            std::fs::create_dir_all(user_dir).map_err(storage)?;
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            write_private(&tmp, &hex).map_err(storage)?;
            // Of two processes making it at once, the first rename wins; both then read it.
            if std::fs::hard_link(&tmp, &path).is_err() && !path.exists() {
                return Err(storage(format!("{}: cannot be written", path.display())));
            }
            let _ = std::fs::remove_file(&tmp);
            std::fs::read_to_string(&path).map_err(storage)?
        }
    };
    let bytes = crate::core::ids::unhex(hex.trim())
        .filter(|b| b.len() == 32)
        .ok_or_else(|| storage(format!("{}: not a 32-byte hex key; remove it to make a new one (its secrets are then lost)", path.display())))?;
    Ok(ChaCha20Poly1305::new(Key::from_slice(&bytes)))
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

fn seal(key: &ChaCha20Poly1305, slot: &str, value: &str) -> Result<String, StoreError> {
    let mut nonce = [0u8; 12];
    getrandom::fill(&mut nonce).map_err(storage)?;
    let sealed = key
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: value.as_bytes(),
                aad: slot.as_bytes(),
            },
        )
        .map_err(|_| storage("encryption failed"))?;
    Ok(format!(
        "v1:{}{}",
        crate::core::ids::hex(&nonce),
        crate::core::ids::hex(&sealed)
    ))
}

fn open_sealed(key: &ChaCha20Poly1305, slot: &str, text: &str) -> Option<String> {
    let bytes = crate::core::ids::unhex(text.strip_prefix("v1:")?)?;
    if bytes.len() < 12 {
        return None;
    }
    let (nonce, sealed) = bytes.split_at(12);
    let plain = key
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: sealed,
                aad: slot.as_bytes(),
            },
        )
        .ok()?;
    String::from_utf8(plain).ok()
}

/// Every row of `scopes` in `db`: (scope, name, stored value, secret).
fn rows(db: &Db, scopes: &[String]) -> Result<Vec<(String, String, String, bool)>, StoreError> {
    let mut out = Vec::new();
    for scope in scopes {
        let found = db
            .query(
                "SELECT name, value, secret FROM env WHERE scope=?1 ORDER BY name",
                params![scope.as_str()],
            )
            .map_err(storage)?;
        for r in found {
            let row = (|| Ok((scope.clone(), r.text(0)?, r.text(1)?, r.flag(2)?)))()
                .map_err(|e: crate::sql::SqlError| storage(e))?;
            out.push(row);
        }
    }
    Ok(out)
}

/// The first value of each name in `found` (nearest scope first), secrets decrypted; the key is
/// read only when there is a secret to open.
fn resolve(
    found: Vec<(String, String, String, bool)>,
) -> Result<BTreeMap<String, EnvValue>, StoreError> {
    let mut key = None;
    let mut out = BTreeMap::new();
    for (scope, name, stored, secret) in found {
        if out.contains_key(&name) {
            continue;
        }
        let value = match secret {
            false => stored,
            true => {
                if key.is_none() {
                    key = Some(secrets_key(&crate::project::user_dir())?);
                }
                let k = key.as_ref().ok_or_else(|| storage("no secrets key"))?;
                open_sealed(k, &format!("{scope}/{name}"), &stored).ok_or_else(|| {
                    storage(format!("secret {name} ({scope}) does not decrypt with this user's key; set it again with `weft env set {name} - --secret`"))
                })?
            }
        };
        out.insert(
            name.clone(),
            EnvValue {
                name,
                scope,
                secret,
                value: Some(value),
            },
        );
    }
    Ok(out)
}

impl FileStore {
    /// The database of `scope`'s values: the user's own env.db in their config folder, or the
    /// project's store (store.db, or its Postgres database).
    fn with_env_db<T>(
        &self,
        scope: &Scope,
        f: impl FnOnce(&Db) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match scope {
            Scope::User => {
                let dir = crate::project::user_dir();
                std::fs::create_dir_all(&dir).map_err(storage)?;
                let db = rusqlite::Connection::open(dir.join("env.db")).map_err(storage)?;
                db.execute_batch(&format!("PRAGMA busy_timeout=5000; {}", super::schema::ENV))
                    .map_err(storage)?;
                f(&Db::sqlite(db))
            }
            _ => self.idx(|c| f(c)),
        }
    }

    /// Sets `name` in `scope`; a secret is stored encrypted.
    pub fn env_set(
        &self,
        scope: &Scope,
        name: &str,
        value: &str,
        secret: bool,
    ) -> Result<(), StoreError> {
        check_name(name)?;
        if secret && value.len() < MIN_SECRET_LEN {
            return Err(StoreError::Invalid {
                rule: "env.secret",
                detail: format!("a secret must be at least {MIN_SECRET_LEN} bytes: a shorter one would be redacted out of ordinary text"),
            });
        }
        if let Scope::Thread(id) = scope {
            self.row(id)?;
            self.refuse_shadow(name)?;
        }
        let slot = format!("{}/{name}", scope.key());
        let stored = match secret {
            true => seal(&secrets_key(&crate::project::user_dir())?, &slot, value)?,
            false => value.to_string(),
        };
        self.with_env_db(scope, |db| {
            db.execute(
                "INSERT INTO env(scope, name, value, secret, updated_at) VALUES(?1,?2,?3,?4,?5)
                 ON CONFLICT(scope, name) DO UPDATE SET value=excluded.value,
                   secret=excluded.secret, updated_at=excluded.updated_at",
                params![
                    scope.key(),
                    name,
                    stored,
                    secret,
                    crate::core::ids::now_ts()
                ],
            )
            .map(|_| ())
            .map_err(storage)
        })?;
        self.touch(scope);
        Ok(())
    }

    /// Removes `name` from `scope`; false when it was not set there.
    pub fn env_unset(&self, scope: &Scope, name: &str) -> Result<bool, StoreError> {
        check_name(name)?;
        let gone = self.with_env_db(scope, |db| {
            db.execute(
                "DELETE FROM env WHERE scope=?1 AND name=?2",
                params![scope.key(), name],
            )
            .map(|n| n > 0)
            .map_err(storage)
        })?;
        self.touch(scope);
        Ok(gone)
    }

    /// A thread's value never shadows the project's or the user's: a name either holds is
    /// refused for thread scope (a model with `env.set` cannot redirect what a project decided,
    /// such as the endpoint a tool sends a token to).
    fn refuse_shadow(&self, name: &str) -> Result<(), StoreError> {
        for (scope, whose) in [(Scope::Project, "the project"), (Scope::User, "the user")] {
            if self.env_list(&scope)?.iter().any(|v| v.name == name) {
                return Err(StoreError::Invalid {
                    rule: "env.shadow",
                    detail: format!("`{name}` is set by {whose}; a thread's value never overrides it (change it with `weft env set {name} …`{})", if whose == "the user" { " --user" } else { "" }),
                });
            }
        }
        Ok(())
    }

    /// The values set in `scope` (secrets without their value).
    pub fn env_list(&self, scope: &Scope) -> Result<Vec<EnvValue>, StoreError> {
        self.with_env_db(scope, |db| rows(db, &[scope.key()]))
            .map(|rows| {
                rows.into_iter()
                    .map(|(scope, name, value, secret)| EnvValue {
                        name,
                        scope,
                        secret,
                        value: (!secret).then_some(value),
                    })
                    .collect()
            })
    }

    /// What `id` sees: the project's values, then the user's, then its own and its ancestors'
    /// (nearest first) for names neither sets — a thread never shadows the project or the user
    /// — secrets decrypted (for the processes that need them, never to print).
    pub fn env_resolve(&self, id: &ThreadId) -> Result<BTreeMap<String, EnvValue>, StoreError> {
        let mut chain = Vec::new();
        let mut cur = Some(id.clone());
        while let Some(t) = cur.take() {
            if chain.len() > 1000 {
                break;
            }
            cur = self.reg(|s| s.get(&t))?.and_then(|r| r.parent_id);
            chain.push(format!("thread:{t}"));
        }
        let mut found =
            self.with_env_db(&Scope::Project, |db| rows(db, &["project".to_string()]))?;
        found.extend(self.with_env_db(&Scope::User, |db| rows(db, &["user".to_string()]))?);
        found.extend(self.with_env_db(&Scope::Project, |db| rows(db, &chain))?);
        resolve(found)
    }

    /// The values every thread shares: the project's over the user's, secrets decrypted (for
    /// processes started once per runtime, such as MCP servers).
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn env_shared(&self) -> Result<BTreeMap<String, String>, StoreError> {
        let mut found =
            self.with_env_db(&Scope::Project, |db| rows(db, &["project".to_string()]))?;
        found.extend(self.with_env_db(&Scope::User, |db| rows(db, &["user".to_string()]))?);
        Ok(resolve(found)?
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.value?)))
            .collect())
    }

    /// Every secret of the project, its threads and the user that this user's key opens, as a
    /// redactor. A secret that does not decrypt cannot leak from here either: it is skipped.
    pub(crate) fn redactor(&self) -> Redactor {
        let read = |scope: &Scope| {
            self.with_env_db(scope, |db| {
                db.query("SELECT scope, name, value FROM env WHERE secret=1", &[])
                    .map_err(storage)?
                    .iter()
                    .map(|r| Ok((r.text(0)?, r.text(1)?, r.text(2)?)))
                    .collect::<Result<Vec<_>, crate::sql::SqlError>>()
                    .map_err(storage)
            })
            .unwrap_or_default()
        };
        let mut sealed = read(&Scope::Project);
        sealed.extend(read(&Scope::User));
        // The database's password is a secret too: never in a transcript, a log or an event.
        let database = self
            .project()
            .config()
            .ok()
            .and_then(|c| c.database)
            .map(|url| url.passwords())
            .unwrap_or_default()
            .into_iter()
            .map(|pw| ("WEFT_DATABASE_PASSWORD".to_string(), pw));
        let key = match sealed.is_empty() {
            true => None,
            false => secrets_key(&crate::project::user_dir()).ok(),
        };
        let opened = sealed.into_iter().filter_map(|(scope, name, stored)| {
            let key = key.as_ref()?;
            open_sealed(key, &format!("{scope}/{name}"), &stored).map(|v| (name, v))
        });
        let all: Vec<(String, String)> = opened.chain(database).collect();
        if all.is_empty() {
            return Redactor::default();
        }
        Redactor::new(all)
    }

    /// When the values of the project (its threads included) and of the user last changed:
    /// two `stat`s, so a runtime can check before every tool result whether to reload its
    /// redactor.
    pub(crate) fn env_stamps(
        &self,
    ) -> (Option<std::time::SystemTime>, Option<std::time::SystemTime>) {
        let at = |p: std::path::PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        (
            at(self.stamp_path(&Scope::Project)),
            at(self.stamp_path(&Scope::User)),
        )
    }

    fn stamp_path(&self, scope: &Scope) -> std::path::PathBuf {
        match scope {
            Scope::User => crate::project::user_dir().join("env.stamp"),
            _ => self.project().state_dir().join("env.stamp"),
        }
    }

    /// How many values this process changed (a runtime reloads its redactor when it moves).
    pub(crate) fn env_changes(&self) -> u64 {
        self.env_changes.load(std::sync::atomic::Ordering::Acquire)
    }

    fn touch(&self, scope: &Scope) {
        self.env_changes
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let _ = std::fs::write(self.stamp_path(scope), crate::core::ids::now_ts());
    }
}
