//! The environment variables the resident service is told its mode by, and those a client's
//! environment is compared without.

/// How `run` uses the service: `auto` (the default: when one is running and admits the
/// request), `off` (never), `require` (fail, with the reason, when the request is not served;
/// for tests and benchmarks that must know where the step ran).
pub const MODE_ENV: &str = "SMITHERS_RESIDENT";

/// The environment variables that may differ between the service and its client: a shell
/// changes them as it goes, and `run` reads none of them (its working directory is passed as
/// a descriptor). Every other variable must be equal for a request to be served.
pub const IGNORED_ENV: &[&str] = &["PWD", "OLDPWD", "_", "SHLVL", MODE_ENV];
