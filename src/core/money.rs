//! Money: integer nano-USD ([`Nanos`]) and model prices.
//!
//! Owns every conversion between the USD figures users write and the integers the ledger keeps.
//! Must never use floating point for arithmetic on money: a float only appears when a YAML number
//! is first read, and is rounded to the nearest nano-USD at once.

use serde::{Deserialize, Serialize};
use std::fmt;

/// An amount of money in nano-USD (1 USD = 1_000_000_000).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Nanos(pub i64);

/// A USD amount that cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MoneyError {
    /// Text that is not a USD amount.
    #[error("`{0}` is not a USD amount (expected e.g. 0.25 or \"$1.50\")")]
    NotUsd(String),
    /// Finer than the ledger counts.
    #[error("`{0}` has more than 9 decimals (the ledger counts nano-USD)")]
    TooPrecise(String),
    /// A number that is negative, not finite or too large.
    #[error("{0} is not a USD amount between 0 and 9e9")]
    OutOfRange(f64),
    /// A whole number of USD too large to count in nano-USD.
    #[error("{0} USD is too large")]
    TooLarge(u64),
    /// A JSON value that is neither a number nor a string (its JSON text).
    #[error("{0} is not a USD amount")]
    NotAmount(String),
}

/// Nano-USD in one USD.
pub(crate) const NANOS_PER_USD: i64 = 1_000_000_000;

impl Nanos {
    /// Zero nano-USD.
    pub const ZERO: Nanos = Nanos(0);

    /// Parses a USD amount such as `0.25`, `"$1.50"` or `"2"` exactly (up to 9 decimals).
    pub fn parse_usd(text: &str) -> Result<Nanos, MoneyError> {
        let t = text.trim().trim_start_matches('$').trim();
        let bad = || MoneyError::NotUsd(text.into());
        if t.is_empty() || t.starts_with('-') {
            return Err(bad());
        }
        let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
        if !whole.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        if frac.len() > 9 {
            return Err(MoneyError::TooPrecise(text.into()));
        }
        let whole: i64 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| bad())?
        };
        let mut frac_n: i64 = 0;
        for (i, c) in frac.chars().enumerate() {
            frac_n += i64::from(c as u8 - b'0') * 10i64.pow(8 - i as u32);
        }
        whole
            .checked_mul(NANOS_PER_USD)
            .and_then(|w| w.checked_add(frac_n))
            .map(Nanos)
            .ok_or_else(bad)
    }

    /// Converts a YAML/JSON number of USD, rounding to the nearest nano-USD.
    pub fn from_usd_f64(usd: f64) -> Result<Nanos, MoneyError> {
        if !usd.is_finite() || !(0.0..=9.0e9).contains(&usd) {
            return Err(MoneyError::OutOfRange(usd));
        }
        // Go through the shortest decimal text so 0.1 becomes exactly 100_000_000.
        Nanos::parse_usd(&format!("{usd}")).or_else(|_| Ok(Nanos((usd * 1e9).round() as i64)))
    }

    /// Parses a serde_json value that is a number or a string of USD.
    pub fn from_json_usd(v: &serde_json::Value) -> Result<Nanos, MoneyError> {
        match v {
            serde_json::Value::String(s) => Nanos::parse_usd(s),
            serde_json::Value::Number(n) => match (n.as_u64(), n.as_f64()) {
                (Some(u), _) => i64::try_from(u)
                    .ok()
                    .and_then(|u| u.checked_mul(NANOS_PER_USD))
                    .map(Nanos)
                    .ok_or(MoneyError::TooLarge(u)),
                (None, Some(f)) => Nanos::from_usd_f64(f),
                _ => Err(MoneyError::NotAmount(n.to_string())),
            },
            other => Err(MoneyError::NotAmount(other.to_string())),
        }
    }

    /// Saturating addition.
    pub fn plus(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(other.0))
    }

    /// Saturating subtraction.
    pub fn minus(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(other.0))
    }
}

impl fmt::Display for Nanos {
    /// Formats as USD with as many decimals as needed (at least 2): `$0.000123`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        let whole = abs / NANOS_PER_USD as u64;
        let frac = format!("{:09}", abs % NANOS_PER_USD as u64);
        let trimmed = frac.trim_end_matches('0');
        let frac = if trimmed.len() < 2 {
            &frac[..2]
        } else {
            trimmed
        };
        write!(f, "{sign}${whole}.{frac}")
    }
}

/// The price of one model, in nano-USD per million tokens (exact for any price with ≤ 9 decimals).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Price {
    /// Nano-USD per million prompt tokens.
    pub input: i64,
    /// Nano-USD per million output tokens.
    pub output: i64,
    /// Nano-USD per million prompt tokens read from the provider's cache.
    pub cache_read: i64,
    /// Nano-USD per million prompt tokens written to the provider's cache (Anthropic bills them
    /// at 1.25× input). Never taken below `input`: 0 means the input price.
    #[serde(default)]
    pub cache_write: i64,
}

/// Token counts of one LLM call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens billed at the input price (excluding cache reads).
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Of `input_tokens`, those written to the provider's cache (billed at `cache_write`).
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl Price {
    /// The cost of a call: `ceil(Σ tokens × price_per_million / 1e6)`, computed in i128.
    ///
    /// One rounding per call (up, so a reservation is never smaller than the truth).
    pub fn cost(&self, usage: &Usage) -> Nanos {
        let writes = usage.cache_write_tokens.min(usage.input_tokens);
        let micro = i128::from(usage.input_tokens - writes) * i128::from(self.input)
            + i128::from(writes) * i128::from(self.cache_write.max(self.input))
            + i128::from(usage.output_tokens) * i128::from(self.output)
            + i128::from(usage.cache_read_tokens) * i128::from(self.cache_read);
        let nanos = (micro + 999_999) / 1_000_000;
        Nanos(i64::try_from(nanos).unwrap_or(i64::MAX))
    }

    /// The most output tokens that fit in `available` after a prompt of `prompt_tokens`.
    pub fn max_output_within(&self, available: Nanos, prompt_tokens: u64) -> u64 {
        let budget_micro = i128::from(available.0) * 1_000_000
            - i128::from(prompt_tokens) * i128::from(self.input);
        if budget_micro < 0 {
            return 0;
        }
        if self.output <= 0 {
            return u64::MAX;
        }
        u64::try_from(budget_micro / i128::from(self.output)).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_usd_exactly() {
        assert_eq!(Nanos::parse_usd("0.50"), Ok(Nanos(500_000_000)));
        assert_eq!(Nanos::parse_usd("$1.5"), Ok(Nanos(1_500_000_000)));
        assert_eq!(Nanos::parse_usd("0.000000001"), Ok(Nanos(1)));
        assert!(Nanos::parse_usd("-1").is_err());
        assert!(Nanos::parse_usd("abc").is_err());
        assert!(Nanos::parse_usd("0.0000000001").is_err());
        assert_eq!(Nanos::from_usd_f64(0.1), Ok(Nanos(100_000_000)));
        assert_eq!(Nanos::from_usd_f64(0.07), Ok(Nanos(70_000_000)));
    }

    #[test]
    fn formats_usd() {
        assert_eq!(Nanos(500_000_000).to_string(), "$0.50");
        assert_eq!(Nanos(123).to_string(), "$0.000000123");
        assert_eq!(Nanos(2_000_000_000).to_string(), "$2.00");
    }

    #[test]
    fn cost_rounds_up_once_per_call() {
        let p = Price {
            input: 150_000_000,
            output: 600_000_000,
            cache_read: 75_000_000,
            cache_write: 0,
        };
        let u = Usage {
            input_tokens: 1,
            output_tokens: 1,
            cache_read_tokens: 1,
            cache_write_tokens: 0,
        };
        assert_eq!(p.cost(&u), Nanos(825));
        let u = Usage {
            input_tokens: 1000,
            output_tokens: 0,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
        };
        assert_eq!(p.cost(&u), Nanos(150_000));
        // Cache writes: at `cache_write`, never below input (0 is the input price).
        let u = Usage {
            input_tokens: 1000,
            cache_write_tokens: 400,
            ..Usage::default()
        };
        assert_eq!(p.cost(&u), Nanos(150_000));
        let p = Price {
            cache_write: 187_500_000,
            ..p
        };
        assert_eq!(p.cost(&u), Nanos(90_000 + 75_000));
        assert_eq!(p.max_output_within(Nanos(150_000 + 600), 1000), 1);
    }
}
