//! A native runtime whose every sandbox that a warm one can serve is an armed one (see the
//! runtime's `armed` module): before each such `create`, two throwaway sandboxes of the same
//! configuration teach its pool that configuration, and the create waits for the armed refill.
//! The suites run against it (`conformance_armed.rs`, `containment_armed.rs`): an armed
//! sandbox must pass every case a cold one passes. A create that should have claimed an
//! armed sandbox and did not fails, and so does a sandbox's first execute whose command did
//! not run in the armed init (given up for a cold one): a case can never pass on a cold
//! sandbox by accident.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use smithers_runtime::{
    CancellationToken, CollectReport, EnforcementReport, ExecOutcome, OutputSink, RequestBundle,
    Runtime, RuntimeError, RuntimeKind, SandboxConfig, SandboxHandle, ShipReport, StepCommand,
};
use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime};
use smithers_test_support::conformance::SuiteEnv;

#[derive(Debug)]
pub struct ArmedRuntime {
    runtime: NativeRuntime,
    /// The sandboxes that claimed an armed one and have not executed yet.
    armed: std::sync::Mutex<std::collections::HashSet<String>>,
    /// One first execute of an armed sandbox at a time: the pool's count of the steps it
    /// served armed tells, before and after, whether this one's was.
    first_execute: tokio::sync::Mutex<()>,
}

/// What the pool serves (the runtime's own rule, `warm::eligible`, seen from outside).
fn servable(config: &SandboxConfig) -> bool {
    let c = &config.controls;
    !c.allow_network
        && c.egress_policy.is_none()
        && c.disk_limit_bytes.is_none()
        && c.cpu_limit.is_none()
        && c.volumes.is_empty()
        && config.root_dir.is_dir()
}

impl ArmedRuntime {
    fn claimed_armed(&self) -> u64 {
        self.runtime.warm_status().map_or(0, |s| s.claimed_armed)
    }
}

#[async_trait]
impl Runtime for ArmedRuntime {
    fn kind(&self) -> RuntimeKind {
        self.runtime.kind()
    }
    async fn probe(&self) -> EnforcementReport {
        self.runtime.probe().await
    }
    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        if !servable(config) {
            return self.runtime.create(config).await;
        }
        // Twice at most: the pool gives up an armed sandbox whose init is gone or spoke out
        // of turn, and the create then starts cold, as it should; one such loss on a loaded
        // machine (it happened once in a CI run) is not a failure of the armed path, two in
        // a row are.
        let mut attempt = 0;
        let handle = loop {
            attempt += 1;
            for i in 0..2 {
                let mut teach = config.clone();
                teach.sandbox_id = format!("{}-teach{attempt}-{i}", config.sandbox_id);
                let handle = self.runtime.create(&teach).await?;
                self.runtime.cleanup(&handle).await?;
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            let status = loop {
                let status = self.runtime.warm_status().expect("a pool");
                if status.armed > 0 || Instant::now() > deadline {
                    break status;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            let before = self.claimed_armed();
            let handle = self.runtime.create(config).await?;
            if self.claimed_armed() != before {
                break handle;
            }
            // Not claimed: it must not look like a pass of an armed sandbox.
            let _ = self.runtime.cleanup(&handle).await;
            if attempt == 2 {
                return Err(RuntimeError::Spawn {
                    operation: "claim an armed sandbox (test runtime)".into(),
                    reason: format!(
                        "no armed sandbox was claimed, twice: {status:?}, then {:?}",
                        self.runtime.warm_status()
                    ),
                });
            }
        };
        self.armed
            .lock()
            .unwrap()
            .insert(format!("{}:{}", handle.run_id, handle.sandbox_id));
        Ok(handle)
    }
    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        self.runtime.ship(handle, request).await
    }
    async fn execute(
        &self,
        handle: &SandboxHandle,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecOutcome, RuntimeError> {
        let first = self
            .armed
            .lock()
            .unwrap()
            .remove(&format!("{}:{}", handle.run_id, handle.sandbox_id));
        if !first {
            return self.runtime.execute(handle, command, cancel, output).await;
        }
        let _one = self.first_execute.lock().await;
        let served = || self.runtime.warm_status().map_or(0, |s| s.served_armed);
        let before = served();
        let outcome = self
            .runtime
            .execute(handle, command, cancel, output)
            .await?;
        // A command that never started (refused before its exec) was in no init at all.
        if outcome.command_started_after_us.is_some() && served() == before {
            return Err(RuntimeError::Spawn {
                operation: "run the step in its armed sandbox (test runtime)".into(),
                reason: "the armed init was given up and a cold one served the step".into(),
            });
        }
        Ok(outcome)
    }
    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        self.runtime.collect(handle).await
    }
    async fn cleanup(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.runtime.cleanup(handle).await
    }
}

pub fn make_env() -> SuiteEnv {
    let rt = NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        warm: 1,
        ..NativeOptions::default()
    });
    // A host without sandboxes has a pool that never fills: the cases then SKIP (or fail
    // under CI=true) on their own.
    let _ = rt.wait_until_warm(Duration::from_secs(20));
    SuiteEnv::new(Arc::new(ArmedRuntime {
        runtime: rt,
        armed: Default::default(),
        first_execute: Default::default(),
    }))
}
