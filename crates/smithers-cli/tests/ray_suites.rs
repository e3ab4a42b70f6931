//! The shared conformance and containment suites against the `ray` runtime, on the real Ray
//! cluster of `scripts/ray/cluster.sh` (a head and two workers in network namespaces; CI
//! starts it). Every case is a lease: a Ray job holding a `sandbox_slot` that runs the product
//! binary's `serve` on the node Ray chose, spoken to over the codeplane API, so the step runs
//! isolated (the native runtime on that node) across a real network hop.
//!
//! * Row 13 re-executes this test binary as the orchestrator, which places a lease, starts a
//!   step and is SIGKILLed: the node's `serve` cancels the step nobody follows
//!   (`--orphan-timeout-ms`, 5 s here), and this process, which never saw that lease, cleans
//!   it up from the stored handle alone (the lease is found again from the cluster).
//!
//! Without a cluster the cases print `SKIP` (and fail under `CI=true`).

mod support;

use std::sync::Arc;

use smithers_test_support::conformance::{Skip, SuiteEnv};

pub(crate) fn env() -> Result<SuiteEnv, Skip> {
    if support::ray::token().is_none() {
        return Err(Skip::new(
            "no Ray cluster (start one with scripts/ray/cluster.sh up; CI does)",
        ));
    }
    Ok(SuiteEnv::new(Arc::new(support::ray::runtime())))
}

mod conformance {
    smithers_test_support::conformance_tests!(crate::env);
}

mod containment {
    smithers_test_support::containment_tests!(crate::env);
}

/// The engine suite on a lease: each sandbox placed on a node, started there as a session,
/// sent its commands across the network hop, stopped and destroyed (its job ended).
mod engine {
    fn env(
    ) -> Result<smithers_test_support::engine::EngineEnv, smithers_test_support::conformance::Skip>
    {
        if crate::support::ray::token().is_none() {
            return Err(smithers_test_support::conformance::Skip::new(
                "no Ray cluster (start one with scripts/ray/cluster.sh up; CI does)",
            ));
        }
        Ok(smithers_test_support::engine::EngineEnv::new(
            std::sync::Arc::new(crate::support::ray::runtime()),
        ))
    }

    smithers_test_support::engine_tests!(env);
}
