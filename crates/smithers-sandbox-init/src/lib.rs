//! The in-sandbox init: a small, single-threaded program (no tokio, no threads) that executes a
//! [`plan::Prelude`] and a [`plan::InitPlan`]. It runs as a separate process so that nothing is
//! forked from the runtime's multithreaded process. P0 is either executed from the binary or, by default, forked from
//! the runtime's zygote (the same binary in `--zygote` mode, see [`crate::zygote`]), which hands
//! it the same three descriptors: from there on both are identical.
//!
//! Process tree and protocol:
//!
//! ```text
//! runtime ──socket (fd 0)──► P0  init, host pid ns: reads the prelude, opens the cgroups,
//!                            │   unshares user (+maps) and the other namespaces but the
//!                            │   network one, reads the plan, forks P1 (into the v2 cgroup),
//!                            │   makes the network namespace and hands it to P1, then
//!                            │   only waits: a "k" byte or EOF on fd 0 (the runtime died) →
//!                            │   SIGKILL P1; once P1 is gone it closes its descriptors.
//!                            └► P1  pid 1 of the new pid ns: moves itself into the v1 cgroups
//!                               │   (see `CgroupJoin`), builds the root (binds the prepared
//!                               │   one and mounts), pivot_root, enters the network namespace,
//!                               │   drops privileges (caps, no_new_privs, Landlock, seccomp
//!                               │   last), reports `ready`, forks the command, reaps zombies,
//!                               │   reports `exit`, then exits, which kills whatever is left.
//!                               └► P2  the command (stdin /dev/null, stdout/stderr = runtime's pipes)
//! ```
//!
//! The runtime sends two JSON lines on fd 0: the prelude (what P0 needs, before P0 starts),
//! then the plan (what P1 needs, compiled while P0 makes its namespaces; P0 passes it on
//! unparsed). A warm sandbox (the runtime's warm pool) gets a [`plan::WarmPlan`] as its second
//! line instead: P1 builds that much of the root, reports `warm` and waits; the step's plan
//! comes as a third line when a step claims the sandbox, and P1 reads it from fd 0 itself
//! (no further than its newline), while P0 leaves fd 0 alone until P1 has it. Status lines (JSON, one per line) go back over fd 0: `{"event":"ready",...}`,
//! `{"event":"exit","code":N}` / `{"event":"exit","signal":N}`, `{"event":"error",...}`.
//! P1 sends `exit` only after killing and reaping every other process of the sandbox
//! (double-forked, setsid'd, SIGTERM-ignoring ones too): from it on, only P1 is left, and
//! the runtime need not wait for P1's own exit. Because P1 is the pid namespace's init, its
//! death (a kill from P0, say) kills every process of the sandbox too, and P0's `waitpid` on
//! it returns only once all of them are gone. Only the sandbox holds the output pipes (P0 and
//! P1 close theirs), so they end with its processes.
//!
//! The init is its own crate because it is a security boundary of its own (like firecracker's
//! jailer): it depends on no async runtime and on nothing of the runtime that starts it. Its
//! input, [`plan`], holds only types; the runtime compiles them. The modules follow the
//! phases: `control` (the control socket), `namespaces` and `cgroups` (P0 before the
//! fork), `p0` (forking and supervising P1), `network` (the network namespace, made by P0
//! and entered by P1), `p1`, `mounts`, `privileges` and `spawn` (P1), `probe` (the host
//! probe mode), [`zygote`] (the fork server), [`container`] (the docker engine's modes in a
//! long-lived container: wait, an exec's wrapper, its kill) and [`sys`] (syscall wrappers).
//!
//! # Single-threaded, checked
//!
//! The init forks and then runs arbitrary Rust code in the children, which is sound only in a
//! single-threaded process: [`run`] refuses to start otherwise, once, before any mode, so every
//! `fork` below relies on that one check. Forked children run through [`sys::child_exit`],
//! which never lets a panic unwind into the parent's copied frames.

mod cgroups;
pub mod channel;
pub mod container;
mod control;
mod fdpass;
mod flip;
mod mounts;
mod namespaces;
mod network;
mod p0;
mod p1;
pub mod plan;
mod privileges;
mod probe;
mod sandbox;
mod session;
mod spawn;
pub mod sys;
mod terminal;
pub mod zygote;

use std::path::Path;

use crate::probe::run_probe;

pub use mounts::{apply, make_mount_point};

pub use plan::INIT_ENV;

/// Entry point of the `smithers-sandbox-init` binary (and of `smithers-sandbox __sandbox-init`).
pub fn main() -> ! {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(run(&args))
}

/// Runs the init with its arguments (without the program name); returns the exit code.
pub fn run(args: &[String]) -> i32 {
    // The init forks and then runs arbitrary Rust code in the children, which is sound only
    // in a single-threaded process (another thread could hold the allocator's lock, or any
    // other, at the fork). It is started as its own program (or dispatched before anything
    // else in the CLI), so a second thread here is a bug: refuse rather than risk it.
    match sys::thread_count() {
        Some(1) => {}
        n => {
            eprintln!(
                "smithers-sandbox-init: must run single-threaded, but this process has {} threads",
                n.map_or("an unknown number of".to_string(), |n| n.to_string())
            );
            return 2;
        }
    }
    match args.first().map(String::as_str) {
        None => crate::sandbox::run_sandbox(),
        Some("--zygote") => crate::zygote::serve(crate::sandbox::run_sandbox),
        Some("--egress-holder") => match (args.get(1), args.get(2)) {
            (Some(socket), Some(listen)) => crate::network::egress_holder(socket, listen),
            _ => {
                eprintln!(
                    "smithers-sandbox-init: --egress-holder needs a socket and the listeners"
                );
                2
            }
        },
        Some(container::WAIT) => container::wait(),
        Some(container::EXEC) => match container::parse_exec(&args[1..]) {
            Some(exec) => container::exec(&exec),
            None => {
                eprintln!("smithers-sandbox-init: --container-exec needs TOKEN --cwd DIR [--null-stdin] -- ARGV...");
                2
            }
        },
        Some(container::KILL) => match args.get(1) {
            Some(token) => container::kill(token),
            None => 2,
        },
        Some(container::STATUS) => match args.get(1) {
            Some(token) => container::status(token),
            None => 2,
        },
        Some("--flip") => crate::flip::run(),
        Some("--probe") => match args.get(1) {
            Some(scratch) => run_probe(Path::new(scratch)),
            None => {
                eprintln!("smithers-sandbox-init: --probe needs a scratch directory");
                2
            }
        },
        Some(other) => {
            eprintln!("smithers-sandbox-init: unexpected argument {other:?} (this program is started by the smithers runtime)");
            2
        }
    }
}
