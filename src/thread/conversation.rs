//! The conversation: the system prompt a thread runs under, and rebuilding a conversation from
//! a transcript (continuations).

use crate::core::ids::ThreadId;
use crate::core::limits::Limits;
use crate::directive::Directive;
use crate::provider::{Block, Message, Role};
use crate::record::line::Line;
use serde_json::{json, Value};

pub(super) fn system_prompt(d: &Directive, id: &ThreadId, limits: &Limits) -> String {
    let mut s = format!(
        "You are thread {id} of the weft runtime, running directive `{}`.{}\nLimits: {} turns, {} spend, depth {}.",
        d.name,
        if d.description.is_empty() { String::new() } else { format!(" {}", d.description) },
        limits.turns,
        limits.spend,
        limits.depth
    );
    if !d.outputs.is_empty() {
        let outs: Vec<String> = d
            .outputs
            .iter()
            .map(|(k, o)| {
                format!(
                    "{k} ({}{})",
                    o.kind,
                    if o.required { ", required" } else { "" }
                )
            })
            .collect();
        s.push_str(&format!(
            "\nWhen done, call directive_return with: {}.",
            outs.join(", ")
        ));
    }
    s
}

pub(super) fn message_text(m: &Message) -> String {
    m.content
        .iter()
        .filter_map(|b| match b {
            Block::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Rebuilds a conversation from transcript events (resume, fork): user messages,
/// assistant text and tool calls, tool results. A tool call left without a result (the thread
/// ended mid-call) gets an error result. Also returns the LLM calls made, attempts included.
pub fn rebuild_conversation(events: &[Value]) -> (Vec<Message>, u64) {
    let mut msgs: Vec<Message> = Vec::new();
    let mut calls = 0u64;
    // Edited messages read as edited, deleted ones not at all (the signed lines stay).
    for e in &crate::store::apply_edits(events) {
        match Line::parse(e) {
            Line::LlmCall { .. } | Line::LlmRetry { .. } => calls += 1,
            Line::Conversation {
                messages,
                calls_made,
            } => {
                msgs = serde_json::from_value(messages).unwrap_or_default();
                calls += calls_made;
            }
            Line::Message { text, .. } => {
                close_tool_round(&mut msgs);
                msgs.push(Message::user(text));
            }
            Line::AssistantText { text } => said_by_model(&mut msgs, Block::Text { text }),
            // Bounded again: a line written before the bound, or imported, may nest deeper
            // than a conversation line (where it sits lower) can be read back.
            Line::ToolUse { id, name, input } => {
                let input = crate::core::limits::bounded_input(input);
                said_by_model(&mut msgs, Block::ToolUse { id, name, input })
            }
            Line::ToolResult {
                id,
                is_error,
                content,
            } => {
                let block = Block::ToolResult {
                    id,
                    content,
                    is_error,
                };
                match msgs.last_mut() {
                    Some(m)
                        if m.role == Role::User
                            && matches!(m.content.first(), Some(Block::ToolResult { .. })) =>
                    {
                        m.content.push(block)
                    }
                    _ => msgs.push(Message {
                        role: Role::User,
                        content: vec![block],
                    }),
                }
            }
            _ => {}
        }
    }
    close_tool_round(&mut msgs);
    (msgs, calls)
}

/// Adds `block` to the model's message under way (or starts one).
fn said_by_model(msgs: &mut Vec<Message>, block: Block) {
    match msgs.last_mut() {
        Some(m) if m.role == Role::Assistant => m.content.push(block),
        _ => msgs.push(Message {
            role: Role::Assistant,
            content: vec![block],
        }),
    }
}

/// Gives every unanswered tool call of the last assistant message an error result.
fn close_tool_round(msgs: &mut Vec<Message>) {
    let answered: Vec<String> = match msgs.last() {
        Some(m) if m.role == Role::User => m
            .content
            .iter()
            .filter_map(|b| match b {
                Block::ToolResult { id, .. } => Some(id.clone()),
                _ => None,
            })
            .collect(),
        _ => vec![],
    };
    let assistant = match msgs.len() {
        0 => return,
        n if msgs[n - 1].role == Role::Assistant => n - 1,
        n if n >= 2 && msgs[n - 2].role == Role::Assistant && !answered.is_empty() => n - 2,
        _ => return,
    };
    let missing: Vec<Block> = msgs[assistant]
        .content
        .iter()
        .filter_map(|b| match b {
            Block::ToolUse { id, .. } if !answered.contains(id) => Some(Block::ToolResult {
                id: id.clone(),
                content: json!({ "error": "the thread ended before this tool call finished" })
                    .to_string(),
                is_error: true,
            }),
            _ => None,
        })
        .collect();
    if missing.is_empty() {
        return;
    }
    if assistant == msgs.len() - 1 {
        msgs.push(Message {
            role: Role::User,
            content: missing,
        });
    } else if let Some(last) = msgs.last_mut() {
        last.content.extend(missing);
    }
}
