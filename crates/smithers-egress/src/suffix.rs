//! Public suffixes (`com`, `co.uk`, `github.io`, ...): a wildcard over one of them
//! (`*.github.io`) allows every stranger's domain beneath it, so the policy lint refuses it.
//!
//! The list is Mozilla's Public Suffix List (MPL-2.0), vendored in `data/` with its comments
//! stripped (the header keeps its version); names in it that are not ASCII are kept in their
//! IDNA (punycode) form, the only form a policy name may take.

use std::collections::HashSet;
use std::sync::OnceLock;

const LIST: &str = include_str!("../data/public_suffix_list.dat");

struct Suffixes {
    exact: HashSet<String>,
    /// `*.x` rules: every direct child of `x` is a public suffix...
    wildcard: HashSet<String>,
    /// ...unless it is named by a `!` rule.
    exception: HashSet<String>,
}

fn suffixes() -> &'static Suffixes {
    static SET: OnceLock<Suffixes> = OnceLock::new();
    SET.get_or_init(|| {
        let mut s = Suffixes {
            exact: HashSet::new(),
            wildcard: HashSet::new(),
            exception: HashSet::new(),
        };
        for line in LIST.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with("//") {
                continue;
            }
            let ascii = |n: &str| idna::domain_to_ascii(n).unwrap_or_else(|_| n.to_string());
            if let Some(rest) = line.strip_prefix("*.") {
                s.wildcard.insert(ascii(rest));
            } else if let Some(rest) = line.strip_prefix('!') {
                s.exception.insert(ascii(rest));
            } else {
                s.exact.insert(ascii(line));
            }
        }
        s
    })
}

/// Whether `name` (lower-case ASCII, no trailing dot) is a public suffix: on the list, a
/// child of a wildcard entry that no exception names, or a single label (every top-level
/// name is one, listed or not).
pub fn is_public_suffix(name: &str) -> bool {
    if !name.contains('.') {
        return true;
    }
    let s = suffixes();
    if s.exact.contains(name) {
        return true;
    }
    match name.split_once('.') {
        Some((_, parent)) => s.wildcard.contains(parent) && !s.exception.contains(name),
        None => false,
    }
}

/// The version line of the vendored list, for `doctor` and the docs.
pub fn list_version() -> &'static str {
    LIST.lines()
        .find_map(|l| l.strip_prefix("// VERSION: "))
        .unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_and_registrable_names() {
        for s in [
            "com",
            "co.uk",
            "github.io",
            "s3.amazonaws.com",
            "anything",
            "xn--fiqs8s",
        ] {
            assert!(is_public_suffix(s), "{s}");
        }
        for n in [
            "example.com",
            "github.com",
            "bbc.co.uk",
            "me.github.io",
            "api.openai.com",
        ] {
            assert!(!is_public_suffix(n), "{n}");
        }
        assert_ne!(list_version(), "unknown");
    }
}
