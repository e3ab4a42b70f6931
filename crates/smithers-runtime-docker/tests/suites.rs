//! The shared conformance and containment suites (smithers-test-support) against
//! the docker runtime: one `#[test]` per case, real containers on a real engine.
//!
//! The suites copy the host's `smithers-attack` binary into the project and run it from
//! `/workspace`; it links against glibc, so the image is `smithers-test:glibc` (busybox plus
//! the host's loader and libc, built by scripts/docker-up.sh).

use std::sync::Arc;

use smithers_runtime_docker::{default_socket, DockerOptions, DockerRuntime};
use smithers_test_support::conformance::{Skip, SuiteEnv};

const IMAGE: &str = "smithers-test:glibc";

pub fn make_env() -> Result<SuiteEnv, Skip> {
    let socket = default_socket();
    if !std::path::Path::new(&socket).exists() {
        return Err(Skip::new(format!(
            "no Docker engine socket at {socket} (run scripts/docker-up.sh)"
        )));
    }
    let runtime = DockerRuntime::new(DockerOptions {
        watchdog: Some(env!("CARGO_BIN_EXE_smithers-docker-watchdog").into()),
        ..DockerOptions::default()
    });
    Ok(SuiteEnv::new(Arc::new(runtime)).with_image(IMAGE))
}

mod conformance {
    smithers_test_support::conformance_tests!(crate::make_env);
}

mod containment {
    smithers_test_support::containment_tests!(crate::make_env);
}
