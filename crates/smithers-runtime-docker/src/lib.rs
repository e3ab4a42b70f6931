//! The `docker` runtime: each sandbox is a container on a local Docker engine, reached over
//! its unix socket with `bollard` (the Engine API, never the docker CLI).
//!
//! # Model
//!
//! * `/workspace` is an **overlay** of the project: lower = the live host tree (`rootDir`),
//!   upper/work in a per-sandbox directory **outside** the project
//!   (`<state_root>/<name>/layer/{upper,work}`). The overlay is a Docker volume of the `local`
//!   driver with overlay options, so the engine mounts it when the container starts and this
//!   process needs no mount privilege. The changes the step made are exactly the upper layer,
//!   turned into patches by `smithers-patch` like the local runtime's: both runtimes produce
//!   the same patches for the same writes. The project's `.smithers/` is hidden under an
//!   empty read-only tmpfs.
//! * Same in-sandbox paths as the local runtime: the request JSON is bound read-only at
//!   `/run/smithers/request/request.json` (`$SMITHERS_SANDBOX_REQUEST_PATH`); the step writes
//!   its result JSON at `/run/smithers/out/result.json` (`$SMITHERS_SANDBOX_RESULT_PATH`) or
//!   prints it as stdout; every file under the writable `/result` becomes an artifact. Both
//!   are binds of directories in the state dir. `collect` writes the bundle at
//!   `<rootDir>/.smithers/sandboxes/<runId>/<sandboxId>/result`.
//! * One container per `execute`, created with the command itself (measured faster than a
//!   long-lived container plus `exec`: one create/start instead of create/start/exec/kill),
//!   attached before start so no output is lost.
//!
//! # The engine: a sandbox across many commands
//!
//! The runtime is also a [`smithers_runtime::Engine`] (`live`): `create` and `ship` are the
//! step's; `start` runs one long-lived container from the same body a step's container gets,
//! whose command is this build's binary (bound read-only, as the egress holder's) waiting in
//! the init's `--container-wait` mode under Docker's init; each `exec` is a `docker exec` of
//! that binary as the command's wrapper (`--container-exec`: the command's own process group,
//! killed whole when it ends; its exit code or signal told apart), and a timeout or a cancel
//! kills that group with a second exec (`--container-kill`), Docker having no call to kill an
//! exec. The wrappers' pid files are in a tmpfs of the container's own, checked before use.
//! `stop` kills the container and waits for it (the egress decisions of the sandbox's life go
//! to its log, for `collect`'s bundle); `destroy` is `stop` and `cleanup`. The binary is
//! [`DockerOptions::egress_holder`]: without it the engine refuses at `create`.
//!
//! # Enforced, or refused
//!
//! | control | how |
//! |---|---|
//! | network | `NetworkMode=none` (only `lo`) unless `allowNetwork`; ports only with it, bound to 127.0.0.1 |
//! | memory | `Memory` = `MemorySwap` (no extra swap); OOM → [`Termination::Memory`](smithers_runtime::Termination::Memory) |
//! | cpu | `NanoCpus` |
//! | pids | default [`plan::DEFAULT_PIDS_LIMIT`]; `pids.max` on a parent cgroup we own (`CgroupParent=/smithers-docker/<name>`, cgroupfs driver, as root), else `PidsLimit`; the cap reached → [`Termination::Pids`](smithers_runtime::Termination::Pids) |
//! | disk | `/tmp` is a tmpfs of `diskLimit` (default 256 MiB); the workspace's upper layer is put on a tmpfs of `diskLimit` mounted by this process, which needs CAP_SYS_ADMIN: without it `diskLimit` is refused ([`RuntimeError::ControlUnsupported`](smithers_runtime::RuntimeError::ControlUnsupported)) |
//! | privileges | `CapDrop=ALL`, no `CapAdd`, `no-new-privileges`, a seccomp deny-list ([`plan::seccomp_profile`]: the engine default's denials plus `ptrace`/`process_vm_*`, namespace flags on `clone`), read-only root filesystem, private IPC |
//! | identity | the step runs as the **owner uid:gid of `rootDir`** so its files belong to the project's owner; when that is root, it is uid 0 with no capabilities (documented in the probe as degraded) |
//! | env | nothing from the host: PATH/HOME/TMPDIR set to in-container values, the step's `env`, the Smithers variables |
//! | processes | `Init=true` (reaps orphans); the container's pid namespace means every process dies with it; timeout and cancellation `SIGKILL` the container and wait for it; the `smithers-docker-watchdog` binary kills it if this process dies mid-execute |
//! | workspace (remote), egress proxy | refused: this runtime cannot honour them |
//!
//! The engine must be **local** (the overlay and the binds are host paths). An unreachable
//! engine, a missing image or an unenforceable control fail closed with
//! [`RuntimeError::Unavailable`](smithers_runtime::RuntimeError::Unavailable) / [`RuntimeError::ControlUnsupported`](smithers_runtime::RuntimeError::ControlUnsupported), never a fallback.
//!
//! # Nothing leaks
//!
//! Containers and volumes carry the labels `smithers.managed=true`, `smithers.run_id`,
//! `smithers.sandbox_id`, the owner's pid and start time and the state directory;
//! [`DockerRuntime::cleanup_orphans`] removes those whose owner process is gone. `cleanup`
//! from a handle (which may come back from a crafted database in the project tree) removes
//! only objects named as `create` derives them from the ids and project root and labelled for
//! exactly that sandbox, after inspecting them.

#![forbid(unsafe_code)]

/// The pids limit on a parent cgroup of ours.
mod cgroup;
/// The bundle, through `smithers_runtime::collect`.
mod collect;
/// The egress holder container; this build's binary bound into a container.
mod egress;
/// The controls refused, the probe, one sandbox's enforcement report.
mod enforcement;
/// The engine connection, its failures named with their fix, object removal.
mod engine;
/// What a stored handle names, and whether it may be trusted to name it.
mod handle;
/// State directories, the capped tmpfs layer, files read untrusted.
mod hostfs;
/// The `Engine`: start, exec, stop of a long-lived container.
mod live;
/// Usage and limit hits from the container's cgroup.
mod monitor;
/// The labelled leftovers of dead owners removed.
mod orphans;
/// Pure translation to Engine API objects.
pub mod plan;
/// A step's output relayed and capped.
mod pump;
/// One step's container created, attached, started, watched and waited for.
mod run;
/// The runtime value, its options, its engine connection.
mod runtime;
/// The sandboxes started through the engine and not stopped.
mod started;
/// The `Runtime` verbs: create, ship, execute, collect, cleanup, probe.
mod verbs;
/// The watchdog process of a running container.
mod watchdog;

pub use engine::{default_socket, MIN_API_VERSION};
pub use orphans::{OrphanFilter, OrphanReport};
pub use plan::BackendState;
pub use runtime::{DockerOptions, DockerRuntime, WATCHDOG_BIN};
