//! The init's input: the [`Prelude`] (what P0 needs) and the [`InitPlan`] (what P1 needs), as
//! the runtime sends them, one line of JSON each, over the init's control socket. Only the
//! types live here; the runtime (`smithers-runtime-native`'s `plan`) compiles them from a
//! sandbox's configuration, purely, and the init only executes them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Environment variable naming the init executable (the runtime looks there first).
pub const INIT_ENV: &str = "SMITHERS_SANDBOX_INIT";

/// Bumped when the init and the runtime would disagree on the plan's meaning (11: a prelude
/// may ask for a session, which an older init would take for a step with no command).
pub const PLAN_VERSION: u32 = 12;

/// Size of the tmpfs the new root is built on ([`RootFs::Tmpfs`]): it only holds directories,
/// mount points, symlinks and the `/etc` copies, and is remounted read-only before the
/// command starts.
pub const ROOT_TMPFS_BYTES: u64 = 1 << 20;

/// Mount attributes applied with `mount_setattr` (or a remount where that is missing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountAttrs {
    pub readonly: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

impl MountAttrs {
    /// Read-only, no setuid, no devices: the system directories.
    pub const RO: MountAttrs = MountAttrs {
        readonly: true,
        nosuid: true,
        nodev: true,
        noexec: false,
    };
    /// Writable, no setuid, no devices: workspace, /tmp, /result.
    pub const RW: MountAttrs = MountAttrs {
        readonly: false,
        nosuid: true,
        nodev: true,
        noexec: false,
    };
    /// A device node: no attribute change (nosuid/noexec mean nothing on a character device,
    /// and skipping the call saves a mount operation per node).
    pub const DEVICE: MountAttrs = MountAttrs {
        readonly: false,
        nosuid: false,
        nodev: false,
        noexec: false,
    };
}

/// What to create at a bind target before binding onto it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TargetKind {
    Dir,
    File,
}

/// One step of building the sandbox's root. Every `path` is a path **inside** the sandbox
/// (absolute); the init prefixes it with the new root's host path before `pivot_root`.
/// `source`, `lower`, `upper` and `work` are host paths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "op")]
pub enum MountOp {
    Dir {
        path: PathBuf,
        mode: u32,
    },
    Symlink {
        path: PathBuf,
        target: PathBuf,
    },
    Tmpfs {
        path: PathBuf,
        size_bytes: u64,
        mode: u32,
        attrs: MountAttrs,
    },
    Bind {
        source: PathBuf,
        path: PathBuf,
        kind: TargetKind,
        attrs: MountAttrs,
        /// Skip silently when the source vanished since the host was inspected.
        optional: bool,
    },
    /// Copies a small host file into the new root (cheaper than a bind mount; the root is made
    /// read-only afterwards). Skipped when the source vanished or exceeds `max_bytes`.
    CopyFile {
        source: PathBuf,
        path: PathBuf,
        max_bytes: u64,
    },
    /// Binds a path of the new root onto itself to change its attributes (`.git`, `/proc/sys`).
    Rebind {
        path: PathBuf,
        attrs: MountAttrs,
        optional: bool,
    },
    Overlay {
        lower: PathBuf,
        /// Frozen layers stacked over `lower`, top first (a session's checkpoints): each is
        /// a former upper layer the runtime keeps read-only. Empty for a plain step.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        layers: Vec<PathBuf>,
        upper: PathBuf,
        work: PathBuf,
        path: PathBuf,
        attrs: MountAttrs,
        /// Names at the top of the lower layer that the merged view must not show (the
        /// project's `.smithers/`): before mounting, the init puts an overlay whiteout (a 0/0
        /// character device, which needs no privilege since Linux 5.8) of each name in the
        /// upper layer, so the name is absent, not read-only, and the step may make its own.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        hide: Vec<String>,
    },
    Proc {
        path: PathBuf,
    },
    Devpts {
        path: PathBuf,
    },
    /// Applies attributes to an existing mount without recursion (the root tmpfs, `/dev`).
    Setattr {
        path: PathBuf,
        attrs: MountAttrs,
    },
}

impl MountOp {
    /// What the init creates in the new root before this mount (its mount point), with the
    /// mode of a directory; `None` for an op that creates nothing or only mounts on a path
    /// that exists inside another mount (`Rebind`, `Setattr`), and for the file
    /// operations (`Dir`, `Symlink`, `CopyFile`), which are their own content.
    pub fn mount_point(&self) -> Option<(&Path, TargetKind, u32)> {
        match self {
            MountOp::Bind { path, kind, .. } => Some((path, *kind, 0o755)),
            MountOp::Tmpfs { path, .. }
            | MountOp::Overlay { path, .. }
            | MountOp::Devpts { path } => Some((path, TargetKind::Dir, 0o755)),
            MountOp::Proc { path } => Some((path, TargetKind::Dir, 0o555)),
            MountOp::Dir { .. }
            | MountOp::Symlink { .. }
            | MountOp::CopyFile { .. }
            | MountOp::Rebind { .. }
            | MountOp::Setattr { .. } => None,
        }
    }

    /// Whether the op only writes files into the new root (no mount): what a prepared root
    /// holds ([`RootFs::Prepared`]).
    pub fn is_file_op(&self) -> bool {
        matches!(
            self,
            MountOp::Dir { .. } | MountOp::Symlink { .. } | MountOp::CopyFile { .. }
        )
    }
}

/// What the sandbox's root is, before the mounts of the plan go on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum RootFs {
    /// A fresh tmpfs on which the init carries out every op of the plan.
    Tmpfs,
    /// A host directory the runtime prepared ahead with the plan's file operations and every
    /// mount point (the runtime's `plan::split_prepared` and `prepared_root`), bound at the new
    /// root: the init only mounts. Shared by sandboxes, never written by one: it is bound
    /// read-only like the tmpfs root it stands for, by the plan's last op.
    Prepared { source: PathBuf },
}

/// The Landlock ruleset: read everywhere visible, write only below `write_dirs` and to
/// `write_files`. It handles no network access: without `allowNetwork` the boundary is the
/// sandbox's own network namespace (only `lo`), so a step may use TCP and UDP on its own
/// loopback; Landlock's TCP rules would deny exactly that, and exist only from Linux 6.7.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LandlockPlan {
    pub read_dirs: Vec<PathBuf>,
    pub write_dirs: Vec<PathBuf>,
    pub write_files: Vec<PathBuf>,
    /// Scope signals and abstract unix sockets to the sandbox (Landlock ABI 6).
    pub scope: bool,
}

/// One BPF instruction, as the kernel's `struct sock_filter`.
pub type BpfInstruction = (u16, u8, u8, u32);

/// What the command is and how it starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecSpec {
    pub argv: Vec<String>,
    /// `KEY=VALUE` strings, already filtered.
    pub env: Vec<String>,
    pub cwd: PathBuf,
    /// The `PATH` used to find `argv[0]` (the init does the search itself, because
    /// `execvpe` would search the init's own environment).
    pub search_path: String,
    /// The command's stdin: a path inside the sandbox opened read-only (the runtime's FIFO,
    /// fed by the caller's stream), else `/dev/null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<PathBuf>,
    /// A session's command only: a pseudo-terminal of the sandbox's own (its devpts) as the
    /// command's stdin, stdout, stderr and controlling terminal, this size at the start. The
    /// master is sent back with a `terminal` report before the command starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<TerminalSize>,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TerminalSize {
    pub rows: u16,
    pub cols: u16,
}

/// How P1 enters the sandbox's cgroups without the cost of a cgroup migration.
///
/// Writing a pid to `cgroup.procs` takes the kernel's global threadgroup rwsem for writing,
/// which waits for an RCU grace period: 5–15 ms on this project's machines, the largest single
/// cost of a cold start. Two paths avoid it: a single-threaded process moving *itself* through
/// a v1 `tasks` file (pid `0`) skips that lock, and `clone3(CLONE_INTO_CGROUP)` places a new
/// v2 child directly (read side only). The `cgroup.procs` write is the fallback for kernels
/// without `clone3` (before 5.7).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CgroupJoin {
    /// v1 `tasks` files P1 writes `0` into, first thing after the fork.
    pub v1_tasks: Vec<PathBuf>,
    /// The v2 directory P1 is cloned into (`clone3(CLONE_INTO_CGROUP)`), else moved into by P0.
    pub v2_dir: Option<PathBuf>,
}

/// What the init's P0 needs: the user namespace's maps, the cgroups to open and whether to
/// make a network namespace. It is the first line the init reads; the plan, which P0 passes
/// on to P1 unparsed, follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Prelude {
    pub version: u32,
    /// Host ids the sandbox's user and group map to (one-line maps).
    pub host_uid: u32,
    pub host_gid: u32,
    /// The ids the step sees.
    pub sandbox_uid: u32,
    pub sandbox_gid: u32,
    /// The sandbox's cgroups, which P1 (and so every sandbox process) is born into.
    pub cgroups: CgroupJoin,
    /// A new network namespace (only `lo`); false shares the host's network.
    pub unshare_net: bool,
    /// Egress listeners P0 binds inside the new network namespace and hands to the runtime
    /// (see [`EgressListen`]); `None`: the namespace has no way out at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressListen>,
    /// A warm sandbox (see [`WarmPlan`]): the second line is a [`WarmPlan`], and the step's
    /// [`InitPlan`] follows on a third line, whenever the runtime has a step for it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm: bool,
    /// A sandbox that takes many commands: P0 makes an exec channel (a `SOCK_SEQPACKET`
    /// pair), sends the runtime its end with an `execChannel` status line before P1 may run
    /// anything, and P1, once `ready`, serves [`SessionRequest`]s there instead of running
    /// the plan's `exec` (which must be empty), until told to stop or the channel ends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub session: bool,
}

/// The sockets of the egress engine, bound by P0 inside the sandbox's network namespace
/// (as root of its user namespace, so ports under 1024 too) and sent to the runtime over the
/// control socket with an `egress` status line; P0 keeps none, and no sandbox process ever
/// has them. The runtime serves them from the host: nothing of ours runs in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressListen {
    /// The resolver, UDP and TCP, at 127.0.0.1:53.
    pub dns: bool,
    /// The HTTP proxy (CONNECT and absolute-form), at 127.0.0.1:this.
    pub http_port: u16,
    /// The SOCKS5 proxy, at 127.0.0.1:this.
    pub socks_port: u16,
    /// A capture listener at 0.0.0.0:port for each allowed port.
    pub capture_ports: Vec<u16>,
}

impl EgressListen {
    /// The names of the listeners, in the order their descriptors are sent.
    pub fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.dns {
            out.push("dnsUdp".to_string());
            out.push("dnsTcp".to_string());
        }
        out.push("http".to_string());
        out.push("socks".to_string());
        out.extend(self.capture_ports.iter().map(|p| format!("capture:{p}")));
        out
    }
}

impl Prelude {
    pub fn new(host_uid: u32, host_gid: u32, cgroups: CgroupJoin, allow_network: bool) -> Prelude {
        Prelude {
            version: PLAN_VERSION,
            host_uid,
            host_gid,
            // The host uid appears as root inside: the step owns what the host user owns (the
            // project), and nothing more, because caps are dropped and the view is read-only
            // outside the writable mounts. See the crate docs for the reasoning.
            sandbox_uid: 0,
            sandbox_gid: 0,
            cgroups,
            unshare_net: !allow_network,
            egress: None,
            warm: false,
            session: false,
        }
    }
}

/// Everything else the init needs, as one serialisable value (the second line it reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitPlan {
    pub version: u32,
    pub hostname: String,
    /// Empty host directory the new root is mounted on.
    pub new_root: PathBuf,
    /// What is mounted there.
    pub root: RootFs,
    pub mounts: Vec<MountOp>,
    pub landlock: LandlockPlan,
    /// The seccomp program, installed after everything else (empty: none).
    pub seccomp: Vec<BpfInstruction>,
    /// Empty when [`InitPlan::exec_follows`].
    pub exec: ExecSpec,
    /// A warm sandbox armed when a step claims it (at `create`, before the command is
    /// known): P1 sets the whole sandbox up (mounts, pivot, Landlock, seccomp), reports
    /// `ready`, and only then reads the command, an [`ExecSpec`] on a line of its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exec_follows: bool,
}

/// The part of a sandbox a warm pool prepares before any step is known: what P1 builds of
/// the root ahead (the root itself and the mounts that depend on no step: system
/// directories, `/etc`, `/proc`, `/dev`, `/tmp`, `$HOME`). P1 then reports `warm` and waits;
/// the step's [`InitPlan`], sent when a step claims the sandbox, must name the same
/// `new_root` and `root`, and its `mounts` are only the rest (the workspace, `/result`, the
/// request and out directories, volumes, the read-only root). From there on a warm sandbox
/// is exactly the cold one the whole plan would have made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmPlan {
    pub version: u32,
    pub new_root: PathBuf,
    pub root: RootFs,
    pub mounts: Vec<MountOp>,
}

/// What the host probe (`--probe <scratch>`) reads on its stdin, one JSON value: the seccomp
/// program to try installing, compiled by the runtime (the init has no compiler of its own);
/// `None` when the runtime could not compile one, which the probe reports as not tried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeInput {
    pub version: u32,
    pub seccomp: Option<Vec<BpfInstruction>>,
}

/// The largest message on a session's exec channel, either way. A request is one datagram
/// (its descriptors ride with it), so its argv and environment must fit: the runtime refuses a
/// larger command before sending it, and the init refuses what arrives truncated. Under the
/// default socket buffer (`net.core.wmem_default`, 208 KiB), so a datagram this size is
/// always accepted.
pub const MAX_SESSION_MESSAGE: usize = 128 * 1024;

/// At most this many commands of a session run at once; more is refused (the sandbox's pids
/// limit bounds processes; this bounds the init's own table and descriptors).
pub const MAX_SESSION_EXECS: usize = 1024;

/// A request on a session's exec channel (runtime → P1), one JSON datagram.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", deny_unknown_fields)]
pub enum SessionRequest {
    /// Start `exec` with the three descriptors that come with the datagram as its stdin,
    /// stdout and stderr (`exec.stdin` must be `None`), or, with `exec.terminal`, none: then
    /// on a terminal of its own. `id` is the runtime's, unique among
    /// the session's running commands.
    Exec { id: u64, exec: ExecSpec },
    /// Send `signal` (1..=64) to the command's process group (each command starts in a
    /// session of its own, so its group is its pid).
    Signal { id: u64, signal: i32 },
    /// Kill every process of the sandbox, report each running command's end and
    /// `stopped`, and end P1 (and with it the sandbox).
    Stop,
    /// Hold every process of the sandbox still (`SIGSTOP` to all but P1), and report
    /// `paused` once each of their threads is stopped (so what they wrote stays as it is while
    /// the runtime reads the workspace), or refuse (and continue them) when some did not stop
    /// in time. Commands asked for while paused start at the resume. `id` names the answer.
    Pause { id: u64 },
    /// Continue every process (`SIGCONT`), start the commands held back, report `resumed`.
    Resume { id: u64 },
    /// Hand the session over for a layer flip: refused while a command runs or waits;
    /// else every process is held still (as by `pause`), `handedOver` reported, and the
    /// spawner that serves the channel ends. P1 then reads the channel itself, for the
    /// `respawn` (or a stop).
    Handover { id: u64 },
    /// To P1, after a handover: start a new spawner, confined over the workspace as it is
    /// mounted now (its Landlock rules are bound to the mount they were made on), which
    /// continues every process and reports `respawned`.
    Respawn { id: u64 },
}

/// A report on a session's exec channel (P1 → runtime), one JSON datagram.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "camelCase", deny_unknown_fields)]
pub enum SessionReport {
    /// The master of the command `id`'s terminal (its `exec.terminal`) comes with this
    /// report, before the command's `started` or `exit`.
    Terminal { id: u64 },
    /// The command `id` runs (its exec succeeded).
    #[serde(rename_all = "camelCase")]
    Started {
        id: u64,
        pid: i32,
        monotonic_ns: u64,
    },
    /// The command `id` ended: its main process exited with `code` or was killed by
    /// `signal`, and what was left of its process group was killed. A command that could not
    /// start ends so too, with a shell's code (126, 127) and the reason on its stderr.
    Exit {
        id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
    },
    /// A request that was not carried out, and why (`id` when the request named one).
    Refused {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
        message: String,
    },
    /// Every process of the sandbox is gone; P1 ends next.
    Stopped,
    /// The `pause` `id` holds: every process but P1 is stopped.
    Paused { id: u64 },
    /// The `resume` `id` is done.
    Resumed { id: u64 },
    /// The `handover` `id` is done: every process is held still, the spawner is ending.
    HandedOver { id: u64 },
    /// The `respawn` `id` is done: a new spawner serves the channel, every process runs.
    Respawned { id: u64 },
}

/// What `smithers-sandbox-init --flip` reads on its stdin: swap the overlay at `target` in the
/// running sandbox whose init is `ns_pid` for a new one (see [`crate::flip`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlipRequest {
    /// A host pid in the sandbox's user and mount namespaces (its P0).
    pub ns_pid: i32,
    /// The overlay's mount point inside the sandbox (`/workspace`).
    pub target: PathBuf,
    /// The new overlay, as a plan mounts one (its `path` unused: it goes to `target`).
    pub mount: FlipOverlay,
    /// The overlay to mount again if the new one cannot be (its upper and lowers as they
    /// are now, a work directory of its own: a volatile one cannot be used twice).
    pub put_back: FlipOverlay,
    /// An empty host directory the new overlay is first mounted on, in a mount namespace of
    /// the helper's own.
    pub scratch: PathBuf,
}

/// One overlay of a [`FlipRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlipOverlay {
    pub lower: PathBuf,
    /// Frozen layers over `lower`, top first.
    pub layers: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub attrs: MountAttrs,
    pub hide: Vec<String>,
}

/// How `--flip` ended: its exit codes.
pub mod flip_exit {
    /// The new overlay is at the target.
    pub const DONE: i32 = 0;
    /// A process of the sandbox holds the old overlay (a working directory, an open or
    /// mapped file in it): nothing changed.
    pub const BUSY: i32 = 3;
    /// The new overlay could not be mounted; the old one is back (its upper at the path the
    /// request named).
    pub const PUT_BACK: i32 = 4;
    /// Neither could be mounted: the sandbox has no workspace any more.
    pub const LOST: i32 = 5;
    /// The runtime did not say go: nothing was done.
    pub const CALLED_OFF: i32 = 6;
}
