//! Helpers for YAML error messages that name the file's own line, shared by config, directive
//! and script parsing.

/// The message of a YAML error without its rendered snippet.
pub(crate) fn yaml_message(e: &serde_saphyr::Error) -> String {
    let full = e.to_string();
    let first = full.lines().next().unwrap_or("invalid YAML").trim();
    let first = first.trim_start_matches("error: ");
    // The location is reported separately (shifted to the file's own lines): drop the parser's.
    match first.strip_prefix("line ").and_then(|r| r.split_once(": ")) {
        Some((pos, rest))
            if pos
                .split(' ')
                .next()
                .is_some_and(|n| n.parse::<u64>().is_ok()) =>
        {
            rest.to_string()
        }
        _ => first.to_string(),
    }
}

/// The 1-based line (and column 1) of the first line whose key is `key`, for error messages.
pub(crate) fn find_line(text: &str, key: &str) -> Option<(u64, u64)> {
    text.lines().enumerate().find_map(|(i, l)| {
        let t = l.trim_start();
        (t.starts_with(&format!("{key}:"))
            || t.contains(&format!(" {key}:"))
            || t.contains(&format!("{{{key}:")))
        .then(|| (i as u64 + 1, (l.len() - t.len()) as u64 + 1))
    })
}
