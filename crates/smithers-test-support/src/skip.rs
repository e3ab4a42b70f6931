//! The one CI-aware skip of the workspace's tests.
//!
//! A test that needs something this host lacks (root, a kernel feature, Docker, a Ray cluster,
//! node) keeps its own check and, when the check fails, calls [`skip_or_fail`] (or
//! [`skip_unless!`](crate::skip_unless)): under `CI=true` a missing capability fails the run;
//! elsewhere the test passes after printing `SKIP <test>: <reason>`.
//!
//! The line goes to the process's real stderr, not through `print!`/`eprint!`: libtest captures
//! those and shows them only for a failing test, and a skipped test passes. `std::io::stderr()`
//! writes to file descriptor 2 directly; libtest's capture only swaps what the print macros
//! write to, so the line is shown by a plain `cargo test` (the `skip_line_reaches_real_stderr`
//! test of this crate proves it by running itself).

use std::io::Write;

/// Whether this run is CI's (`CI=true`): a missing capability then fails instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Writes a line to the real stderr, past libtest's capture: SKIP and KNOWN FAILURE lines must
/// be seen in a normal `cargo test` run, not only with `--nocapture`.
pub fn say(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(format!("{line}\n").as_bytes());
}

/// The running test's name: libtest names each test's thread after the test
/// (`module::case`); `"?"` on a thread without a name.
pub fn test_name() -> String {
    std::thread::current().name().unwrap_or("?").to_string()
}

/// A required capability is missing: panics under `CI=true`; otherwise prints
/// `SKIP <test>: <reason>` (the running test's name) and returns false, so that a check can
/// end with `ok || skip_or_fail("...")`. Under CI the panic names the caller's line.
#[track_caller]
pub fn skip_or_fail(reason: &str) -> bool {
    skip_or_fail_as(&test_name(), reason)
}

/// [`skip_or_fail`] for a test whose name is not its thread's (a suite case run from a table,
/// a check on another thread).
#[track_caller]
pub fn skip_or_fail_as(test: &str, reason: &str) -> bool {
    if in_ci() {
        panic!("{test}: required capability missing under CI=true: {reason}");
    }
    say(&format!("SKIP {test}: {reason}"));
    false
}

/// An optional capability is missing (one CI need not have either: a v1 cgroup hierarchy, a
/// tool some hosts lack): prints `SKIP <test>: <reason>` also under `CI=true`, returns false.
pub fn skip_optional(reason: &str) -> bool {
    say(&format!("SKIP {}: {reason}", test_name()));
    false
}

/// Returns from the test (with `Default::default()`: `()`, `None`, `false`) after
/// [`skip_or_fail`] when `$cond` is false. The reason takes `format!` arguments.
///
/// ```ignore
/// smithers_test_support::skip_unless!(is_root(), "needs root to mount");
/// ```
#[macro_export]
macro_rules! skip_unless {
    ($cond:expr, $($reason:tt)+) => {
        if !$cond {
            $crate::skip_or_fail(&::std::format!($($reason)+));
            return ::std::default::Default::default();
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child run of this test binary by `skip_line_reaches_real_stderr`.
    const CHILD_ENV: &str = "SMITHERS_TEST_SUPPORT_SKIP_CHILD";

    #[test]
    fn a_skip_returns_false_outside_ci() {
        if in_ci() {
            return;
        }
        assert!(!skip_or_fail(
            "nothing missing, this is the skip's own test"
        ));
        assert!(!skip_optional("nothing missing either"));
    }

    fn skipping_check() -> Option<u32> {
        skip_unless!(false, "the condition {} is false", "given");
        Some(1)
    }

    #[test]
    fn skip_unless_returns_the_default() {
        if in_ci() {
            let caught = std::panic::catch_unwind(skipping_check);
            assert!(caught.is_err(), "under CI=true a skip must fail");
            return;
        }
        assert_eq!(skipping_check(), None);
    }

    /// The child half: a passing test that skips, run with libtest's capture on.
    #[test]
    fn child_prints_a_skip() {
        if std::env::var_os(CHILD_ENV).is_some() {
            skip_or_fail("the capture test's marker reason");
        }
    }

    /// Runs this test binary again on `child_prints_a_skip`, capture on (no `--nocapture`), and
    /// finds the SKIP line, with the test's name, on the child's stderr.
    #[test]
    fn skip_line_reaches_real_stderr() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "skip::tests::child_prints_a_skip",
                "--test-threads=2",
            ])
            .env(CHILD_ENV, "1")
            .env_remove("CI")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{out:?}");
        assert!(
            stderr.contains(
                "SKIP skip::tests::child_prints_a_skip: the capture test's marker reason"
            ),
            "stderr: {stderr}"
        );
    }
}
