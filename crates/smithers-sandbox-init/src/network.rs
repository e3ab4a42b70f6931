//! The sandbox's network namespace: P0 makes it (and brings `lo` up) while P1 builds the
//! root, and hands it to P1 over a socket pair; P1 enters it last, just before dropping its
//! capabilities.

use std::os::fd::{AsRawFd, OwnedFd};

use rustix::fs::{Mode, OFlags};

use crate::control::{report_error, CONTROL_FD};
use crate::plan::EgressListen;
use crate::sys::{self, SysError, SysResult};

/// P0: makes the network namespace (P0 enters it) and sends it to P1; on failure reports why
/// and sends nothing, which P1 takes as the end of the sandbox.
pub(crate) fn send_network_namespace(
    sock: &OwnedFd,
    proc_self: &OwnedFd,
    egress: Option<&EgressListen>,
) {
    // `lo` comes up here too, while P1 is still building the root: it is the only device of
    // the namespace, and P0 (root of the sandbox's user namespace) may configure it. So do
    // the egress listeners, sent to the runtime before P1 may enter the namespace: a
    // sandbox whose listeners could not be made never runs its step.
    let made = sys::unshare(libc::CLONE_NEWNET, "network namespace").and_then(|()| {
        lo_up()?;
        if let Some(listen) = egress {
            send_egress_listeners(listen)?;
        }
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
            let sent = crate::fdpass::send_fds(sock.as_raw_fd(), &[fd.as_raw_fd()]);
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
    let fds = crate::fdpass::recv_fds(sock.as_raw_fd()).map_err(|e| SysError {
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

/// Binds the egress listeners in the current (the sandbox's) network namespace and sends
/// them to the runtime: one `egress` status line carrying every descriptor, in the order of
/// [`EgressListen::names`]. Ours are closed once sent.
fn send_egress_listeners(listen: &EgressListen) -> SysResult<()> {
    let fds = bind_egress_listeners(listen)?;
    let mut line = serde_json::json!({"event": "egress", "listeners": listen.names()}).to_string();
    line.push('\n');
    let raw: Vec<libc::c_int> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    send_with_fds(CONTROL_FD, line.as_bytes(), &raw).map_err(|e| SysError {
        op: "send the egress listeners to the runtime".into(),
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    })
}

/// The docker runtime's holder (`--egress-holder SOCKET LISTEN`): run as the only process
/// of a container whose network namespace the step's container joins, it binds the egress
/// listeners there, sends them to the runtime over the unix socket SOCKET (bound into the
/// container) with the same `egress` line as P0, then holds the namespace until the runtime
/// closes the socket. It runs no step code and keeps no listener.
pub(crate) fn egress_holder(socket: &str, listen: &str) -> i32 {
    let listen: EgressListen = match serde_json::from_str(listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("smithers-sandbox-init: --egress-holder: the listeners are not valid: {e}");
            return 2;
        }
    };
    let fds = match bind_egress_listeners(&listen) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("smithers-sandbox-init: {e}");
            return 1;
        }
    };
    let mut stream = match std::os::unix::net::UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("smithers-sandbox-init: connecting to the runtime at {socket}: {e}");
            return 1;
        }
    };
    let mut line = serde_json::json!({"event": "egress", "listeners": listen.names()}).to_string();
    line.push('\n');
    let raw: Vec<libc::c_int> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    if let Err(e) = send_with_fds(stream.as_raw_fd(), line.as_bytes(), &raw) {
        eprintln!("smithers-sandbox-init: sending the egress listeners: {e}");
        return 1;
    }
    drop(fds);
    // Held until the runtime is done with the sandbox (EOF), or gone.
    let mut buf = [0u8; 64];
    while matches!(std::io::Read::read(&mut stream, &mut buf), Ok(n) if n > 0) {}
    0
}

/// Binds the egress listeners in the current network namespace, in the order of
/// [`EgressListen::names`].
fn bind_egress_listeners(listen: &EgressListen) -> SysResult<Vec<OwnedFd>> {
    const LOOPBACK: [u8; 4] = [127, 0, 0, 1];
    let mut fds = Vec::new();
    if listen.dns {
        fds.push(inet_socket(libc::SOCK_DGRAM, LOOPBACK, 53)?);
        fds.push(inet_socket(libc::SOCK_STREAM, LOOPBACK, 53)?);
    }
    fds.push(inet_socket(libc::SOCK_STREAM, LOOPBACK, listen.http_port)?);
    fds.push(inet_socket(libc::SOCK_STREAM, LOOPBACK, listen.socks_port)?);
    for port in &listen.capture_ports {
        fds.push(inet_socket(libc::SOCK_STREAM, [0, 0, 0, 0], *port)?);
    }
    Ok(fds)
}

/// An IPv4 socket bound to `addr:port` (listening, for a stream socket).
fn inet_socket(kind: libc::c_int, addr: [u8; 4], port: u16) -> SysResult<OwnedFd> {
    use std::os::fd::FromRawFd;
    let what = || {
        format!(
            "bind the egress listener {}:{port}",
            std::net::Ipv4Addr::from(addr)
        )
    };
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, kind | libc::SOCK_CLOEXEC, 0) };
    sys::check(fd, what)?;
    // SAFETY: `fd` is a new descriptor, ours alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: SO_REUSEADDR takes an int; `one` outlives the call.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    // SAFETY: sockaddr_in is plain old data; zeroed is a valid value.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = port.to_be();
    sin.sin_addr.s_addr = u32::from_ne_bytes(addr);
    // SAFETY: `sin` is a valid sockaddr_in of the size given.
    let ret = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    sys::check(ret, what)?;
    if kind == libc::SOCK_STREAM {
        // SAFETY: listen(2) on our bound socket.
        let ret = unsafe { libc::listen(fd.as_raw_fd(), 1024) };
        sys::check(ret, what)?;
    }
    Ok(fd)
}

/// `payload` with `fds` attached to its first byte (SCM_RIGHTS), so the descriptors arrive
/// with the line that names them; a short write's rest goes without them.
pub(crate) fn send_with_fds(
    sock: libc::c_int,
    payload: &[u8],
    fds: &[libc::c_int],
) -> std::io::Result<()> {
    let mut sent = crate::fdpass::send_with_rights(sock, payload, fds, 0)?;
    while sent < payload.len() {
        sent += crate::fdpass::send_with_rights(sock, &payload[sent..], &[], 0)?;
    }
    Ok(())
}
