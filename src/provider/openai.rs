//! The `openai` provider: the chat-completions API at any base URL (OpenAI, Ollama, vLLM,
//! llama.cpp, OpenRouter), streamed with `stream_options.include_usage`.
//!
//! Owns the wire mapping in both directions: tools as `tools`/`tool_calls` (parallel calls,
//! assistant messages with null content), tool results as `tool` messages, usage with cached
//! prompt tokens. Knows nothing of budgets: it sends the `max_tokens` it is given, as
//! `max_completion_tokens` to the OpenAI models that refuse `max_tokens` (reasoning models).

use super::http::{self, HttpSettings};
use super::{
    Block, BoxFuture, ErrorKind, LlmRequest, LlmResponse, Message, Provider, ProviderError, Role,
    ToolCall,
};
use crate::core::money::Usage;
use crate::project::config::MaxTokensField;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use tokio_util::sync::CancellationToken;

/// An OpenAI-compatible chat-completions provider.
pub(crate) struct OpenAi {
    name: String,
    settings: HttpSettings,
    client: reqwest::Client,
    /// Config's choice of output-cap field, if any (else by model, [`max_tokens_field`]).
    max_tokens_field: Option<MaxTokensField>,
}

impl OpenAi {
    /// A provider named `name` with these settings.
    pub(crate) fn new(
        name: &str,
        settings: HttpSettings,
        max_tokens_field: Option<MaxTokensField>,
    ) -> Result<OpenAi, String> {
        let client = http::client(&settings)?;
        Ok(OpenAi {
            name: name.into(),
            settings,
            client,
            max_tokens_field,
        })
    }
}

/// The request field that caps output for `model`: OpenAI's reasoning models (`o1`, `o3`,
/// `o4-*`, `gpt-5*`) refuse `max_tokens` and want `max_completion_tokens`; every other
/// OpenAI-compatible server (llama.cpp, vLLM, Ollama) knows `max_tokens`.
pub(crate) fn max_tokens_field(model: &str) -> &'static str {
    let m = model.rsplit('/').next().unwrap_or(model);
    let reasoning = ["o1", "o3", "o4"]
        .iter()
        .any(|f| m == *f || m.starts_with(&format!("{f}-")))
        || m.starts_with("gpt-5");
    if reasoning {
        "max_completion_tokens"
    } else {
        "max_tokens"
    }
}

/// The request body for `req`, capping output with `field` (`max_tokens` or
/// `max_completion_tokens`).
pub(crate) fn body(req: &LlmRequest, field: &str) -> Value {
    let mut messages = vec![json!({ "role": "system", "content": &*req.system })];
    for m in req.messages.iter() {
        messages.extend(wire_messages(m));
    }
    let mut body = json!({
        "model": req.model,
        "messages": messages,
        field: req.max_tokens,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| json!({ "type": "function", "function": { "name": t.name, "description": t.description, "parameters": t.input_schema } }))
            .collect();
    }
    body
}

fn wire_messages(m: &Message) -> Vec<Value> {
    let texts: Vec<&str> = m
        .content
        .iter()
        .filter_map(|b| match b {
            Block::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    match m.role {
        Role::Assistant => {
            let calls: Vec<Value> = m
                .content
                .iter()
                .filter_map(|b| match b {
                    Block::ToolUse { id, name, input } => Some(json!({
                        "id": id, "type": "function",
                        "function": { "name": name, "arguments": input.to_string() }
                    })),
                    _ => None,
                })
                .collect();
            let content = if texts.is_empty() {
                Value::Null
            } else {
                json!(texts.join("\n"))
            };
            let mut msg = json!({ "role": "assistant", "content": content });
            if !calls.is_empty() {
                msg["tool_calls"] = json!(calls);
            }
            vec![msg]
        }
        Role::User => {
            let mut out: Vec<Value> = m
                .content
                .iter()
                .filter_map(|b| match b {
                    Block::ToolResult {
                        id,
                        content,
                        is_error,
                    } => {
                        let content = if *is_error {
                            format!("ERROR: {content}")
                        } else {
                            content.clone()
                        };
                        Some(json!({ "role": "tool", "tool_call_id": id, "content": content }))
                    }
                    _ => None,
                })
                .collect();
            if !texts.is_empty() {
                out.push(json!({ "role": "user", "content": texts.join("\n") }));
            }
            out
        }
    }
}

/// Assembles a streamed response (public for tests).
#[derive(Default)]
pub(crate) struct Assembler {
    text: String,
    /// Text not yet handed to the request's sink.
    fresh: String,
    calls: BTreeMap<u64, (String, String, String)>,
    usage: Option<Usage>,
    finish: Option<String>,
    /// `[DONE]` arrived: the response is whole.
    done: bool,
    /// Content and tool-call deltas received.
    pub deltas: u64,
}

impl Assembler {
    /// Feeds one `data:` payload; returns true at `[DONE]`.
    pub(crate) fn feed(&mut self, data: &str) -> Result<bool, ProviderError> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(true);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| {
            http::fail(ErrorKind::Server, format!("bad stream chunk ({e}): {data}"))
        })?;
        if let Some(err) = v.get("error") {
            let msg = err
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("error in stream")
                .to_string();
            return Err(http::fail(ErrorKind::Server, msg));
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            let prompt = u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0);
            let cached = u
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .min(prompt);
            self.usage = Some(Usage {
                input_tokens: prompt - cached,
                output_tokens: u
                    .get("completion_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
                cache_read_tokens: cached,
                // OpenAI bills no cache writes.
                cache_write_tokens: 0,
            });
        }
        for choice in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish = Some(f.to_string());
            }
            let Some(delta) = choice.get("delta") else {
                continue;
            };
            if let Some(t) = delta.get("content").and_then(Value::as_str) {
                if !t.is_empty() {
                    self.text.push_str(t);
                    self.fresh.push_str(t);
                    self.deltas += 1;
                }
            }
            for tc in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let index = tc
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(self.calls.len() as u64);
                let entry = self.calls.entry(index).or_default();
                if let Some(id) = tc.get("id").and_then(Value::as_str) {
                    entry.0 = id.to_string();
                }
                if let Some(n) = tc.pointer("/function/name").and_then(Value::as_str) {
                    entry.1.push_str(n);
                }
                if let Some(a) = tc.pointer("/function/arguments").and_then(Value::as_str) {
                    entry.2.push_str(a);
                }
                self.deltas += 1;
            }
        }
        Ok(false)
    }

    /// What arrived so far, as a failure's partial usage.
    pub(crate) fn partial_usage(&self) -> Usage {
        self.usage.unwrap_or_default()
    }

    /// The finished response. A whole response (`[DONE]`) without a usage chunk (a server that
    /// ignores `stream_options.include_usage`) is accepted with its usage marked incomplete: the
    /// thread settles it at its bound. A stream that ends before both is cut short.
    pub(crate) fn finish(self) -> Result<LlmResponse, ProviderError> {
        if self.usage.is_none() && !self.done {
            return Err(http::cut_short(
                ErrorKind::Connection,
                "the stream ended before [DONE]: the answer may be cut short",
                Usage::default(),
            ));
        }
        let usage_incomplete = self.usage.is_none();
        let usage = self.usage.unwrap_or_default();
        let mut tool_calls = Vec::new();
        for (i, (id, name, args)) in self.calls {
            let input = if args.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(&args).unwrap_or_else(|_| super::not_json(&args))
            };
            let id = if id.is_empty() {
                format!("call_{i}")
            } else {
                id
            };
            tool_calls.push(ToolCall { id, name, input });
        }
        let stop_reason = match self.finish.as_deref() {
            Some("length") => "max_tokens",
            Some("tool_calls") => "tool_use",
            _ if !tool_calls.is_empty() => "tool_use",
            _ => "end_turn",
        };
        Ok(LlmResponse {
            text: self.text,
            tool_calls,
            usage,
            stop_reason: stop_reason.into(),
            stream_deltas: self.deltas,
            usage_incomplete,
        })
    }
}

impl Provider for OpenAi {
    fn name(&self) -> &str {
        &self.name
    }

    fn complete(
        &self,
        req: LlmRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<Result<LlmResponse, ProviderError>> {
        http::post_stream::<Assembler>(
            &self.client,
            &self.settings,
            "/chat/completions",
            http::Auth::Bearer,
            &[],
            &body(
                &req,
                self.max_tokens_field
                    .map_or_else(|| max_tokens_field(&req.model), MaxTokensField::as_str),
            ),
            req.on_text.clone(),
            cancel,
        )
    }
}

impl http::StreamAssembler for Assembler {
    fn feed(&mut self, ev: &http::SseEvent) -> Result<bool, ProviderError> {
        Assembler::feed(self, &ev.data)
    }
    fn partial_usage(&self) -> Usage {
        Assembler::partial_usage(self)
    }
    fn usage_final(&self) -> bool {
        self.usage.is_some()
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
    fn parallel_tool_calls_interleaved_across_chunks_are_assembled() {
        let mut a = Assembler::default();
        let chunks = [
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c0","type":"function","function":{"name":"spawn_thread","arguments":""}},{"index":1,"id":"c1","type":"function","function":{"name":"wait_threads","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"ids\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"directive\":\"x\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"[]}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4}}}"#,
        ];
        for c in chunks {
            assert!(!a.feed(c).unwrap());
        }
        assert!(a.feed("[DONE]").unwrap());
        let r = a.finish().unwrap();
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(
            (
                r.tool_calls[0].id.as_str(),
                r.tool_calls[0].input["directive"].as_str()
            ),
            ("c0", Some("x"))
        );
        assert_eq!(r.tool_calls[1].input, json!({ "ids": [] }));
        assert_eq!(
            (
                r.usage.input_tokens,
                r.usage.cache_read_tokens,
                r.usage.output_tokens
            ),
            (6, 4, 5)
        );
        assert_eq!(r.stop_reason, "tool_use");
    }

    #[test]
    fn a_whole_stream_without_usage_is_kept_but_marked_and_a_cut_one_is_an_error() {
        let mut a = Assembler::default();
        a.feed(r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#)
            .unwrap();
        assert!(a.feed("[DONE]").unwrap());
        let r = a.finish().unwrap();
        assert_eq!(r.text, "hi");
        assert!(r.usage_incomplete, "settled at the bound, never $0");
        let mut a = Assembler::default();
        a.feed(r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#)
            .unwrap();
        let e = a.finish().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Connection);
        assert!(e.usage_incomplete);
    }

    #[test]
    fn reasoning_models_get_max_completion_tokens() {
        for m in [
            "gpt-5",
            "gpt-5-mini",
            "o3",
            "o4-mini",
            "o1",
            "openai/gpt-5-nano",
        ] {
            assert_eq!(max_tokens_field(m), "max_completion_tokens", "{m}");
        }
        for m in ["gpt-4o-mini", "gpt-4.1", "smollm2", "o3x", "llama-3.1-8b"] {
            assert_eq!(max_tokens_field(m), "max_tokens", "{m}");
        }
        let req = LlmRequest {
            model: "gpt-5-mini".into(),
            system: "s".into(),
            messages: Default::default(),
            tools: Default::default(),
            max_tokens: 77,
            directive: "d".into(),
            thread_id: crate::core::ids::ThreadId::generate("d"),
            call_index: 0,
            on_text: None,
            known_prompt_bytes: None,
        };
        let b = body(&req, max_tokens_field(&req.model));
        assert_eq!(b["max_completion_tokens"], 77);
        assert!(b.get("max_tokens").is_none());
    }

    #[test]
    fn tool_results_become_tool_messages_and_text_a_user_message() {
        let m = Message {
            role: Role::User,
            content: vec![
                Block::ToolResult {
                    id: "a".into(),
                    content: "1".into(),
                    is_error: false,
                },
                Block::ToolResult {
                    id: "b".into(),
                    content: "no".into(),
                    is_error: true,
                },
                Block::Text {
                    text: "and then".into(),
                },
            ],
        };
        let w = wire_messages(&m);
        assert_eq!(w.len(), 3);
        assert_eq!(
            (w[0]["role"].as_str(), w[0]["tool_call_id"].as_str()),
            (Some("tool"), Some("a"))
        );
        assert!(w[1]["content"].as_str().unwrap().starts_with("ERROR"));
        assert_eq!(w[2]["role"], "user");
    }
}
