//! A configured LLM backend (`providers.<name>` of a config file): its kind, where it is, how
//! its key and output cap are named. Plain data below `config.rs` and `models.rs`, which both
//! build on it.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Which backend a provider entry drives (config `providers.<name>.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Replays a script file (the default of a [`ProviderConfig`] built in code).
    #[default]
    Scripted,
    /// An OpenAI-compatible chat-completions server.
    Openai,
    /// Anthropic's messages API.
    Anthropic,
}

/// The request field that caps an OpenAI-compatible call's output
/// (config `providers.<name>.max_tokens_field`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    /// `max_tokens`: what llama.cpp, vLLM, Ollama and older OpenAI models read.
    MaxTokens,
    /// `max_completion_tokens`: what OpenAI's reasoning models want.
    MaxCompletionTokens,
}

impl MaxTokensField {
    /// The field's name in the request body.
    pub fn as_str(self) -> &'static str {
        match self {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

/// One configured LLM backend.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// `scripted`, `openai` or `anthropic`.
    pub kind: ProviderKind,
    /// Base URL for HTTP providers.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Name of the environment variable that holds the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Model tiers (`fast`, `smart`, ...) → model ids.
    #[serde(default)]
    pub tiers: BTreeMap<String, String>,
    /// Extra HTTP headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// For `scripted`: the script file (relative to the project root).
    #[serde(default)]
    pub script: Option<String>,
    /// Longest silence while reading a response (humantime, e.g. `120s`).
    #[serde(default, deserialize_with = "de_duration")]
    #[cfg_attr(feature = "cli", schemars(with = "Option<String>"))]
    pub read_timeout: Option<Duration>,
    /// For `openai`: the request field that caps output, `max_tokens` or
    /// `max_completion_tokens` (default: the latter for OpenAI's reasoning models `o1`, `o3`,
    /// `o4-*`, `gpt-5*`, the former for everything else).
    #[serde(default)]
    pub max_tokens_field: Option<MaxTokensField>,
}

impl ProviderConfig {
    /// This entry over an earlier one of the same kind, key by key (a later file that sets only
    /// `base_url` keeps the key variable and tiers).
    pub(crate) fn over(self, old: ProviderConfig) -> ProviderConfig {
        let mut tiers = old.tiers;
        tiers.extend(self.tiers);
        let mut headers = old.headers;
        headers.extend(self.headers);
        ProviderConfig {
            kind: self.kind,
            base_url: self.base_url.or(old.base_url),
            api_key_env: self.api_key_env.or(old.api_key_env),
            tiers,
            headers,
            script: self.script.or(old.script),
            read_timeout: self.read_timeout.or(old.read_timeout),
            max_tokens_field: self.max_tokens_field.or(old.max_tokens_field),
        }
    }
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    s.map(|s| {
        humantime::parse_duration(&s)
            .map_err(|_| serde::de::Error::custom(format!("`{s}` is not a duration (e.g. 120s)")))
    })
    .transpose()
}
