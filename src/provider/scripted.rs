//! The scripted provider: a first-class provider for tests and demos that plays turns from a
//! YAML file instead of calling a model.
//!
//! The file maps a directive name (or `default`) to a list of turns. Every thread of a directive
//! plays the list from its start (turn = the thread's call index), so a script is a pure
//! function of (directive, call index). Each turn may have `text`, `tool_calls: [{name, input}]`,
//! `usage: {input_tokens, output_tokens}`, `delay` (humantime) and `error: {kind, retry_after,
//! message}`. It honours the ledger's `max_tokens` like a real model: output usage never exceeds it.

use super::{BoxFuture, ErrorKind, LlmRequest, LlmResponse, Provider, ProviderError, ToolCall};
use crate::core::money::Usage;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCall {
    name: String,
    #[serde(default)]
    input: serde_json::Value,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_tokens: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawError {
    kind: String,
    #[serde(default)]
    retry_after: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTurn {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_calls: Vec<RawCall>,
    #[serde(default)]
    usage: Option<RawUsage>,
    #[serde(default)]
    delay: Option<String>,
    #[serde(default)]
    error: Option<RawError>,
}

/// One scripted turn.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    text: String,
    tool_calls: Vec<(String, serde_json::Value)>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_tokens: u64,
    delay: Option<Duration>,
    error: Option<(ErrorKind, Option<Duration>, String)>,
}

/// The scripted provider.
#[derive(Debug, Clone)]
pub(crate) struct Scripted {
    source: String,
    turns: Arc<BTreeMap<String, Vec<Turn>>>,
}

impl Scripted {
    /// Loads a script file; errors name the file, line and what was expected.
    pub(crate) fn load(path: &Path) -> Result<Scripted, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read script: {e}", path.display()))?;
        Scripted::parse(&path.display().to_string(), &text)
    }

    /// Parses script text.
    pub(crate) fn parse(source: &str, text: &str) -> Result<Scripted, String> {
        let raw: BTreeMap<String, Vec<RawTurn>> = serde_saphyr::from_str(text).map_err(|e| {
            let loc = e.location().map(|l| format!(":{}:{}", l.line(), l.column())).unwrap_or_default();
            format!(
                "{source}{loc}: invalid script: {} (expected a map of directive name → list of turns with text, tool_calls, usage, delay, error)",
                crate::project::yaml::yaml_message(&e)
            )
        })?;
        let mut turns = BTreeMap::new();
        for (directive, list) in raw {
            let mut out = Vec::with_capacity(list.len());
            for (i, t) in list.into_iter().enumerate() {
                let at = format!("{source}: `{directive}` turn {}", i + 1);
                let dur = |s: &str| {
                    humantime::parse_duration(s)
                        .map_err(|_| format!("{at}: `{s}` is not a duration (e.g. 200ms, 2s)"))
                };
                let delay = t.delay.as_deref().map(dur).transpose()?;
                let error = match t.error {
                    Some(e) => {
                        let kind = ErrorKind::parse(&e.kind).ok_or_else(|| {
                            format!("{at}: error kind `{}` (expected rate_limited, overloaded, server, timeout, connection, auth, invalid_request or context_overflow)", e.kind)
                        })?;
                        let ra = e.retry_after.as_deref().map(dur).transpose()?;
                        Some((
                            kind,
                            ra,
                            e.message
                                .unwrap_or_else(|| format!("scripted {} error", e.kind)),
                        ))
                    }
                    None => None,
                };
                let usage = t.usage.unwrap_or(RawUsage {
                    input_tokens: None,
                    output_tokens: None,
                    cache_read_tokens: None,
                });
                out.push(Turn {
                    text: t.text.unwrap_or_default(),
                    tool_calls: t
                        .tool_calls
                        .into_iter()
                        .map(|c| (c.name, c.input))
                        .collect(),
                    input_tokens: usage.input_tokens,
                    output_tokens: usage.output_tokens,
                    cache_read_tokens: usage.cache_read_tokens.unwrap_or(0),
                    delay,
                    error,
                });
            }
            turns.insert(directive, out);
        }
        Ok(Scripted {
            source: source.into(),
            turns: Arc::new(turns),
        })
    }

    fn turn(&self, req: &LlmRequest) -> Result<&Turn, ProviderError> {
        let list = self
            .turns
            .get(&req.directive)
            .or_else(|| self.turns.get("default"))
            .ok_or_else(|| ProviderError {
                kind: ErrorKind::Script,
                message: format!(
                    "script {} has no turns for directive `{}` and no `default` list; add one",
                    self.source, req.directive
                ),
                retry_after: None,
                usage: Usage::default(),
                usage_incomplete: false,
            })?;
        list.get(req.call_index as usize)
            .ok_or_else(|| ProviderError {
                kind: ErrorKind::Script,
                message: format!(
                "script {} ran out of turns for `{}`: it has {} and the thread asked for turn {}",
                self.source,
                req.directive,
                list.len(),
                req.call_index + 1
            ),
                retry_after: None,
                usage: Usage::default(),
                usage_incomplete: false,
            })
    }
}

impl Provider for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }

    /// Exact: the scripted provider bills what its script says (or its 3-bytes heuristic).
    fn prompt_token_bound(&self, req: &LlmRequest, _template_overhead: u64) -> u64 {
        match self.turn(req) {
            Ok(Turn {
                input_tokens: Some(n),
                ..
            }) => *n,
            _ => super::heuristic_prompt_tokens(req),
        }
    }

    fn complete(
        &self,
        req: LlmRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<Result<LlmResponse, ProviderError>> {
        let turn = self.turn(&req).cloned();
        // Only a turn without scripted usage needs the (conversation-long) estimate.
        let estimate = match &turn {
            Ok(Turn {
                input_tokens: Some(_),
                ..
            }) => 0,
            _ => super::heuristic_prompt_tokens(&req),
        };
        Box::pin(async move {
            let turn = turn?;
            if let Some(d) = turn.delay {
                tokio::select! {
                                   _ = tokio::time::sleep(d) => {}
                                   _ = cancel.cancelled() => return Err(ProviderError {
                                       kind: ErrorKind::Cancelled, message: "cancelled".into(), retry_after: None, usage: Usage::default(),
                usage_incomplete: false,
                                   }),
                               }
            }
            if let Some((kind, retry_after, message)) = turn.error {
                return Err(ProviderError {
                    kind,
                    message,
                    retry_after,
                    usage: Usage::default(),
                    usage_incomplete: false,
                });
            }
            let calls: Vec<ToolCall> = turn
                .tool_calls
                .iter()
                .enumerate()
                .map(|(i, (name, input))| ToolCall {
                    id: format!("call_{}_{i}", req.call_index),
                    name: name.clone(),
                    input: input.clone(),
                })
                .collect();
            let natural = turn.output_tokens.unwrap_or_else(|| {
                (turn.text.len() as u64).div_ceil(4)
                    + calls
                        .iter()
                        .map(|c| 8 + c.input.to_string().len() as u64 / 4)
                        .sum::<u64>()
            });
            let output_tokens = natural.min(req.max_tokens);
            let stop_reason = if natural > req.max_tokens {
                "max_tokens"
            } else if calls.is_empty() {
                "end_turn"
            } else {
                "tool_use"
            };
            if let Some(sink) = &req.on_text {
                sink.send(&turn.text);
            }
            Ok(LlmResponse {
                text: turn.text,
                tool_calls: calls,
                usage: Usage {
                    input_tokens: turn.input_tokens.unwrap_or(estimate),
                    output_tokens,
                    cache_read_tokens: turn.cache_read_tokens,
                    cache_write_tokens: 0,
                },
                stop_reason: stop_reason.into(),
                stream_deltas: 0,
                usage_incomplete: false,
            })
        })
    }
}
