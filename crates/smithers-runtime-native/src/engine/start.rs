//! `start`: a sandbox brought up to take many commands. The same plan a step's would be
//! (compiled, on the prepared root, through the same launcher), with a session prelude: P0
//! hands over the exec channel, P1 reports `ready` and waits for commands.

use std::sync::Arc;

use serde_json::Value;
use smithers_runtime::{RuntimeError, SandboxHandle, StepCommand};
use tokio::sync::oneshot;

use crate::backend::Backend;
use crate::exec::launch::{self, LaunchInput};
use crate::exec::{read_stored_config, EgressSetup};
use crate::launcher::{json_line, prelude, spawn_err};
use crate::layout::host_layout;
use crate::runtime::NativeRuntime;
use crate::status::StatusReader;

use crate::live::channel::Channel;
use crate::live::Live;

/// What the status task found before the sandbox was ready.
enum Readiness {
    /// The exec channel, and the init's `ready` (what it confirmed: Landlock, seccomp, ...).
    Ready(Arc<Channel>, Value),
    Failed(String),
}

pub(crate) async fn start(
    rt: &NativeRuntime,
    handle: &SandboxHandle,
) -> Result<Arc<Live>, RuntimeError> {
    let backend = Backend::from_handle(handle, "start")?;
    let stored = read_stored_config(&backend, "start")?;
    let controls = &stored.config.controls;
    super::check_env(controls.env.iter())?;
    let caps = rt.caps();
    let init = caps.init.as_ref().map_err(spawn_err)?;
    let seccomp = caps.seccomp.as_ref().map_err(spawn_err)?;
    let egress = EgressSetup::new(&caps, &backend, controls)?;
    let copy = backend.workspace.copy_reason().map(|_| backend.copy());
    if copy.as_ref().is_some_and(|c| !c.is_dir()) {
        return Err(RuntimeError::OutOfOrder {
            verb: "start",
            reason: "the workspace copy was not made: call ship before start".into(),
        });
    }
    let (mut layout, workspace) = host_layout(&backend, copy);
    layout.layers = crate::layers::stack_paths(&backend)?;
    let mut prelude = prelude(&caps, &backend, controls.allow_network);
    prelude.egress = egress.listen.clone();
    prelude.session = true;
    let prelude_line = json_line(&prelude)?;
    // The plan is compiled for a stand-in command: its environment, search path and
    // working directory are every command's base; the command itself is taken out.
    let stand_in = StepCommand {
        argv: vec!["true".into()],
        cwd: None,
        stdin: Default::default(),
    };
    let input = LaunchInput {
        caps: &caps,
        zygote: rt.options.zygote.then_some(&rt.zygote),
        init,
        seccomp,
        backend: &backend,
        command: &stand_in,
        controls,
        layout: &layout,
        workspace,
        prelude: &prelude,
        prelude_line: &prelude_line,
        step_env: &egress.step_env,
        egress_etc: egress.resolv.as_deref(),
        session: true,
    };
    // A warm init claimed at create was made for one step's prelude, not a session's: the
    // launcher ends it (an armed one before a cold init mounts the same layers).
    let (launched, _no_stdin) = launch::launch(&input, rt.take_attached(&backend)).await?;
    let plan = launched.plan;
    let base = launched
        .session_exec
        .ok_or_else(|| spawn_err("no base command"))?;
    // A second descriptor of our end of the control socket, to send `k` (kill) with while the
    // status task reads the first.
    let killer = launched.ours.try_clone().map_err(spawn_err)?;
    let ours = tokio::net::UnixStream::from_std({
        launched.ours.set_nonblocking(true).map_err(spawn_err)?;
        launched.ours
    })
    .map_err(spawn_err)?;
    // The init's first output pipes carry nothing in a session (each command has its own).
    drop((launched.spawned.stdout, launched.spawned.stderr));
    let (ready_tx, ready_rx) = oneshot::channel();
    let live = Arc::new(Live::new(
        backend,
        base,
        launched.spawned.pid,
        launched.spawned.child,
        killer,
    ));
    tokio::spawn(read_status(
        ours,
        live.clone(),
        egress.policy,
        egress.denials_file,
        ready_tx,
    ));
    match ready_rx.await {
        Ok(Readiness::Ready(channel, ready)) => {
            live.set_channel(channel);
            // What holds for the sandbox's life, as a step's report says it: the sandbox's
            // bundle carries it (written at stop, with how the sandbox ended).
            let b = &live.backend;
            let report = crate::report::enforcement(
                &caps,
                &stored,
                &plan,
                &b.cgroups,
                Some(&ready),
                &b.workspace,
            );
            live.set_enforcement(report);
            Ok(live)
        }
        Ok(Readiness::Failed(reason)) => {
            live.kill().await;
            Err(RuntimeError::spawn("start the sandbox", reason))
        }
        Err(_) => Err(spawn_err("the status reader ended")),
    }
}

/// Reads the init's status lines for the sandbox's life: the egress listeners (served from
/// here), the exec channel, `ready` or an `error`; then waits for the end of the socket,
/// which comes once every process of the sandbox is gone.
async fn read_status(
    control: tokio::net::UnixStream,
    live: Arc<Live>,
    mut policy: Option<crate::egress::Served>,
    denials_file: std::path::PathBuf,
    ready_tx: oneshot::Sender<Readiness>,
) {
    let (records_tx, mut records_rx) = tokio::sync::mpsc::unbounded_channel();
    // A session has no step to relay decisions to as they happen: each is in the engine's
    // summary (and the denials file); the live copies are dropped here.
    tokio::spawn(async move { while records_rx.recv().await.is_some() {} });
    let mut ready_tx = Some(ready_tx);
    let mut channel = None;
    let mut ready = None;
    let mut reader = StatusReader::new(&control);
    while let Some(line) = reader.next_line().await {
        let Ok(v) = serde_json::from_slice::<Value>(&line) else {
            continue;
        };
        let failure = match v["event"].as_str() {
            Some("egress") => {
                let names: Vec<String> = (v["listeners"].as_array().into_iter().flatten())
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect();
                let fds = reader.take_fds();
                match policy.take() {
                    Some(p) => match crate::egress::start(
                        p,
                        &names,
                        fds,
                        denials_file.clone(),
                        records_tx.clone(),
                    ) {
                        Ok(engine) => {
                            live.set_egress(engine);
                            None
                        }
                        Err(message) => Some(message),
                    },
                    None => None,
                }
            }
            Some("execChannel") => match reader.take_fds().pop().map(Channel::start) {
                Some(Ok(c)) => {
                    channel = Some(c);
                    None
                }
                Some(Err(e)) => Some(format!("the exec channel: {e}")),
                None => Some("the exec channel came without its descriptor".into()),
            },
            Some("ready") => {
                ready = Some(v.clone());
                None
            }
            Some("error") => Some(format!(
                "{} ({})",
                v["message"].as_str().unwrap_or("unknown"),
                v["stage"].as_str().unwrap_or("init")
            )),
            _ => None,
        };
        if let Some(reason) = failure {
            if let Some(tx) = ready_tx.take() {
                let _ = tx.send(Readiness::Failed(reason));
            }
            continue;
        }
        if ready.is_some() && channel.is_some() {
            if let Some(tx) = ready_tx.take() {
                let (c, r) = (
                    channel.take().expect("checked"),
                    ready.take().expect("checked"),
                );
                let _ = tx.send(Readiness::Ready(c, r));
            }
        }
    }
    if let Some(tx) = ready_tx.take() {
        let _ = tx.send(Readiness::Failed(
            "the sandbox init ended before it was ready".into(),
        ));
    }
    live.ended.cancel();
    drop(control);
}
