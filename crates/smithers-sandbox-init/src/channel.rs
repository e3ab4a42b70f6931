//! A session's exec channel, both ends (P1 in the sandbox, the runtime on the host): a
//! `SOCK_SEQPACKET` socket, one message per datagram, descriptors attached (SCM_RIGHTS) to the
//! datagram they belong to. See [`crate::plan::SessionRequest`] and
//! [`crate::plan::SessionReport`].

use std::os::fd::{OwnedFd, RawFd};

/// One datagram as received.
#[derive(Debug)]
pub struct Datagram {
    pub bytes: Vec<u8>,
    /// The descriptors that came with it (close-on-exec), in order.
    pub fds: Vec<OwnedFd>,
    /// The datagram or its descriptors did not fit (the rest is lost: refuse it).
    pub truncated: bool,
}

/// Sends `payload` as one datagram with `fds` attached (see
/// [`crate::fdpass::send_with_rights`]).
pub fn send(sock: RawFd, payload: &[u8], fds: &[RawFd], flags: libc::c_int) -> std::io::Result<()> {
    crate::fdpass::send_with_rights(sock, payload, fds, flags).map(drop)
}

/// Receives one datagram into `buf` (its bound) with its descriptors; `None` at the channel's
/// end. The buffer is the caller's, so a reader of many datagrams reuses one.
pub fn recv(sock: RawFd, buf: &mut [u8], flags: libc::c_int) -> std::io::Result<Option<Datagram>> {
    Ok(
        crate::fdpass::recv_with_rights(sock, buf, flags)?.map(|r| Datagram {
            bytes: buf[..r.len].to_vec(),
            fds: r.fds,
            truncated: r.truncated,
        }),
    )
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
        let first = recv(b.as_raw_fd(), &mut [0u8; 64], 0).unwrap().unwrap();
        assert_eq!(
            (first.bytes.as_slice(), first.fds.len(), first.truncated),
            (&b"one"[..], 3, false)
        );
        let second = recv(b.as_raw_fd(), &mut [0u8; 64], 0).unwrap().unwrap();
        assert_eq!(
            (second.bytes.as_slice(), second.fds.len()),
            (&b"two"[..], 0)
        );
        // Too long for the buffer: cut, and said so.
        send(a.as_raw_fd(), &[7u8; 100], &[], 0).unwrap();
        assert!(
            recv(b.as_raw_fd(), &mut [0u8; 64], 0)
                .unwrap()
                .unwrap()
                .truncated
        );
        drop(a);
        assert!(recv(b.as_raw_fd(), &mut [0u8; 64], 0).unwrap().is_none());
    }
}
