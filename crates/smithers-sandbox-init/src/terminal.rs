//! A session command's terminal: a pseudo-terminal of the sandbox's own devpts instance
//! (mounted `newinstance` at `/dev/pts`, so its numbers and its slaves are the sandbox's, and no
//! terminal of the host is reachable from it). The spawner opens the master, sends it to the
//! runtime (which relays it to the caller's terminal through its filter) and starts the command
//! on the slave.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::plan::TerminalSize;
use crate::sys;

/// The master of a new terminal of `size` and its slave's path, unlocked.
pub(crate) fn open(size: TerminalSize) -> Result<(OwnedFd, CString), String> {
    let fail = |what: &str| {
        format!(
            "cannot {what} the command's terminal: {}",
            std::io::Error::last_os_error()
        )
    };
    // SAFETY: a valid C string; the new descriptor is owned below.
    let fd = unsafe {
        libc::open(
            c"/dev/pts/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(fail("open"));
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let master = unsafe { OwnedFd::from_raw_fd(fd) };
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads an int through a valid pointer.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(fail("unlock"));
    }
    let mut number: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes an unsigned int through a valid pointer.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTN, &mut number) } < 0 {
        return Err(fail("number"));
    }
    resize(&master, size).map_err(|_| fail("size"))?;
    let slave = CString::new(format!("/dev/pts/{number}")).map_err(|_| fail("name"))?;
    Ok((master, slave))
}

/// Sets the terminal's size (the master's; the kernel tells the slave's foreground group).
pub(crate) fn resize(master: &OwnedFd, size: TerminalSize) -> std::io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize through a valid pointer.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Writes a command's start failure where its output goes: the terminal (the runtime reads
/// it from the master).
pub(crate) fn tell(slave: &CString, message: &str) {
    // SAFETY: a valid C string; O_NOCTTY so the spawner never gets a controlling terminal.
    let fd = unsafe {
        libc::open(
            slave.as_ptr(),
            libc::O_WRONLY | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if fd >= 0 {
        // SAFETY: `fd` was just opened and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let _ = sys::write_all_fd(fd.as_raw_fd(), message.as_bytes());
    }
}
