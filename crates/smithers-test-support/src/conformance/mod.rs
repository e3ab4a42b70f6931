//! The conformance suite every backend passes, and the harness it shares with the containment
//! suite ([`crate::containment`]).
//!
//! A backend wires both suites into its integration tests with one line each:
//!
//! ```ignore
//! // crates/<backend>/tests/conformance.rs
//! use smithers_test_support::conformance::{Skip, SuiteEnv};
//! fn make_env() -> Result<SuiteEnv, Skip> {
//!     Ok(SuiteEnv::new(std::sync::Arc::new(MyRuntime::new())))
//! }
//! smithers_test_support::conformance_tests!(make_env);
//! ```
//!
//! The macro expands to one `#[test]` per case (so `cargo test` lists each case by name), each
//! building its own tokio runtime, calling `make_env` and running the case against real
//! sandboxes. A case that cannot run here (the runtime is unavailable on this host) prints
//! `SKIP <case>: <reason>`, and fails instead when `CI=true`.
//!
//! Every case runs commands inside a real sandbox and checks the host afterwards. Limits are
//! "enforced or refused": either `create` refuses the control with
//! [`RuntimeError::ControlUnsupported`], or the outcome reports the limit was hit. A protection
//! an attack gets through must be reported as not enforced by the runtime's enforcement report;
//! a silent pass is a failure.
//!
//! [`RuntimeError::ControlUnsupported`]: smithers_runtime::RuntimeError::ControlUnsupported

mod attack_bin;
mod cases;
mod checks;
mod harness;
mod macros;
mod project;
mod sandbox;
mod suite_env;

pub use crate::skip::say;
pub use attack_bin::locate_attack_bin;
pub use cases::*;
pub(crate) use checks::sh;
pub use checks::{
    assert_no_marker_processes, assert_reported_not_enforced, breaches, check_bundle,
    create_or_refused, host_marker_pids, kill_host_pids, run_once, BundleCheck, PROTECTION_NAMES,
};
pub use harness::{host_secret, libtest_name, run_case, run_case_with, unique};
pub(crate) use macros::run_table;
pub use macros::{run_all, CASES};
pub use project::{Project, TreeSnapshot};
pub use sandbox::{create_placed, start, unavailable_or_panic, Captured, Exec, Sandbox};
pub use suite_env::{
    CaseFn, CaseFuture, CaseResult, IntoSuiteEnv, Skip, SuiteEnv, ATTACK_BIN_ENV, ENV_ALLOWLIST,
    HELPER_ENV, HOST_SECRET_ENV, SAFETY_TIMEOUT_MS, VERBOSE_ENV,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_names_drop_the_crate() {
        assert_eq!(libtest_name("containment::row13_x"), "row13_x");
        assert_eq!(libtest_name("conformance::native::case"), "native::case");
        assert_eq!(libtest_name("bare"), "bare");
    }

    #[test]
    fn snapshots_see_every_kind_of_change() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a"), "1").unwrap();
        std::fs::create_dir(root.join(".smithers")).unwrap();
        let before = TreeSnapshot::of(root, &[".smithers"]);
        assert!(before
            .diff(&TreeSnapshot::of(root, &[".smithers"]))
            .is_empty());
        std::fs::write(root.join(".smithers/state"), "ignored").unwrap();
        assert!(before
            .diff(&TreeSnapshot::of(root, &[".smithers"]))
            .is_empty());
        std::fs::write(root.join("a"), "2").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("l")).unwrap();
        let diff = before.diff(&TreeSnapshot::of(root, &[".smithers"]));
        assert_eq!(diff.len(), 2, "{diff:?}");
        assert!(diff[0].starts_with("changed a"));
        assert!(diff[1].starts_with("added l"));
    }

    fn bundle(manifest: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("patches")).unwrap();
        std::fs::write(dir.path().join("patches/0.patch"), "--- a/x\n+++ b/x\n").unwrap();
        std::fs::write(dir.path().join("README.md"), manifest).unwrap();
        dir
    }

    #[test]
    fn a_valid_bundle_passes() {
        let b = bundle(r#"{"outputs":{},"status":"finished","patches":["patches/0.patch"]}"#);
        let check = check_bundle(b.path());
        assert!(check.patch_text.contains("+++ b/x"));
        assert_eq!(check.files.len(), 2);
    }

    #[test]
    #[should_panic(expected = "escapes patches/")]
    fn an_escaping_patch_path_fails() {
        let b = bundle(r#"{"status":"finished","patches":["patches/../README.md"]}"#);
        check_bundle(b.path());
    }

    #[test]
    #[should_panic(expected = "symlink")]
    fn a_symlink_in_the_bundle_fails() {
        let b = bundle(r#"{"status":"failed","patches":[]}"#);
        std::os::unix::fs::symlink("/etc/passwd", b.path().join("patches/leak")).unwrap();
        check_bundle(b.path());
    }

    #[test]
    #[should_panic(expected = "status")]
    fn a_bad_status_fails() {
        let b = bundle(r#"{"status":"done","patches":[]}"#);
        check_bundle(b.path());
    }

    #[test]
    fn case_tables_list_every_case_once() {
        let names: Vec<&str> = CASES.iter().map(|(n, _)| *n).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(names.len(), unique.len());
        assert_eq!(crate::containment::CASES.len(), 17);
        for (i, (name, _)) in crate::containment::CASES.iter().enumerate() {
            assert!(name.starts_with(&format!("row{:02}_", i + 1)), "{name}");
        }
    }
}
