//! A warm sandbox: its init forked and given the step-independent part of every plan, its
//! cgroups, and how a claim hands them to a sandbox.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use smithers_runtime::SandboxConfig;

use crate::armed::Armed;
use crate::backend::Backend;
use crate::cgroup::{CgroupLimits, SandboxCgroups};
use crate::host::HostCaps;
use crate::launcher::{
    await_report, fork_from_zygote, json_line, output_pipe, ForkedInit, ZygoteSlot,
};
use crate::names;
use crate::plan::{self, HostLayout, PlanInput, Prelude, WarmPlan, WorkspaceFacts};
use crate::prepared_root;

/// A prepared sandbox, waiting for a step.
#[derive(Debug)]
pub(crate) struct WarmSandbox {
    /// The runtime's end of the init's control socket: prelude and warm plan sent, the
    /// `warm` report read. Closing it makes P0 kill P1.
    pub(crate) control: UnixStream,
    pub(crate) init: ForkedInit,
    pub(crate) cgroups: SandboxCgroups,
    /// What the init was sent, to compare with a step's.
    pub(crate) prelude: Prelude,
    pub(crate) plan: WarmPlan,
    /// When it reported `warm`.
    pub(crate) since: Instant,
    /// Set up whole for a configuration (see [`crate::armed`]).
    pub(crate) armed: Option<Armed>,
}

/// A warm sandbox claimed by a sandbox at `create`, attached to it until its first
/// `execute`: its cgroups are the sandbox's now (the handle's, removed by its cleanup), so
/// dropping this only ends the init.
#[derive(Debug)]
pub(crate) struct ClaimedWarm {
    pub(crate) control: UnixStream,
    pub(crate) init: ForkedInit,
    pub(crate) prelude: Prelude,
    pub(crate) plan: WarmPlan,
    pub(crate) since: Instant,
    /// Its directories are the sandbox's now (renamed at create).
    pub(crate) armed: Option<Armed>,
}

impl WarmSandbox {
    /// Hands the cgroups to the sandbox that claims this one.
    pub(crate) fn claim(self) -> (ClaimedWarm, SandboxCgroups) {
        let claimed = ClaimedWarm {
            control: self.control,
            init: self.init,
            prelude: self.prelude,
            plan: self.plan,
            since: self.since,
            armed: self.armed,
        };
        (claimed, self.cgroups)
    }

    /// Whether the init is still waiting: nothing may have come on its control socket since
    /// its `warm` report (an end of file, or an error, means it is gone).
    pub(super) fn waiting(&self) -> bool {
        let mut fds = [libc::pollfd {
            fd: self.control.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: `fds` is a valid array of one pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) };
        n == 0
    }

    /// Ends an unclaimed warm sandbox: its init is killed (the socket closes) and, once its
    /// processes are gone, its cgroups removed, and an armed one's directories.
    pub(crate) fn discard(self) {
        let WarmSandbox {
            control,
            init,
            cgroups,
            armed,
            ..
        } = self;
        drop(control);
        drop(init);
        cgroups.kill_all();
        let _ = cgroups.remove(Duration::from_secs(2));
        if let Some(armed) = armed {
            armed.remove_dirs();
        }
    }
}

/// An init forked from this very process (see [`smithers_sandbox_init::zygote::fork_here`])
/// before the host is even looked at: it waits on its control socket for its prelude, which
/// the pool's thread sends once it knows the host. It is our child, so the pool's thread
/// reaps it (see [`WarmPool::start_once`]).
#[derive(Debug)]
pub(crate) struct PreForked {
    control: UnixStream,
    pub(super) init: ForkedInit,
}

impl PreForked {
    /// Forks it; an error when this process is not single-threaded (or the fork failed).
    pub(crate) fn fork() -> std::io::Result<PreForked> {
        let (ours, theirs) = UnixStream::pair()?;
        let (out_r, out_w) = output_pipe()?;
        let (err_r, err_w) = output_pipe()?;
        let pid = smithers_sandbox_init::zygote::fork_here(&[
            theirs.as_raw_fd(),
            out_w.as_raw_fd(),
            err_w.as_raw_fd(),
        ])?;
        // Forked before the host is detected: where detection moves this process (a leaf of
        // its v2 cgroup), the init must go too.
        crate::cgroup::procs::move_with_this_process(pid as u32);
        // The init has its own copies now; ours of its ends must go so that EOF means
        // "init gone" (dropped here, with the pipes' write ends).
        Ok(PreForked {
            control: ours,
            init: ForkedInit {
                pid,
                stdout: out_r,
                stderr: err_r,
            },
        })
    }
}

/// Waits for our child `pid` to end and reaps it.
pub(super) fn reap(pid: libc::pid_t) {
    let _ = smithers_sandbox_init::sys::wait_child(pid, 0);
    crate::cgroup::procs::forget_companion(pid as u32);
}

/// Whether a sandbox of this configuration may be served by a warm one: a warm sandbox has
/// no network, the default `/tmp` size and no cpu cgroup. The rest of the plan is compared
/// at `execute`.
pub(crate) fn eligible(config: &SandboxConfig) -> bool {
    // A sandbox over frozen layers is made cold: its plan holds them.
    config.workspace_layers.is_empty() && eligible_controls(&config.controls)
}

/// [`eligible`], of the controls alone.
pub(crate) fn eligible_controls(c: &smithers_runtime::Controls) -> bool {
    !c.allow_network
        && c.egress_policy.is_none()
        && c.disk_limit_bytes.is_none()
        && c.cpu_limit.is_none()
        && c.volumes.is_empty()
        && c.home.is_none()
        && c.secrets.is_empty()
}

/// The step-independent part of every plan on this host, and the prepared root it is bound
/// on (made if need be).
fn warm_plan(caps: &HostCaps) -> Result<WarmPlan, String> {
    // Placeholders for everything a step brings: none of it reaches the prefix (the test
    // `the_warm_prefix_depends_on_no_step` holds the plan to that).
    let step = Path::new("/nonexistent/smithers-warm-step");
    let layout = HostLayout {
        root_dir: step.join("project"),
        layers: Vec::new(),
        upper: step.join("upper"),
        work: step.join("work"),
        workspace_copy: None,
        new_root: Backend::new_root_in(&caps.state_root),
        artifacts: step.join("artifacts"),
        out: step.join("out"),
        request: step.join("request"),
    };
    let seccomp = caps.seccomp.clone()?;
    let argv = vec!["true".to_string()];
    let empty = Default::default();
    let plan = plan::compile(&PlanInput {
        home: None,
        stdin: false,
        git_common: None,
        layout: &layout,
        workspace: WorkspaceFacts { has_git_dir: false },
        host: &caps.facts,
        allow_network: false,
        tmp_bytes: plan::DEFAULT_TMP_BYTES,
        volumes: &[],
        argv: &argv,
        cwd: None,
        step_env: &empty,
        host_env: &caps.host_env,
        egress_etc: None,
        seccomp,
        prepared_root: true,
    });
    let (files, mounts) = plan::split_prepared(plan.mounts);
    let source = prepared_root::ensure(&caps.state_root, &files, &mounts)
        .map_err(|e| format!("prepare the sandbox root: {e}"))?;
    let (prefix, _) = plan::split_warm(mounts);
    Ok(WarmPlan {
        version: plan::PLAN_VERSION,
        new_root: plan.new_root,
        root: plan::RootFs::Prepared { source },
        mounts: prefix,
    })
}

/// Makes one warm sandbox: cgroups with the default limits, an init forked from the zygote
/// and given the warm plan, and its `warm` report.
pub(super) fn make(
    caps: &HostCaps,
    zygote: &ZygoteSlot,
    limits: &CgroupLimits,
    preforked: Option<PreForked>,
) -> Result<WarmSandbox, String> {
    let init = caps.init.as_ref().map_err(Clone::clone)?;
    let plan = warm_plan(caps)?;
    std::fs::create_dir_all(&plan.new_root)
        .map_err(|e| format!("make {}: {e}", plan.new_root.display()))?;
    let cgroups = caps
        .cgroups
        .create(&names::warm_cgroup_name(), limits)
        .map_err(|e| format!("create the sandbox cgroups: {e}"))?;
    let mut prelude = Prelude::new(caps.uid, caps.gid, cgroups.join_plan(), false);
    prelude.warm = true;
    let started = (|| {
        let mut lines = json_line(&prelude).map_err(|e| e.to_string())?;
        lines.extend(json_line(&plan).map_err(|e| e.to_string())?);
        let (mut ours, forked) = match preforked {
            Some(PreForked { control, init }) => (control, init),
            None => {
                let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
                let forked = fork_from_zygote(zygote, init, &theirs)
                    .ok_or_else(|| "the zygote could not fork an init".to_string())?;
                // The init has its own copy now; ours must go so that EOF means "init gone".
                drop(theirs);
                (ours, forked)
            }
        };
        ours.write_all(&lines).map_err(|e| e.to_string())?;
        let mut sandbox = WarmSandbox {
            control: ours,
            init: forked,
            cgroups: cgroups.clone(),
            prelude: prelude.clone(),
            plan: plan.clone(),
            since: Instant::now(),
            armed: None,
        };
        match await_report(&sandbox.control, "warm") {
            Ok(_) => {
                sandbox.since = Instant::now();
                Ok(sandbox)
            }
            Err(e) => {
                drop(sandbox.control);
                Err(e)
            }
        }
    })();
    started.inspect_err(|_| {
        cgroups.kill_all();
        let _ = cgroups.remove(Duration::from_secs(2));
    })
}
