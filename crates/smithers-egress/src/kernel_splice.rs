//! Copying a tunnel's bytes in the kernel: socket → pipe → socket with `splice(2)`, so that a
//! connection to a host no secret is bound to costs no copy through this process (what the
//! engine has decided about it was decided on its first flight).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// How much one splice moves at most: the pipe's capacity when it could be raised to it
/// (fewer splices and wake-ups per byte of a bulk transfer), else a pipe's default.
const CHUNK: usize = 1 << 20;
const DEFAULT_CHUNK: usize = 64 << 10;

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Raises the pipe's capacity to [`CHUNK`]; how much one splice may move through it (an
/// unprivileged user's pipes may be capped lower: then the default).
fn widen(pipe: &OwnedFd) -> usize {
    // SAFETY: fcntl on a pipe descriptor we hold; F_SETPIPE_SZ takes an int.
    let r = unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, CHUNK as libc::c_int) };
    if r >= CHUNK as libc::c_int {
        CHUNK
    } else {
        DEFAULT_CHUNK
    }
}

fn splice(from: libc::c_int, to: libc::c_int, len: usize) -> std::io::Result<usize> {
    // SAFETY: splice between two descriptors we hold, no offsets (both are a socket or a pipe).
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Moves bytes from `from` to `to` until `from` ends (Ok) or either fails, adding each byte
/// written to `counted`. The caller shuts `to`'s write side after.
pub(crate) async fn copy(
    from: &TcpStream,
    to: &TcpStream,
    counted: &AtomicU64,
) -> std::io::Result<()> {
    let (pr, pw) = pipe()?;
    let chunk = widen(&pw);
    let mut held = 0usize;
    loop {
        if held == 0 {
            from.readable().await?;
            let moved = from.try_io(Interest::READABLE, || {
                splice(from.as_raw_fd(), pw.as_raw_fd(), chunk)
            });
            match moved {
                Ok(0) => return Ok(()),
                Ok(n) => held = n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        to.writable().await?;
        let moved = to.try_io(Interest::WRITABLE, || {
            splice(pr.as_raw_fd(), to.as_raw_fd(), held)
        });
        match moved {
            Ok(n) => {
                held -= n;
                counted.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}
