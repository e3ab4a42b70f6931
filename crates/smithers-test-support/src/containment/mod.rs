//! The containment suite: the 17 rows of the threat model (security.md), each attempted from
//! INSIDE a real sandbox by the `smithers-attack` binary and checked on the host afterwards.
//!
//! ```ignore
//! // crates/<backend>/tests/containment.rs
//! smithers_test_support::containment_tests!(make_env);
//! ```
//!
//! A row the runtime cannot enforce on this host passes only when the runtime says so: a limit
//! refused by `create` ([`RuntimeError::ControlUnsupported`]), or a protection reported as
//! degraded/unavailable by the outcome's enforcement report or the probe. The tool never sends
//! traffic anywhere but loopback: reachability of the outside is checked with a UDP `connect`
//! (a route lookup, no packet) to TEST-NET addresses.

use crate::conformance::{CaseFn, Skip, SuiteEnv};

mod filesystem;
mod network;
mod privileges;
mod processes;
mod resources;

pub use filesystem::{
    row03_host_project_tree_untouched, row04_system_dirs_read_only, row05_host_secrets_invisible,
    row14_symlink_to_host_file, row15_result_path_escapes_rejected,
};
pub use network::{row01_host_loopback_unreachable, row02_no_route_outside};
pub use privileges::{row07_privilege_gain_denied, row17_devices_denied};
pub use processes::{
    row06_host_processes_invisible, row12_outlive_timeout, row13_survive_host_kill,
};
pub use resources::{
    row08_fork_bomb_capped, row09_memory_hog_killed, row10_disk_fill_capped,
    row11_output_flood_capped, row16_bundle_bomb_rejected,
};

/// Calls `$callback!` with the list of containment rows.
#[doc(hidden)]
#[macro_export]
macro_rules! __containment_case_list {
    ($callback:ident ! ( $($args:tt)* )) => {
        $crate::$callback! { $($args)* [
            row01_host_loopback_unreachable,
            row02_no_route_outside,
            row03_host_project_tree_untouched,
            row04_system_dirs_read_only,
            row05_host_secrets_invisible,
            row06_host_processes_invisible,
            row07_privilege_gain_denied,
            row08_fork_bomb_capped,
            row09_memory_hog_killed,
            row10_disk_fill_capped,
            row11_output_flood_capped,
            row12_outlive_timeout,
            row13_survive_host_kill,
            row14_symlink_to_host_file,
            row15_result_path_escapes_rejected,
            row16_bundle_bomb_rejected,
            row17_devices_denied,
        ] }
    };
}

/// Expands to one `#[test]` per containment row, each running against the runtime that
/// `$make_env` (a `fn() -> SuiteEnv` or `fn() -> Result<SuiteEnv, Skip>`) returns.
/// `known_failures = ["row16_..."]` records rows this runtime is known to fail (see
/// [`crate::conformance::run_case_with`]).
#[macro_export]
macro_rules! containment_tests {
    ($make_env:path) => {
        $crate::containment_tests!($make_env, known_failures = []);
    };
    ($make_env:path, known_failures = [$($known:literal),* $(,)?]) => {
        $crate::__containment_case_list!(__suite_tests!($make_env, containment, &[$($known),*],));
    };
}

/// Every row by name, for a backend that drives them itself.
pub const CASES: &[(&str, CaseFn)] = __containment_case_list!(__case_table!(containment,));

/// Runs every row in order; panics on the first failure, returns the skipped rows.
pub async fn run_all(env: &SuiteEnv) -> Vec<(&'static str, Skip)> {
    crate::conformance::run_table(env, CASES).await
}

// What every row passes to the attack binary.

pub(crate) fn args(parts: &[String]) -> Vec<&str> {
    parts.iter().map(String::as_str).collect()
}

/// Joins attempts (each a list of words) with `+`.
pub(crate) fn batch(attempts: &[Vec<String>]) -> Vec<String> {
    let mut out = Vec::new();
    for a in attempts {
        if !out.is_empty() {
            out.push("+".to_string());
        }
        out.extend(a.iter().cloned());
    }
    out
}

pub(crate) fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}
