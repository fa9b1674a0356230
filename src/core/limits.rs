//! Limits: what a thread may use (turns, tokens, spend, duration, depth, spawns, concurrency),
//! and their resolution `defaults → directive → caller overrides → parent cap` (SPEC §4 step 3).
//!
//! Owns the arithmetic of inheritance only; it knows nothing of the ledger or of actors.

use crate::core::money::{MoneyError, Nanos};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A limit that cannot be set.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    /// A count that is not a whole number.
    #[error("limit `{name}`: `{text}` is not {what}")]
    NotWhole {
        /// The limit.
        name: String,
        /// The value given.
        text: String,
        /// What was expected, e.g. "a whole number of turns".
        what: &'static str,
    },
    /// A spend that is not a USD amount.
    #[error("limit `spend`: {0}")]
    Spend(MoneyError),
    /// A duration that cannot be read.
    #[error("limit `duration`: `{0}` is not a duration (e.g. 90s, 2m, 1h 30m)")]
    Duration(String),
    /// No limit has this name.
    #[error("unknown limit `{0}` (known: {known})", known = LIMIT_NAMES.join(", "))]
    Unknown(String),
}

/// A partial set of limits as written in config, a directive or an override. `None` = not set here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitSet {
    /// Most LLM calls (turns) the thread may make.
    pub turns: Option<u64>,
    /// Most tokens (input + output) the thread's own calls may use.
    pub tokens: Option<u64>,
    /// Most money the thread and its whole subtree may spend.
    pub spend: Option<Nanos>,
    /// Wall-clock time the thread may run.
    pub duration: Option<Duration>,
    /// How many levels of descendants the thread may have below it.
    pub depth: Option<i64>,
    /// Most children the thread may spawn over its life.
    pub spawns: Option<u64>,
    /// Most children alive at once.
    pub concurrency: Option<u64>,
}

/// Every limit resolved to a concrete value; what a thread runs under and signs in thread.json.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Most LLM calls.
    pub turns: u64,
    /// Most tokens of the thread's own calls.
    pub tokens: u64,
    /// Spend cap of the thread's subtree, nano-USD.
    pub spend: Nanos,
    /// Wall-clock cap, in milliseconds.
    pub duration_ms: u64,
    /// Levels of descendants allowed below this thread.
    pub depth: i64,
    /// Children over the thread's life.
    pub spawns: u64,
    /// Children alive at once.
    pub concurrency: u64,
}

impl Limits {
    /// The duration limit as a `Duration`.
    pub fn duration(&self) -> Duration {
        Duration::from_millis(self.duration_ms)
    }
}

/// The names accepted in `limits:` maps and `--limit k=v`.
pub(crate) const LIMIT_NAMES: [&str; 7] = [
    "turns",
    "tokens",
    "spend",
    "duration",
    "depth",
    "spawns",
    "concurrency",
];

/// JSON Schema of a `limits:` map (front matter, `defaults.limits`): the names [`LimitSet::set`]
/// takes, each in the forms it reads.
#[cfg(feature = "cli")]
pub(crate) fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let whole = serde_json::json!([
        { "type": "integer", "minimum": 0 }, { "type": "string", "pattern": "^\\s*[0-9]+\\s*$" }
    ]);
    schemars::json_schema!({
        "type": ["object", "null"],
        "additionalProperties": false,
        "properties": {
            "turns": { "description": "most LLM calls", "anyOf": whole },
            "tokens": { "description": "most tokens (input + output) of the thread's own calls", "anyOf": whole },
            "spawns": { "description": "most children over the thread's life", "anyOf": whole },
            "concurrency": { "description": "most children alive at once", "anyOf": whole },
            "depth": { "description": "levels of descendants below the thread", "anyOf": [
                { "type": "integer" }, { "type": "string", "pattern": "^\\s*-?[0-9]+\\s*$" } ] },
            "spend": { "description": "most USD the thread and its subtree may spend (e.g. 0.50 or \"$0.50\")", "anyOf": usd_forms() },
            "duration": { "description": "wall-clock time: whole seconds, or a duration with its unit (10m, 90s, 1h 30m)", "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": "^\\s*([0-9]+\\s*[a-zA-Zµ]+\\s*)+$" } ] }
        }
    })
}

/// The forms a USD amount takes (`Nanos::from_json_usd`): a number, or a decimal string with at
/// most 9 decimals and an optional `$`.
#[cfg(feature = "cli")]
fn usd_forms() -> serde_json::Value {
    serde_json::json!([
        { "type": "number", "minimum": 0 },
        { "type": "string", "pattern": "^\\s*\\$?\\s*([0-9]+(\\.[0-9]{0,9})?|\\.[0-9]{1,9})\\s*$" }
    ])
}

/// JSON Schema of a USD amount (a price per million tokens), or nothing.
#[cfg(feature = "cli")]
pub(crate) fn usd_json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut forms = usd_forms();
    if let Some(f) = forms.as_array_mut() {
        f.push(serde_json::json!({ "type": "null" }));
    }
    schemars::json_schema!({ "description": "USD per million tokens", "anyOf": forms })
}

/// Built-in defaults, used under any config: 15 turns, 200k tokens, $0.50, 10 min, depth 5,
/// 20 spawns, 5 concurrent children.
pub(crate) fn builtin_defaults() -> LimitSet {
    LimitSet {
        turns: Some(15),
        tokens: Some(200_000),
        spend: Some(Nanos(500_000_000)),
        duration: Some(Duration::from_secs(600)),
        depth: Some(5),
        spawns: Some(20),
        concurrency: Some(5),
    }
}

impl LimitSet {
    /// `self` with every value that `over` sets replaced by it.
    pub fn overlay(&self, over: &LimitSet) -> LimitSet {
        LimitSet {
            turns: over.turns.or(self.turns),
            tokens: over.tokens.or(self.tokens),
            spend: over.spend.or(self.spend),
            duration: over.duration.or(self.duration),
            depth: over.depth.or(self.depth),
            spawns: over.spawns.or(self.spawns),
            concurrency: over.concurrency.or(self.concurrency),
        }
    }

    /// Sets one limit from text (`--limit k=v`, YAML scalar). Errors name the limit and the
    /// expected form; unknown names are refused.
    pub fn set(&mut self, name: &str, value: &serde_json::Value) -> Result<(), LimitError> {
        let text = match value {
            serde_json::Value::String(s) => s.trim().to_string(),
            other => other.to_string(),
        };
        let not_whole = |what: &'static str| LimitError::NotWhole {
            name: name.into(),
            text: text.clone(),
            what,
        };
        let int = |what: &'static str| text.parse::<u64>().map_err(|_| not_whole(what));
        match name {
            "turns" => self.turns = Some(int("a whole number of turns")?),
            "tokens" => self.tokens = Some(int("a whole number of tokens")?),
            "spawns" => self.spawns = Some(int("a whole number of spawns")?),
            "concurrency" => self.concurrency = Some(int("a whole number of threads")?),
            "depth" => {
                self.depth = Some(
                    text.parse::<i64>()
                        .map_err(|_| not_whole("a whole number"))?,
                )
            }
            "spend" => self.spend = Some(Nanos::from_json_usd(value).map_err(LimitError::Spend)?),
            "duration" => {
                let d = match value {
                    serde_json::Value::Number(n) => n.as_u64().map(Duration::from_secs),
                    _ => humantime::parse_duration(&text).ok(),
                };
                self.duration = Some(d.ok_or_else(|| LimitError::Duration(text.clone()))?)
            }
            other => return Err(LimitError::Unknown(other.into())),
        }
        Ok(())
    }

    /// Builds a set from a JSON/YAML map, refusing unknown names.
    pub fn from_map(
        map: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<LimitSet, LimitError> {
        let mut set = LimitSet::default();
        for (k, v) in map {
            set.set(k, v)?;
        }
        Ok(set)
    }
}

/// Resolves limits exactly as SPEC §4 step 3: `defaults → directive → overrides`, then every
/// value is `min(own, parent)` and `depth = min(own, parent.depth − 1)`.
///
/// A parent's value is always a cap, even when it equals the default. The result may have a
/// negative depth; the caller refuses that before any LLM call (see [`check_depth`]).
pub(crate) fn resolve(
    defaults: &LimitSet,
    directive: &LimitSet,
    overrides: &LimitSet,
    parent: Option<&Limits>,
) -> Limits {
    let own = builtin_defaults()
        .overlay(defaults)
        .overlay(directive)
        .overlay(overrides);
    let b = builtin_defaults();
    let mut l = Limits {
        turns: own.turns.or(b.turns).unwrap_or(15),
        tokens: own.tokens.or(b.tokens).unwrap_or(200_000),
        spend: own.spend.or(b.spend).unwrap_or(Nanos(500_000_000)),
        duration_ms: own
            .duration
            .or(b.duration)
            .map_or(600_000, |d| d.as_millis() as u64),
        depth: own.depth.or(b.depth).unwrap_or(5),
        spawns: own.spawns.or(b.spawns).unwrap_or(20),
        concurrency: own.concurrency.or(b.concurrency).unwrap_or(5),
    };
    if let Some(p) = parent {
        l.turns = l.turns.min(p.turns);
        l.tokens = l.tokens.min(p.tokens);
        l.spend = l.spend.min(p.spend);
        l.duration_ms = l.duration_ms.min(p.duration_ms);
        l.depth = l.depth.min(p.depth - 1);
        l.spawns = l.spawns.min(p.spawns);
        l.concurrency = l.concurrency.min(p.concurrency);
    }
    l
}

/// `l` lowered to every value `by` sets (a value above `l`'s changes nothing): what a model may
/// ask of a child's limits (`spawn_thread {limits}`) — never more than the child's own.
pub(crate) fn lowered(mut l: Limits, by: &LimitSet) -> Limits {
    let cap = |v: &mut u64, o: Option<u64>| *v = o.map_or(*v, |o| o.min(*v));
    cap(&mut l.turns, by.turns);
    cap(&mut l.tokens, by.tokens);
    cap(&mut l.spawns, by.spawns);
    cap(&mut l.concurrency, by.concurrency);
    cap(
        &mut l.duration_ms,
        by.duration.map(|d| d.as_millis() as u64),
    );
    if let Some(sp) = by.spend {
        l.spend = l.spend.min(sp);
    }
    if let Some(d) = by.depth {
        l.depth = l.depth.min(d);
    }
    l
}

/// Refuses a resolved depth below zero, naming the directive.
pub(crate) fn check_depth(limits: &Limits, directive: &str) -> Result<(), String> {
    if limits.depth < 0 {
        return Err(format!(
            "limit exceeded: depth — `{directive}` would run below the tree's depth limit; \
             raise `depth` on the root or spawn fewer levels"
        ));
    }
    Ok(())
}

/// How deep JSON from outside (a model's tool-call arguments, a thread's inputs) may nest.
/// serde_json reads at most 127 levels back, and such values sit a level or two down in a
/// transcript line and in thread.json: deeper ones would be written, signed and never read.
pub(crate) const MAX_NESTING: usize = 64;

/// The one key of the input a tool call gets when its arguments cannot be taken as they came
/// (not JSON, or nested deeper than [`MAX_NESTING`]), with why; the tool phase answers such a
/// call with an error, and runs nothing.
pub(crate) const UNPARSED: &str = "_unparsed_arguments";

/// The input of a call whose arguments are not used, saying `why` and never what came: what
/// is not JSON cannot be redacted field by field (a `set_env` secret), and it is logged.
pub(crate) fn unparsed(why: String) -> serde_json::Value {
    serde_json::json!({ UNPARSED: why })
}

/// A tool call's arguments as weft keeps them: `input`, or when it nests deeper than
/// [`MAX_NESTING`], only why (under [`UNPARSED`]).
pub(crate) fn bounded_input(input: serde_json::Value) -> serde_json::Value {
    match nests_deeper(&input, MAX_NESTING) {
        false => input,
        true => unparsed(format!("nested deeper than {MAX_NESTING} levels")),
    }
}

/// Whether `v` holds arrays or objects nested more than `max` deep (`v` itself counts).
pub(crate) fn nests_deeper(v: &serde_json::Value, max: usize) -> bool {
    use serde_json::Value;
    let deeper = |x: &Value| nests_deeper(x, max - 1);
    match v {
        Value::Array(a) => max == 0 || a.iter().any(deeper),
        Value::Object(o) => max == 0 || o.values().any(deeper),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &str)]) -> LimitSet {
        let mut s = LimitSet::default();
        for (k, v) in pairs {
            s.set(k, &serde_json::Value::String(v.to_string())).unwrap();
        }
        s
    }

    fn limits(turns: u64, spend: &str, depth: i64) -> Limits {
        resolve(
            &set(&[
                ("turns", &turns.to_string()),
                ("spend", spend),
                ("depth", &depth.to_string()),
            ]),
            &LimitSet::default(),
            &LimitSet::default(),
            None,
        )
    }

    #[test]
    fn resolution_table() {
        let d = set(&[("turns", "15"), ("spend", "0.50"), ("depth", "5")]);
        // (directive, overrides, parent) → (turns, spend nanos, depth)
        type Case = (LimitSet, LimitSet, Option<Limits>, (u64, i64, i64));
        let cases: Vec<Case> = vec![
            (
                LimitSet::default(),
                LimitSet::default(),
                None,
                (15, 500_000_000, 5),
            ),
            (
                set(&[("turns", "30")]),
                LimitSet::default(),
                None,
                (30, 500_000_000, 5),
            ),
            (
                set(&[("turns", "30")]),
                set(&[("turns", "10"), ("spend", "0.10")]),
                Some(limits(30, "1.00", 4)),
                (10, 100_000_000, 3),
            ),
            // The parent caps a child asking for more.
            (
                set(&[("turns", "25"), ("spend", "5")]),
                LimitSet::default(),
                Some(limits(3, "0.20", 5)),
                (3, 200_000_000, 4),
            ),
            // A parent value equal to the default is still a cap.
            (
                set(&[("turns", "40")]),
                LimitSet::default(),
                Some(limits(15, "0.50", 5)),
                (15, 500_000_000, 4),
            ),
            // Depth 0 parent gives a child depth -1 (refused by check_depth).
            (
                LimitSet::default(),
                LimitSet::default(),
                Some(limits(15, "0.50", 0)),
                (15, 500_000_000, -1),
            ),
        ];
        for (i, (dir, ov, parent, want)) in cases.into_iter().enumerate() {
            let got = resolve(&d, &dir, &ov, parent.as_ref());
            assert_eq!((got.turns, got.spend.0, got.depth), want, "case {i}");
        }
    }

    #[test]
    fn depth_below_zero_is_refused() {
        let l = resolve(
            &LimitSet::default(),
            &LimitSet::default(),
            &LimitSet::default(),
            Some(&limits(5, "1", 0)),
        );
        assert!(check_depth(&l, "x").unwrap_err().contains("depth"));
    }

    #[test]
    fn unknown_and_malformed_limits_are_refused() {
        let mut s = LimitSet::default();
        assert!(s
            .set("turnz", &"3".into())
            .unwrap_err()
            .to_string()
            .contains("unknown limit `turnz`"));
        assert!(s
            .set("duration", &"soon".into())
            .unwrap_err()
            .to_string()
            .contains("duration"));
        assert!(s.set("spend", &"lots".into()).is_err());
        s.set("duration", &"1h 30m".into()).unwrap();
        assert_eq!(s.duration, Some(Duration::from_secs(5400)));
    }
}
