//! The host probe (`--probe <scratch>`): tries every mechanism once in throwaway namespaces
//! and prints what works as JSON, for the runtime's enforcement report.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::mounts::{apply, mkdir_p, touch};
use crate::network::lo_up;
use crate::plan::{LandlockPlan, MountAttrs, MountOp, ProbeInput, PLAN_VERSION};
use crate::privileges::{apply_landlock, install_seccomp};
use crate::sys::{self, SysError, SysResult};

fn outcome(r: SysResult<()>) -> Value {
    match r {
        Ok(()) => json!({"ok": true}),
        Err(e) => json!({"ok": false, "detail": e.to_string(), "errno": e.errno}),
    }
}

/// Tries every mechanism once in throwaway namespaces and prints the findings as JSON on stdout;
/// the seccomp program it tries is the runtime's, read from stdin ([`ProbeInput`]).
/// Everything it mounts lives in its own mount namespace and vanishes with it; the scratch
/// directory is the caller's to remove.
pub(crate) fn run_probe(scratch: &Path) -> i32 {
    let mut out = serde_json::Map::new();
    let (uid, gid) = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    let user = sys::unshare(libc::CLONE_NEWUSER, "user namespace").and_then(|()| {
        sys::write_file(Path::new("/proc/self/setgroups"), b"deny")?;
        sys::write_file(
            Path::new("/proc/self/uid_map"),
            format!("0 {uid} 1\n").as_bytes(),
        )?;
        sys::write_file(
            Path::new("/proc/self/gid_map"),
            format!("0 {gid} 1\n").as_bytes(),
        )
    });
    let user_ok = user.is_ok();
    out.insert("user".into(), outcome(user));
    if user_ok {
        for (name, flag) in [
            ("mount", libc::CLONE_NEWNS),
            ("ipc", libc::CLONE_NEWIPC),
            ("uts", libc::CLONE_NEWUTS),
            ("net", libc::CLONE_NEWNET),
            ("cgroup", libc::CLONE_NEWCGROUP),
            ("pid", libc::CLONE_NEWPID),
        ] {
            out.insert(name.into(), outcome(sys::unshare(flag, name)));
        }
        let mount_ok = out["mount"]["ok"] == json!(true);
        if mount_ok {
            out.insert("overlay".into(), outcome(probe_overlay(scratch)));
            out.insert("layerFlip".into(), outcome(probe_layer_flip(scratch)));
        }
        if out["pid"]["ok"] == json!(true) && mount_ok {
            out.insert("proc".into(), outcome(probe_proc(scratch)));
        }
        if out["net"]["ok"] == json!(true) {
            out.insert("loopback".into(), outcome(lo_up()));
        }
    }
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only queries.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    out.insert(
        "landlockAbi".into(),
        if abi > 0 {
            json!(abi)
        } else {
            json!({"ok": false, "errno": sys::errno()})
        },
    );
    let nnp = sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS").map(|_| ());
    out.insert("noNewPrivs".into(), outcome(nnp));
    let landlock = apply_landlock(&LandlockPlan {
        read_dirs: vec![PathBuf::from("/")],
        write_dirs: vec![PathBuf::from("/tmp")],
        write_files: vec![],
        scope: true,
    });
    out.insert(
        "landlock".into(),
        match landlock {
            Ok(status) => json!({"ok": status == "enforced", "status": status}),
            Err(e) => json!({"ok": false, "detail": e}),
        },
    );
    let seccomp = match probe_input() {
        Ok(ProbeInput {
            seccomp: Some(program),
            ..
        }) => outcome(install_seccomp(&program)),
        Ok(ProbeInput { seccomp: None, .. }) => {
            json!({"ok": false, "detail": "not tried: the runtime has no seccomp program"})
        }
        Err(detail) => json!({"ok": false, "detail": detail}),
    };
    out.insert("seccomp".into(), seccomp);
    println!("{}", Value::Object(out));
    0
}

/// The probe's input (see [`ProbeInput`]), read from stdin to its end.
fn probe_input() -> Result<ProbeInput, String> {
    use std::io::Read;
    let mut text = Vec::new();
    std::io::stdin()
        .lock()
        .take(64 << 20)
        .read_to_end(&mut text)
        .map_err(|e| format!("reading the probe's input: {e}"))?;
    let input: ProbeInput = serde_json::from_slice(&text)
        .map_err(|e| format!("the probe's input is not valid: {e}"))?;
    if input.version != PLAN_VERSION {
        return Err(format!(
            "probe input version {} but this init speaks {PLAN_VERSION} (another build)",
            input.version
        ));
    }
    Ok(input)
}

fn probe_overlay(scratch: &Path) -> SysResult<()> {
    sys::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    let dirs = ["lower", "upper", "work", "merged"].map(|d| scratch.join(d));
    for d in &dirs {
        mkdir_p(d, 0o755)?;
    }
    mkdir_p(&dirs[0].join("sub"), 0o755)?;
    apply(
        &MountOp::Overlay {
            lower: dirs[0].clone(),
            layers: Vec::new(),
            upper: dirs[1].clone(),
            work: dirs[2].clone(),
            path: PathBuf::from("/"),
            attrs: MountAttrs::RW,
            hide: Vec::new(),
        },
        &dirs[3],
        false,
    )?;
    // Deleting a lower directory is what fails (EIO) without userxattr.
    sys::rx(rustix::fs::rmdir(dirs[3].join("sub")), || {
        "rmdir through overlay".to_string()
    })?;
    touch(&dirs[3].join("written"))?;
    if !dirs[1].join("written").exists() {
        return Err(SysError {
            op: "overlay write did not reach the upper layer".into(),
            errno: libc::EIO,
        });
    }
    Ok(())
}

/// A session's checkpoint as the kernel will see it: an overlay's upper layer, once that
/// overlay is unmounted, becomes a lower layer of a new one, through which a directory of it
/// is removed (some kernels' overlayfs answers EIO there; then sessions refuse checkpoints).
fn probe_layer_flip(scratch: &Path) -> SysResult<()> {
    let base = scratch.join("flip");
    let dirs = ["lower", "upper0", "work0", "upper1", "work1", "merged"].map(|d| base.join(d));
    for d in &dirs {
        mkdir_p(d, 0o755)?;
    }
    let overlay = |layers: Vec<PathBuf>, upper: &Path, work: &Path| MountOp::Overlay {
        lower: dirs[0].clone(),
        layers,
        upper: upper.to_path_buf(),
        work: work.to_path_buf(),
        path: PathBuf::from("/"),
        attrs: MountAttrs::RW,
        hide: Vec::new(),
    };
    apply(&overlay(Vec::new(), &dirs[1], &dirs[2]), &dirs[5], false)?;
    mkdir_p(&dirs[5].join("d/e"), 0o755)?;
    touch(&dirs[5].join("d/e/x"))?;
    sys::umount2(&dirs[5], 0)?;
    apply(
        &overlay(vec![dirs[1].clone()], &dirs[3], &dirs[4]),
        &dirs[5],
        false,
    )?;
    let merged = &dirs[5];
    sys::rx(rustix::fs::unlink(merged.join("d/e/x")), || {
        "unlink through a flipped overlay".to_string()
    })?;
    sys::rx(rustix::fs::rmdir(merged.join("d/e")), || {
        "rmdir of a frozen layer's directory".to_string()
    })?;
    sys::rx(rustix::fs::rmdir(merged.join("d")), || {
        "rmdir of a frozen layer's directory".to_string()
    })?;
    sys::umount2(merged, 0)
}

fn probe_proc(scratch: &Path) -> SysResult<()> {
    let target = scratch.join("proc");
    mkdir_p(&target, 0o755)?;
    // SAFETY: the probe is single-threaded.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return sys::fail("fork");
    }
    if pid == 0 {
        sys::child_exit(|| {
            let ok = sys::mount(
                Some(c"proc"),
                &target,
                Some(c"proc"),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                None,
            )
            .is_ok();
            if ok {
                0
            } else {
                1
            }
        });
    }
    // A failed wait must not read as success (a status of 0 would).
    let (_, status) = sys::wait_child(pid, 0)?;
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(SysError {
            op: "mount proc in a new pid namespace".into(),
            errno: libc::EPERM,
        })
    }
}
