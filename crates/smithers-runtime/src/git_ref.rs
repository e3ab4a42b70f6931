//! Git ref names taken from outside (a project's `.git/HEAD`, a client): the rules of
//! `git check-ref-format` (git-check-ref-format(1)), plus no leading `-` (it would read as an
//! option to any git command it reaches). A name that passes is also a plain relative path of
//! `Normal` components, so it cannot climb out of the directory it is joined to.

use crate::error::RuntimeError;

/// Why `name` is not a valid git ref name, or `None` when it is.
pub fn ref_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("it is empty");
    }
    if name == "@" {
        return Some("it is `@`");
    }
    if name.starts_with('-') {
        return Some("it starts with `-`");
    }
    if name.starts_with('/') || name.ends_with('/') || name.contains("//") {
        return Some("it has an empty component (a leading, trailing or doubled `/`)");
    }
    if name.ends_with('.') {
        return Some("it ends with `.`");
    }
    if name.contains("..") {
        return Some("it contains `..`");
    }
    if name.contains("@{") {
        return Some("it contains `@{`");
    }
    if let Some(c) = name.chars().find(|c| {
        c.is_ascii_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\')
    }) {
        return Some(if c.is_ascii_control() {
            "it contains a control character"
        } else {
            "it contains one of ` ~^:?*[\\`"
        });
    }
    for component in name.split('/') {
        if component.starts_with('.') {
            return Some("a component starts with `.`");
        }
        if component.ends_with(".lock") {
            return Some("a component ends with `.lock`");
        }
    }
    None
}

/// `Ok` when `name` is a valid git ref name (see [`ref_name_problem`]).
pub fn validate_ref_name(what: &'static str, name: &str) -> Result<(), RuntimeError> {
    match ref_name_problem(name) {
        None => Ok(()),
        Some(problem) => Err(RuntimeError::InvalidControl {
            control: what,
            reason: format!("{name:?} is not a valid git ref name: {problem}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_pass() {
        for ok in [
            "refs/heads/main",
            "refs/heads/feature/x-1",
            "main",
            "refs/tags/v1.2.3",
            "refs/heads/a@b",
            "refs/heads/ünïcode",
            "HEAD",
        ] {
            assert_eq!(ref_name_problem(ok), None, "{ok}");
        }
    }

    #[test]
    fn every_rule_of_check_ref_format_refuses() {
        for bad in [
            "",
            "@",
            "-main",
            "/refs/heads/x",
            "refs/heads/x/",
            "refs//heads",
            "refs/heads/x.",
            "refs/../etc/passwd",
            "../../etc/passwd",
            "refs/heads/a..b",
            "refs/heads/x@{1}",
            "refs/heads/a b",
            "refs/heads/a\tb",
            "refs/heads/a\nb",
            "refs/heads/a\x7fb",
            "refs/heads/a~1",
            "refs/heads/a^",
            "refs/heads/a:b",
            "refs/heads/a?",
            "refs/heads/a*",
            "refs/heads/a[b",
            "refs/heads/a\\b",
            "refs/heads/.hidden",
            ".git/config",
            "refs/heads/x.lock",
            "refs/heads/x.lock/y",
        ] {
            assert!(ref_name_problem(bad).is_some(), "{bad:?} passed");
            assert!(validate_ref_name("ref", bad).is_err());
        }
    }

    /// What passes is a relative path of plain components: joining it cannot climb out.
    #[test]
    fn valid_names_are_plain_relative_paths() {
        use std::path::{Component, Path};
        for ok in ["refs/heads/main", "a/b/c", "x"] {
            assert!(Path::new(ok)
                .components()
                .all(|c| matches!(c, Component::Normal(_))));
        }
    }
}
