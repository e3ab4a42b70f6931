//! Descriptors over a unix socket: how a runtime's init (native) or holder (docker) hands
//! the listeners it bound inside a sandbox's network namespace to the trusted process.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// One `recvmsg` into `buf` (non-blocking when `dontwait`); descriptors that came with it are
/// appended to `fds`, close-on-exec. `Ok(0)` is the end of the stream.
pub fn recv_with_fds(
    fd: RawFd,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    dontwait: bool,
) -> std::io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for more descriptors than any init sends (u64: aligned for cmsghdr).
    let mut control = [0u64; 64];
    // SAFETY: msghdr is plain old data; zeroed is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let flags = libc::MSG_CMSG_CLOEXEC | if dontwait { libc::MSG_DONTWAIT } else { 0 };
    // SAFETY: `msg` and what it points to are valid for the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, flags) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel filled `control` up to msg_controllen; the macros walk only that.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let len = (*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    // Each received descriptor is new in this process and ours to own.
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(n as usize)
}

/// Reads (blocking) up to and including the first newline, at most `max` bytes: the line
/// and the descriptors that came with it.
pub fn recv_line_with_fds(fd: RawFd, max: usize) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(pos) = line.iter().position(|b| *b == b'\n') {
            line.truncate(pos);
            return Ok((line, fds));
        }
        if line.len() > max {
            return Err(std::io::Error::other(format!("a line over {max} bytes")));
        }
        match recv_with_fds(fd, &mut chunk, &mut fds, false) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => line.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
