//! The store's tables (store.db, or the project's Postgres database): the search index, KV,
//! tombstones, scheduled effects and env values, step by step.

use crate::sql::Step;

/// Scheduled effects (`effects.rs`).
const EFFECTS: &str =
    "CREATE TABLE IF NOT EXISTS effects(id TEXT PRIMARY KEY, thread TEXT NOT NULL,
    kind TEXT NOT NULL, target TEXT NOT NULL, inputs TEXT NOT NULL, due_at TEXT NOT NULL,
    created_at TEXT NOT NULL, status TEXT NOT NULL, result TEXT, claimed_by INTEGER,
    limits TEXT NOT NULL);
    CREATE INDEX IF NOT EXISTS effects_due ON effects(status, due_at);";

/// Env values (`env.rs`; also the user's own env.db).
pub(super) const ENV: &str = "CREATE TABLE IF NOT EXISTS env(scope TEXT NOT NULL, name TEXT NOT NULL,
    value TEXT NOT NULL, secret INTEGER NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY(scope, name));";

/// The store's schema, step by step (see `sql/migrate.rs`).
pub(super) const STEPS: &[Step] = &[
    Step {
        sql: "CREATE TABLE IF NOT EXISTS msgs(
               thread TEXT NOT NULL, directive TEXT NOT NULL, n INTEGER NOT NULL,
               seq INTEGER NOT NULL, role TEXT NOT NULL, text TEXT NOT NULL,
               PRIMARY KEY(thread, n));
             CREATE VIRTUAL TABLE IF NOT EXISTS msgs_fts USING fts5(text, tokenize='unicode61', detail='column');
             CREATE TABLE IF NOT EXISTS indexed(thread TEXT PRIMARY KEY, head INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS deleted(thread TEXT PRIMARY KEY, at TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS kv(thread TEXT NOT NULL, key TEXT NOT NULL,
               value TEXT NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY(thread, key));",
        // Words as FTS5's unicode61 finds them: `folded` is the text lower-cased and without
        // diacritics, folded here in Rust (whatever the database's locale), at most
        // `FOLDED_MAX` bytes of it (a tsvector holds at most 1 MiB); the `simple`
        // configuration splits it (no stemming, no stop words).
        postgres: Some(
            "CREATE TABLE IF NOT EXISTS msgs(
               thread TEXT NOT NULL, directive TEXT NOT NULL, n BIGINT NOT NULL,
               seq BIGINT NOT NULL, role TEXT NOT NULL, text TEXT NOT NULL, folded TEXT NOT NULL,
               words tsvector GENERATED ALWAYS AS (to_tsvector('simple', folded)) STORED,
               PRIMARY KEY(thread, n));
             CREATE INDEX IF NOT EXISTS msgs_words ON msgs USING GIN(words);
             CREATE TABLE IF NOT EXISTS indexed(thread TEXT PRIMARY KEY, head BIGINT NOT NULL);
             CREATE TABLE IF NOT EXISTS deleted(thread TEXT PRIMARY KEY, at TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS kv(thread TEXT NOT NULL, key TEXT NOT NULL,
               value TEXT NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY(thread, key));",
        ),
    },
    Step {
        sql: EFFECTS,
        postgres: None,
    },
    Step {
        sql: ENV,
        postgres: None,
    },
];
