//! P1, pid 1 of the sandbox's pid namespace: joins the v1 cgroups, builds and enters the root,
//! enters the network namespace, drops its privileges, starts the command and reaps every
//! process of the sandbox before reporting the command's exit.

use std::os::fd::OwnedFd;
use std::path::Path;

use serde_json::{json, Value};

use crate::cgroups::{await_cgroups, join_v1};
use crate::control::{
    parse_exec, parse_plan, read_step_line, report, report_error, report_plan_error, stage,
    StageResult,
};
use crate::mounts::apply;
use crate::network::enter_network_namespace;
use crate::plan::{InitPlan, MountOp, RootFs, WarmPlan};
use crate::privileges::{read_cap_last_cap, restrict, restrict_session_init};
use crate::spawn::PreparedExec;
use crate::sys::{self, cpath, cstring, SysError, SysResult};

/// P1, pid 1 of the sandbox. Returns the exit code of P1 itself.
pub(crate) fn pid1(
    plan: &InitPlan,
    v1_tasks: &[libc::c_int],
    joined: libc::c_int,
    netns: Option<OwnedFd>,
    exec_channel: Option<OwnedFd>,
) -> i32 {
    if !enter(v1_tasks) {
        return 1;
    }
    // Only a warm P1 reads a line after its plan (a cold one's fd 0 is P0's from here on).
    if plan.exec_follows {
        return report_plan_error("a cold sandbox's plan must hold its command".to_string());
    }
    // A session's commands come as messages; a plan's command there would be ignored.
    if exec_channel.is_some() && !plan.exec.argv.is_empty() {
        return report_plan_error("a session's plan must hold no command".to_string());
    }
    let ready = match setup(plan, netns, joined, exec_channel.is_some()) {
        Ok(r) => r,
        Err((stage, err)) => {
            report_error(stage, &err);
            return 1;
        }
    };
    match exec_channel {
        Some(channel) => crate::session::spawner::serve_as_init(channel, plan),
        None => run_command(plan, Some(ready)),
    }
}

/// P1's first steps, warm or not: dies with P0, joins the v1 cgroups. False (reported) when
/// either fails.
fn enter(v1_tasks: &[libc::c_int]) -> bool {
    if let Err(e) = sys::prctl(
        libc::PR_SET_PDEATHSIG,
        libc::SIGKILL as libc::c_ulong,
        "PR_SET_PDEATHSIG",
    ) {
        report_error("pdeathsig", &e);
        return false;
    }
    if let Err(e) = join_v1(v1_tasks) {
        report_error("cgroup", &e);
        return false;
    }
    true
}

/// P1 of a warm sandbox: builds what the [`WarmPlan`] holds of the root, reports `warm`,
/// reads the step's plan from fd 0 (the next line), then goes on as [`pid1`] would with the
/// rest of the mounts. A plan with [`InitPlan::exec_follows`] (a sandbox armed at `create`)
/// is set up whole, `ready` reported, and the command read from the line after. `taken` is
/// closed once the last line of ours is read, which gives fd 0 back to P0. Returns the exit
/// code of P1 itself.
pub(crate) fn pid1_warm(
    warm: &WarmPlan,
    v1_tasks: &[libc::c_int],
    joined: libc::c_int,
    netns: Option<OwnedFd>,
    taken: OwnedFd,
) -> i32 {
    if !enter(v1_tasks) {
        return 1;
    }
    let last_cap = read_cap_last_cap();
    let prepared = match build_root(&warm.new_root, &warm.root, &warm.mounts) {
        Ok(p) => p,
        Err((stage, err)) => {
            report_error(stage, &err);
            return 1;
        }
    };
    report(json!({"event": "warm"}));
    let mut plan = match read_step_line().and_then(|line| parse_plan(&line)) {
        Ok(plan) => plan,
        Err(message) => return report_plan_error(message),
    };
    // Kept (open) only while a line of ours is still to come.
    let taken = plan.exec_follows.then_some(taken);
    // The step's plan goes on from where the warm one stopped, on the same root: any other
    // root would leave the first half of its mounts undone.
    if plan.new_root != warm.new_root || plan.root != warm.root {
        return report_plan_error(
            "the step's plan is for another root than this warm sandbox's".to_string(),
        );
    }
    let ready = (|| {
        for op in &plan.mounts {
            stage("mount", apply(op, &plan.new_root, prepared))?;
        }
        enter_root(&plan, netns, joined, last_cap, false)
    })();
    let ready = match ready {
        Ok(r) => r,
        Err((stage, err)) => {
            report_error(stage, &err);
            return 1;
        }
    };
    if plan.exec_follows {
        // Set up and confined as the step will be (what follows needs only read, spawn and
        // wait): `ready` now, while the runtime is still making the sandbox's other parts.
        report(ready);
        plan.exec = match read_step_line().and_then(|line| parse_exec(&line)) {
            Ok(exec) => exec,
            Err(message) => return report_plan_error(message),
        };
        drop(taken);
        return run_command(&plan, None);
    }
    run_command(&plan, Some(ready))
}

/// P1 once set up: reports `ready` (unless already reported), starts the command, reaps
/// every process of the sandbox, reports the command's exit. Returns the exit code of P1
/// itself.
fn run_command(plan: &InitPlan, ready: Option<Value>) -> i32 {
    if let Some(ready) = ready {
        report(ready);
    }
    // A terminal is a live sandbox's (its spawner makes one per command): refused here
    // rather than started without one.
    let prepared = match plan.exec.terminal {
        Some(_) => Err((
            126,
            "smithers-sandbox: a terminal is given only to a live sandbox's command\n".into(),
        )),
        None => PreparedExec::new(&plan.exec),
    };
    let pid = match prepared.and_then(|exec| exec.spawn()) {
        // posix_spawn returns once the command's exec succeeded: it runs from here on.
        Ok(pid) => {
            report(json!({"event": "started", "monotonicNs": sys::monotonic_ns()}));
            pid
        }
        // The command could not start: what a shell would print and exit with.
        Err((code, message)) => {
            let _ = sys::write_all_fd(2, message.as_bytes());
            report(json!({"event": "exit", "code": code}));
            return 0;
        }
    };
    // The output pipes are the command's now: once it and whatever it started are gone,
    // the runtime reads their end without waiting for us.
    // SAFETY: closing our own stdout and stderr, which nothing here writes to again.
    unsafe {
        libc::close(1);
        libc::close(2);
    }
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if r == pid {
            break;
        }
        if r < 0 && sys::errno() != libc::EINTR {
            report_error(
                "wait",
                &SysError {
                    op: "wait command".into(),
                    errno: sys::errno(),
                },
            );
            return 1;
        }
        // Another pid: an orphan reparented to us and now reaped. Keep waiting.
    }
    // Whatever the command left behind ends now, before the report: the `exit` event means
    // no process of the sandbox but this one is left, so the runtime can go on without
    // waiting for our own exit and the teardown of the namespaces (~0.3 ms here). We have no
    // capabilities, but every sandbox process has our uid, which is all kill(2) asks.
    // SAFETY: kill(-1) from pid 1 of the pid namespace reaches every other process in it.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    loop {
        // SAFETY: waitpid with a null status pointer.
        let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::__WALL) };
        if r < 0 && sys::errno() != libc::EINTR {
            break; // ECHILD: none left.
        }
    }
    if libc::WIFEXITED(status) {
        report(json!({"event": "exit", "code": libc::WEXITSTATUS(status)}));
    } else if libc::WIFSIGNALED(status) {
        report(json!({"event": "exit", "signal": libc::WTERMSIG(status)}));
    }
    // Returning ends pid 1, which would also make the kernel kill every remaining process of
    // the sandbox (there are none left).
    0
}

/// P1: build the root, pivot, drop privileges. Returns the `ready` report.
pub(crate) fn setup(
    plan: &InitPlan,
    netns: Option<OwnedFd>,
    joined: libc::c_int,
    session: bool,
) -> StageResult<Value> {
    let last_cap = read_cap_last_cap();
    build_root(&plan.new_root, &plan.root, &plan.mounts)?;
    enter_root(plan, netns, joined, last_cap, session)
}

/// Mounts the root at `new_root` and carries out `mounts` on it; returns whether the root is
/// a prepared one (see [`apply`]).
fn build_root(new_root: &Path, root_fs: &RootFs, mounts: &[MountOp]) -> StageResult<bool> {
    // Nothing we mount may propagate back to the host.
    stage(
        "mount",
        sys::mount(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        ),
    )?;
    let root = new_root;
    let prepared = match root_fs {
        RootFs::Tmpfs => {
            let data = cstring(&format!("mode=0755,size={}", crate::plan::ROOT_TMPFS_BYTES));
            stage(
                "mount",
                sys::mount(
                    Some(c"tmpfs"),
                    root,
                    Some(c"tmpfs"),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    Some(&data),
                ),
            )?;
            false
        }
        // Not recursive: the prepared directory holds no mounts, and nothing of the host
        // below it may come along. Read-only with the plan's last op, like the tmpfs root.
        RootFs::Prepared { source } => {
            stage(
                "mount",
                sys::mount(Some(&cpath(source)), root, None, libc::MS_BIND, None),
            )?;
            true
        }
    };
    for op in mounts {
        stage("mount", apply(op, root, prepared))?;
    }
    Ok(prepared)
}

/// Sets the host name, pivots into the root, waits for the cgroups, enters the network
/// namespace and drops privileges. Returns the `ready` report (a session's spawner makes
/// it: `null` for a session's P1).
fn enter_root(
    plan: &InitPlan,
    netns: Option<OwnedFd>,
    joined: libc::c_int,
    last_cap: u32,
    session: bool,
) -> StageResult<Value> {
    let root = &plan.new_root;
    // The name's bytes as they are, with their length (a C string made of it would end at a
    // NUL and be read past its end).
    stage(
        "hostname",
        sys::rx(
            rustix::system::sethostname(plan.hostname.as_bytes()),
            || "sethostname".to_string(),
        ),
    )?;
    stage("pivot_root", pivot(root))?;
    stage("cgroup", await_cgroups(joined))?;
    // As late as can be, still with the capabilities setns needs: P0 makes the namespace
    // while we build the root (its ~0.5 ms took longer than the prepared root's mounts).
    if let Some(sock) = netns {
        stage("network", enter_network_namespace(&sock))?;
    }
    if session {
        return restrict_session_init(last_cap, plan.landlock.scope).map(|()| Value::Null);
    }
    restrict(plan, last_cap)
}

fn pivot(root: &Path) -> SysResult<()> {
    sys::rx(rustix::process::chdir(root), || {
        format!("chdir {}", root.display())
    })?;
    // pivot_root(".", ".") stacks the old root on the new one, which the unmount then drops.
    sys::rx(rustix::process::pivot_root(".", "."), || {
        "pivot_root".to_string()
    })?;
    sys::umount2(Path::new("."), libc::MNT_DETACH)?;
    sys::rx(rustix::process::chdir("/"), || "chdir /".to_string())
}
