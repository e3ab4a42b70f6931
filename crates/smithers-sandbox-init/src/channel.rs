//! A session's exec channel, both ends (P1 in the sandbox, the runtime on the host): a
//! `SOCK_SEQPACKET` socket, one message per datagram, descriptors attached (SCM_RIGHTS) to the
//! datagram they belong to. See [`crate::plan::SessionRequest`] and
//! [`crate::plan::SessionReport`].

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// One datagram as received.
#[derive(Debug)]
pub struct Datagram {
    pub bytes: Vec<u8>,
    /// The descriptors that came with it (close-on-exec), in order.
    pub fds: Vec<OwnedFd>,
    /// The datagram or its descriptors did not fit (the rest is lost: refuse it).
    pub truncated: bool,
}

/// Room for the descriptors of one datagram: a request carries 3; up to 8 are received (and
/// then closed) so that an over-full one is refused whole.
const MAX_FDS: usize = 8;

/// Sends `payload` as one datagram with `fds` attached. `MSG_NOSIGNAL`: a peer that is gone is
/// `EPIPE`, not a signal; `flags` adds e.g. `MSG_DONTWAIT`.
pub fn send(sock: RawFd, payload: &[u8], fds: &[RawFd], flags: libc::c_int) -> std::io::Result<()> {
    assert!(
        fds.len() <= MAX_FDS,
        "at most {MAX_FDS} descriptors per datagram"
    );
    let mut control = [0u64; 8];
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
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one datagram of at most `max` bytes (`flags` adds e.g. `MSG_DONTWAIT`). `None` at
/// the channel's end (a read of 0 bytes with no descriptor).
pub fn recv(sock: RawFd, max: usize, flags: libc::c_int) -> std::io::Result<Option<Datagram>> {
    let mut bytes = vec![0u8; max];
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain old data; zeroed is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
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
                let len = (*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    bytes.truncate(n);
    Ok(Some(Datagram {
        bytes,
        fds,
        truncated,
    }))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn a_datagram_and_its_descriptors_arrive_together_and_the_end_is_seen() {
        let (a, b) = crate::fdpass::seqpacket_pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        send(a.as_raw_fd(), b"one", &[file.as_raw_fd(); 3], 0).unwrap();
        send(a.as_raw_fd(), b"two", &[], 0).unwrap();
        let first = recv(b.as_raw_fd(), 64, 0).unwrap().unwrap();
        assert_eq!(
            (first.bytes.as_slice(), first.fds.len(), first.truncated),
            (&b"one"[..], 3, false)
        );
        let second = recv(b.as_raw_fd(), 64, 0).unwrap().unwrap();
        assert_eq!(
            (second.bytes.as_slice(), second.fds.len()),
            (&b"two"[..], 0)
        );
        // Too long for the buffer: cut, and said so.
        send(a.as_raw_fd(), &[7u8; 100], &[], 0).unwrap();
        assert!(recv(b.as_raw_fd(), 64, 0).unwrap().unwrap().truncated);
        drop(a);
        assert!(recv(b.as_raw_fd(), 64, 0).unwrap().is_none());
    }
}
