//! The `anthropic` provider: the Messages API, streamed.
//!
//! Owns the wire mapping: `tool_use`/`tool_result` blocks (streamed `input_json_delta` assembled
//! per content block), usage from `message_start` and `message_delta` including cache reads and
//! cache creation, `ping` and `error` events, the `anthropic-version` header.

use super::http::{self, HttpSettings};
use super::{
    Block, BoxFuture, ErrorKind, LlmRequest, LlmResponse, Provider, ProviderError, Role, ToolCall,
};
use crate::core::money::Usage;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use tokio_util::sync::CancellationToken;

/// The API version sent in `anthropic-version`.
pub const API_VERSION: &str = "2023-06-01";

/// An Anthropic Messages provider.
pub(crate) struct Anthropic {
    name: String,
    settings: HttpSettings,
    client: reqwest::Client,
}

impl Anthropic {
    /// A provider named `name` with these settings.
    pub(crate) fn new(name: &str, settings: HttpSettings) -> Result<Anthropic, String> {
        let client = http::client(&settings)?;
        Ok(Anthropic {
            name: name.into(),
            settings,
            client,
        })
    }
}

/// The request body for `req` (public for tests of the wire format).
pub(crate) fn body(req: &LlmRequest) -> Value {
    let messages: Vec<Value> = req
        .messages
        .iter()
        .map(|m| {
            let content: Vec<Value> = m
                .content
                .iter()
                .map(|b| match b {
                    Block::Text { text } => json!({ "type": "text", "text": text }),
                    Block::ToolUse { id, name, input } => json!({ "type": "tool_use", "id": id, "name": name, "input": input }),
                    Block::ToolResult { id, content, is_error } => {
                        json!({ "type": "tool_result", "tool_use_id": id, "content": content, "is_error": is_error })
                    }
                })
                .collect();
            let role = if m.role == Role::Assistant { "assistant" } else { "user" };
            json!({ "role": role, "content": content })
        })
        .collect();
    let mut body = json!({
        "model": req.model,
        "max_tokens": req.max_tokens,
        "system": &*req.system,
        "messages": messages,
        "stream": true,
    });
    if !req.tools.is_empty() {
        body["tools"] =
            req.tools.iter().map(|t| json!({ "name": t.name, "description": t.description, "input_schema": t.input_schema })).collect();
    }
    body
}

/// Assembles a streamed response (public for tests).
#[derive(Default)]
pub(crate) struct Assembler {
    blocks: BTreeMap<u64, (String, String, String, String)>,
    input: u64,
    cache_read: u64,
    cache_creation: u64,
    output: u64,
    started: bool,
    /// `message_stop` arrived: the response is whole.
    stopped: bool,
    /// The final usage (`message_delta`) arrived.
    usage_final: bool,
    stop: Option<String>,
    /// Text and tool-input deltas received.
    pub deltas: u64,
    /// Text not yet handed to the request's sink.
    fresh: String,
}

impl Assembler {
    /// Feeds one event; returns true at `message_stop`.
    pub(crate) fn feed(&mut self, event: &str, data: &str) -> Result<bool, ProviderError> {
        if event == "ping" {
            return Ok(false);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| {
            http::fail(ErrorKind::Server, format!("bad stream event ({e}): {data}"))
        })?;
        let kind = if event.is_empty() {
            v.get("type").and_then(Value::as_str).unwrap_or_default()
        } else {
            event
        };
        match kind {
            "message_start" => {
                self.started = true;
                let u = v.pointer("/message/usage").cloned().unwrap_or(Value::Null);
                self.input = u.get("input_tokens").and_then(Value::as_u64).unwrap_or(0);
                self.cache_read = u
                    .get("cache_read_input_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                self.cache_creation = u
                    .get("cache_creation_input_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                self.output = u.get("output_tokens").and_then(Value::as_u64).unwrap_or(0);
            }
            "content_block_start" => {
                let i = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                let b = v.get("content_block").cloned().unwrap_or(Value::Null);
                let s = |k: &str| {
                    b.get(k)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string()
                };
                let text = s("text");
                self.blocks.insert(i, (s("type"), s("id"), s("name"), text));
            }
            "content_block_delta" => {
                let i = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                let entry = self.blocks.entry(i).or_default();
                let d = v.get("delta").cloned().unwrap_or(Value::Null);
                match d.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        let t = d.get("text").and_then(Value::as_str).unwrap_or_default();
                        entry.3.push_str(t);
                        self.fresh.push_str(t);
                    }
                    Some("input_json_delta") => entry.3.push_str(
                        d.get("partial_json")
                            .and_then(Value::as_str)
                            .unwrap_or_default(),
                    ),
                    _ => {}
                }
                self.deltas += 1;
            }
            "message_delta" => {
                if let Some(s) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop = Some(s.to_string());
                }
                if let Some(o) = v.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    self.output = o;
                    self.usage_final = true;
                }
                if let Some(n) = v.pointer("/usage/input_tokens").and_then(Value::as_u64) {
                    self.input = n;
                }
            }
            "message_stop" => {
                self.stopped = true;
                return Ok(true);
            }
            "error" => {
                let t = v
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let msg = v
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("error event")
                    .to_string();
                let kind = match t {
                    "overloaded_error" => ErrorKind::Overloaded,
                    "rate_limit_error" => ErrorKind::RateLimited,
                    "authentication_error" | "permission_error" => ErrorKind::Auth,
                    "invalid_request_error" => ErrorKind::InvalidRequest,
                    _ => ErrorKind::Server,
                };
                return Err(http::fail(kind, format!("{t}: {msg}")));
            }
            _ => {}
        }
        Ok(false)
    }

    /// Usage so far. Cache-creation tokens are prompt tokens billed at the cache-write price
    /// (1.25× input): part of `input_tokens`, counted again as `cache_write_tokens`.
    pub(crate) fn usage(&self) -> Usage {
        Usage {
            input_tokens: self.input + self.cache_creation,
            output_tokens: self.output,
            cache_read_tokens: self.cache_read,
            cache_write_tokens: self.cache_creation,
        }
    }

    /// The finished response.
    pub(crate) fn finish(self) -> Result<LlmResponse, ProviderError> {
        if !self.started {
            return Err(http::fail(
                ErrorKind::Connection,
                "the stream ended before message_start",
            ));
        }
        if !self.stopped {
            return Err(http::cut_short(
                ErrorKind::Connection,
                "the stream ended before message_stop: the answer may be cut short",
                self.usage(),
            ));
        }
        let usage = self.usage();
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        for (_, (kind, id, name, body)) in self.blocks {
            match kind.as_str() {
                "tool_use" => {
                    let input = if body.trim().is_empty() {
                        json!({})
                    } else {
                        serde_json::from_str(&body).unwrap_or_else(|_| super::not_json(&body))
                    };
                    tool_calls.push(ToolCall { id, name, input });
                }
                _ => text.push_str(&body),
            }
        }
        let stop_reason = self.stop.unwrap_or_else(|| {
            if tool_calls.is_empty() {
                "end_turn".into()
            } else {
                "tool_use".into()
            }
        });
        Ok(LlmResponse {
            text,
            tool_calls,
            usage,
            stop_reason,
            stream_deltas: self.deltas,
            usage_incomplete: !self.usage_final,
        })
    }
}

impl Provider for Anthropic {
    fn name(&self) -> &str {
        &self.name
    }

    fn complete(
        &self,
        req: LlmRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<Result<LlmResponse, ProviderError>> {
        let version = [("anthropic-version", API_VERSION)];
        http::post_stream::<Assembler>(
            &self.client,
            &self.settings,
            "/v1/messages",
            http::Auth::Header("x-api-key"),
            &version,
            &body(&req),
            req.on_text.clone(),
            cancel,
        )
    }
}

impl http::StreamAssembler for Assembler {
    fn feed(&mut self, ev: &http::SseEvent) -> Result<bool, ProviderError> {
        Assembler::feed(self, &ev.event, &ev.data)
    }
    fn partial_usage(&self) -> Usage {
        self.usage()
    }
    fn usage_final(&self) -> bool {
        self.usage_final
    }
    fn finish(self) -> Result<LlmResponse, ProviderError> {
        Assembler::finish(self)
    }
    fn take_text(&mut self) -> String {
        std::mem::take(&mut self.fresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overloaded_error_event_is_classified() {
        let mut a = Assembler::default();
        a.feed(
            "message_start",
            r#"{"type":"message_start","message":{"usage":{"input_tokens":9,"output_tokens":1}}}"#,
        )
        .unwrap();
        a.feed("ping", "{}").unwrap();
        let e = a
            .feed(
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            )
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Overloaded);
        assert_eq!(
            a.usage().input_tokens,
            9,
            "what message_start billed is kept"
        );
    }

    #[test]
    fn cache_tokens_are_counted() {
        let mut a = Assembler::default();
        a.feed(
            "message_start",
            r#"{"type":"message_start","message":{"usage":{"input_tokens":5,"cache_read_input_tokens":100,"cache_creation_input_tokens":7,"output_tokens":1}}}"#,
        )
        .unwrap();
        a.feed("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":12}}"#).unwrap();
        assert!(a
            .feed("message_stop", r#"{"type":"message_stop"}"#)
            .unwrap());
        let r = a.finish().unwrap();
        assert_eq!(
            (
                r.usage.input_tokens,
                r.usage.cache_read_tokens,
                r.usage.output_tokens
            ),
            (12, 100, 12)
        );
        assert!(!r.usage_incomplete);
    }

    #[test]
    fn a_stream_that_ends_before_message_stop_is_cut_short_not_complete() {
        let mut a = Assembler::default();
        a.feed(
            "message_start",
            r#"{"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":1}}}"#,
        )
        .unwrap();
        a.feed("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}"#).unwrap();
        let e = a.finish().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Connection);
        assert!(
            e.usage_incomplete && e.message.contains("message_stop"),
            "{e}"
        );
        assert_eq!(e.usage.input_tokens, 5);
    }
}
