//! Transcript lines as people read them (`weft log`, the web page's twin): a short label and
//! the text, checkpoints left out, long tool output cut with a note of how much was left.

use super::line::Line;
use crate::core::money::{Nanos, Usage};
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

/// The label and text of a transcript line; None for lines people do not read (checkpoints).
pub fn describe(line: &Value) -> Option<(String, String)> {
    let (label, text) = match Line::parse(line) {
        Line::Checkpoint { .. } => return None,
        Line::ThreadStarted {
            directive,
            model,
            provider,
            parent,
            ..
        } => (
            "started",
            format!(
                "{directive} on {model} ({provider}){}",
                parent
                    .map(|p| format!(", child of {p}"))
                    .unwrap_or_default()
            ),
        ),
        Line::Status { status } => ("status", status.as_str().to_string()),
        Line::Message { role, text, .. } if role == "assistant" => ("assistant", text),
        Line::Message { text, .. } => ("user", text),
        Line::AssistantText { text } => ("assistant", text),
        Line::ToolUse { name, input, .. } => ("tool call", format!("{name} {input}")),
        Line::ToolResult {
            is_error, content, ..
        } => (
            if is_error {
                "tool error"
            } else {
                "tool result"
            },
            cut(&content),
        ),
        Line::LlmCall {
            model,
            usage,
            cost_nanos,
            error,
            ..
        } => (
            "llm",
            call(
                &model,
                usage,
                cost_nanos.unwrap_or_default(),
                error.map(|e| e.message),
            ),
        ),
        Line::LlmRetry {
            model,
            usage,
            cost_nanos,
            message,
            ..
        } => (
            "llm retry",
            call(&model, usage, cost_nanos.unwrap_or_default(), Some(message)),
        ),
        Line::ChildSpawned { id, .. } => ("child", format!("started {id}")),
        Line::ChildFinished {
            id,
            status,
            spend_nanos,
            error,
            ..
        } => (
            "child",
            format!(
                "{id} {} ({}){}",
                status.as_str(),
                spend_nanos.unwrap_or_default(),
                error.map(|e| format!(" — {e}")).unwrap_or_default()
            ),
        ),
        Line::ThreadFinished {
            status, error, run, ..
        } => (
            "finished",
            format!(
                "{}{}{}",
                status.as_str(),
                error.map(|e| format!(" — {e}")).unwrap_or_default(),
                run.and_then(|r| r.outputs)
                    .map(|o| format!(" outputs {o}"))
                    .unwrap_or_default()
            ),
        ),
        _ => return Some(as_it_is(line)),
    };
    Some((label.to_string(), text))
}

/// An LLM call's model, tokens, cost and error, if any.
fn call(model: &str, usage: Usage, cost: Nanos, error: Option<String>) -> String {
    format!(
        "{model} · {} in / {} out · {cost}{}",
        usage.input_tokens,
        usage.output_tokens,
        error.map(|m| format!(" · {m}")).unwrap_or_default()
    )
}

/// Any other line: its kind, and its fields as JSON.
fn as_it_is(line: &Value) -> (String, String) {
    let kind = line["type"].as_str().unwrap_or("?");
    let mut rest = line.clone();
    if let Some(o) = rest.as_object_mut() {
        for k in ["seq", "ts", "type", "prev"] {
            o.remove(k);
        }
    }
    (kind.replace('_', " "), cut(&rest.to_string()))
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
