//! The built-in providers (`openai`, `anthropic`) and the dated table of the models they know:
//! prices and context windows as their vendors published them. Config overrides any entry
//! (`pricing.<model>`, `context_window.<model>`); a model missing here needs a price in config
//! before it can run under a spend limit.

use super::providers::{ProviderConfig, ProviderKind};
use crate::core::money::Price;
use std::collections::BTreeMap;

/// The date the table below was last checked against the vendors' price pages. Prices change:
/// anyone who sees a different price on the vendor's page should override it in config and fix
/// the table.
pub(crate) const PRICES_AS_OF: &str = "2025-10-15";

/// One model of the built-in table: USD per million tokens (as nano-USD) and context window.
pub(crate) struct KnownModel {
    /// The vendor's model id (dated snapshots `<id>-YYYY-MM-DD` / `<id>-YYYYMMDD` share it).
    pub id: &'static str,
    /// Nano-USD per million input tokens.
    pub input: i64,
    /// Nano-USD per million output tokens.
    pub output: i64,
    /// Nano-USD per million cached input tokens read.
    pub cache_read: i64,
    /// Nano-USD per million input tokens written to the cache.
    pub cache_write: i64,
    /// Context window in tokens.
    pub context: u64,
}

/// An OpenAI model: no cache-write premium (OpenAI caches without billing writes).
const fn m(id: &'static str, input: i64, output: i64, cache_read: i64, context: u64) -> KnownModel {
    KnownModel {
        id,
        input: input * 1_000,
        output: output * 1_000,
        cache_read: cache_read * 1_000,
        cache_write: input * 1_000,
        context,
    }
}

/// An Anthropic model: cache writes (5-minute cache) billed at 1.25× input.
const fn a(id: &'static str, input: i64, output: i64, cache_read: i64, context: u64) -> KnownModel {
    let mut k = m(id, input, output, cache_read, context);
    k.cache_write = k.input * 5 / 4;
    k
}

/// Tokens Anthropic's tool-use system prompt adds to a call with tools, as documented
/// (docs.anthropic.com, "Tool use: pricing"): 346 for Claude 4-era and 3.5/3.7 Sonnet models,
/// up to 530 on Claude 3 models (Opus 3), so 530 for every `claude-3*`. None for other vendors.
pub(crate) fn tool_prompt_tokens(model: &str) -> Option<u64> {
    if model.starts_with("claude-3") {
        Some(530)
    } else if model.starts_with("claude-") {
        Some(346)
    } else {
        None
    }
}

/// Prices in micro-USD per million tokens (so `150_000` is $0.15 / Mtok), as of [`PRICES_AS_OF`].
pub(crate) const KNOWN_MODELS: &[KnownModel] = &[
    // OpenAI (platform.openai.com/docs/pricing), standard tier.
    m("gpt-5", 1_250_000, 10_000_000, 125_000, 400_000),
    m("gpt-5-mini", 250_000, 2_000_000, 25_000, 400_000),
    m("gpt-5-nano", 50_000, 400_000, 5_000, 400_000),
    m("gpt-4.1", 2_000_000, 8_000_000, 500_000, 1_047_576),
    m("gpt-4.1-mini", 400_000, 1_600_000, 100_000, 1_047_576),
    m("gpt-4.1-nano", 100_000, 400_000, 25_000, 1_047_576),
    m("gpt-4o", 2_500_000, 10_000_000, 1_250_000, 128_000),
    m("gpt-4o-mini", 150_000, 600_000, 75_000, 128_000),
    m("o3", 2_000_000, 8_000_000, 500_000, 200_000),
    m("o4-mini", 1_100_000, 4_400_000, 275_000, 200_000),
    // Anthropic (docs.anthropic.com/en/docs/about-claude/pricing); cache writes at 1.25× input.
    a(
        "claude-opus-4-1",
        15_000_000,
        75_000_000,
        1_500_000,
        200_000,
    ),
    a(
        "claude-opus-4-0",
        15_000_000,
        75_000_000,
        1_500_000,
        200_000,
    ),
    a("claude-sonnet-4-5", 3_000_000, 15_000_000, 300_000, 200_000),
    a("claude-sonnet-4-0", 3_000_000, 15_000_000, 300_000, 200_000),
    a("claude-haiku-4-5", 1_000_000, 5_000_000, 100_000, 200_000),
    a(
        "claude-3-5-haiku-latest",
        800_000,
        4_000_000,
        80_000,
        200_000,
    ),
];

/// The table's entry for `model`, also for a dated snapshot of it (`gpt-4o-mini-2024-07-18`,
/// `claude-sonnet-4-5-20250929`). Never matches a longer family name (`gpt-5-pro` is not
/// `gpt-5`): a wrong price would be an overspend.
pub(crate) fn known(model: &str) -> Option<&'static KnownModel> {
    let base = strip_date(model);
    KNOWN_MODELS.iter().find(|k| k.id == base)
}

fn strip_date(model: &str) -> &str {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some((base, date)) = model.rsplit_once('-') {
        if date.len() == 8 && digits(date) {
            return base;
        }
    }
    // -YYYY-MM-DD
    let parts: Vec<&str> = model.rsplitn(4, '-').collect();
    if parts.len() == 4
        && parts[0].len() == 2
        && parts[1].len() == 2
        && parts[2].len() == 4
        && parts[..3].iter().all(|p| digits(p))
    {
        return parts[3];
    }
    model
}

impl KnownModel {
    /// Its price.
    pub(crate) fn price(&self) -> Price {
        Price {
            input: self.input,
            output: self.output,
            cache_read: self.cache_read,
            cache_write: self.cache_write,
        }
    }
}

/// The built-in providers, configured as their official SDKs are: the key from
/// `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`, the base URL from `OPENAI_BASE_URL` /
/// `ANTHROPIC_BASE_URL` (read when the provider is built) or the vendor's.
pub(crate) fn builtin_providers() -> BTreeMap<String, ProviderConfig> {
    let tiers = |fast: &str, smart: &str| {
        BTreeMap::from([
            ("default".to_string(), fast.to_string()),
            ("fast".to_string(), fast.to_string()),
            ("smart".to_string(), smart.to_string()),
        ])
    };
    BTreeMap::from([
        (
            "openai".to_string(),
            ProviderConfig {
                kind: ProviderKind::Openai,
                api_key_env: Some("OPENAI_API_KEY".into()),
                tiers: tiers("gpt-5-mini", "gpt-5"),
                ..Default::default()
            },
        ),
        (
            "anthropic".to_string(),
            ProviderConfig {
                kind: ProviderKind::Anthropic,
                api_key_env: Some("ANTHROPIC_API_KEY".into()),
                tiers: tiers("claude-haiku-4-5", "claude-sonnet-4-5"),
                ..Default::default()
            },
        ),
    ])
}

/// The environment variable that overrides the base URL of a provider kind when its config
/// names none (as the official SDKs read it), and the vendor's URL otherwise.
pub(crate) fn default_base_url(kind: ProviderKind) -> (&'static str, &'static str) {
    if kind == ProviderKind::Anthropic {
        ("ANTHROPIC_BASE_URL", "https://api.anthropic.com")
    } else {
        ("OPENAI_BASE_URL", "https://api.openai.com/v1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_share_their_family_price_and_longer_names_do_not() {
        assert_eq!(known("gpt-4o-mini-2024-07-18").unwrap().id, "gpt-4o-mini");
        assert_eq!(
            known("claude-sonnet-4-5-20250929").unwrap().id,
            "claude-sonnet-4-5"
        );
        assert_eq!(known("gpt-4o-mini").unwrap().input, 150_000_000);
        assert!(known("gpt-5-pro").is_none());
        assert!(known("gpt-4o-mini-audio").is_none());
        assert!(known("my-model").is_none());
    }

    #[test]
    fn every_entry_is_priced_and_unique() {
        for (i, k) in KNOWN_MODELS.iter().enumerate() {
            assert!(
                k.input > 0
                    && k.output >= k.input
                    && k.cache_read <= k.input
                    && k.cache_write >= k.input,
                "{}",
                k.id
            );
            assert!(k.context >= 100_000, "{}", k.id);
            assert!(KNOWN_MODELS[..i].iter().all(|o| o.id != k.id), "{}", k.id);
        }
    }
}
