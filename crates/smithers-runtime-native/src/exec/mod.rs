//! `execute`: compile the plan, start the init, pump output, enforce the timeout, cancellation
//! and the output cap, and turn what happened into an [`ExecOutcome`].
//!
//! In steps: the stored config and the command are checked ([`read_stored_config`],
//! [`check_command`]) and the egress policy prepared ([`EgressSetup`]); `launch` starts the
//! step's init (the warm one claimed at create, or a cold one) and sends it the plan;
//! `supervise` runs the step to its end (output, status, limits); `outcome` turns what
//! happened into the outcome and the bundle's log.

mod disk_guard;
pub(crate) mod launch;
mod outcome;
mod pump;
mod result;
mod supervise;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use smithers_runtime::{
    CancellationToken, Controls, ExecOutcome, OutputSink, RuntimeError, StepCommand,
};

use crate::backend::{Backend, StoredConfig};
use crate::egress;
use crate::host::HostCaps;
use crate::launcher::{json_line, prelude, spawn_err, ZygoteSlot};
use crate::layout::host_layout;
use crate::names::project_dirs;
use crate::plan;
use crate::threads::blocking;
use crate::warm::ClaimedWarm;

use launch::{LaunchInput, Launched};

/// Writes a sandbox's log and outcome for `collect` (a live sandbox's, at its stop).
pub(crate) use outcome::persist as persist_outcome;
use supervise::Supervision;

#[allow(clippy::too_many_arguments)]
pub(crate) async fn execute(
    caps: &HostCaps,
    zygote: Option<&ZygoteSlot>,
    backend: &Backend,
    command: &StepCommand,
    cancel: CancellationToken,
    sink: &dyn OutputSink,
    warm: Option<ClaimedWarm>,
    started_hook: &(dyn Fn(bool) + Send + Sync),
) -> Result<ExecOutcome, RuntimeError> {
    let called = Instant::now();
    let called_ns = smithers_sandbox_init::sys::monotonic_ns();
    let stored = read_stored_config(backend, "execute")?;
    let controls = &stored.config.controls;
    check_command(command, controls)?;
    let init = caps.init.as_ref().map_err(spawn_err)?;
    let seccomp = caps.seccomp.as_ref().map_err(spawn_err)?;
    let egress = EgressSetup::new(caps, backend, controls)?;

    // A result from a previous execute must not be mistaken for this one's.
    let result_file = backend.out().join(plan::RESULT_FILE_NAME);
    let _ = std::fs::remove_file(&result_file);

    let copy = backend.workspace.copy_reason().map(|_| backend.copy());
    if let Some(copy) = &copy {
        if !copy.is_dir() {
            return Err(RuntimeError::OutOfOrder {
                verb: "execute",
                reason: "the workspace copy was not made: call ship before execute".into(),
            });
        }
    }
    let (mut layout, workspace) = host_layout(backend, copy);
    layout.layers = crate::layers::stack_paths(backend)?;
    // The prelude goes into the socket's buffer before the init exists, and the init is
    // started before the plan is compiled: the init's fork and its namespaces (~0.4 ms here)
    // overlap the plan's compilation (~0.1 ms), and P0 reads the plan only after its
    // namespaces are made. A plan that cannot be made closes the socket instead, and the init,
    // at the end of its input, exits.
    let mut prelude = prelude(caps, backend, controls.allow_network);
    prelude.egress = egress.listen;
    let prelude_line = json_line(&prelude)?;
    let input = LaunchInput {
        caps,
        zygote,
        init,
        seccomp,
        backend,
        command,
        controls,
        layout: &layout,
        workspace,
        prelude: &prelude,
        prelude_line: &prelude_line,
        step_env: &egress.step_env,
        egress_etc: egress.resolv.as_deref(),
        session: false,
    };
    // The caller's stream as the command's stdin, through a FIFO in the request directory;
    // the feed stops when this function returns.
    let (launched, _stdin_feed) = launch::launch(&input, warm).await?;
    let Launched {
        ours,
        spawned,
        plan,
        ready,
        warm_for,
        armed_served,
        armed_given_up,
        warm_lost,
        started,
        session_exec: _,
    } = launched;
    // While the sandbox starts the command (over half a millisecond before it even runs),
    // the directories its bundle is written into are made, off collect's path. A failure
    // here is collect's to report: it makes them again.
    let (_, _, result_path) = project_dirs(&backend.root_dir, &stored.config);
    let _ = blocking("prepare the bundle's directories", move || {
        smithers_bundle::prepare_bundle_dirs(&result_path)
    })
    .await;
    let supervision = Supervision {
        sink,
        controls,
        backend,
        disk_reserve: caps.disk_reserve,
        cancel,
        started_hook,
        armed_served,
        called,
        called_ns,
    };
    let ran = supervision
        .run(ours, spawned, ready, egress.policy, egress.denials_file)
        .await?;
    let ended = supervise::after_run(ran, started, &backend.cgroups, sink).await?;
    outcome::check_setup(controls, &ended)?;
    let (outcome, result_problem) =
        outcome::outcome(caps, &stored, &plan, backend, &result_file, &ended)?;
    let warm_start = outcome::WarmStart {
        warm_for,
        armed_served,
        armed_given_up,
        warm_lost,
    };
    let lines = outcome::log_lines(ended, &warm_start, backend, result_problem.as_deref());
    outcome::persist(backend, &outcome, lines, result_problem.as_deref())?;
    Ok(outcome)
}

/// The config `create` kept, once `ship` has been called (`verb`, execute or start, before
/// either is out of order).
pub(crate) fn read_stored_config(
    backend: &Backend,
    verb: &'static str,
) -> Result<StoredConfig, RuntimeError> {
    let config_bytes =
        std::fs::read(backend.config_file()).map_err(|e| RuntimeError::OutOfOrder {
            verb,
            reason: format!("the sandbox has no state (not created, or cleaned up): {e}"),
        })?;
    let stored: StoredConfig = serde_json::from_slice(&config_bytes)
        .map_err(|e| RuntimeError::spawn("read the sandbox config", e))?;
    let request_file = backend.request_dir().join(plan::REQUEST_FILE_NAME);
    if !request_file.is_file() {
        return Err(RuntimeError::OutOfOrder {
            verb,
            reason: format!("nothing was shipped: call ship before {verb}"),
        });
    }
    Ok(stored)
}

/// Refuses a command (or an environment) the init could not run as given.
fn check_command(command: &StepCommand, controls: &Controls) -> Result<(), RuntimeError> {
    if command.argv.is_empty() || command.argv[0].is_empty() {
        return Err(RuntimeError::InvalidControl {
            control: "command",
            reason: "the command is empty".into(),
        });
    }
    // A C string ends at its first NUL: the init would silently run a shorter command (or
    // an environment entry without its tail), so such input is refused here, whole.
    if let Some(i) = command.argv.iter().position(|a| a.contains('\0')) {
        return Err(RuntimeError::InvalidControl {
            control: "command",
            reason: format!("argument {i} contains a NUL byte, which a command line cannot carry"),
        });
    }
    if let Some((k, _)) = controls
        .env
        .iter()
        .find(|(k, v)| k.contains('\0') || v.contains('\0') || k.contains('='))
    {
        return Err(RuntimeError::InvalidControl {
            control: "env",
            reason: format!(
                "variable {:?} has a NUL byte or '=' in its name, or a NUL byte in its value",
                k.replace('\0', "\\0")
            ),
        });
    }
    if let Some(cwd) = &command.cwd {
        if cwd.contains('\0') {
            return Err(RuntimeError::InvalidControl {
                control: "cwd",
                reason: "contains a NUL byte".into(),
            });
        }
        if !cwd.starts_with('/') {
            return Err(RuntimeError::InvalidControl {
                control: "cwd",
                reason: format!("must be an absolute path inside the sandbox, got {cwd:?}"),
            });
        }
    }
    Ok(())
}

/// The step's egress policy and what it needs: the listeners P0 binds, the resolver
/// configuration, the proxy variables and the denials file.
pub(crate) struct EgressSetup {
    pub(crate) policy: Option<egress::Served>,
    pub(crate) listen: Option<smithers_sandbox_init::plan::EgressListen>,
    pub(crate) resolv: Option<PathBuf>,
    pub(crate) step_env: BTreeMap<String, String>,
    pub(crate) denials_file: PathBuf,
}

impl EgressSetup {
    pub(crate) fn new(
        caps: &HostCaps,
        backend: &Backend,
        controls: &Controls,
    ) -> Result<EgressSetup, RuntimeError> {
        // The policy was checked at create; parsed again from the stored config, which is ours.
        let egress_policy = egress::policy(controls)?;
        let egress_listen = egress_policy.as_ref().map(egress::listen_plan);
        let egress_resolv = match &egress_policy {
            Some(_) => Some(egress::etc_files(&caps.state_root).map_err(|e| {
                RuntimeError::io(
                    "write the egress resolver configuration in",
                    &caps.state_root,
                    e,
                )
            })?),
            None => None,
        };
        // The step's secrets: their values read now (never stored), their placeholders and
        // the run's authority given to the step.
        let secrets = egress::secrets(controls, &backend.request_dir())?;
        // The proxy variables and the secrets' placeholders, under the step's own (which win).
        let step_env = match &egress_policy {
            None => controls.env.clone(),
            Some(_) => {
                let mut env: std::collections::BTreeMap<String, String> =
                    egress::proxy_env().into_iter().collect();
                if let Some(s) = &secrets {
                    env.extend(egress::secrets_env(s));
                }
                env.extend(controls.env.clone());
                env
            }
        };
        let denials_file = backend.request_dir().join(egress::DENIALS_FILE);

        Ok(EgressSetup {
            policy: egress_policy.map(|policy| egress::Served { policy, secrets }),
            listen: egress_listen,
            resolv: egress_resolv,
            step_env,
            denials_file,
        })
    }
}
