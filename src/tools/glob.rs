//! `file_find`'s globs over path segments: `**` any number of segments, `*` any run of
//! characters within one, `?` one character.
//!
//! Owns matching only and never touches the disk. Matching never backtracks exponentially: both
//! levels use the two-pointer wildcard walk (back to the last star only), so a match costs at
//! most pattern × path steps whatever a model writes (`*a*a*a*a*a*a*a*ab` included).

/// A parsed glob.
#[derive(Debug)]
pub(crate) struct Glob {
    /// Its segments (`/`-separated; empty and `.` segments dropped), as characters.
    segs: Vec<Vec<char>>,
}

impl Glob {
    /// `text` as a glob (a leading `./` or `/`-doubling means nothing).
    pub(crate) fn new(text: &str) -> Glob {
        let segs = text
            .split('/')
            .filter(|s| !s.is_empty() && *s != ".")
            .map(|s| s.chars().collect())
            .collect();
        Glob { segs }
    }

    /// Whether `path` (relative, `/`-separated) matches.
    pub(crate) fn matches(&self, path: &str) -> bool {
        let parts: Vec<Vec<char>> = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| s.chars().collect())
            .collect();
        wildcard(&self.segs, &parts, |p| is_globstar(p), |p, s| segment(p, s))
    }

    /// The leading segments without a wildcard that are folders (every one but a last, which
    /// names the files): where a walk for this glob may start.
    pub(crate) fn folder(&self) -> String {
        let literal = |s: &Vec<char>| !s.iter().any(|c| matches!(c, '*' | '?'));
        let n = self.segs.iter().take_while(|s| literal(s)).count();
        let n = n.min(self.segs.len().saturating_sub(1));
        let parts: Vec<String> = self.segs[..n].iter().map(|s| s.iter().collect()).collect();
        if parts.is_empty() {
            ".".into()
        } else {
            parts.join("/")
        }
    }
}

fn is_globstar(seg: &[char]) -> bool {
    seg == ['*', '*']
}

/// One segment: `*` any run, `?` one character, anything else itself.
fn segment(p: &[char], s: &[char]) -> bool {
    wildcard(p, s, |c| *c == '*', |c, x| *c == '?' || c == x)
}

/// The two-pointer wildcard match of `pat` against `text`: `star(p)` matches any run of items,
/// `one(p, t)` says whether a non-star item matches one item. On a mismatch it goes back only to
/// the last star, one item further: at most `pat.len() × text.len()` steps.
fn wildcard<P, T>(
    pat: &[P],
    text: &[T],
    star: impl Fn(&P) -> bool,
    one: impl Fn(&P, &T) -> bool,
) -> bool {
    let (mut i, mut j) = (0, 0);
    // (pattern index after the last star, text index that star has taken up to)
    let mut back: Option<(usize, usize)> = None;
    while j < text.len() {
        if i < pat.len() && star(&pat[i]) {
            i += 1;
            back = Some((i, j));
        } else if i < pat.len() && one(&pat[i], &text[j]) {
            i += 1;
            j += 1;
        } else if let Some((after, taken)) = back {
            i = after;
            j = taken + 1;
            back = Some((after, j));
        } else {
            return false;
        }
    }
    pat[i..].iter().all(star)
}

#[cfg(test)]
mod tests {
    use super::Glob;

    #[test]
    fn globs_match_by_segment() {
        let m = |p: &str, s: &str| Glob::new(p).matches(s);
        assert!(m("*.md", "a.md"));
        assert!(!m("*.md", "d/a.md"));
        assert!(m("**/*.md", "d/e/a.md"));
        assert!(m("**/*.md", "a.md"));
        assert!(m("./d/**", "d/e/a.md"));
        assert!(m("d/?.txt", "d/x.txt"));
        assert!(!m("d/?.txt", "d/xy.txt"));
        assert!(m("a/**/b/**/c", "a/x/b/y/z/c"));
        assert!(!m("a/**/b/**/c", "a/x/c"));
        assert!(m("*a*b", "xaaab"));
        assert!(!m("*a*a*a*a*a*a*a*a*a*ab", &"a".repeat(60)));
        assert_eq!(Glob::new("notes/**/*.md").folder(), "notes");
        assert_eq!(Glob::new("notes/a.md").folder(), "notes");
        assert_eq!(Glob::new("*.md").folder(), ".");
    }
}
