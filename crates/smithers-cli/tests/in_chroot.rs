//! Inside a chroot the kernel refuses new user namespaces (EPERM). `doctor` and `run` must say
//! so and name the fix (leave the chroot, or enter the tree with pivot_root/switch_root or a
//! container), not blame a sysctl (issue 14).
//!
//! The chroot is a temporary directory with the host's system directories, `/proc` and the
//! built binaries bound into it. Needs root (chroot, bind mounts); elsewhere it prints SKIP.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use smithers_test_support::skip_or_fail;
use support::native::bin_path;

/// A chroot tree; unmounts and removes itself, and keeps the directory (never deleting through
/// a mount that is still there) when an unmount failed.
struct Chroot {
    root: Option<tempfile::TempDir>,
    mounts: Vec<PathBuf>,
}

fn mount(args: &[&str], target: &Path) {
    let ok = Command::new("mount")
        .args(args)
        .arg(target)
        .status()
        .unwrap();
    assert!(ok.success(), "mount {args:?} {}", target.display());
}

impl Chroot {
    fn new() -> Chroot {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().to_path_buf();
        let mut tree = Chroot {
            root: Some(root),
            mounts: Vec::new(),
        };
        let bin_dir = Path::new(bin_path()).parent().unwrap().to_path_buf();
        let mut binds: Vec<(PathBuf, PathBuf)> =
            ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"]
                .iter()
                // Merged-/usr hosts have /bin etc. as links into /usr: the link is copied.
                .filter(|d| Path::new(d).is_dir() && !Path::new(d).is_symlink())
                .map(|d| (PathBuf::from(d), PathBuf::from(d)))
                .collect();
        for link in ["/bin", "/sbin", "/lib", "/lib64"] {
            if let Ok(target) = std::fs::read_link(link) {
                std::os::unix::fs::symlink(target, base.join(&link[1..])).unwrap();
            }
        }
        binds.push((bin_dir, PathBuf::from("/opt/smithers")));
        for (from, to) in binds {
            let target = base.join(to.strip_prefix("/").unwrap());
            std::fs::create_dir_all(&target).unwrap();
            mount(&["--bind", from.to_str().unwrap()], &target);
            tree.mounts.push(target.clone());
            mount(&["-o", "remount,bind,ro"], &target);
        }
        for dev in ["null", "zero", "urandom"] {
            let target = base.join("dev").join(dev);
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::write(&target, "").unwrap();
            mount(&["--bind", &format!("/dev/{dev}")], &target);
            tree.mounts.push(target);
        }
        let proc_dir = base.join("proc");
        std::fs::create_dir_all(&proc_dir).unwrap();
        mount(&["-t", "proc", "proc"], &proc_dir);
        tree.mounts.push(proc_dir);
        std::fs::create_dir_all(base.join("tmp/p")).unwrap();
        std::fs::write(base.join("tmp/p/a.txt"), "one\n").unwrap();
        tree
    }

    fn run(&self, script: &str) -> std::process::Output {
        let out = Command::new("chroot")
            .arg(self.root.as_ref().unwrap().path())
            .args(["/bin/sh", "-c", script])
            .env("NO_COLOR", "1")
            .env("HOME", "/tmp")
            .env("TMPDIR", "/tmp")
            .output()
            .unwrap();
        println!(
            "$ chroot ... {script}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

impl Drop for Chroot {
    fn drop(&mut self) {
        let mut left = false;
        for m in self.mounts.iter().rev() {
            let ok = Command::new("umount")
                .arg(m)
                .status()
                .is_ok_and(|s| s.success());
            left |= !ok;
        }
        if left {
            // Keep the directory: removing it would reach through a mount into the host.
            let kept = self.root.take().unwrap().keep();
            eprintln!(
                "left {} in place: a mount in it could not be removed",
                kept.display()
            );
        }
    }
}

#[test]
fn in_a_chroot_doctor_and_run_name_the_chroot_not_a_sysctl() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip_or_fail("chroot and bind mounts need root");
        return;
    }
    let tree = Chroot::new();
    let doctor = tree.run("/opt/smithers/smithers-sandbox doctor; echo doctor=$?");
    let text = String::from_utf8_lossy(&doctor.stdout).to_string();
    assert!(text.contains("doctor=1"), "doctor says unusable: {text}");
    assert!(text.contains("chroot"), "doctor names the chroot: {text}");
    let run = tree.run("cd /tmp/p && /opt/smithers/smithers-sandbox run -- true; echo run=$?");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!stdout.contains("run=0"), "refused: {stdout}");
    assert!(
        stderr.contains("TASK_RUNTIME_UNAVAILABLE") && stderr.contains("chroot"),
        "refused at create naming the chroot: {stderr}"
    );
    assert!(stderr.contains("pivot_root"), "with the fix: {stderr}");
}
