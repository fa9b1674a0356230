//! Transcript lines as people read them (`weft log`, the web page's twin): a short label and
//! the text, checkpoints left out, long tool output cut with a note of how much was left.

use crate::core::money::Nanos;
use serde_json::Value;

/// Tool output longer than this is cut in the readable form (`--json` keeps it whole).
const CUT: usize = 600;

/// How long something took, as people say it: `350ms`, `4.2s`, `2m`, `2m 5s`, `1h 3m`.
pub fn human_duration(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..=999 => format!("{ms}ms"),
        1000..=59_999 => {
            let tenths = (ms % 1000) / 100;
            if tenths == 0 {
                format!("{s}s")
            } else {
                format!("{s}.{tenths}s")
            }
        }
        60_000..=3_599_999 if s.is_multiple_of(60) => format!("{}m", s / 60),
        60_000..=3_599_999 => format!("{}m {}s", s / 60, s % 60),
        _ if (s / 60).is_multiple_of(60) => format!("{}h", s / 3600),
        _ => format!("{}h {}m", s / 3600, (s / 60) % 60),
    }
}

/// `n` and `word`, with an `s` unless `n` is 1.
#[cfg_attr(not(feature = "cli"), allow(dead_code))] // the terminal's words
pub(crate) fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

fn cut(text: &str) -> String {
    if text.len() <= CUT {
        return text.to_string();
    }
    let mut end = CUT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &text[..end], text.len() - end)
}

fn usd(v: &Value) -> String {
    Nanos(v.as_i64().unwrap_or(0)).to_string()
}

/// The label and text of a transcript line; None for lines people do not read (checkpoints).
pub fn describe(line: &Value) -> Option<(String, String)> {
    let kind = line["type"].as_str().unwrap_or("?");
    let s = |k: &str| line[k].as_str().unwrap_or_default().to_string();
    let (label, text) = match kind {
        "checkpoint" => return None,
        "thread_started" => (
            "started",
            format!(
                "{} on {} ({}){}",
                s("directive"),
                s("model"),
                s("provider"),
                line["parent"]
                    .as_str()
                    .map(|p| format!(", child of {p}"))
                    .unwrap_or_default()
            ),
        ),
        "status" => ("status", s("status")),
        "message" => (
            if line["role"] == "assistant" {
                "assistant"
            } else {
                "user"
            },
            s("text"),
        ),
        "assistant_text" => ("assistant", s("text")),
        "tool_use" => ("tool call", format!("{} {}", s("name"), line["input"])),
        "tool_result" => (
            if line["is_error"] == true {
                "tool error"
            } else {
                "tool result"
            },
            cut(&match &line["content"] {
                Value::String(t) => t.clone(),
                other => other.to_string(),
            }),
        ),
        "llm_call" | "llm_retry" => (
            if kind == "llm_call" {
                "llm"
            } else {
                "llm retry"
            },
            format!(
                "{} · {} in / {} out · {}{}",
                s("model"),
                line["usage"]["input_tokens"].as_u64().unwrap_or(0),
                line["usage"]["output_tokens"].as_u64().unwrap_or(0),
                usd(&line["cost_nanos"]),
                line["error"]["message"]
                    .as_str()
                    .or(line["message"].as_str())
                    .map(|m| format!(" · {m}"))
                    .unwrap_or_default()
            ),
        ),
        "child_spawned" => ("child", format!("started {}", s("id"))),
        "child_finished" => (
            "child",
            format!(
                "{} {} ({}){}",
                s("id"),
                s("status"),
                usd(&line["spend_nanos"]),
                line["error"]
                    .as_str()
                    .map(|e| format!(" — {e}"))
                    .unwrap_or_default()
            ),
        ),
        "thread_finished" => (
            "finished",
            format!(
                "{}{}{}",
                s("status"),
                line["error"]
                    .as_str()
                    .map(|e| format!(" — {e}"))
                    .unwrap_or_default(),
                match &line["outputs"] {
                    Value::Null => String::new(),
                    o => format!(" outputs {o}"),
                }
            ),
        ),
        other => {
            let mut rest = line.clone();
            if let Some(o) = rest.as_object_mut() {
                for k in ["seq", "ts", "type", "prev"] {
                    o.remove(k);
                }
            }
            return Some((other.replace('_', " "), cut(&rest.to_string())));
        }
    };
    Some((label.to_string(), text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn durations_and_counts_read_as_people_say_them() {
        let d: Vec<String> = [
            0, 350, 1000, 4200, 59_999, 60_000, 125_000, 3_600_000, 3_780_000,
        ]
        .iter()
        .map(|ms| human_duration(*ms))
        .collect();
        assert_eq!(
            d,
            ["0ms", "350ms", "1s", "4.2s", "59.9s", "1m", "2m 5s", "1h", "1h 3m"]
        );
        assert_eq!(
            (plural(1, "turn"), plural(0, "turn"), plural(3, "turn")),
            ("1 turn".into(), "0 turns".into(), "3 turns".into())
        );
    }

    #[test]
    fn long_tool_output_is_cut_with_a_note_and_checkpoints_are_skipped() {
        let (label, text) = describe(
            &json!({ "type": "tool_result", "content": "é".repeat(1000), "is_error": false }),
        )
        .unwrap();
        assert_eq!(label, "tool result");
        assert!(
            text.ends_with("(1400 more bytes)") || text.ends_with("more bytes)"),
            "{text}"
        );
        assert!(text.len() < 700);
        assert!(describe(&json!({ "type": "checkpoint" })).is_none());
    }
}
