//! The part of JSON Schema a tool's `input_schema` may use, checked before anything runs:
//! `type` (one or a list), `properties`, `required`, `additionalProperties` (boolean), `enum`,
//! `items`, `minimum`/`maximum`, `minLength`/`maxLength`, `description` and `default`. A schema
//! using anything else is refused when the tool loads, so no constraint is silently ignored.

use serde_json::Value;

const KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "enum",
    "items",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "description",
    "default",
    "title",
    "$schema",
];

/// Checks a schema uses only the supported keywords (recursively), and that the top level
/// describes an object.
pub(crate) fn check_schema(schema: &Value) -> Result<(), String> {
    fn walk(s: &Value, at: &str) -> Result<(), String> {
        let Some(o) = s.as_object() else {
            return Err(format!("input_schema{at}: a schema is a mapping"));
        };
        for k in o.keys() {
            if !KEYWORDS.contains(&k.as_str()) {
                return Err(format!(
                    "input_schema{at}: `{k}` is not supported (supported: {})",
                    KEYWORDS.join(", ")
                ));
            }
        }
        if let Some(props) = o.get("properties") {
            let Some(props) = props.as_object() else {
                return Err(format!(
                    "input_schema{at}.properties: a mapping of names to schemas"
                ));
            };
            for (name, p) in props {
                walk(p, &format!("{at}.properties.{name}"))?;
            }
        }
        if let Some(items) = o.get("items") {
            walk(items, &format!("{at}.items"))?;
        }
        Ok(())
    }
    walk(schema, "")?;
    match schema.get("type") {
        None => Ok(()),
        Some(Value::String(t)) if t == "object" => Ok(()),
        Some(other) => Err(format!(
            "input_schema.type is {other}: a tool's input is a JSON object (type: object)"
        )),
    }
}

/// Validates `v` against `schema`; the error names the path of the first problem.
pub(crate) fn validate(schema: &Value, v: &Value) -> Result<(), String> {
    check(schema, v, "input")
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_type(v: &Value, t: &str) -> bool {
    let actual = type_name(v);
    actual == t || (t == "number" && actual == "integer")
}

fn check(schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    let Some(s) = schema.as_object() else {
        return Ok(());
    };
    match s.get("type") {
        Some(Value::String(t)) if !is_type(v, t) => {
            return Err(format!("{at} must be {t}, not {}", type_name(v)))
        }
        Some(Value::Array(ts)) if !ts.iter().filter_map(Value::as_str).any(|t| is_type(v, t)) => {
            return Err(format!(
                "{at} must be one of {}, not {}",
                Value::Array(ts.clone()),
                type_name(v)
            ))
        }
        _ => {}
    }
    if let Some(Value::Array(options)) = s.get("enum") {
        if !options.contains(v) {
            return Err(format!(
                "{at} must be one of {}",
                Value::Array(options.clone())
            ));
        }
    }
    if let Some(n) = v.as_f64() {
        if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
            if n < min {
                return Err(format!("{at} must be at least {min}"));
            }
        }
        if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
            if n > max {
                return Err(format!("{at} must be at most {max}"));
            }
        }
    }
    if let Some(text) = v.as_str() {
        let len = text.chars().count() as u64;
        if let Some(min) = s.get("minLength").and_then(Value::as_u64) {
            if len < min {
                return Err(format!("{at} must be at least {min} characters"));
            }
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64) {
            if len > max {
                return Err(format!("{at} must be at most {max} characters"));
            }
        }
    }
    if let Value::Object(o) = v {
        let props = s.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(req)) = s.get("required") {
            for r in req.iter().filter_map(Value::as_str) {
                if !o.contains_key(r) {
                    return Err(format!("{at}.{r} is required"));
                }
            }
        }
        for (k, val) in o {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => check(ps, val, &format!("{at}.{k}"))?,
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(format!("{at}.{k} is not an accepted input"))
                }
                None => {}
            }
        }
    }
    if let (Value::Array(items), Some(item_schema)) = (v, s.get("items")) {
        for (i, item) in items.iter().enumerate() {
            check(item_schema, item, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn inputs_are_checked_against_the_supported_subset() {
        let s = json!({"type":"object","properties":{
            "path":{"type":"string","minLength":1},
            "n":{"type":"integer","minimum":1,"maximum":10},
            "mode":{"enum":["a","b"]},
            "tags":{"type":"array","items":{"type":"string"}}},
            "required":["path"],"additionalProperties":false});
        check_schema(&s).unwrap();
        validate(&s, &json!({"path":"x","n":3,"mode":"a","tags":["t"]})).unwrap();
        assert_eq!(
            validate(&s, &json!({})).unwrap_err(),
            "input.path is required"
        );
        assert!(validate(&s, &json!({"path":"x","n":11}))
            .unwrap_err()
            .contains("at most 10"));
        assert!(validate(&s, &json!({"path":"x","n":1.5}))
            .unwrap_err()
            .contains("integer"));
        assert!(validate(&s, &json!({"path":"x","tags":[1]}))
            .unwrap_err()
            .contains("input.tags[0]"));
        assert!(validate(&s, &json!({"path":"x","other":1}))
            .unwrap_err()
            .contains("not an accepted"));
        assert!(check_schema(&json!({"type":"object","patternProperties":{}})).is_err());
        assert!(check_schema(&json!({"type":"string"})).is_err());
    }
}
