//! The step's init, started and sent its plan: the warm one claimed at create when it built
//! exactly this plan's first part (an armed one: all of it), else a cold one. An armed init
//! given up is ended, and its mounts' volatile marks cleared, before a cold one mounts the
//! same layers.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use smithers_runtime::{Controls, RuntimeError, StepCommand};

use crate::backend::Backend;
use crate::cgroup::SandboxCgroups;
use crate::files::remove_tree;
use crate::host::HostCaps;
use crate::init_command::InitCommand;
use crate::launcher::{json_line, spawn_err, start_cold, ForkedInit, SpawnedInit, ZygoteSlot};
use crate::layout::git_layer;
use crate::plan::{self, BpfInstruction, HostLayout, InitPlan, PlanInput, Prelude, WorkspaceFacts};
use crate::prepared_root;
use crate::stdin_feed::{self, StdinFeed};
use crate::threads::blocking;
use crate::warm::ClaimedWarm;

use super::supervise::KILL_GRACE;

/// What the step's init is started with.
pub(crate) struct LaunchInput<'a> {
    pub(crate) caps: &'a HostCaps,
    pub(crate) zygote: Option<&'a ZygoteSlot>,
    pub(crate) init: &'a InitCommand,
    pub(crate) seccomp: &'a Vec<BpfInstruction>,
    pub(crate) backend: &'a Backend,
    pub(crate) command: &'a StepCommand,
    pub(crate) controls: &'a Controls,
    pub(crate) layout: &'a HostLayout,
    pub(crate) workspace: WorkspaceFacts,
    pub(crate) prelude: &'a Prelude,
    pub(crate) prelude_line: &'a [u8],
    pub(crate) step_env: &'a BTreeMap<String, String>,
    pub(crate) egress_etc: Option<&'a Path>,
    /// A sandbox that takes many commands ([`Prelude::session`]): the plan is sent without
    /// its command, which [`Launched::session_exec`] keeps as every command's base.
    pub(crate) session: bool,
}

/// The step's init, sent its plan, and how it came to serve the step (for the log).
pub(crate) struct Launched {
    /// Our end of its control socket.
    pub(crate) ours: UnixStream,
    pub(crate) spawned: SpawnedInit,
    pub(crate) plan: InitPlan,
    /// An armed init's `ready`, which the pool's keeper read.
    pub(crate) ready: Option<Value>,
    /// How long the warm init that serves the step had been waiting.
    pub(crate) warm_for: Option<Duration>,
    pub(crate) armed_served: bool,
    pub(crate) armed_given_up: bool,
    /// Why the claimed warm init could not be sent the plan (it was gone).
    pub(crate) warm_lost: Option<String>,
    /// When the init was started (the step's duration counts from here).
    pub(crate) started: Instant,
    /// A session's base command (environment, search path, working directory), taken out of
    /// the plan it was compiled into.
    pub(crate) session_exec: Option<plan::ExecSpec>,
}

/// Starts the step's init and sends it the plan; with the stdin feed, which must live as long
/// as the step.
pub(crate) async fn launch(
    input: &LaunchInput<'_>,
    warm: Option<ClaimedWarm>,
) -> Result<(Launched, Option<StdinFeed>), RuntimeError> {
    let (backend, layout) = (input.backend, input.layout);
    // An armed warm init has mounted the workspace over this sandbox's layers already.
    let armed = warm.as_ref().is_some_and(|w| w.armed.is_some());
    // A warm init attached at create serves only the prelude a cold one would get (the
    // plan is compared below, once compiled); otherwise it is dropped, which ends it.
    // An armed init not used keeps its control socket here until it is known to have ended.
    let mut given_up_control = None;
    let warm = keep_if_same_prelude(warm, input.prelude, &mut given_up_control);
    let started = Instant::now();
    let mut cold = match warm {
        // An armed init given up must be gone before a cold one joins its cgroups (below).
        None if armed => None,
        Some(_) => None,
        None => Some(start_cold(input.zygote, input.init, input.prelude_line).await?),
    };
    // The caller's stream as the command's stdin, through a FIFO in the request directory;
    // the feed stops when `execute` returns.
    let request_dir = backend.request_dir();
    let stdin_feed = match input.command.stdin.take() {
        Some(reader) => Some(
            stdin_feed::start(&request_dir, reader)
                .map_err(|e| RuntimeError::io("make the stdin FIFO in", &request_dir, e))?,
        ),
        None => None,
    };
    let git_common = git_layer(backend, layout)?;
    // A second execute mounts the overlays again over the same layers (an armed init's
    // mounts are this execute's own: their marks are cleared only if it is given up).
    let git_work = git_common.as_ref().map(|g| g.work.clone());
    if !armed {
        clear_volatile_marks(layout, git_work.as_deref())?;
    }
    let mut plan = compile_plan(input, stdin_feed.is_some(), git_common).await?;
    let session_exec = input.session.then(|| std::mem::take(&mut plan.exec));
    let sent = send_to_warm(warm, &plan, backend)?;
    let warmed = sent.warmed;
    let ready = sent.ready.filter(|_| warmed.is_some());
    if let Some(control) = sent.given_up_control {
        given_up_control = Some(control);
    }
    // An armed init given up (or lost) is ended, and its mounts' volatile marks cleared,
    // before a cold one mounts the same layers.
    if armed && warmed.is_none() {
        end_given_up_armed(
            backend,
            given_up_control.take(),
            layout,
            git_work.as_deref(),
        )
        .await?;
    }
    drop(given_up_control);
    let warm_for = sent.warm_for.filter(|_| warmed.is_some());
    let armed_served = armed && warmed.is_some();
    let armed_given_up = armed && warmed.is_none() && sent.warm_lost.is_none();
    let (ours, spawned) = match warmed {
        Some(warm) => warm,
        None => {
            let (mut ours, spawned) = match cold.take() {
                Some(c) => c,
                None => start_cold(input.zygote, input.init, input.prelude_line).await?,
            };
            ours.write_all(&json_line(&plan)?)
                .map_err(|e| spawn_err(format!("sending the plan: {e}")))?;
            (ours, spawned)
        }
    };
    let launched = Launched {
        ours,
        spawned,
        plan,
        ready,
        warm_for,
        armed_served,
        armed_given_up,
        warm_lost: sent.warm_lost,
        started,
        session_exec,
    };
    Ok((launched, stdin_feed))
}

/// The warm init attached at create, if it was sent the prelude a cold one would get;
/// otherwise it is dropped (which ends it), an armed one's control socket kept in
/// `given_up_control` until it is known to have ended.
fn keep_if_same_prelude(
    warm: Option<ClaimedWarm>,
    prelude: &Prelude,
    given_up_control: &mut Option<UnixStream>,
) -> Option<ClaimedWarm> {
    match warm {
        Some(w) => {
            let mut cold = prelude.clone();
            cold.warm = true;
            if w.prelude == cold {
                Some(w)
            } else {
                // A plain one is dropped here, which ends it.
                if w.armed.is_some() {
                    *given_up_control = Some(w.control);
                }
                None
            }
        }
        None => None,
    }
}

/// The step's plan, compiled as for a cold start; on the prepared root when the runtime uses
/// one (made here if need be).
async fn compile_plan(
    input: &LaunchInput<'_>,
    stdin: bool,
    git_common: Option<plan::GitCommonLayer>,
) -> Result<InitPlan, RuntimeError> {
    let (caps, controls, command) = (input.caps, input.controls, input.command);
    let tmp_bytes = controls.disk_limit_bytes.unwrap_or(plan::DEFAULT_TMP_BYTES);
    let home = match &controls.home {
        Some(name) => Some(crate::home::prepare(
            crate::home::homes_root(&caps.host_env).as_deref(),
            name,
            caps.uid,
        )?),
        None => None,
    };
    let mut plan = plan::compile(&PlanInput {
        home: home.as_deref(),
        stdin,
        git_common,
        layout: input.layout,
        workspace: input.workspace,
        host: &caps.facts,
        allow_network: controls.allow_network,
        tmp_bytes,
        volumes: &controls.volumes,
        argv: &command.argv,
        cwd: command.cwd.as_deref(),
        step_env: input.step_env,
        host_env: &caps.host_env,
        egress_etc: input.egress_etc,
        seccomp: input.seccomp.clone(),
        prepared_root: caps.prepared_root,
    });
    if caps.prepared_root {
        let (files, mounts) = plan::split_prepared(std::mem::take(&mut plan.mounts));
        // Usually one stamp of an existing root, done here; making one (and sweeping old
        // ones) is a tree of file operations, on a blocking thread.
        let (source, mounts) = match prepared_root::existing(&caps.state_root, &files, &mounts) {
            Some(source) => (Ok(source), mounts),
            None => {
                let state_root = caps.state_root.clone();
                blocking("prepare the sandbox root", move || {
                    let made = prepared_root::ensure(&state_root, &files, &mounts).map_err(|e| {
                        RuntimeError::io("prepare the sandbox root in", &state_root, e)
                    });
                    (made, mounts)
                })
                .await?
            }
        };
        let source = source?;
        plan.mounts = mounts;
        plan.root = plan::RootFs::Prepared { source };
    }
    Ok(plan)
}

/// What became of the claimed warm init once the plan was known.
struct SentToWarm {
    /// It goes on: our end of its control socket, and the init.
    warmed: Option<(UnixStream, SpawnedInit)>,
    /// An armed one's `ready` (see [`Launched::ready`]).
    ready: Option<Value>,
    warm_for: Option<Duration>,
    warm_lost: Option<String>,
    /// Its control socket, when it does not go on.
    given_up_control: Option<UnixStream>,
}

/// Sends the claimed warm init the rest of `plan` (an armed one only the command), when it
/// built exactly the plan's first part.
fn send_to_warm(
    warm: Option<ClaimedWarm>,
    plan: &InitPlan,
    backend: &Backend,
) -> Result<SentToWarm, RuntimeError> {
    // The warm init goes on only if what it built is exactly this plan's first part, on the
    // same root: it is then sent the rest. Else a cold init is started after all.
    let warm_rest = warm.as_ref().and_then(|w| {
        let (prefix, rest) = plan::split_warm(plan.mounts.clone());
        (plan.new_root == w.plan.new_root && plan.root == w.plan.root && prefix == w.plan.mounts)
            .then_some(rest)
    });
    let warm_for = warm.as_ref().map(|w| w.since.elapsed());
    // The warm init is sent the rest of the plan; an armed one, set up with exactly this
    // plan's rest already, only the command. It may have died since its claim (killed, or
    // the OOM killer): the write then fails (its socket's peer is gone) and a cold init
    // serves the step instead, which the bundle's log names (`warmStartLost`).
    let mut warm_lost = None;
    let mut given_up_control = None;
    let mut ready = None;
    let warmed = match (warm, warm_rest) {
        (Some(w), Some(rest)) => {
            let mut step = plan.clone();
            step.mounts = rest;
            let line = match &w.armed {
                None => Some(json_line(&step)?),
                Some(armed) => {
                    step.exec = Default::default();
                    step.exec_follows = true;
                    let same = json_line(&step)? == armed.line_for(backend).as_bytes();
                    ready = Some(armed.ready.clone());
                    same.then(|| json_line(&plan.exec)).transpose()?
                }
            };
            let mut control = w.control;
            match line.map(|line| control.write_all(&line)) {
                Some(Ok(())) => Some((control, ForkedInit::into_spawned(w.init)?)),
                not_sent => {
                    warm_lost = not_sent.and_then(|r| r.err()).map(|e| e.to_string());
                    given_up_control = Some(control);
                    None
                }
            }
        }
        (Some(w), None) => {
            given_up_control = Some(w.control);
            None
        }
        (None, _) => None,
    };
    Ok(SentToWarm {
        warmed,
        ready,
        warm_for,
        warm_lost,
        given_up_control,
    })
}

/// Ends the armed init given up (see [`end_given_up_init`]) and clears its mounts' volatile
/// marks, so that a cold init may mount the same layers.
async fn end_given_up_armed(
    backend: &Backend,
    control: Option<UnixStream>,
    layout: &HostLayout,
    git_work: Option<&Path>,
) -> Result<(), RuntimeError> {
    let cgroups = backend.cgroups.clone();
    let ended = blocking("end the armed warm init", move || {
        end_given_up_init(control, &cgroups, KILL_GRACE)
    })
    .await?;
    if !ended {
        return Err(RuntimeError::Spawn {
                operation: "end the armed warm sandbox's init".into(),
                reason: format!(
                    "it was still running (its mounts are over this sandbox's layers) {} s after it was told to end and killed; no cold init may mount them meanwhile",
                    KILL_GRACE.as_secs()
                ),
            });
    }
    clear_volatile_marks(layout, git_work)?;
    Ok(())
}

/// The init mounts its overlays `volatile` (never synced, see the init's `mounts`), and
/// overlayfs leaves `work/incompat/volatile` in the work directory of such a mount: it refuses
/// to mount that work directory again, since after a crash the upper layer may have lost
/// writes. A second `execute` in the same sandbox mounts its layer again, so the mark is
/// removed first (with the rest of overlayfs' `work/`), but only when it was made since this boot (the layer then cannot have
/// been through a crash: a crash is a reboot). A mark from before this boot is left, and the
/// mount refused, as overlayfs means it to be.
fn clear_volatile_mark(work: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // Overlayfs makes its `work/` and `work/incompat/` mode 000, owned by whoever mounted it:
    // root looks inside anyway, an ordinary user (the sandbox's root is their own uid) must
    // open them up first, or the mark is never seen and the next mount refused. They are
    // overlayfs' scratch, made anew at every mount.
    for dir in [work.join("work"), work.join("work/incompat")] {
        if std::fs::symlink_metadata(&dir)
            .is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o700 != 0o700)
        {
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        }
    }
    let mark = work.join("work/incompat/volatile");
    let meta = match std::fs::symlink_metadata(&mark) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(RuntimeError::io(
                "look for the overlay's volatile mark",
                &mark,
                e,
            ))
        }
    };
    let booted = std::fs::read_to_string("/proc/stat").ok().and_then(|stat| {
        stat.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|t| t.trim().parse::<i64>().ok())
    });
    match booted {
        // Overlayfs' own `work/` (mode 000 directories), which it makes anew at every mount.
        Some(booted) if meta.is_dir() && meta.ctime() >= booted => {
            let own = work.join("work");
            remove_tree(&own)
                .map_err(|e| RuntimeError::io("remove the overlay's volatile mark", &own, e))
        }
        _ => Err(RuntimeError::spawn(
            "mount the workspace again",
            format!(
                "{} is from before this boot: the layer may have lost writes in a crash",
                mark.display()
            ),
        )),
    }
}

/// Ends an armed warm init that is not used after all, before a cold one mounts the same
/// layers: closing our end of its control socket tells P0 to kill P1, its cgroups are emptied
/// (one pid at a time: they serve the cold init next), and P0's closing of the socket, after
/// it reaped P1, says the sandbox's processes are gone, with or without cgroups. Whether both
/// happened within `budget`.
fn end_given_up_init(
    control: Option<UnixStream>,
    cgroups: &SandboxCgroups,
    budget: Duration,
) -> bool {
    use std::io::Read as _;
    let deadline = Instant::now() + budget;
    if let Some(c) = &control {
        let _ = c.shutdown(std::net::Shutdown::Write);
    }
    let emptied = cgroups.kill_and_wait(budget);
    let Some(mut control) = control else {
        return emptied;
    };
    if control.set_nonblocking(false).is_err() {
        return false;
    }
    let mut buf = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || control.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        match control.read(&mut buf) {
            Ok(0) => return emptied,
            // P0's reports (its `initExit`), or a peer already gone.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => return emptied,
            Err(_) => return false,
        }
    }
}

/// [`clear_volatile_mark`] of the workspace's layer (overlay) and of the git layer.
fn clear_volatile_marks(layout: &HostLayout, git_work: Option<&Path>) -> Result<(), RuntimeError> {
    if layout.workspace_copy.is_none() {
        clear_volatile_mark(&layout.work)?;
    }
    if let Some(work) = git_work {
        clear_volatile_mark(work)?;
    }
    Ok(())
}
