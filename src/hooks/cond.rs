//! Hook conditions (SPEC §9): `{path, op, value}` leaves combined with `all`, `any`, `not`,
//! evaluated against an event's context. Paths are dotted and index lists (`child.outputs.0`).

use serde_json::Value;

/// A parsed condition.
#[derive(Debug, Clone)]
pub(crate) enum Cond {
    /// Every one holds.
    All(Vec<Cond>),
    /// At least one holds.
    Any(Vec<Cond>),
    /// It does not hold.
    Not(Box<Cond>),
    /// `path op value`.
    Leaf {
        /// Dotted path into the context.
        path: String,
        /// The comparison.
        op: Op,
        /// The value compared with (unused by `exists`).
        value: Value,
    },
}

/// A comparison.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
    In,
    Contains,
    Regex(regex::Regex),
    Exists,
}

/// The operators a condition takes (`op:`; default `eq`).
pub(crate) const OPS: [&str; 10] = [
    "eq", "ne", "gt", "gte", "lt", "lte", "in", "contains", "regex", "exists",
];

/// Parses a condition; the error says what is wrong (the caller names the file).
pub(crate) fn parse(v: &Value) -> Result<Cond, String> {
    let Some(o) = v.as_object() else {
        return Err(format!("a condition is a mapping, got {v}"));
    };
    if let Some(list) = o.get("all").or_else(|| o.get("any")) {
        let Some(items) = list.as_array() else {
            return Err("`all` / `any` take a list of conditions".into());
        };
        let parsed = items.iter().map(parse).collect::<Result<Vec<_>, _>>()?;
        return Ok(if o.contains_key("all") {
            Cond::All(parsed)
        } else {
            Cond::Any(parsed)
        });
    }
    if let Some(inner) = o.get("not") {
        return Ok(Cond::Not(Box::new(parse(inner)?)));
    }
    let path = o
        .get("path")
        .and_then(Value::as_str)
        .ok_or("a condition needs `path` (or `all`, `any`, `not`)")?
        .to_string();
    let op_name = o.get("op").and_then(Value::as_str).unwrap_or("eq");
    let value = o.get("value").cloned().unwrap_or(Value::Null);
    let op = match op_name {
        "eq" => Op::Eq,
        "ne" => Op::Ne,
        "gt" => Op::Gt,
        "gte" => Op::Gte,
        "lt" => Op::Lt,
        "lte" => Op::Lte,
        "in" => Op::In,
        "contains" => Op::Contains,
        "exists" => Op::Exists,
        "regex" => {
            let pattern = value.as_str().ok_or("`regex` needs a string value")?;
            Op::Regex(
                regex::RegexBuilder::new(pattern)
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| format!("regex `{pattern}`: {e}"))?,
            )
        }
        other => return Err(format!("unknown op `{other}` ({})", OPS.join(", "))),
    };
    if matches!(op, Op::In) && !value.is_array() {
        return Err("`in` needs a list value".into());
    }
    Ok(Cond::Leaf { path, op, value })
}

/// The value at a dotted path (list elements by index), if any.
pub(crate) fn lookup<'a>(ctx: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = ctx;
    for seg in path.split('.').filter(|s| !s.is_empty()) {
        cur = match cur {
            Value::Object(m) => m.get(seg)?,
            Value::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn number(v: &Value) -> Option<f64> {
    v.as_f64()
}

impl Cond {
    /// Whether it holds in `ctx`.
    pub(crate) fn holds(&self, ctx: &Value) -> bool {
        match self {
            Cond::All(c) => c.iter().all(|c| c.holds(ctx)),
            Cond::Any(c) => c.iter().any(|c| c.holds(ctx)),
            Cond::Not(c) => !c.holds(ctx),
            Cond::Leaf { path, op, value } => {
                let found = lookup(ctx, path);
                let Some(v) = found else {
                    return matches!(op, Op::Ne);
                };
                let ord = || number(v).zip(number(value)).map(|(a, b)| a.partial_cmp(&b));
                match op {
                    Op::Exists => !v.is_null(),
                    Op::Eq => v == value,
                    Op::Ne => v != value,
                    Op::Gt => matches!(ord(), Some(Some(std::cmp::Ordering::Greater))),
                    Op::Gte => matches!(
                        ord(),
                        Some(Some(
                            std::cmp::Ordering::Greater | std::cmp::Ordering::Equal
                        ))
                    ),
                    Op::Lt => matches!(ord(), Some(Some(std::cmp::Ordering::Less))),
                    Op::Lte => matches!(
                        ord(),
                        Some(Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal))
                    ),
                    Op::In => value.as_array().is_some_and(|a| a.contains(v)),
                    Op::Contains => match (v, value) {
                        (Value::String(s), Value::String(sub)) => s.contains(sub.as_str()),
                        (Value::Array(a), x) => a.contains(x),
                        (Value::Object(m), Value::String(k)) => m.contains_key(k),
                        _ => false,
                    },
                    Op::Regex(re) => v.as_str().is_some_and(|s| re.is_match(s)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_table_of_conditions() {
        let ctx = json!({
            "directive": "api/users", "cost": { "turns": 3, "spend_nanos": 1500 },
            "child": { "status": "error", "outputs": ["a", "b"] }, "tags": ["x"], "empty": null
        });
        let table = [
            (
                json!({"path": "directive", "op": "contains", "value": "api"}),
                true,
            ),
            (
                json!({"path": "directive", "op": "eq", "value": "api/users"}),
                true,
            ),
            (
                json!({"path": "directive", "op": "ne", "value": "api/users"}),
                false,
            ),
            (json!({"path": "cost.turns", "op": "gte", "value": 3}), true),
            (json!({"path": "cost.turns", "op": "gt", "value": 3}), false),
            (
                json!({"path": "cost.spend_nanos", "op": "lt", "value": 2000}),
                true,
            ),
            (
                json!({"path": "cost.spend_nanos", "op": "lte", "value": 1499}),
                false,
            ),
            (
                json!({"path": "child.status", "op": "in", "value": ["error", "cancelled"]}),
                true,
            ),
            (
                json!({"path": "child.outputs.1", "op": "eq", "value": "b"}),
                true,
            ),
            (
                json!({"path": "tags", "op": "contains", "value": "x"}),
                true,
            ),
            (
                json!({"path": "directive", "op": "regex", "value": "^api/"}),
                true,
            ),
            (json!({"path": "missing", "op": "exists"}), false),
            (json!({"path": "empty", "op": "exists"}), false),
            (json!({"path": "cost", "op": "exists"}), true),
            (json!({"path": "missing", "op": "ne", "value": 1}), true),
            (
                json!({"all": [{"path": "cost.turns", "op": "gte", "value": 3}, {"path": "directive", "op": "contains", "value": "api"}]}),
                true,
            ),
            (
                json!({"any": [{"path": "cost.turns", "op": "gt", "value": 9}, {"path": "tags", "op": "contains", "value": "y"}]}),
                false,
            ),
            (
                json!({"not": {"path": "child.status", "op": "eq", "value": "completed"}}),
                true,
            ),
        ];
        for (c, want) in table {
            assert_eq!(parse(&c).unwrap().holds(&ctx), want, "{c}");
        }
        assert!(parse(&json!({"path": "x", "op": "like", "value": 1}))
            .unwrap_err()
            .contains("unknown op `like`"));
        assert!(parse(&json!({"path": "x", "op": "in", "value": 1})).is_err());
        assert!(parse(&json!({"path": "x", "op": "regex", "value": "("})).is_err());
        assert!(parse(&json!("text")).is_err());
    }
}
