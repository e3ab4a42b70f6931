//! The sandbox's network namespace: P0 makes it (and brings `lo` up) while P1 builds the
//! root, and hands it to P1 over a socket pair; P1 enters it last, just before dropping its
//! capabilities.

use std::os::fd::{AsRawFd, OwnedFd};

use rustix::fs::{Mode, OFlags};

use crate::control::report_error;
use crate::sys::{self, SysError, SysResult};

/// P0: makes the network namespace (P0 enters it) and sends it to P1; on failure reports why
/// and sends nothing, which P1 takes as the end of the sandbox.
pub(crate) fn send_network_namespace(sock: &OwnedFd, proc_self: &OwnedFd) {
    // `lo` comes up here too, while P1 is still building the root: it is the only device of
    // the namespace, and P0 (root of the sandbox's user namespace) may configure it.
    let made = sys::unshare(libc::CLONE_NEWNET, "network namespace").and_then(|()| {
        lo_up()?;
        sys::rx(
            rustix::fs::openat(
                proc_self,
                "ns/net",
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            ),
            || "open /proc/self/ns/net".to_string(),
        )
    });
    match made {
        // Ours is closed when dropped; P1 has its own copy once sent.
        Ok(fd) => {
            let sent = crate::zygote::send_fds(sock.as_raw_fd(), &[fd.as_raw_fd()]);
            drop(fd);
            // P1 gone (EPIPE: it failed first, and reported why) is not news.
            let failed = sent.err().filter(|e| e.raw_os_error() != Some(libc::EPIPE));
            if let Some(e) = failed {
                report_error(
                    "network",
                    &SysError {
                        op: "send the network namespace to pid 1".into(),
                        errno: e.raw_os_error().unwrap_or(libc::EIO),
                    },
                );
            }
        }
        Err(e) => report_error("network", &e),
    }
}

/// P1: enters the network namespace P0 made (see `start`).
pub(crate) fn enter_network_namespace(sock: &OwnedFd) -> SysResult<()> {
    let fds = crate::zygote::recv_fds(sock.as_raw_fd()).map_err(|e| SysError {
        op: "receive the network namespace".into(),
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    })?;
    let Some(fd) = fds.and_then(|mut fds| fds.pop()) else {
        return Err(SysError {
            op: "receive the network namespace (P0 could not make it)".into(),
            errno: libc::ECHILD,
        });
    };
    // SAFETY: setns(2) on a namespace descriptor we own.
    let ret = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
    sys::check(ret, || "setns into the network namespace".to_string()).map(|_| ())
}

pub(crate) fn lo_up() -> SysResult<()> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    sys::check(fd, || "socket for lo".to_string())?;
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `ifr` is a valid ifreq for SIOCGIFFLAGS/SIOCSIFFLAGS on our own socket.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) < 0 {
            sys::fail("SIOCGIFFLAGS lo")
        } else {
            ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr) < 0 {
                sys::fail("SIOCSIFFLAGS lo")
            } else {
                Ok(())
            }
        }
    };
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    result
}
