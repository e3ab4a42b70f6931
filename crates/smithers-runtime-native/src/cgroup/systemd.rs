//! A transient systemd scope with `Delegate=yes` holding this process, as rootless podman
//! makes one: systemd's user instance (root: the system instance) owns a subtree it may hand
//! over, and does so for a scope asked for over D-Bus. `busctl` (part of systemd, so present
//! wherever this applies) makes the call, which keeps a D-Bus client out of the runtime.

use std::process::Command;
use std::time::{Duration, Instant};

pub(super) fn enter_delegated_scope() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let pid = std::process::id();
    let unit = format!("smithers-sandbox-{pid}.scope");
    let mut cmd = Command::new("busctl");
    if uid != 0 {
        let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR").ok_or(
            "XDG_RUNTIME_DIR is not set, so the user's systemd instance cannot be reached",
        )?;
        if !std::path::Path::new(&runtime_dir).join("bus").exists() {
            return Err(format!(
                "no user bus at {}/bus (is the user's systemd instance running? loginctl enable-linger {uid})",
                std::path::Path::new(&runtime_dir).display()
            ));
        }
        cmd.arg("--user");
    }
    cmd.args([
        "call",
        "--quiet",
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "StartTransientUnit",
        "ssa(sv)a(sa(sv))",
        &unit,
        "fail",
        "2",
        "PIDs",
        "au",
        "1",
        &pid.to_string(),
        "Delegate",
        "b",
        "true",
        "0",
    ]);
    let out = cmd
        .output()
        .map_err(|e| format!("busctl (asking systemd for a delegated scope): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "systemd refused a delegated scope: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    // The job moves us asynchronously: wait until our cgroup is the scope.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        if own
            .lines()
            .any(|l| l.starts_with("0::") && l.ends_with(&unit))
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "systemd did not move this process into {unit} within 3 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
