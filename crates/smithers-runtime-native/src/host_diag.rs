//! Why a host refuses what the sandbox needs, and the fix for *this* host: a sysctl, an
//! AppArmor profile, a chroot, a container engine's default confinement. The runtime's
//! refusals and `doctor` both say it, so that the fix printed is the one that works here.
//!
//! Everything here is cheap file reads; the real attempts (a user namespace, a fresh `/proc`)
//! are made by the init's probe, whose failures are explained with [`userns_fix`] and
//! [`proc_fix`].

use std::path::Path;

/// The container engine this process runs under, when it shows.
pub fn container_engine() -> Option<&'static str> {
    if Path::new("/.dockerenv").exists() {
        return Some("docker");
    }
    if Path::new("/run/.containerenv").exists() {
        return Some("podman");
    }
    let env = std::fs::read("/proc/1/environ").unwrap_or_default();
    for var in env.split(|b| *b == 0) {
        if let Some(value) = var.strip_prefix(b"container=") {
            return Some(match value {
                b"podman" => "podman",
                b"docker" => "docker",
                b"lxc" => "lxc",
                _ => "a container engine",
            });
        }
    }
    let cgroup = std::fs::read_to_string("/proc/1/cgroup").unwrap_or_default();
    if cgroup.contains("kubepods") {
        return Some("kubernetes");
    }
    if cgroup.contains("/docker") || cgroup.contains("containerd") {
        return Some("docker");
    }
    None
}

/// True in a chroot: no mount is at `/` from this process's view (a chroot into a directory
/// that is not a mount point), or pid 1's root is not ours (when we may look at it).
/// The kernel refuses new user namespaces in a chroot (EPERM).
pub fn in_chroot(mountinfo: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    if let (Ok(ours), Ok(init)) = (std::fs::metadata("/"), std::fs::metadata("/proc/1/root/.")) {
        return (ours.dev(), ours.ino()) != (init.dev(), init.ino());
    }
    !mountinfo.lines().any(|l| l.split(' ').nth(4) == Some("/"))
}

/// Mounts over parts of `/proc` (a container engine's masked paths): the kernel then refuses
/// a fresh `/proc` in a new pid namespace, which the sandbox needs.
pub fn proc_overmounts(mountinfo: &str) -> Vec<String> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with("/proc/"))
        .map(str::to_string)
        .collect()
}

fn sysctl(name: &str) -> Option<i64> {
    std::fs::read_to_string(Path::new("/proc/sys").join(name.replace('.', "/")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// True when AppArmor is active on this kernel.
fn apparmor_enabled() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|v| v.trim() == "Y")
}

/// The AppArmor profile that lets the runtime's binaries create user namespaces, as
/// bubblewrap ships one for itself (`/etc/apparmor.d/bwrap-userns-restrict`).
fn apparmor_profile_fix() -> String {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "/usr/local/bin/smithers-sandbox".into());
    format!(
        "allow the runtime's binaries to create user namespaces with an AppArmor profile, as bubblewrap ships one: write /etc/apparmor.d/smithers-sandbox containing `abi <abi/4.0>, include <tunables/global> profile smithers-sandbox {exe} flags=(unconfined) {{ userns, }}` (and the same for smithers-sandbox-init beside it), then apparmor_parser -r /etc/apparmor.d/smithers-sandbox; or, host-wide: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
    )
}

/// The flags that let a container engine's container run the native runtime, for what
/// failed: its seccomp profile refuses new user namespaces, its AppArmor profile refuses
/// mounts, its masked `/proc` paths refuse a fresh `/proc`.
pub fn container_flags(engine: &str) -> String {
    let apparmor = if apparmor_enabled() {
        " --security-opt apparmor=unconfined"
    } else {
        " (and --security-opt apparmor=unconfined on hosts with AppArmor)"
    };
    match engine {
        "podman" => format!(
            "run the container with --security-opt seccomp=unconfined --security-opt unmask=ALL{apparmor} (or run the steps with --runtime docker against the host's engine)"
        ),
        "kubernetes" => "give the pod securityContext.seccompProfile.type=Unconfined, procMount: Unmasked and an unconfined AppArmor profile (or run the steps on the host or with --runtime docker)".into(),
        _ => format!(
            "run the container with --security-opt seccomp=unconfined --security-opt systempaths=unconfined{apparmor} (or run the steps with --runtime docker against the host's engine)"
        ),
    }
}

/// Why this host refuses user namespaces before anything is tried, with the fix; None when
/// nothing known stands in the way. (The init's probe makes the real attempt.)
pub fn userns_refusal(uid: u32, mountinfo: &str) -> Option<(String, String)> {
    if sysctl("user.max_user_namespaces") == Some(0) {
        return Some((
            "user namespaces are disabled (user.max_user_namespaces = 0)".into(),
            "sysctl -w user.max_user_namespaces=15000 (persist it in /etc/sysctl.d/)".into(),
        ));
    }
    if !Path::new("/proc/self/ns/user").exists() {
        return Some((
            "the kernel has no user namespaces".into(),
            "use a kernel built with CONFIG_USER_NS".into(),
        ));
    }
    if in_chroot(mountinfo) {
        return Some((
            "this process is in a chroot, where the kernel refuses new user namespaces".into(),
            "run the runtime outside the chroot, or enter the tree with pivot_root/switch_root or a container instead of chroot".into(),
        ));
    }
    if uid != 0 {
        if sysctl("kernel.unprivileged_userns_clone") == Some(0) {
            return Some((
                "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)"
                    .into(),
                "sysctl -w kernel.unprivileged_userns_clone=1 (persist it in /etc/sysctl.d/), or run the runtime as root".into(),
            ));
        }
        if sysctl("kernel.apparmor_restrict_unprivileged_userns") == Some(1) {
            return Some((
                "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1)".into(),
                apparmor_profile_fix(),
            ));
        }
    }
    None
}

/// The fix for a user namespace the kernel refused when it was really tried.
pub fn userns_fix(uid: u32, mountinfo: &str) -> String {
    if let Some((_, fix)) = userns_refusal(uid, mountinfo) {
        return fix;
    }
    if let Some(engine) = container_engine() {
        return format!(
            "inside {engine}, whose default seccomp profile refuses new user namespaces: {}",
            container_flags(engine)
        );
    }
    "enable user namespaces: sysctl -w user.max_user_namespaces=15000 (kernel.unprivileged_userns_clone=1, kernel.apparmor_restrict_unprivileged_userns=0 where they exist)".into()
}

/// The fix for a fresh `/proc` the kernel refused in a new pid namespace.
pub fn proc_fix(mountinfo: &str) -> String {
    let over = proc_overmounts(mountinfo);
    let engine = container_engine();
    match (engine, over.is_empty()) {
        (Some(engine), _) => format!(
            "inside {engine}, which masks parts of /proc{}: {}",
            if over.is_empty() {
                String::new()
            } else {
                format!(" ({})", over.join(", "))
            },
            container_flags(engine)
        ),
        (None, false) => format!(
            "/proc is partly over-mounted ({}); the kernel allows a new /proc only where every /proc mount is visible in full",
            over.join(", ")
        ),
        (None, true) => "make sure /proc is mounted in full (not partly over-mounted)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_masks_are_found() {
        let mi = "\
1 0 0:1 / / rw - overlay overlay rw
2 1 0:2 / /proc rw - proc proc rw
3 2 0:3 /null /proc/kcore rw - devtmpfs udev rw
4 2 0:4 / /proc/acpi ro - tmpfs tmpfs ro
";
        assert_eq!(proc_overmounts(mi), vec!["/proc/kcore", "/proc/acpi"]);
        assert!(proc_fix(mi).contains("/proc/kcore"));
    }

    #[test]
    fn docker_flags_name_seccomp_and_systempaths() {
        let flags = container_flags("docker");
        assert!(
            flags.contains("--security-opt seccomp=unconfined"),
            "{flags}"
        );
        assert!(
            flags.contains("--security-opt systempaths=unconfined"),
            "{flags}"
        );
    }
}
