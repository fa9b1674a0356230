//! Project and user configuration (`.weft/config.yaml`, `<user config dir>/weft/config.yaml`).
//!
//! Owns parsing, defaults and lookups (pricing, providers, limits). The user file is read first
//! and the project file overlays it key by key. Must never hold secrets: API keys are read from
//! the environment variable a provider names, at the moment a provider is built.

use super::yaml::find_line;
use crate::core::limits::LimitSet;
use crate::core::money::{Nanos, Price};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A configuration error, naming the file and (when known) the line.
#[derive(Debug, thiserror::Error)]
#[error("{file}{}: {message}", line.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
pub struct ConfigError {
    /// The file that failed.
    pub file: PathBuf,
    /// Line and column, when the parser knows them.
    pub line: Option<(u64, u64)>,
    /// What is wrong and what was expected.
    pub message: String,
}

/// A model without a price (config's or the built-in table's): it cannot run under a spend limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "model `{model}` has no price (weft's built-in table, as of {as_of}, does not know it); add `pricing: {{ {model}: {{ input: <USD/M>, output: <USD/M> }} }}` to .weft/config.yaml",
    as_of = super::models::PRICES_AS_OF
)]
pub struct NoPrice {
    /// The model id.
    pub model: String,
}

/// How often transcripts and thread.json are fsynced (SPEC §11 durability policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// fsync at terminal transitions and checkpoints; every write reaches the OS at once.
    #[default]
    Normal,
    /// fsync every transition and every transcript line.
    Strict,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct RawPrice {
    #[cfg_attr(
        feature = "cli",
        schemars(schema_with = "crate::core::limits::usd_json_schema")
    )]
    input: serde_json::Value,
    #[cfg_attr(
        feature = "cli",
        schemars(schema_with = "crate::core::limits::usd_json_schema")
    )]
    output: serde_json::Value,
    #[serde(default)]
    #[cfg_attr(
        feature = "cli",
        schemars(schema_with = "crate::core::limits::usd_json_schema")
    )]
    cache_read: Option<serde_json::Value>,
    #[serde(default)]
    #[cfg_attr(
        feature = "cli",
        schemars(schema_with = "crate::core::limits::usd_json_schema")
    )]
    cache_write: Option<serde_json::Value>,
    #[serde(default)]
    prompt_overhead_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    #[serde(default)]
    #[cfg_attr(
        feature = "cli",
        schemars(schema_with = "crate::core::limits::json_schema")
    )]
    limits: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    defaults: Option<RawDefaults>,
    #[serde(default)]
    providers: BTreeMap<String, ProviderConfig>,
    #[serde(default)]
    pricing: BTreeMap<String, RawPrice>,
    #[serde(default)]
    durability: Option<Durability>,
    #[serde(default)]
    retries: Option<u32>,
    #[serde(default)]
    cancel_grace: Option<String>,
    #[serde(default)]
    checkpoint_every: Option<u64>,
    #[serde(default)]
    context_window: BTreeMap<String, u64>,
    #[serde(default)]
    prompt_overhead_tokens: Option<u64>,
    #[serde(default)]
    files: Option<RawFiles>,
    #[serde(default)]
    mcp_servers: BTreeMap<String, McpServerConfig>,
    #[serde(default)]
    builtin_hooks: Option<BuiltinHooks>,
    #[serde(default)]
    continuation_threshold: Option<f64>,
    #[serde(default)]
    database: Option<String>,
    #[serde(default)]
    files_root: Option<std::path::PathBuf>,
    #[serde(default)]
    node: Option<super::node::RawNode>,
    #[serde(default)]
    auto_resume: Option<bool>,
    #[serde(default)]
    mcp_server: Option<super::mcp_server::RawMcpServer>,
}

/// The YAML text being overlaid, so an error can name the line of the key it is about.
struct Source<'a> {
    /// The file (only named in errors).
    file: &'a Path,
    /// Its text.
    text: &'a str,
}

impl Source<'_> {
    /// An error at the first line that names `key`.
    fn at(&self, key: &str, message: String) -> ConfigError {
        ConfigError {
            file: self.file.into(),
            line: find_line(self.text, key),
            message,
        }
    }
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `defaults.limits`.
    pub default_limits: LimitSet,
    /// `defaults.provider`: the provider used when a directive names none.
    pub default_provider: String,
    /// Largest `max_tokens` asked of any call before the ledger lowers it.
    pub max_output_tokens: u64,
    /// Providers by name.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Prices by model id.
    pub pricing: BTreeMap<String, Price>,
    /// fsync policy.
    pub durability: Durability,
    /// How many times a retryable LLM error is retried.
    pub retries: u32,
    /// How long a cancelled thread waits for its children before killing them.
    pub cancel_grace: Duration,
    /// A signed checkpoint line is written every this many transcript lines.
    pub checkpoint_every: u64,
    /// Context window (tokens) by model id; a call whose prompt cannot fit is refused.
    pub context_window: BTreeMap<String, u64>,
    /// Tokens a chat template adds to every call beyond the text itself (special tokens, tool
    /// preamble), by model id, with `default` for the rest: part of each call's prompt bound.
    pub prompt_overhead: BTreeMap<String, u64>,
    /// Size limits of each thread's file area.
    pub files: FileLimits,
    /// MCP tool servers by name.
    pub mcp_servers: BTreeMap<String, McpServerConfig>,
    /// Which built-in hooks run.
    pub builtin_hooks: BuiltinHooks,
    /// Share of the context window past which a thread continues in a new thread.
    pub continuation_threshold: f64,
    /// `database:` (or `$WEFT_DATABASE_URL`, which wins): the Postgres server that holds the
    /// registry, the ledger and the store; None keeps them in SQLite under `.weft/state/`.
    pub database: Option<crate::sql::DatabaseUrl>,
    /// `files_root:`: where threads' file areas live (`<root>/<thread id>/files/`), e.g. a
    /// folder several machines share; relative to the project folder. None: each thread's
    /// own folder (`.weft/threads/<id>/files/`).
    pub files_root: Option<std::path::PathBuf>,
    /// `node:` (see [`NodeConfig`]).
    pub node: Option<NodeConfig>,
    /// `auto_resume:`: a node that adopts the threads of a node whose lease ran out resumes
    /// each interrupted tree as a continuation of its top thread (default false).
    pub auto_resume: bool,
    /// `mcp_server:`: what MCP clients may start (None: nothing).
    pub mcp_server: Option<McpServerOpen>,
}

pub use super::mcp_server::McpServerOpen;
pub(crate) use super::node::NodeConfig;
pub use super::providers::{MaxTokensField, ProviderConfig, ProviderKind};
use super::sections::RawFiles;
pub use super::sections::{BuiltinHooks, FileLimits, McpServerConfig};

/// Template overhead tokens per call when config sets none.
pub(crate) const DEFAULT_PROMPT_OVERHEAD: u64 = 256;

/// The commented config `weft init` writes.
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) const DEFAULT_CONFIG_YAML: &str = include_str!("default_config.yaml");

/// JSON Schema of `.weft/config.yaml` (and the user's config), from the parser's own types.
#[cfg(feature = "cli")]
pub(crate) fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(RawConfig)).unwrap_or_default()
}

impl Default for Config {
    fn default() -> Config {
        let mut providers = super::models::builtin_providers();
        providers.insert(
            "scripted".to_string(),
            ProviderConfig {
                kind: ProviderKind::Scripted,
                ..Default::default()
            },
        );
        let mut pricing = BTreeMap::new();
        pricing.insert(
            "scripted".to_string(),
            Price {
                input: 1_000_000_000,
                output: 4_000_000_000,
                cache_read: 100_000_000,
                cache_write: 0,
            },
        );
        Config {
            default_limits: LimitSet::default(),
            default_provider: "scripted".into(),
            max_output_tokens: 4096,
            providers,
            pricing,
            durability: Durability::Normal,
            retries: 3,
            cancel_grace: Duration::from_secs(5),
            checkpoint_every: 64,
            context_window: BTreeMap::new(),
            prompt_overhead: BTreeMap::new(),
            files: FileLimits::default(),
            mcp_servers: BTreeMap::new(),
            builtin_hooks: BuiltinHooks::default(),
            continuation_threshold: 0.9,
            database: None,
            files_root: None,
            node: None,
            auto_resume: false,
            mcp_server: None,
        }
    }
}

impl Config {
    /// Built-in defaults, then the user file, then the project file (each optional).
    pub fn load(
        user_file: Option<&Path>,
        project_file: Option<&Path>,
    ) -> Result<Config, ConfigError> {
        let mut cfg = Config::default();
        for file in [user_file, project_file].into_iter().flatten() {
            if file.exists() {
                cfg.overlay_file(file)?;
            }
        }
        cfg.database_from_env()?;
        Ok(cfg)
    }

    /// `$WEFT_DATABASE_URL` (also set by `weft --database URL`), when set, names the database
    /// whatever the files say; an empty value keeps the files' choice.
    fn database_from_env(&mut self) -> Result<(), ConfigError> {
        let Some(url) = std::env::var("WEFT_DATABASE_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())
        else {
            return Ok(());
        };
        let url = crate::sql::DatabaseUrl::parse(&url).map_err(|e| ConfigError {
            file: "$WEFT_DATABASE_URL".into(),
            line: None,
            message: e.to_string(),
        })?;
        self.database = Some(url);
        Ok(())
    }

    /// Overlays one YAML file's keys.
    pub fn overlay_file(&mut self, file: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|e| ConfigError {
            file: file.into(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        self.overlay_text(file, &text)
    }

    /// Overlays YAML text (`file` only names it in errors).
    pub fn overlay_text(&mut self, file: &Path, text: &str) -> Result<(), ConfigError> {
        let mut raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| ConfigError {
                file: file.into(),
                line: e.location().map(|l| (l.line(), l.column())),
                message: crate::project::yaml::yaml_message(&e),
            })?
        };
        let src = Source { file, text };
        if let Some(d) = raw.defaults.take() {
            self.overlay_defaults(&src, d)?;
        }
        for (name, p) in std::mem::take(&mut raw.providers) {
            self.overlay_provider(name, p);
        }
        for (model, p) in std::mem::take(&mut raw.pricing) {
            self.overlay_price(&src, model, p)?;
        }
        if let Some(d) = raw.durability.take() {
            self.durability = d;
        }
        if let Some(root) = raw.files_root.take() {
            if root.as_os_str().is_empty() {
                return Err(src.at("files_root", "files_root: empty; name a folder (relative to the project folder) or remove the key".into()));
            }
            self.files_root = Some(root);
        }
        if let Some(a) = raw.auto_resume.take() {
            self.auto_resume = a;
        }
        if let Some(m) = raw.mcp_server.take() {
            self.mcp_server =
                Some(super::mcp_server::check(m).map_err(|e| src.at("mcp_server", e))?);
        }
        if let Some(n) = raw.node.take() {
            self.node = Some(super::node::check(n).map_err(|e| src.at("node", e))?);
        }
        if let Some(url) = raw.database.take() {
            let url = crate::sql::DatabaseUrl::parse(&url)
                .map_err(|e| src.at("database", e.to_string()))?;
            self.database = Some(url);
        }
        self.overlay_run_settings(&src, &mut raw)?;
        for (name, server) in raw.mcp_servers {
            if let Some(problem) = server.problem(&name) {
                return Err(src.at(&name, problem));
            }
            self.mcp_servers.insert(name, server);
        }
        if let Some(f) = raw.files {
            if let Some(n) = f.max_file_bytes {
                self.files.max_file_bytes = n;
            }
            if let Some(n) = f.max_area_bytes {
                self.files.max_area_bytes = n;
            }
        }
        Ok(())
    }

    /// `defaults:` — limits (overlaid key by key), provider and largest output.
    fn overlay_defaults(&mut self, src: &Source<'_>, d: RawDefaults) -> Result<(), ConfigError> {
        if let Some(l) = d.limits {
            let set = LimitSet::from_map(&l)
                .map_err(|m| src.at("limits", format!("defaults.limits: {m}")))?;
            self.default_limits = self.default_limits.overlay(&set);
        }
        if let Some(p) = d.provider {
            self.default_provider = p;
        }
        if let Some(m) = d.max_output_tokens {
            self.max_output_tokens = m.max(1);
        }
        Ok(())
    }

    /// One of `providers:` (its kinds already checked by serde), overlaid key by key on an
    /// earlier file's provider of the same name and kind.
    fn overlay_provider(&mut self, name: String, p: ProviderConfig) {
        let merged = match self.providers.remove(&name) {
            Some(old) if old.kind == p.kind => p.over(old),
            _ => p,
        };
        self.providers.insert(name, merged);
    }

    /// One of `pricing:` (USD per million tokens, rounded to nano-USD once here).
    fn overlay_price(
        &mut self,
        src: &Source<'_>,
        model: String,
        p: RawPrice,
    ) -> Result<(), ConfigError> {
        let usd = |v: &serde_json::Value, what: &str| {
            Nanos::from_json_usd(v)
                .map_err(|m| src.at(&model, format!("pricing.{model}.{what}: {m}")))
        };
        let price = Price {
            input: usd(&p.input, "input")?.0,
            output: usd(&p.output, "output")?.0,
            cache_read: match &p.cache_read {
                Some(v) => usd(v, "cache_read")?.0,
                None => 0,
            },
            // Only Anthropic reports cache writes (billed at 1.25× input); not given, they are
            // charged at the input price.
            cache_write: match &p.cache_write {
                Some(v) => usd(v, "cache_write")?.0,
                None => 0,
            },
        };
        if let Some(o) = p.prompt_overhead_tokens {
            self.prompt_overhead.insert(model.clone(), o);
        }
        self.pricing.insert(model, price);
        Ok(())
    }

    /// The settings of how threads run: retries, cancel grace, checkpoints, context windows,
    /// prompt overhead, built-in hooks, continuation threshold.
    fn overlay_run_settings(
        &mut self,
        src: &Source<'_>,
        raw: &mut RawConfig,
    ) -> Result<(), ConfigError> {
        if let Some(r) = raw.retries {
            self.retries = r;
        }
        if let Some(g) = &raw.cancel_grace {
            // At most an hour: a deadline is now + grace, which a huge grace would overflow.
            self.cancel_grace = humantime::parse_duration(g)
                .ok()
                .filter(|d| *d <= Duration::from_secs(3600))
                .ok_or_else(|| {
                    src.at(
                        "cancel_grace",
                        format!("cancel_grace: `{g}` is not a duration of at most 1h (e.g. 5s)"),
                    )
                })?;
        }
        if let Some(c) = raw.checkpoint_every {
            self.checkpoint_every = c.max(1);
        }
        self.context_window
            .extend(std::mem::take(&mut raw.context_window));
        if let Some(o) = raw.prompt_overhead_tokens {
            self.prompt_overhead.insert("default".into(), o);
        }
        if let Some(b) = &raw.builtin_hooks {
            self.builtin_hooks = *b;
        }
        if let Some(t) = raw.continuation_threshold {
            if !(0.1..=1.0).contains(&t) {
                return Err(src.at(
                    "continuation_threshold",
                    format!("continuation_threshold {t}: a share of the context window between 0.1 and 1.0"),
                ));
            }
            self.continuation_threshold = t;
        }
        Ok(())
    }

    /// Template overhead tokens of one call to `model` (see [`Config::prompt_overhead`]):
    /// config's for the model, else the larger of config's default and what the vendor
    /// documents for the model's tool-use system prompt.
    pub fn prompt_overhead_of(&self, model: &str) -> u64 {
        if let Some(o) = self.prompt_overhead.get(model) {
            return *o;
        }
        let default = self
            .prompt_overhead
            .get("default")
            .copied()
            .unwrap_or(DEFAULT_PROMPT_OVERHEAD);
        super::models::tool_prompt_tokens(model).map_or(default, |t| t.max(default))
    }

    /// The context window of `model` in tokens: config's, else the built-in table's.
    pub fn context_window_of(&self, model: &str) -> Option<u64> {
        self.context_window
            .get(model)
            .copied()
            .or_else(|| super::models::known(model).map(|k| k.context))
    }

    /// The price of `model` (config's, else the built-in table's), or an error that says how to
    /// add one.
    pub fn price(&self, model: &str) -> Result<Price, NoPrice> {
        let known = || super::models::known(model).map(|k| k.price());
        self.pricing
            .get(model)
            .copied()
            .or_else(known)
            .ok_or_else(|| NoPrice {
                model: model.into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_text_parses_to_defaults() {
        let mut c = Config::default();
        c.overlay_text(Path::new("config.yaml"), DEFAULT_CONFIG_YAML)
            .unwrap();
        assert_eq!(c.default_limits.turns, Some(15));
        assert_eq!(c.default_limits.spend, Some(Nanos(500_000_000)));
        assert_eq!(c.price("scripted").unwrap().output, 4_000_000_000);
        assert_eq!(c.cancel_grace, Duration::from_secs(5));
    }

    #[test]
    fn errors_name_file_and_key() {
        let mut c = Config::default();
        let e = c
            .overlay_text(Path::new("c.yaml"), "defaults:\n  limits: { turnz: 3 }\n")
            .unwrap_err();
        assert!(e.to_string().contains("c.yaml:2"), "{e}");
        assert!(e.to_string().contains("turnz"), "{e}");
        let e = c
            .overlay_text(
                Path::new("c.yaml"),
                "pricing:\n  m: { input: cheap, output: 1 }\n",
            )
            .unwrap_err();
        assert!(e.to_string().contains("pricing.m.input"), "{e}");
        let e = c
            .overlay_text(Path::new("c.yaml"), "bogus: 1\n")
            .unwrap_err();
        assert!(e.to_string().contains("c.yaml:1"), "{e}");
        assert!(c
            .price("gpt-x")
            .unwrap_err()
            .to_string()
            .contains("pricing"));
    }

    #[test]
    fn built_in_providers_and_prices_exist_and_config_overrides_them() {
        let mut c = Config::default();
        assert_eq!(
            c.providers["openai"].api_key_env.as_deref(),
            Some("OPENAI_API_KEY")
        );
        assert_eq!(c.providers["anthropic"].kind, ProviderKind::Anthropic);
        assert_eq!(c.price("gpt-4o-mini").unwrap().input, 150_000_000);
        assert_eq!(
            c.price("claude-haiku-4-5-20251001").unwrap().output,
            5_000_000_000
        );
        assert_eq!(c.context_window_of("gpt-4o"), Some(128_000));
        c.overlay_text(
            Path::new("c.yaml"),
            "pricing:\n  gpt-4o: { input: 9, output: 9 }\ncontext_window: { gpt-4o: 1000 }\nproviders:\n  openai: { kind: openai, base_url: \"http://x/v1\" }\n",
        )
        .unwrap();
        assert_eq!(c.price("gpt-4o").unwrap().input, 9_000_000_000);
        assert_eq!(c.context_window_of("gpt-4o"), Some(1000));
        assert_eq!(
            c.providers["openai"].base_url.as_deref(),
            Some("http://x/v1")
        );
        assert_eq!(
            c.providers["openai"].api_key_env.as_deref(),
            Some("OPENAI_API_KEY"),
            "a later file overlays a provider key by key"
        );
    }

    #[test]
    fn a_bad_kind_names_its_line_and_the_allowed_values() {
        let cases = [
            (
                "providers:\n  local:\n    kind: bogus\n",
                "c.yaml:3:",
                "scripted, openai, anthropic",
            ),
            ("durability: fast\n", "c.yaml:1:", "normal, strict"),
            (
                "providers:\n  local: { kind: openai, max_tokens_field: x }\n",
                "c.yaml:2:",
                "max_tokens, max_completion_tokens",
            ),
        ];
        for (text, at, allowed) in cases {
            let e = Config::default()
                .overlay_text(Path::new("c.yaml"), text)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(at) && e.contains(allowed), "{e}");
        }
        let mut c = Config::default();
        c.overlay_text(
            Path::new("c.yaml"),
            "durability: strict\nproviders:\n  local: { kind: openai, max_tokens_field: max_tokens }\n",
        )
        .unwrap();
        assert_eq!(c.durability, Durability::Strict);
        assert_eq!(c.providers["local"].kind, ProviderKind::Openai);
        assert_eq!(
            c.providers["local"].max_tokens_field,
            Some(MaxTokensField::MaxTokens)
        );
    }
}
