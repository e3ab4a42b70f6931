//! The init's status socket, read line by line with `recvmsg`, so that descriptors sent
//! with a line (P0's egress listeners) are received, not dropped as a plain read would.

use std::os::fd::OwnedFd;

/// The init's status lines, read with `recvmsg` so that descriptors sent with a line (the
/// egress listeners) are received rather than dropped; bounded (a line over 1 MiB ends it).
pub(crate) struct StatusReader<'a> {
    stream: &'a tokio::net::UnixStream,
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
    eof: bool,
}

impl<'a> StatusReader<'a> {
    pub(crate) fn new(stream: &'a tokio::net::UnixStream) -> Self {
        StatusReader {
            stream,
            buf: Vec::new(),
            fds: Vec::new(),
            eof: false,
        }
    }

    /// Descriptors received so far, in order.
    pub(crate) fn take_fds(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.fds)
    }

    pub(crate) async fn next_line(&mut self) -> Option<Vec<u8>> {
        use std::os::fd::AsRawFd;
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let rest = self.buf.split_off(pos + 1);
                let mut line = std::mem::replace(&mut self.buf, rest);
                line.pop();
                return Some(line);
            }
            if self.eof || self.buf.len() > 1 << 20 {
                return None;
            }
            if self.stream.readable().await.is_err() {
                return None;
            }
            let fd = self.stream.as_raw_fd();
            let mut chunk = [0u8; 16 << 10];
            let got = self.stream.try_io(tokio::io::Interest::READABLE, || {
                recv_with_fds(fd, &mut chunk, &mut self.fds)
            });
            match got {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => self.eof = true,
            }
        }
    }
}

/// One `recvmsg` into `buf`, descriptors appended to `fds` (close-on-exec).
fn recv_with_fds(fd: i32, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> std::io::Result<usize> {
    use std::os::fd::FromRawFd;
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
    // SAFETY: `msg` and what it points to are valid for the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel filled `control` up to msg_controllen; the macros walk only that.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<i32>();
                let len = (*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<i32>() {
                    // Each received descriptor is new in this process and ours to own.
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(n as usize)
}
