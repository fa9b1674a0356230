//! Capabilities: dot-separated permission patterns, matching and attenuation (SPEC §8).
//!
//! `*` matches exactly one segment, `**` any number (zero included). Fail-closed: anything not
//! covered by a held capability is denied. Attenuation keeps a child's capability only as far as
//! some parent capability covers it, narrowed to every covering parent capability.

/// Does the capability pattern `pattern` grant the concrete permission `perm`?
pub fn matches(pattern: &str, perm: &str) -> bool {
    let p: Vec<&str> = pattern.split('.').collect();
    let s: Vec<&str> = perm.split('.').collect();
    match_segs(&p, &s)
}

fn match_segs(p: &[&str], s: &[&str]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(&"**"), _) => match_segs(&p[1..], s) || (!s.is_empty() && match_segs(p, &s[1..])),
        (Some(&"*"), Some(_)) => match_segs(&p[1..], &s[1..]),
        (Some(a), Some(b)) => a == b && match_segs(&p[1..], &s[1..]),
        _ => false,
    }
}

/// Is `perm` granted by any of `caps`?
pub fn allowed(caps: &[String], perm: &str) -> bool {
    caps.iter().any(|c| matches(c, perm))
}

/// The capabilities a child ends with: each declared one intersected with every parent one.
/// A child that declares none inherits the parent's.
pub fn attenuate(child: &[String], parent: &[String]) -> Vec<String> {
    if child.is_empty() {
        return parent.to_vec();
    }
    let mut out: Vec<String> = Vec::new();
    for c in child {
        let cs: Vec<&str> = c.split('.').collect();
        for p in parent {
            let ps: Vec<&str> = p.split('.').collect();
            for r in intersect(&cs, &ps, 0) {
                let joined = r.join(".");
                if !joined.is_empty() && !out.contains(&joined) {
                    out.push(joined);
                }
            }
        }
    }
    // Drop patterns already covered by a broader one in the set.
    let all = out.clone();
    out.retain(|x| !all.iter().any(|y| y != x && covers(y, x)));
    out
}

/// Does pattern `a` cover every permission pattern `b` covers? (Conservative: literal check.)
fn covers(a: &str, b: &str) -> bool {
    let b_as_perm = b.replace("**", "\u{1}").replace('*', "\u{2}");
    // A `*`/`**` in b must be matched by a wildcard in a: treat them as opaque segments that only
    // `*` (for \u{2}) or `**` can match.
    let a_segs: Vec<&str> = a.split('.').collect();
    let b_segs: Vec<&str> = b_as_perm.split('.').collect();
    covers_segs(&a_segs, &b_segs)
}

fn covers_segs(p: &[&str], s: &[&str]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(&"**"), _) => covers_segs(&p[1..], s) || (!s.is_empty() && covers_segs(p, &s[1..])),
        (_, Some(&"\u{1}")) => false,
        (Some(&"*"), Some(_)) => covers_segs(&p[1..], &s[1..]),
        (Some(a), Some(b)) => a == b && covers_segs(&p[1..], &s[1..]),
        _ => false,
    }
}

/// Patterns whose matches are all matched by both `a` and `b` (sound: never wider than the truth).
fn intersect(a: &[&str], b: &[&str], depth: usize) -> Vec<Vec<String>> {
    if depth > 64 {
        return vec![];
    }
    let prefix = |seg: &str, rest: Vec<Vec<String>>| -> Vec<Vec<String>> {
        rest.into_iter()
            .map(|mut r| {
                r.insert(0, seg.to_string());
                r
            })
            .collect()
    };
    match (a.first(), b.first()) {
        (None, None) => vec![vec![]],
        (None, Some(_)) => {
            if b.iter().all(|s| *s == "**") {
                vec![vec![]]
            } else {
                vec![]
            }
        }
        (Some(_), None) => intersect(b, a, depth + 1),
        (Some(&"**"), Some(&"**")) => {
            let mut out = prefix("**", intersect(&a[1..], &b[1..], depth + 1));
            out.extend(intersect(&a[1..], b, depth + 1));
            out.extend(intersect(a, &b[1..], depth + 1));
            out
        }
        (Some(&"**"), Some(seg)) => {
            let mut out = intersect(&a[1..], b, depth + 1);
            out.extend(prefix(seg, intersect(a, &b[1..], depth + 1)));
            out
        }
        (Some(_), Some(&"**")) => intersect(b, a, depth + 1),
        (Some(x), Some(y)) => {
            let seg = match (*x, *y) {
                ("*", "*") => "*",
                ("*", lit) | (lit, "*") => lit,
                (l1, l2) if l1 == l2 => l1,
                _ => return vec![],
            };
            prefix(seg, intersect(&a[1..], &b[1..], depth + 1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn star_is_one_segment_double_star_any() {
        assert!(matches("thread.spawn.*", "thread.spawn.worker"));
        assert!(!matches("thread.spawn.*", "thread.spawn.research.answer"));
        assert!(matches("thread.spawn.**", "thread.spawn.research.answer"));
        assert!(matches("tool.**", "tool"));
        assert!(!matches("tool.fs", "tool.fs.write"));
        assert!(!matches("tool.f*", "tool.fs"));
    }

    #[test]
    fn attenuation_narrows_to_every_covering_parent() {
        let child = v(&["thread.spawn.**"]);
        let parent = v(&["thread.spawn.research.*", "thread.spawn.worker"]);
        let got = attenuate(&child, &parent);
        assert!(
            got.contains(&"thread.spawn.research.*".to_string()),
            "{got:?}"
        );
        assert!(got.contains(&"thread.spawn.worker".to_string()), "{got:?}");
        assert!(!allowed(&got, "thread.spawn.other"));
        assert!(allowed(&got, "thread.spawn.research.answer"));
    }

    #[test]
    fn attenuation_drops_uncovered_and_inherits_when_empty() {
        assert!(attenuate(&v(&["tool.shell"]), &v(&["tool.fs.*"])).is_empty());
        assert_eq!(attenuate(&[], &v(&["tool.x"])), v(&["tool.x"]));
        assert_eq!(attenuate(&v(&["a.*.c"]), &v(&["a.b.*"])), v(&["a.b.c"]));
    }
}
