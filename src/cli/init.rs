//! `weft init`: a project folder, its default config, trust in the user's key, empty databases.

use super::{failed, usage, Exit};
use std::io::Write;
use std::path::PathBuf;

/// The first line of the config `weft init` writes: editors running the YAML language server
/// complete and check it against `.weft/schemas/config.json`.
const CONFIG_MODELINE: &str = "# yaml-language-server: $schema=./schemas/config.json";

pub(super) fn init(explicit: Option<PathBuf>) -> Result<i32, Exit> {
    let root = match explicit {
        Some(p) => p,
        None => std::env::current_dir().map_err(|e| usage(e.to_string()))?,
    };
    let weft = root.join(".weft");
    for d in ["state", "threads", "trust"] {
        std::fs::create_dir_all(weft.join(d)).map_err(|e| Exit {
            code: 1,
            message: format!("{}: {e}", weft.join(d).display()),
        })?;
    }
    std::fs::create_dir_all(root.join("directives")).map_err(failed)?;
    let cfg = weft.join("config.yaml");
    if cfg.exists() {
        out!("{} already exists; left as it is", cfg.display());
    } else {
        let text = format!(
            "{CONFIG_MODELINE}\n{}",
            crate::project::config::DEFAULT_CONFIG_YAML
        );
        std::fs::write(&cfg, text).map_err(|e| Exit {
            code: 1,
            message: format!("{}: {e}", cfg.display()),
        })?;
        out!("wrote {}", cfg.display());
    }
    // JSON Schemas for editors, rewritten on every init (they follow the weft that wrote them).
    let schemas = weft.join("schemas");
    super::schema::write_all(&schemas).map_err(|e| Exit {
        code: 1,
        message: format!("{}: {e}", schemas.display()),
    })?;
    out!(
        "wrote JSON Schemas to {} (editors: start tools/*.yaml with `# yaml-language-server: $schema=../.weft/schemas/tool.json`)",
        schemas.display()
    );
    let signer = crate::record::signing::Signer::load_or_create(&crate::project::user_dir())
        .map_err(failed)?;
    signer.trust_in(&weft.join("trust")).map_err(failed)?;
    // Empty databases (their schema on the configured server, if any), so `weft threads` works
    // before the first run.
    let project = crate::project::Project { root: root.clone() };
    let config = project.config().map_err(|e| usage(e.to_string()))?;
    let url = config.database.as_ref();
    crate::registry::Store::open_at(url, &project.state_dir().join("registry.db"))
        .map_err(failed)?;
    crate::ledger::open_db(url, &project.state_dir().join("ledger.db")).map_err(failed)?;
    out!(
        "signing key {} trusted in {}",
        signer.key_id,
        weft.join("trust").display()
    );
    Ok(0)
}
