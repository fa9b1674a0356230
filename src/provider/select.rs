//! Which provider and model a thread runs on: every configured backend by name, `--provider`,
//! `--script`, `--model`, and a directive's `model` (id or tier).

use super::{anthropic, http, openai, scripted, Provider};
use crate::project::config::ProviderKind;

/// Every provider a runtime can use, by config name, and the rules that pick one for a thread.
pub(crate) struct Providers {
    by_name: std::collections::BTreeMap<String, std::sync::Arc<dyn Provider>>,
    /// Providers that could not be built (e.g. a missing API key): the reason, given when a
    /// thread asks for one.
    broken: std::collections::BTreeMap<String, String>,
    /// Provider for every thread (`--script` forces `scripted`, `--provider` names one).
    force: Option<String>,
    /// Model for every thread (`--model`).
    model: Option<String>,
}

/// A provider and model for every thread of one tree (`POST /v1/threads`' `provider`, `model`),
/// over the runtime's: like `--provider` and `--model`, but for one tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Route {
    /// Provider name (under `providers:` in config).
    pub provider: Option<String>,
    /// Model id.
    pub model: Option<String>,
}

/// What the runtime was asked for on the command line.
#[derive(Debug, Clone, Default)]
pub(crate) struct Choice {
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
    pub(crate) fn build(
        project_root: &std::path::Path,
        config: &crate::project::config::Config,
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
    pub(crate) fn single(name: &str, provider: std::sync::Arc<dyn Provider>) -> Providers {
        let mut by_name = std::collections::BTreeMap::new();
        by_name.insert(name.to_string(), provider);
        Providers {
            by_name,
            broken: Default::default(),
            force: Some(name.into()),
            model: None,
        }
    }

    /// The same set with `model` for every thread (when given).
    pub(crate) fn with_model(mut self, model: Option<String>) -> Providers {
        self.model = model.or(self.model);
        self
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
    pub(crate) fn select(
        &self,
        config: &crate::project::config::Config,
        d: &crate::directive::Directive,
        route: Option<&Route>,
    ) -> Result<(std::sync::Arc<dyn Provider>, String, String), String> {
        let forced_model = route.and_then(|r| r.model.clone()).or(self.model.clone());
        let name = route
            .and_then(|r| r.provider.clone())
            .or_else(|| self.force.clone())
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
        if pc.is_some_and(|p| p.kind == ProviderKind::Scripted) || prov.name() == "scripted" {
            return Ok((prov, name, "scripted".into()));
        }
        let tiers = pc.map(|p| &p.tiers);
        let model = match (&forced_model, &d.model.id, &d.model.tier) {
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
    pc: &crate::project::config::ProviderConfig,
) -> Result<std::sync::Arc<dyn Provider>, String> {
    match pc.kind {
        ProviderKind::Scripted => {
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
            let (base_var, vendor_base) = crate::project::models::default_base_url(kind);
            let base_url = pc.base_url.clone().unwrap_or_else(|| {
                std::env::var(base_var)
                    .ok()
                    .filter(|u| !u.is_empty())
                    .unwrap_or_else(|| vendor_base.into())
            });
            let settings = http::HttpSettings {
                base_url,
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
            if kind == ProviderKind::Anthropic {
                Ok(std::sync::Arc::new(anthropic::Anthropic::new(
                    name, settings,
                )?))
            } else {
                Ok(std::sync::Arc::new(openai::OpenAi::new(
                    name,
                    settings,
                    pc.max_tokens_field,
                )?))
            }
        }
    }
}
