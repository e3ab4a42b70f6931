//! The `bubblewrap` runtime without bubblewrap: a step runs in Linux namespaces on this host,
//! built and supervised by our own small init (no external binary).
//!
//! * [`plan`] compiles the policy purely (mount list, environment, Landlock rules); [`seccomp`]
//!   compiles the syscall filter. Both are unit-tested without root.
//! * The in-sandbox init, which executes the plan, is its own crate, [`smithers_sandbox_init`]
//!   (a separate, single-threaded executable: `smithers-sandbox-init`, built by this crate as a
//!   thin binary, or `smithers-sandbox __sandbox-init`); it owns the plan's types, and its
//!   syscall wrappers (`smithers_sandbox_init::sys`: mounts, statvfs) serve the runtime too.
//! * [`cgroup`] is cgroups v1 and v2 behind one interface.
//! * [`NativeRuntime`] implements [`smithers_runtime::Runtime`], one module per verb: `probe`,
//!   `create`, `ship`, `exec`, `collect`, `cleanup` (dispatched from `verbs`). The init is
//!   started through `launcher` (a fork of the zygote, or the binary), which `exec` and the
//!   warm sandboxes of `warm` and `armed` share.
//!
//! # Identity inside
//!
//! The sandbox's root (uid 0 inside) maps to the **runtime's own uid** on the host, one id
//! only. This is deliberate: the step must be able to modify the project through the overlay,
//! and the project is owned by the user running the runtime; mapping to any other host uid
//! would make the project read-only inside (unmapped owner). The consequence, when the runtime
//! runs as host root, is that DAC checks on bound host files use host root's identity. What
//! keeps that safe: nothing writable is bound but the workspace overlay, `/result`, the out
//! directory and `/tmp`; every other mount is read-only (mount flags, locked by dropping all
//! capabilities, and `mount`/`mount_setattr` are denied by seccomp); Landlock denies writes
//! outside the writable mounts again; `/etc` is filtered, no home directory, no `/sys`; all
//! capabilities are dropped from every set with no_new_privs. Running the runtime as an
//! unprivileged user makes the sandbox that user's, with nothing of root.
//!
//! # Host state of a sandbox
//!
//! `<state_root>/<runId>+<sandboxId>/` (outside the project; a tmpfs by default, see
//! [`default_state_root`]) holds the new root's mount point, `/result`'s artifacts, the step's
//! result file, the output log and the outcome; with a disk limit also the workspace layer,
//! `layer/`: a size-capped tmpfs with the overlay's `upper/` and `work/`, or in copy mode
//! ([`WorkspaceMode`]) the project's copy `copy/`. Without a disk limit the layer is on disk
//! (see `NativeOptions::layer_root`): `<layer_root>/<runId>+<sandboxId>/` is the overlay's work
//! directory (or holds `copy/`), with the upper directory beside it as its name plus
//! `.upper`. The handle's
//! `sandbox_root` is the spec's `<rootDir>/.smithers/sandboxes/<runId>/<sandboxId>/` with
//! `request/` and the bundle in `result/`. When collect had to leave changes of the step out
//! of the bundle for a size limit, it marks the layer kept (`keep-layer` in the state
//! directory) and cleanup moves the written layer (the upper directory, or the copy) to that
//! directory's `kept-layer/` instead of removing it; accepting or rejecting the review
//! removes it (see `smithers_runtime::kept_layer`).
//!
//! Cleanup from a stored handle (see `owned.rs`) trusts none of its paths: the state and
//! layer directories are recomputed from the ids, the cgroups killed and removed are those
//! recorded in the state directory's `cleanup.json`, and a sandbox whose recorded owner is
//! another live process is left alone.

// The runtime and its verbs.
/// `cleanup`: killing and removing everything a sandbox had.
mod cleanup;
/// `collect`: the bundle of what the step changed.
mod collect;
/// `create`: refusals, the workspace decision, the sandbox's directories and cgroups.
mod create;
/// The [`smithers_runtime::Engine`]: a sandbox started once and sent many commands.
mod engine;
/// `execute`: the plan, the init, the step's output, limits and outcome.
mod exec;
/// `probe`, and the checks made once per runtime (overlayfs, a container's confinement).
mod probe;
/// [`NativeRuntime`]: options, host facts, zygote, warm pool; no verb.
mod runtime;
/// `ship`: the request, and in copy mode the project's copy.
mod ship;
/// The [`smithers_runtime::Runtime`] trait: each verb hands over to its module.
mod verbs;

// Starting the init, and sandboxes made before a step asks.
/// Warm sandboxes set up whole for a repeated configuration.
mod armed;
/// Starting an init (zygote fork or binary), sending its prelude and reading its reports.
mod launcher;
/// Where a sandbox's parts are on the host, as the plan names them (and its git layer).
mod layout;
/// Sandboxes started through the engine: how each is held and ended.
mod live;
/// The root prepared once per host configuration.
mod prepared_root;
/// Reading the init's status lines (with the descriptors they carry).
mod status;
/// The caller's stdin, fed to the command through a FIFO.
mod stdin_feed;
/// Warm sandboxes, made ahead and claimed at `create`.
mod warm;
/// The zygote: a pre-started init that forks each sandbox's.
mod zygote;

// What a sandbox is, and what the host offers.
/// The backend state a handle carries, and the config `create` kept.
mod backend;
/// The copy of copy mode.
mod copy;
/// The egress policy's proxy, resolver and listeners.
mod egress;
/// Persistent homes: where they are kept, and one made ready to bind.
pub mod home;
/// What this host offers (found once per runtime), and the default limits.
mod host;
/// How the init is started and where it is found.
mod init_command;
/// A sandbox's workspace layer: where, and what it holds.
mod layer;
/// A session's stack of frozen layers (checkpoints, restores, forks) and their store.
mod layers;
/// What a sandbox's directories and cgroups are called.
mod names;
/// [`NativeOptions`] and [`WorkspaceMode`].
mod options;
/// Cleanup from a stored handle: what it may touch.
mod owned;
/// Owners of the project's files (overlay or copy).
mod ownership;
/// The enforcement report of a step, and the host probe's.
mod report;
/// One upper layer made of a stack of them, for collect.
mod squash;

// Small shared pieces.
/// Milliseconds of the wall clock, as logs stamp them.
mod clock;
/// Private writes, the state root's mode, removing trees.
mod files;
/// Blocking work off the async workers, and side by side.
mod threads;

// Public modules.
/// cgroups v1 and v2 behind one interface.
pub mod cgroup;
/// Diagnoses of the host, with fixes.
pub mod host_diag;
/// The policy compiled purely into the init's plan.
pub mod plan;
/// The seccomp filter, compiled to BPF.
pub mod seccomp;

pub use host::default_state_root;
pub use init_command::{InitCommand, INIT_BIN, INIT_SUBCOMMAND};
pub use options::{
    default_memory_limit, NativeOptions, WorkspaceMode, DEFAULT_DISK_RESERVE_BYTES, WORKSPACE_ENV,
};
/// Entries whose owner the runtime read for the overlay's ownership checks in this process
/// (see the `ownership` module): for tests that hold a run to costing what it changes.
#[doc(hidden)]
pub use ownership::entries_read as ownership_entries_read;
pub use plan::DEFAULT_PATH;
pub use report::protection_names;
pub use runtime::{NativeRuntime, PRESTART_PATIENCE};
pub use warm::WarmStatus;

/// Environment variable naming the init executable.
pub use smithers_sandbox_init::INIT_ENV;
