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

/// One non-blocking `recvmsg`, descriptors appended to `fds` (see `smithers_egress::fdpass`).
fn recv_with_fds(fd: i32, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> std::io::Result<usize> {
    smithers_egress::fdpass::recv_with_fds(fd, buf, fds, true)
}
