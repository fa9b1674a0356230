//! Names the commit the binary was built from, for `weft --version` (`WEFT_COMMIT`: the
//! short hash, with `-dirty` when the work tree had changes; `unknown` outside a git checkout).

fn main() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=WEFT_COMMIT={commit}{suffix}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
    if let Some(head) = std::fs::read_to_string(".git/HEAD").ok().and_then(|h| {
        h.strip_prefix("ref: ")
            .map(|r| format!(".git/{}", r.trim()))
    }) {
        println!("cargo:rerun-if-changed={head}");
    }
}
