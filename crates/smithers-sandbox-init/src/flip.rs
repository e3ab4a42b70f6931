//! `--flip`: swaps the workspace overlay of a running sandbox for another, the layer flip of
//! a session's checkpoint, restore and fork. Started by the runtime for one flip; reads a
//! [`FlipRequest`] (one line) on stdin, makes itself ready (the namespaces joined and made),
//! says `ready` on stdout, and waits for one byte on stdin: `g` once every process of the
//! sandbox is held still and the layers are in place (the flip), anything else or the input's
//! end (nothing done). So the sandbox is held only for the unmount, the mount and the move.
//!
//! The sandbox's init gave up every privilege, so the flip is made from outside: this process
//! joins the sandbox's user namespace (the runtime's user owns it, so it gets every capability
//! there) and makes a mount namespace of its own in it, a copy of the host's where the layer
//! paths resolve. It unmounts the old overlay in the sandbox's mount namespace (a plain
//! unmount: the kernel refuses it while any process has a working directory or an open or
//! mapped file in it, which is the one case a flip must not happen, as that process would go
//! on writing into a layer that is now frozen), mounts the new overlay in its own namespace,
//! clones it (`open_tree`) and moves the clone onto the sandbox's target (`move_mount`).

use std::io::{BufRead, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use rustix::mount::{MoveMountFlags, OpenTreeFlags};

use crate::mounts::{lowerdirs, mount_overlay_at};
use crate::plan::{flip_exit, FlipOverlay, FlipRequest};
use crate::sys::{self, SysError, SysResult};

/// The most a request may hold: 32 layers of 4 KiB paths, and more.
const MAX_REQUEST: u64 = 512 * 1024;

/// The flip, from a request on stdin. Returns the exit code ([`flip_exit`]).
pub(crate) fn run() -> i32 {
    let mut bytes = Vec::new();
    // The lock ends here: the go byte is read through stdin's same buffer later.
    let read = std::io::stdin()
        .lock()
        .take(MAX_REQUEST + 1)
        .read_until(b'\n', &mut bytes);
    if let Err(e) = read {
        eprintln!("smithers-sandbox-init --flip: reading the request: {e}");
        return 2;
    }
    let request: FlipRequest = match serde_json::from_slice(&bytes) {
        Ok(r) if bytes.len() as u64 <= MAX_REQUEST => r,
        Ok(_) => {
            eprintln!("smithers-sandbox-init --flip: the request is over {MAX_REQUEST} bytes");
            return 2;
        }
        Err(e) => {
            eprintln!("smithers-sandbox-init --flip: the request: {e}");
            return 2;
        }
    };
    match flip(&request) {
        Ok(code) => code,
        Err((code, e)) => {
            eprintln!("smithers-sandbox-init --flip: {e}");
            code
        }
    }
}

type FlipResult = Result<i32, (i32, SysError)>;

fn flip(request: &FlipRequest) -> FlipResult {
    let failed = |e: SysError| (2, e);
    // No process of the sandbox may read this one's memory (it holds capabilities there).
    sys::prctl(libc::PR_SET_DUMPABLE, 0, "PR_SET_DUMPABLE").map_err(failed)?;
    let ns = |name: &str| open_ns(request.ns_pid, name);
    let (user, sandbox) = (ns("user").map_err(failed)?, ns("mnt").map_err(failed)?);
    setns(&user, libc::CLONE_NEWUSER, "the sandbox's user namespace").map_err(failed)?;
    sys::unshare(libc::CLONE_NEWNS, "a mount namespace").map_err(failed)?;
    let ours = open_ns(std::process::id() as i32, "mnt").map_err(failed)?;
    // Ready: the runtime now holds the sandbox still, moves the layers and says go.
    let mut out = std::io::stdout();
    out.write_all(b"ready\n")
        .and_then(|()| out.flush())
        .map_err(|e| {
            failed(SysError {
                op: format!("say ready: {e}"),
                errno: libc::EPIPE,
            })
        })?;
    let mut go = [0u8; 1];
    if !matches!(std::io::stdin().read(&mut go), Ok(1)) || go[0] != b'g' {
        // Called off: nothing was done.
        return Ok(flip_exit::CALLED_OFF);
    }

    setns(&sandbox, libc::CLONE_NEWNS, "the sandbox's mount namespace").map_err(failed)?;
    match sys::umount2(&request.target, libc::UMOUNT_NOFOLLOW) {
        Ok(()) => {}
        Err(e) if e.errno == libc::EBUSY => return Err((flip_exit::BUSY, e)),
        Err(e) => return Err(failed(e)),
    }
    match attach(&request.mount, request, &ours, &sandbox) {
        Ok(()) => Ok(flip_exit::DONE),
        Err(e) => {
            eprintln!("smithers-sandbox-init --flip: the new overlay: {e}");
            match attach(&request.put_back, request, &ours, &sandbox) {
                Ok(()) => Ok(flip_exit::PUT_BACK),
                Err(e) => Err((flip_exit::LOST, e)),
            }
        }
    }
}

/// Mounts `overlay` in our namespace, then moves a clone of it onto the target in the
/// sandbox's. Ends in the sandbox's mount namespace.
fn attach(
    overlay: &FlipOverlay,
    request: &FlipRequest,
    ours: &OwnedFd,
    sandbox: &OwnedFd,
) -> SysResult<()> {
    setns(ours, libc::CLONE_NEWNS, "our mount namespace")?;
    let lowerdir = lowerdirs(&overlay.layers, &overlay.lower);
    mount_overlay_at(
        &request.scratch,
        &lowerdir,
        &overlay.upper,
        &overlay.work,
        overlay.attrs,
        &overlay.hide,
    )?;
    let tree = sys::rx(
        rustix::mount::open_tree(
            rustix::fs::CWD,
            &request.scratch,
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        ),
        || format!("open_tree {}", request.scratch.display()),
    )?;
    // Ours alone sees it; it goes with our namespace anyway.
    let _ = sys::umount2(&request.scratch, libc::MNT_DETACH);
    setns(sandbox, libc::CLONE_NEWNS, "the sandbox's mount namespace")?;
    sys::rx(
        rustix::mount::move_mount(
            tree.as_fd(),
            "",
            rustix::fs::CWD,
            &request.target,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        ),
        || format!("move_mount onto {}", request.target.display()),
    )
}

fn open_ns(pid: i32, name: &str) -> SysResult<OwnedFd> {
    let path = format!("/proc/{pid}/ns/{name}");
    sys::rx(
        rustix::fs::open(
            Path::new(&path),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ),
        || format!("open {path}"),
    )
}

fn setns(fd: &OwnedFd, kind: libc::c_int, what: &str) -> SysResult<()> {
    // SAFETY: setns(2) takes a descriptor we own and a namespace type; this process is
    // single-threaded (checked at the start of the init), as joining a user namespace needs.
    let ret = unsafe { libc::setns(fd.as_raw_fd(), kind) };
    sys::check(ret, || format!("setns into {what}")).map(|_| ())
}
