//! Dropping P1's privileges: capabilities, no_new_privs, Landlock, dumpable, and the seccomp
//! program last. The init only installs a program the runtime compiled.

use serde_json::{json, Value};

use crate::control::{stage, StageResult};
use crate::plan::{BpfInstruction, InitPlan, LandlockPlan};
use crate::sys::{self, SysResult};

pub(crate) fn read_cap_last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

// securebits: NOROOT, NO_SETUID_FIXUP, KEEP_CAPS (off) and NO_CAP_AMBIENT_RAISE, all locked.
// (bits 0-7 set except KEEP_CAPS, bit 4).
const SECUREBITS: libc::c_ulong = 0xef;

fn drop_capabilities(last_cap: u32) -> SysResult<()> {
    sys::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, "PR_SET_SECUREBITS")?;
    for cap in 0..=last_cap {
        match sys::prctl(
            libc::PR_CAPBSET_DROP,
            cap as libc::c_ulong,
            "PR_CAPBSET_DROP",
        ) {
            Err(e) if e.errno == libc::EINVAL => {}
            other => {
                other?;
            }
        }
    }
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes no pointers.
    let ret = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    sys::check(ret, || "clear ambient capabilities".to_string())?;
    Ok(())
}

fn capset_zero() -> SysResult<()> {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: header and a two-element data array, as capset(2) version 3 requires.
    let ret =
        unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    sys::check_long(ret, || "capset".to_string()).map(|_| ())
}

pub(crate) fn apply_landlock(plan: &LandlockPlan) -> Result<&'static str, String> {
    use landlock::{
        Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus, Scope, ABI,
    };
    let abi = ABI::V6;
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| err(&e))?;
    // No AccessNet is handled: the network namespace is the boundary (see LandlockPlan).
    if plan.scope {
        ruleset = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(|e| err(&e))?;
    }
    let mut created = ruleset.create().map_err(|e| err(&e))?;
    let rules = plan
        .read_dirs
        .iter()
        .map(|p| (p, AccessFs::from_read(abi)))
        .chain(plan.write_dirs.iter().map(|p| (p, AccessFs::from_all(abi))))
        .chain(
            plan.write_files
                .iter()
                .map(|p| (p, AccessFs::from_file(abi))),
        );
    for (path, access) in rules {
        // A rule for a path that does not exist in this sandbox (an optional device) is
        // simply not needed.
        let Ok(fd) = PathFd::new(path) else { continue };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| err(&e))?;
    }
    let status = created.restrict_self().map_err(|e| err(&e))?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => "enforced",
        RulesetStatus::PartiallyEnforced => "degraded",
        RulesetStatus::NotEnforced => "unavailable",
    })
}

/// A domain that scopes signals and abstract unix sockets and handles no file access: a
/// session's P1's (see [`restrict_session_init`]). Its spawners' domains nest in it without
/// a scope of their own, so every process of the session, whichever spawner started it, may
/// signal every other (a pause, a resume, a command's `kill`), and none a process outside.
/// `None` when this kernel cannot scope (Landlock ABI < 6): nothing is then scoped anywhere.
fn scope_only() -> Option<&'static str> {
    use landlock::{CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetStatus, Scope};
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .ok()?;
    let status = ruleset.create().ok()?.restrict_self().ok()?;
    match status.ruleset {
        RulesetStatus::NotEnforced => None,
        _ => Some("enforced"),
    }
}

/// Installs `program` (nothing when it is empty).
pub(crate) fn install_seccomp(program: &[BpfInstruction]) -> SysResult<()> {
    if program.is_empty() {
        return Ok(());
    }
    let filter: Vec<libc::sock_filter> = program
        .iter()
        .map(|&(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k })
        .collect();
    let fprog = libc::sock_fprog {
        len: filter.len() as libc::c_ushort,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `filter`, which outlives the call; the kernel copies it.
    let ret = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &fprog as *const libc::sock_fprog,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    sys::check(ret, || "install seccomp filter".to_string()).map(|_| ())
}

/// Privileges go in this order: capabilities (while we still may change securebits), then
/// no_new_privs, Landlock (needs no_new_privs), the remaining capability sets, and seccomp last
/// so that nothing above is blocked by it.
/// P1 of a session: every capability gone, no_new_privs, not dumpable; the Landlock domain
/// and the seccomp filter are its spawner's ([`confine_spawner`]), because Landlock's rules
/// are bound to the mount they were made on, and a checkpoint puts a new mount at
/// `/workspace`: each spawner is confined over the workspace as mounted when it starts, and
/// every command is the child of one. P1 runs no command and reads only the runtime's
/// requests; no sandbox process may trace it or read its memory (not dumpable, and none has
/// a capability).
pub(crate) fn restrict_session_init(last_cap: u32, scope: bool) -> StageResult<()> {
    stage("capabilities", drop_capabilities(last_cap))?;
    stage(
        "no_new_privs",
        sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS"),
    )?;
    if scope {
        scope_only();
    }
    stage("capabilities", capset_zero())?;
    stage(
        "dumpable",
        sys::prctl(libc::PR_SET_DUMPABLE, 0, "PR_SET_DUMPABLE").map(|_| ()),
    )
}

/// A session's spawner, forked by P1 (see [`restrict_session_init`]): Landlock, then seccomp,
/// as `restrict` confines a step's P1. Returns the `ready` report.
pub(crate) fn confine_spawner(plan: &InitPlan) -> StageResult<Value> {
    // The scope is P1's (see `scope_only`): a spawner's own would part its commands from
    // those of the spawner before it.
    let rules = LandlockPlan {
        scope: false,
        ..plan.landlock.clone()
    };
    let (landlock, landlock_detail) = match apply_landlock(&rules) {
        Ok(status) => (status, String::new()),
        Err(e) => ("unavailable", e),
    };
    stage("seccomp", install_seccomp(&plan.seccomp))?;
    Ok(json!({
        "event": "ready",
        "landlock": landlock,
        "landlockDetail": landlock_detail,
        "seccomp": !plan.seccomp.is_empty(),
    }))
}

pub(crate) fn restrict(plan: &InitPlan, last_cap: u32) -> StageResult<Value> {
    stage("capabilities", drop_capabilities(last_cap))?;
    stage(
        "no_new_privs",
        sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS"),
    )?;
    let (landlock, landlock_detail) = match apply_landlock(&plan.landlock) {
        Ok(status) => (status, String::new()),
        Err(e) => ("unavailable", e),
    };
    stage("capabilities", capset_zero())?;
    // No process of the sandbox may ptrace or read the memory of pid 1.
    stage(
        "dumpable",
        sys::prctl(libc::PR_SET_DUMPABLE, 0, "PR_SET_DUMPABLE"),
    )?;
    stage("seccomp", install_seccomp(&plan.seccomp))?;
    Ok(json!({
        "event": "ready",
        "landlock": landlock,
        "landlockDetail": landlock_detail,
        "seccomp": !plan.seccomp.is_empty(),
    }))
}
