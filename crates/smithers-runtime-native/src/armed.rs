//! Armed warm sandboxes: a warm sandbox set up whole, ahead of any step, for the
//! configuration its pool keeps being asked for (see [`crate::warm`]).
//!
//! A warm sandbox stops before anything of a step: the workspace overlay, `/result`, the
//! request and output directories, the pivot into the new root, Landlock and seccomp wait for
//! the step's plan, and cost the step about a millisecond here. When a pool's steps repeat
//! one configuration (a workflow's steps on one project: the same configuration claimed twice
//! in a row), the keeper does that part ahead too. It makes the directories of a sandbox
//! named for no step (`.warm-<random>` in the state and layer roots), compiles the plan
//! `execute` compiles for that configuration with those directories, and sends it with
//! [`smithers_sandbox_init::plan::InitPlan::exec_follows`]: P1 mounts the workspace, pivots,
//! confines itself, reports `ready` and waits for the command alone. No step's code has run
//! in it and nothing of a step is in it; the project is its overlay's lower layer, read live,
//! as in any sandbox.
//!
//! `create` claims one only for a configuration equal to the one it was armed for (ids
//! aside) whose project is still the same directory. Its directories are renamed to the
//! sandbox's, never over existing ones, so that on disk it is the sandbox a cold `create`
//! makes. `execute` compiles the step's plan as for a cold start and compares it, byte for
//! byte, with what the init was sent, the sandbox's directory names put in place of the warm
//! ones (the one difference renaming makes): only when they are equal is the command sent.
//! Otherwise the armed init is ended and a cold one serves the step, as for any warm sandbox
//! whose plan differs.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use smithers_runtime::SandboxConfig;

use crate::backend::{Backend, WorkspaceState};
use crate::cgroup::{CgroupHost, SandboxCgroups};
use crate::files::{remove_tree, restrict_mode};
use crate::host::{Defaults, HostCaps};
use crate::launcher::{await_report, json_line, prelude};
use crate::layer::{make_layer_subdirs, place_layer};
use crate::layout::{git_layer, git_repository, host_layout};
use crate::plan::{self, PlanInput, Prelude, WarmPlan};
use crate::prepared_root;

/// What an armed sandbox is armed for: a sandbox's configuration, ids aside, and the
/// workspace `create` decided for it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ArmKey {
    config: SandboxConfig,
    workspace: WorkspaceState,
}

impl ArmKey {
    pub(crate) fn of(config: &SandboxConfig, workspace: &WorkspaceState) -> ArmKey {
        let mut config = config.clone();
        config.run_id.clear();
        config.sandbox_id.clear();
        ArmKey {
            config,
            workspace: workspace.clone(),
        }
    }
}

/// A warm sandbox's arming: what it was set up for and with.
#[derive(Debug)]
pub(crate) struct Armed {
    key: ArmKey,
    /// Its directories, under the warm name.
    pub(crate) backend: Backend,
    /// The line its init was sent: the plan, with `exec_follows`.
    line: String,
    /// Its init's `ready` report, read by the keeper (execute's log takes it from here).
    pub(crate) ready: serde_json::Value,
    /// The project directory's identity when it was mounted (device, inode).
    project: (u64, u64),
}

/// The identity of a directory (device, inode), following links as the overlay's mount did.
fn identity(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}

/// A JSON string's inside for `path` (how it appears in a plan line).
fn json_inside(path: &Path) -> String {
    let quoted = serde_json::to_string(&path.to_string_lossy()).unwrap_or_default();
    quoted[1..quoted.len() - 1].to_string()
}

impl Armed {
    /// Whether it can serve a sandbox of `key`: armed for that configuration, on the project
    /// directory that is there now (one replaced since, say by a fresh clone at the same path,
    /// would not be the one mounted).
    pub(crate) fn serves(&self, key: &ArmKey) -> bool {
        self.key == *key && identity(&key.config.root_dir) == Some(self.project)
    }

    /// Whether it was armed for `key` (the project aside).
    pub(crate) fn armed_for(&self, key: &ArmKey) -> bool {
        self.key == *key
    }

    /// Its directories that are entries of the state or layer root, each with what it is
    /// called for the sandbox whose directories are `real` (the rest are inside them), and
    /// whether arming made it for sure (the git layer's are made only for a plan with one).
    fn top_level(&self, real: &Backend) -> Vec<(PathBuf, PathBuf, bool)> {
        let ours = &self.backend;
        let mut pairs = vec![(ours.state_dir.clone(), real.state_dir.clone(), true)];
        if let (Some(w), Some(r)) = (&ours.layer_dir, &real.layer_dir) {
            pairs.push((w.clone(), r.clone(), true));
            if ours.flat_layer {
                pairs.push((ours.upper(), real.upper(), true));
                for (w, r) in [
                    (ours.git_common_upper(), real.git_common_upper()),
                    (ours.git_common_work(), real.git_common_work()),
                ] {
                    let in_plan = self.line.contains(&json_inside(&w));
                    pairs.push((w, r, in_plan));
                }
            }
        }
        pairs
    }

    /// Renames its directories to those of the sandbox whose directories are `real`, never
    /// over an existing one; all or none (what was renamed is renamed back on a failure). One
    /// its init's mounts need that is gone (removed from under the pool) is an error: the
    /// sandbox would not be the one it was armed as.
    pub(crate) fn adopt(&self, real: &Backend) -> std::io::Result<()> {
        let mut pairs = Vec::new();
        for (from, to, required) in self.top_level(real) {
            match std::fs::symlink_metadata(&from) {
                Ok(_) => pairs.push((from, to)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {}
                Err(e) => {
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("the armed sandbox's {}: {e}", from.display()),
                    ))
                }
            }
        }
        for (done, (from, to)) in pairs.iter().enumerate() {
            if let Err(e) = rename_noreplace(from, to) {
                let mut not_back = Vec::new();
                for (from, to) in pairs[..done].iter().rev() {
                    if let Err(back) = rename_noreplace(to, from) {
                        not_back.push(format!("{} ({back})", to.display()));
                    }
                }
                let mut message = format!("rename {} to {}: {e}", from.display(), to.display());
                if !not_back.is_empty() {
                    message.push_str(&format!(
                        "; not renamed back, left under the sandbox's name: {}",
                        not_back.join(", ")
                    ));
                }
                return Err(std::io::Error::new(e.kind(), message));
            }
        }
        Ok(())
    }

    /// The line its init was sent, as it reads for the sandbox whose directories are `real`
    /// (once [`Armed::adopt`]ed): the warm names replaced by the sandbox's.
    pub(crate) fn line_for(&self, real: &Backend) -> String {
        let mut line = self.line.clone();
        let mut dirs = vec![(&self.backend.state_dir, &real.state_dir)];
        if let (Some(w), Some(r)) = (&self.backend.layer_dir, &real.layer_dir) {
            dirs.push((w, r));
        }
        for (warm, real) in dirs {
            line = line.replace(&json_inside(warm), &json_inside(real));
        }
        line
    }

    /// Removes its directories (an armed sandbox given up before any claim).
    pub(crate) fn remove_dirs(&self) {
        for (dir, _, _) in self.top_level(&self.backend) {
            if std::fs::symlink_metadata(&dir).is_ok() {
                let _ = remove_tree(&dir);
            }
        }
    }
}

fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    let from = std::ffi::CString::new(from.as_os_str().as_bytes())?;
    let to = std::ffi::CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: both are NUL-terminated paths that live across the call; AT_FDCWD dirfds.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What the names of armed sandboxes' directories start with, before their process's pid.
const WARM_PREFIX: &str = ".warm-";

/// A name for an armed sandbox's directories that no sandbox has and no other armed sandbox
/// either: [`WARM_PREFIX`], this process's pid (see [`sweep`]), 16 hex digits at random. A
/// sandbox's directories are named `<run id>+<sandbox id>` (see `NativeRuntime::dir_name`),
/// with a `+` that a warm name never has: even ids that start with `.warm-` cannot collide.
fn warm_name() -> String {
    let mut bytes = [0u8; 8];
    // SAFETY: `bytes` is valid for writes of its length.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // Unique enough without: this process, and a clock in nanoseconds.
        let ns = smithers_sandbox_init::sys::monotonic_ns();
        bytes = (ns ^ (u64::from(std::process::id()) << 40)).to_le_bytes();
    }
    format!(
        "{WARM_PREFIX}{}-{:016x}",
        std::process::id(),
        u64::from_le_bytes(bytes)
    )
}

/// The pid in an entry's name if the entry is exactly one an armed sandbox makes in the state
/// or layer root: a [`warm_name`], alone or with one of the layer's suffixes. Anything else
/// (a sandbox's `run+sandbox` directories above all) is not ours to sweep.
fn warm_entry_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(WARM_PREFIX)?;
    let (pid, rest) = rest.split_once('-')?;
    if pid.is_empty() || pid.len() > 10 || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (random, suffix) = rest.split_at_checked(16)?;
    if !random
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    if !matches!(
        suffix,
        "" | ".upper" | ".upper.git-common" | ".upper.git-common-work"
    ) {
        return None;
    }
    pid.parse::<i32>().ok().filter(|pid| *pid > 0)
}

/// Removes the directories of armed sandboxes whose process is gone (killed before it could
/// discard them; their inits ended with it), in the state and layer roots. Run by a pool's
/// keeper before it makes any. A name whose pid is alive is left, whoever that is now.
pub(crate) fn sweep(caps: &HostCaps) {
    sweep_roots(&[&caps.state_root, &caps.layer_root]);
}

fn sweep_roots(roots: &[&Path]) {
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(warm_entry_pid) else {
                continue;
            };
            // SAFETY: signal 0 only checks that the process exists.
            let gone = unsafe { libc::kill(pid, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone {
                let _ = remove_tree(&entry.path());
            }
        }
    }
}

/// A warm sandbox to arm: its init's control socket, its cgroups, and what its init was sent.
#[derive(Debug)]
pub(crate) struct ToArm<'a> {
    pub(crate) control: &'a UnixStream,
    pub(crate) cgroups: &'a SandboxCgroups,
    pub(crate) prelude: &'a Prelude,
    pub(crate) plan: &'a WarmPlan,
}

/// Arms `sandbox` for sandboxes of `key` (on the keeper's thread): its arming, for the warm
/// sandbox to keep. On an error nothing of the arming is left (its directories removed) and
/// the sandbox must be discarded: its init may have been sent part of a plan, and its cgroups
/// have the key's limits.
pub(crate) fn arm(
    caps: &HostCaps,
    defaults: Defaults,
    sandbox: &ToArm<'_>,
    key: &ArmKey,
) -> Result<Armed, String> {
    if key.workspace != WorkspaceState::Overlay {
        return Err("only an overlay workspace is armed ahead".into());
    }
    let controls = &key.config.controls;
    let project = identity(&key.config.root_dir)
        .ok_or_else(|| format!("{} is gone", key.config.root_dir.display()))?;
    let name = warm_name();
    let mut backend = Backend {
        state_dir: caps.state_root.join(&name),
        root_dir: key.config.root_dir.clone(),
        layer_tmpfs: false,
        layer_dir: None,
        flat_layer: false,
        cgroups: sandbox.cgroups.clone(),
        workspace: WorkspaceState::Overlay,
    };
    let mut armed = Armed {
        key: key.clone(),
        backend: backend.clone(),
        line: String::new(),
        ready: serde_json::Value::Null,
        project,
    };
    let made = (|| -> Result<(), String> {
        std::fs::create_dir_all(&caps.state_root).map_err(|e| e.to_string())?;
        restrict_mode(&caps.state_root).map_err(|e| e.to_string())?;
        std::fs::create_dir(&backend.state_dir).map_err(|e| e.to_string())?;
        place_layer(caps, controls, &mut backend, &name).map_err(|e| e.to_string())?;
        armed.backend = backend.clone();
        let layer = backend.layer();
        std::fs::create_dir(&layer).map_err(|e| format!("create {}: {e}", layer.display()))?;
        make_layer_subdirs(&backend).map_err(|e| e.to_string())?;
        let limits = defaults.limits(caps, controls);
        CgroupHost::set_limits(sandbox.cgroups, &limits).map_err(|e| e.to_string())?;
        let mut prelude = prelude(caps, &backend, controls.allow_network);
        prelude.warm = true;
        if prelude != *sandbox.prelude {
            return Err("the warm init's prelude is not this configuration's".into());
        }
        let seccomp = caps.seccomp.clone()?;
        // Create makes the project's `.smithers` before any execute (and masks it): made here
        // too, the plan's facts are those execute will find, even for a project's first step.
        smithers_runtime::ensure_state_dir(&backend.root_dir).map_err(|e| e.to_string())?;
        let (layout, workspace) = host_layout(&backend, None);
        // A project below its repository's top gets a copy of the host's index at execute:
        // made now, it could be older than the step.
        if matches!(git_repository(&backend, &layout), Some((_, Some(_)))) {
            return Err("a project below its repository's top is not armed ahead".into());
        }
        let git_common = git_layer(&backend, &layout).map_err(|e| e.to_string())?;
        let mut plan = plan::compile(&PlanInput {
            home: None,
            stdin: false,
            git_common,
            layout: &layout,
            workspace,
            host: &caps.facts,
            allow_network: controls.allow_network,
            tmp_bytes: controls.disk_limit_bytes.unwrap_or(plan::DEFAULT_TMP_BYTES),
            volumes: &controls.volumes,
            argv: &[],
            cwd: None,
            step_env: &controls.env,
            host_env: &caps.host_env,
            egress_etc: None,
            seccomp,
            prepared_root: caps.prepared_root,
        });
        let (files, mounts) = plan::split_prepared(std::mem::take(&mut plan.mounts));
        let source = prepared_root::existing(&caps.state_root, &files, &mounts)
            .ok_or("the prepared root changed since the warm sandbox was made")?;
        plan.root = plan::RootFs::Prepared { source };
        let (prefix, rest) = plan::split_warm(mounts);
        if plan.new_root != sandbox.plan.new_root
            || plan.root != sandbox.plan.root
            || prefix != sandbox.plan.mounts
        {
            return Err("the warm sandbox did not build this configuration's root".into());
        }
        plan.mounts = rest;
        plan.exec = Default::default();
        plan.exec_follows = true;
        let line = json_line(&plan).map_err(|e| e.to_string())?;
        use std::io::Write;
        (&*sandbox.control)
            .write_all(&line)
            .map_err(|e| format!("sending the plan: {e}"))?;
        armed.line = String::from_utf8(line).map_err(|e| e.to_string())?;
        armed.ready = await_report(sandbox.control, "ready")?;
        Ok(())
    })();
    match made {
        Ok(()) => Ok(armed),
        Err(e) => {
            armed.remove_dirs();
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_removes_only_what_a_gone_process_armed() {
        let root = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let ours = std::process::id();
        for name in [
            format!("{WARM_PREFIX}{gone}-00000000000000aa"),
            format!("{WARM_PREFIX}{gone}-00000000000000aa.upper"),
            format!("{WARM_PREFIX}{ours}-00000000000000bb"),
            "run+sandbox".to_string(),
            format!("{WARM_PREFIX}x-1"),
            // A sandbox whose run id looks like a warm name, and its layer's upper directory.
            format!("{WARM_PREFIX}{gone}-00000000000000aa+sb"),
            format!("{WARM_PREFIX}{gone}-00000000000000aa+sb.upper"),
            format!("{WARM_PREFIX}{gone}-00000000000000aa.upper.other"),
        ] {
            std::fs::create_dir_all(root.path().join(&name).join("inside")).unwrap();
        }
        sweep_roots(&[root.path()]);
        let mut left: Vec<String> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut expected = [
            format!("{WARM_PREFIX}{gone}-00000000000000aa+sb"),
            format!("{WARM_PREFIX}{gone}-00000000000000aa+sb.upper"),
            format!("{WARM_PREFIX}{gone}-00000000000000aa.upper.other"),
            format!("{WARM_PREFIX}{ours}-00000000000000bb"),
            format!("{WARM_PREFIX}x-1"),
            "run+sandbox".to_string(),
        ];
        expected.sort();
        assert_eq!(left, expected);
    }

    /// An armed sandbox's directories under `root` (state and flat layer), and those of the
    /// sandbox `r+s` it would become.
    fn warm_and_real(root: &Path) -> (Backend, Backend) {
        let warm = Backend {
            state_dir: root.join("state/.warm-1-00000000000000ab"),
            root_dir: "/p".into(),
            layer_tmpfs: false,
            layer_dir: Some(root.join("layers/.warm-1-00000000000000ab")),
            flat_layer: true,
            cgroups: Default::default(),
            workspace: WorkspaceState::Overlay,
        };
        let real = Backend {
            state_dir: root.join("state/r+s"),
            layer_dir: Some(root.join("layers/r+s")),
            ..warm.clone()
        };
        (warm, real)
    }

    /// An armed sandbox with `backend`'s directories whose init was sent `line`.
    fn armed_with(backend: Backend, line: String) -> Armed {
        Armed {
            key: ArmKey::of(
                &serde_json::from_value(serde_json::json!({
                    "runId": "r", "sandboxId": "s", "runtime": "bubblewrap", "rootDir": "/p"
                }))
                .unwrap(),
                &WorkspaceState::Overlay,
            ),
            line,
            backend,
            ready: serde_json::Value::Null,
            project: (0, 0),
        }
    }

    #[test]
    fn a_plan_line_reads_with_the_sandboxs_directories() {
        let (warm, real) = warm_and_real(Path::new("/"));
        let line = serde_json::json!({
            "upper": warm.upper(), "work": warm.work(), "out": warm.out(),
            "request": warm.request_dir(), "lower": "/p",
        })
        .to_string();
        let armed = armed_with(warm, line);
        let expected = serde_json::json!({
            "upper": real.upper(), "work": real.work(), "out": real.out(),
            "request": real.request_dir(), "lower": "/p",
        })
        .to_string();
        assert_eq!(armed.line_for(&real), expected);
    }

    #[test]
    fn an_armed_sandbox_missing_a_directory_is_not_adopted() {
        let root = tempfile::tempdir().unwrap();
        let (warm, real) = warm_and_real(root.path());
        // Its state and layer directories, but not the overlay's upper one.
        std::fs::create_dir_all(&warm.state_dir).unwrap();
        std::fs::create_dir_all(warm.layer_dir.as_ref().unwrap()).unwrap();
        let armed = armed_with(warm.clone(), String::new());
        let err = armed.adopt(&real).unwrap_err();
        assert!(err.to_string().contains(".upper"), "{err}");
        assert!(warm.state_dir.is_dir() && !real.state_dir.exists());
        // With it, all of them are renamed (the git layer's, not in its plan, need not be).
        std::fs::create_dir(warm.upper()).unwrap();
        armed.adopt(&real).unwrap();
        assert!(real.state_dir.is_dir() && real.upper().is_dir() && !warm.state_dir.exists());
    }
}
