//! The conformance cases, by theme. Each is `pub async fn(&SuiteEnv) -> CaseResult`, listed
//! once in [`super::macros`]'s case list.

mod isolation;
mod lifecycle;
mod limits;
mod outcomes;

pub use isolation::{
    env_cleared_except_allowlist, host_tree_unchanged_and_changes_become_patches,
    network_denied_by_default, write_outside_workspace_denied,
};
pub use lifecycle::{
    bundle_for_failed_run, cleanup_after_create_only, cleanup_idempotent_and_complete,
    create_refuses_invalid_controls, create_twice_is_an_error,
};
pub use limits::{
    cancellation_kills_everything, cpu_limit_enforced_or_refused, memory_limit_enforced_or_refused,
    pids_limit_enforced_or_refused, timeout_kills_everything,
};
pub(crate) use limits::{fork_bomb_case, memory_hog_case, outlive_case};
pub use outcomes::{exit_code_is_an_outcome, request_and_result_paths, result_from_stdout};
