//! The case list and the macros that expand it into one `#[test]` per case in a backend's
//! test crate (`$crate` paths, so they expand wherever they are used), and the case tables.

use super::{say, CaseFn, Skip, SuiteEnv};

/// Calls `$callback!` with the list of conformance case names (the one list both the test macro
/// and [`CASES`] are generated from).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_case_list {
    ($callback:ident ! ( $($args:tt)* )) => {
        $crate::$callback! { $($args)* [
            exit_code_is_an_outcome,
            network_denied_by_default,
            write_outside_workspace_denied,
            host_tree_unchanged_and_changes_become_patches,
            request_and_result_paths,
            result_from_stdout,
            env_cleared_except_allowlist,
            memory_limit_enforced_or_refused,
            pids_limit_enforced_or_refused,
            cpu_limit_enforced_or_refused,
            timeout_kills_everything,
            cancellation_kills_everything,
            cleanup_idempotent_and_complete,
            cleanup_after_create_only,
            bundle_for_failed_run,
            create_refuses_invalid_controls,
            create_twice_is_an_error,
        ] }
    };
}

/// Expands to one `#[test]` per case of `$module` (`conformance` or `containment`).
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    ($make_env:path, $module:ident, [$($case:ident),* $(,)?]) => {
        $crate::__suite_tests!($make_env, $module, &[], [$($case),*]);
    };
    ($make_env:path, $module:ident, $known:expr, [$($case:ident),* $(,)?]) => {
        $(
            #[test]
            fn $case() {
                fn case(env: &$crate::conformance::SuiteEnv) -> $crate::conformance::CaseFuture<'_> {
                    ::std::boxed::Box::pin($crate::$module::$case(env))
                }
                let name = $crate::conformance::libtest_name(
                    concat!(module_path!(), "::", stringify!($case)),
                );
                $crate::conformance::run_case_with(&name, $make_env, case, $known);
            }
        )*
    };
}

/// Expands to one `#[test]` per conformance case, each running against the runtime that
/// `$make_env` (a `fn() -> SuiteEnv` or `fn() -> Result<SuiteEnv, Skip>`) returns.
#[macro_export]
macro_rules! conformance_tests {
    ($make_env:path) => {
        $crate::conformance_tests!($make_env, known_failures = []);
    };
    ($make_env:path, known_failures = [$($known:literal),* $(,)?]) => {
        $crate::__conformance_case_list!(__suite_tests!($make_env, conformance, &[$($known),*],));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_table {
    ($module:ident, [$($case:ident),* $(,)?]) => {
        &[$((stringify!($case), {
            fn case(env: &$crate::conformance::SuiteEnv) -> $crate::conformance::CaseFuture<'_> {
                ::std::boxed::Box::pin($crate::$module::$case(env))
            }
            case as $crate::conformance::CaseFn
        })),*]
    };
}

/// Every conformance case by name, for a backend that drives them itself.
pub const CASES: &[(&str, CaseFn)] = __conformance_case_list!(__case_table!(conformance,));

/// Runs every case in order (a single-test alternative to the macro); panics on the first
/// failure, returns the skipped cases with their reasons.
pub async fn run_all(env: &SuiteEnv) -> Vec<(&'static str, Skip)> {
    run_table(env, CASES).await
}

pub(crate) async fn run_table(
    env: &SuiteEnv,
    table: &[(&'static str, CaseFn)],
) -> Vec<(&'static str, Skip)> {
    let mut skipped = Vec::new();
    for (name, case) in table {
        if let Err(skip) = case(env).await {
            say(&format!("SKIP {name}: {}", skip.0));
            skipped.push((*name, skip));
        }
    }
    skipped
}
