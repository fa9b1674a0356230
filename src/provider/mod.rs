//! Providers: the LLM backends behind one trait (SPEC §1): scripted now; OpenAI-compatible and
//! Anthropic HTTP slot in as further implementations of [`Provider`].
//!
//! Owns the provider-neutral conversation types and error classification. A provider must never
//! touch the ledger, the transcript or the registry: it returns usage and the thread accounts.

pub mod anthropic;
pub mod http;
pub mod openai;
pub mod scripted;

use crate::ids::ThreadId;
use crate::money::Usage;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user (prompt, tool results, notices).
    User,
    /// The model.
    Assistant,
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call by the model.
    ToolUse {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments.
        input: serde_json::Value,
    },
    /// A tool's result.
    ToolResult {
        /// Id of the call answered.
        id: String,
        /// Result text (JSON for built-ins).
        content: String,
        /// The call failed or was refused.
        is_error: bool,
    },
}

/// One conversation message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Speaker.
    pub role: Role,
    /// Content blocks.
    pub content: Vec<Block>,
}

impl Message {
    /// A user text message.
    pub fn user(text: impl Into<String>) -> Message {
        Message {
            role: Role::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON schema of the input.
    pub input_schema: serde_json::Value,
}

/// One LLM call.
#[derive(Debug, Clone)]
pub struct LlmRequest {
    /// Model id.
    pub model: String,
    /// System prompt.
    pub system: std::sync::Arc<str>,
    /// Conversation so far.
    pub messages: std::sync::Arc<Vec<Message>>,
    /// Tools offered.
    pub tools: std::sync::Arc<Vec<ToolSpec>>,
    /// Output token cap granted by the ledger.
    pub max_tokens: u64,
    /// Directive name (the scripted provider keys its script by it).
    pub directive: String,
    /// The calling thread.
    pub thread_id: ThreadId,
    /// How many calls (attempts included) this thread made before this one.
    pub call_index: u64,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Call id.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments.
    pub input: serde_json::Value,
}

/// A completed call.
#[derive(Debug, Clone, Default)]
pub struct LlmResponse {
    /// Text answer (possibly empty).
    pub text: String,
    /// Tool calls (possibly none).
    pub tool_calls: Vec<ToolCall>,
    /// Billed usage.
    pub usage: Usage,
    /// Why generation stopped (`end_turn`, `tool_use`, `max_tokens`).
    pub stop_reason: String,
    /// Streamed deltas received (0 when the provider does not stream).
    pub stream_deltas: u64,
}

/// The classes of LLM failure (SPEC §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// 429.
    RateLimited,
    /// 529 / overloaded.
    Overloaded,
    /// 5xx.
    Server,
    /// No answer in time.
    Timeout,
    /// Connection failed or dropped.
    Connection,
    /// 401/403.
    Auth,
    /// 400/422.
    InvalidRequest,
    /// Prompt larger than the model's window.
    ContextOverflow,
    /// The call was cancelled.
    Cancelled,
    /// The scripted provider has no such turn, or its script is wrong.
    Script,
}

impl ErrorKind {
    /// Parses a script's `error.kind`.
    pub fn parse(s: &str) -> Option<ErrorKind> {
        serde_json::from_value(serde_json::Value::String(s.into())).ok()
    }
    /// Worth retrying?
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited
                | ErrorKind::Overloaded
                | ErrorKind::Server
                | ErrorKind::Timeout
                | ErrorKind::Connection
        )
    }
}

/// A failed call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ProviderError {
    /// Class.
    pub kind: ErrorKind,
    /// What happened and what to do.
    pub message: String,
    /// Server-requested wait before retrying.
    pub retry_after: Option<Duration>,
    /// Usage billed despite the failure.
    pub usage: Usage,
}

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// An LLM backend.
pub trait Provider: Send + Sync {
    /// Provider name for transcripts.
    fn name(&self) -> &str;
    /// Prompt tokens the request will be billed for (worst case); used for reservations.
    fn estimate_prompt_tokens(&self, req: &LlmRequest) -> u64 {
        heuristic_prompt_tokens(req)
    }
    /// Makes the call; must return promptly with `Cancelled` when `cancel` fires.
    fn complete(
        &self,
        req: LlmRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<Result<LlmResponse, ProviderError>>;
}

/// A conservative estimate: one token per 3 bytes plus per-message overhead.
pub fn heuristic_prompt_tokens(req: &LlmRequest) -> u64 {
    let mut bytes = req.system.len() + req.model.len();
    for m in req.messages.iter() {
        bytes += 16;
        for b in &m.content {
            bytes += match b {
                Block::Text { text } => text.len(),
                Block::ToolUse { name, input, .. } => name.len() + input.to_string().len(),
                Block::ToolResult { content, .. } => content.len(),
            };
        }
    }
    for t in req.tools.iter() {
        bytes += t.name.len() + t.description.len() + t.input_schema.to_string().len();
    }
    (bytes as u64).div_ceil(3) + 8
}

/// Every provider a runtime can use, by config name, and the rules that pick one for a thread.
pub struct Providers {
    by_name: std::collections::BTreeMap<String, std::sync::Arc<dyn Provider>>,
    /// Providers that could not be built (e.g. a missing API key): the reason, given when a
    /// thread asks for one.
    broken: std::collections::BTreeMap<String, String>,
    /// Provider for every thread (`--script` forces `scripted`, `--provider` names one).
    force: Option<String>,
    /// Model for every thread (`--model`).
    model: Option<String>,
}

/// What the runtime was asked for on the command line.
#[derive(Debug, Clone, Default)]
pub struct Choice {
    /// Scripted provider file: every thread plays it.
    pub script: Option<std::path::PathBuf>,
    /// Provider name for every thread.
    pub provider: Option<String>,
    /// Model id for every thread.
    pub model: Option<String>,
}

impl Providers {
    /// Builds every configured provider. A provider that cannot be built is remembered with the
    /// reason; only a thread that selects it fails (before it starts).
    pub fn build(
        project_root: &std::path::Path,
        config: &crate::config::Config,
        choice: &Choice,
    ) -> Result<Providers, String> {
        let mut p = Providers {
            by_name: Default::default(),
            broken: Default::default(),
            force: choice.provider.clone(),
            model: choice.model.clone(),
        };
        for (name, pc) in &config.providers {
            match build_one(project_root, name, pc) {
                Ok(prov) => {
                    p.by_name.insert(name.clone(), prov);
                }
                Err(e) => {
                    p.broken.insert(name.clone(), e);
                }
            }
        }
        if let Some(script) = &choice.script {
            if let Some(other) = choice.provider.as_deref().filter(|p| *p != "scripted") {
                return Err(format!("--script plays a script for every thread; it cannot be combined with --provider {other}"));
            }
            let s = scripted::Scripted::load(script)?;
            p.by_name.insert("scripted".into(), std::sync::Arc::new(s));
            p.broken.remove("scripted");
            p.force = Some("scripted".into());
        }
        if let Some(f) = &p.force {
            if !p.by_name.contains_key(f) && !p.broken.contains_key(f) {
                return Err(format!(
                    "unknown provider `{f}` (configured: {})",
                    p.names().join(", ")
                ));
            }
        }
        Ok(p)
    }

    /// A set holding one provider under `name`, used for every thread.
    pub fn single(name: &str, provider: std::sync::Arc<dyn Provider>) -> Providers {
        let mut by_name = std::collections::BTreeMap::new();
        by_name.insert(name.to_string(), provider);
        Providers {
            by_name,
            broken: Default::default(),
            force: Some(name.into()),
            model: None,
        }
    }

    fn names(&self) -> Vec<String> {
        self.by_name
            .keys()
            .chain(self.broken.keys())
            .cloned()
            .collect()
    }

    /// The provider and model for a directive: `--provider`/`--script`, else the directive's
    /// `model.provider`, else `defaults.provider`; the model from `--model`, the directive's `id`,
    /// or its `tier` through the provider's `tiers`. The scripted provider's model is `scripted`.
    pub fn select(
        &self,
        config: &crate::config::Config,
        d: &crate::directive::Directive,
    ) -> Result<(std::sync::Arc<dyn Provider>, String, String), String> {
        let name = self
            .force
            .clone()
            .or_else(|| d.model.provider.clone())
            .unwrap_or_else(|| config.default_provider.clone());
        if let Some(why) = self.broken.get(&name) {
            return Err(format!("provider `{name}` cannot be used: {why}"));
        }
        let prov = self
            .by_name
            .get(&name)
            .cloned()
            .ok_or_else(|| format!("directive `{}` asks for provider `{name}`, which is not configured (configured: {})", d.name, self.names().join(", ")))?;
        let pc = config.providers.get(&name);
        if pc.is_some_and(|p| p.kind == "scripted") || prov.name() == "scripted" {
            return Ok((prov, name, "scripted".into()));
        }
        let tiers = pc.map(|p| &p.tiers);
        let model = match (&self.model, &d.model.id, &d.model.tier) {
            (Some(m), _, _) => m.clone(),
            (None, Some(id), _) => id.clone(),
            (None, None, Some(t)) => tiers
                .and_then(|t2| t2.get(t))
                .cloned()
                .ok_or_else(|| format!("provider `{name}` has no tier `{t}` (add providers.{name}.tiers.{t}: <model id>)"))?,
            (None, None, None) => tiers
                .and_then(|t| t.get("default").or_else(|| t.values().next()))
                .cloned()
                .ok_or_else(|| format!("directive `{}` names no model and provider `{name}` has no tiers; pass --model", d.name))?,
        };
        Ok((prov, name, model))
    }
}

fn build_one(
    root: &std::path::Path,
    name: &str,
    pc: &crate::config::ProviderConfig,
) -> Result<std::sync::Arc<dyn Provider>, String> {
    match pc.kind.as_str() {
        "scripted" => {
            let file = pc.script.as_ref().ok_or_else(|| format!("it is scripted but has no script: pass --script FILE or set providers.{name}.script"))?;
            Ok(std::sync::Arc::new(scripted::Scripted::load(
                &root.join(file),
            )?))
        }
        kind => {
            let api_key = match &pc.api_key_env {
                Some(var) => Some(std::env::var(var).ok().filter(|k| !k.is_empty()).ok_or_else(|| {
                    format!("its API key is read from ${var}, which is not set (export {var}=... or set providers.{name}.api_key_env)")
                })?),
                None => None,
            };
            let default_base = if kind == "anthropic" {
                "https://api.anthropic.com"
            } else {
                "https://api.openai.com/v1"
            };
            let settings = http::HttpSettings {
                base_url: pc.base_url.clone().unwrap_or_else(|| default_base.into()),
                api_key,
                headers: pc
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                read_timeout: pc
                    .read_timeout
                    .unwrap_or(std::time::Duration::from_secs(120)),
            };
            if kind == "anthropic" {
                Ok(std::sync::Arc::new(anthropic::Anthropic::new(
                    name, settings,
                )?))
            } else {
                Ok(std::sync::Arc::new(openai::OpenAi::new(name, settings)?))
            }
        }
    }
}
