//! Descriptor passing over unix sockets (SCM_RIGHTS): the zygote's requests, and the network
//! namespace P0 hands to P1.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A connected `SOCK_SEQPACKET` pair, both ends close-on-exec.
pub fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for socketpair to fill.
    let ret = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: socketpair returned two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The most descriptors one message carries (a session's request has 3); more are received,
/// then closed with the message, so that an over-full one is refused whole.
pub const MAX_FDS: usize = 8;

/// Room for one control message of up to [`MAX_FDS`] descriptors, aligned for `cmsghdr`.
type Control = [u64; 8];

/// One `sendmsg` of `payload` with `fds` attached (SCM_RIGHTS; none when empty); the bytes
/// sent. `MSG_NOSIGNAL`: a peer that is gone is `EPIPE`, not a signal; `flags` adds e.g.
/// `MSG_DONTWAIT`. Interrupted calls are made again.
pub fn send_with_rights(
    sock: RawFd,
    payload: &[u8],
    fds: &[RawFd],
    flags: libc::c_int,
) -> std::io::Result<usize> {
    assert!(
        fds.len() <= MAX_FDS,
        "at most {MAX_FDS} descriptors per message"
    );
    let mut control: Control = [0; 8];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: msghdr is plain old data; zeroed is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as libc::c_uint;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE only computes a size (at most 8 ints: within `control`'s 64 bytes).
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as usize;
        // SAFETY: `control` (u64-aligned, 64 bytes) holds one cmsghdr with up to 8 ints; the
        // macros stay within msg_controllen.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(bytes) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
        }
    }
    loop {
        // SAFETY: `msg` and what it points to are valid for the call.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL | flags) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What one [`recv_with_rights`] took.
#[derive(Debug)]
pub struct Received {
    /// Bytes written to the caller's buffer.
    pub len: usize,
    /// The descriptors that came with them (close-on-exec), in order.
    pub fds: Vec<OwnedFd>,
    /// The message or its descriptors did not fit (on a datagram socket the rest is lost).
    pub truncated: bool,
}

/// One `recvmsg` into `buf` with the descriptors that come along (close-on-exec); `None` at
/// the end of the stream (0 bytes, no descriptor). Interrupted calls are made again.
pub fn recv_with_rights(
    sock: RawFd,
    buf: &mut [u8],
    flags: libc::c_int,
) -> std::io::Result<Option<Received>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control: Control = [0; 8];
    // SAFETY: msghdr is plain old data; zeroed is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let len = loop {
        // SAFETY: `msg` and the buffers it points to are valid for the call.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
        if n >= 0 {
            break n as usize;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` up to msg_controllen; the macros walk only that,
    // and each descriptor received is new in this process and ours to own.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let n = (*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize;
                for i in 0..n / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if len == 0 && fds.is_empty() {
        return Ok(None);
    }
    let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    Ok(Some(Received {
        len,
        fds,
        truncated,
    }))
}

/// Sends one byte with `fds` (one to three) attached (SCM_RIGHTS).
pub fn send_fds(sock: RawFd, fds: &[RawFd]) -> std::io::Result<()> {
    assert!(
        (1..=3).contains(&fds.len()),
        "send_fds carries one to three descriptors"
    );
    send_with_rights(sock, b"f", fds, 0).map(drop)
}

/// Receives one message; `None` at end of file. The descriptors are close-on-exec.
pub fn recv_fds(sock: RawFd) -> std::io::Result<Option<Vec<OwnedFd>>> {
    let mut byte = [0u8; 1];
    Ok(recv_with_rights(sock, &mut byte, 0)?.map(|r| r.fds))
}
