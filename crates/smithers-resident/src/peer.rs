//! Who is at the other end of the socket, as both ends check it.
//!
//! A step served by the service runs with the service's credentials, namespaces, root and
//! confinement. So the service serves a client only when these are the client's own, and the
//! client hands its request (its environment, its stdio, a descriptor of its working
//! directory) only to a service whose are its own: a process of the same user in a container
//! that shares `/tmp` or `$XDG_RUNTIME_DIR` could otherwise bind the socket's name and receive
//! them.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// The namespaces both ends must share: a step served sees the service's file systems,
/// network, users, processes and cgroups.
const NAMESPACES: &[&str] = &["mnt", "net", "user", "pid", "ipc", "uts", "cgroup"];

/// The lines of `/proc/<pid>/status` that say what a process may do: its groups, its
/// capabilities, and whether it is confined (no_new_privs: every Landlock domain needs it;
/// a seccomp filter).
const CONFINEMENT: &[&str] = &[
    "Groups:",
    "CapInh:",
    "CapPrm:",
    "CapEff:",
    "CapBnd:",
    "CapAmb:",
    "NoNewPrivs:",
    "Seccomp:",
    "Seccomp_filters:",
];

/// A process as the other end sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// Its start time (`/proc/<pid>/stat` field 22): the same pid later with another start
    /// time is another process.
    start: u64,
    namespaces: Vec<PathBuf>,
    root: (u64, u64),
    /// [`CONFINEMENT`]'s lines, and the security module's label (`attr/current`).
    confinement: Vec<String>,
    /// Its umask (`Umask:` of its status, Linux 4.7+): not part of who it is (a client's
    /// is sent with its request, and the service takes it for the step).
    pub umask: Option<u32>,
}

impl Identity {
    /// This process.
    pub fn of_self() -> Result<Identity, String> {
        Identity::read(
            "self",
            std::process::id() as i32,
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    }

    /// The process at the other end of `sock` (`SO_PEERCRED`: as it was when it connected).
    pub fn of_peer(sock: &impl AsFd) -> Result<Identity, String> {
        let (pid, uid, gid) = peer_cred(sock).map_err(|e| format!("SO_PEERCRED: {e}"))?;
        if pid <= 0 {
            return Err(
                "the process at the other end is not visible from here (another pid namespace)"
                    .into(),
            );
        }
        Identity::read(&pid.to_string(), pid, uid, gid)
    }

    fn read(proc_name: &str, pid: i32, uid: u32, gid: u32) -> Result<Identity, String> {
        let unreadable =
            |what: &str, e: io::Error| format!("the {what} of process {pid} cannot be read: {e}");
        let namespaces = NAMESPACES
            .iter()
            .map(|ns| {
                std::fs::read_link(format!("/proc/{proc_name}/ns/{ns}"))
                    .map_err(|e| unreadable(&format!("{ns} namespace"), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let root = std::fs::metadata(format!("/proc/{proc_name}/root"))
            .map(|m| (m.dev(), m.ino()))
            .map_err(|e| unreadable("root", e))?;
        let status =
            read_proc(&format!("/proc/{proc_name}/status")).map_err(|e| unreadable("status", e))?;
        let mut confinement: Vec<String> = CONFINEMENT
            .iter()
            .map(|key| {
                status
                    .lines()
                    .find(|l| l.starts_with(key))
                    .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                    .unwrap_or_else(|| format!("{key} -"))
            })
            .collect();
        // No security module (or none that labels processes) reads as an error: "-".
        let label = read_proc(&format!("/proc/{proc_name}/attr/current"))
            .map(|b| b.trim_end_matches(['\0', '\n']).to_string())
            .unwrap_or_else(|_| "-".to_string());
        confinement.push(format!("label: {label}"));
        let umask = status
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok());
        Ok(Identity {
            pid,
            uid,
            gid,
            start: start_time(proc_name).map_err(|e| unreadable("start time", e))?,
            namespaces,
            root,
            confinement,
            umask,
        })
    }

    /// Why a step of `theirs` may not be run by `self` (or `self`'s request handed to
    /// `theirs`): another user or group, namespace, root, groups, capabilities or confinement.
    pub fn differences(&self, theirs: &Identity) -> Option<String> {
        if (self.uid, self.gid) != (theirs.uid, theirs.gid) {
            return Some(format!(
                "uid {} gid {} is not uid {} gid {}",
                theirs.uid, theirs.gid, self.uid, self.gid
            ));
        }
        for (i, ns) in NAMESPACES.iter().enumerate() {
            if self.namespaces[i] != theirs.namespaces[i] {
                return Some(format!("the other end is in another {ns} namespace"));
            }
        }
        if self.root != theirs.root {
            return Some("the other end has another root directory".into());
        }
        for (ours, other) in self.confinement.iter().zip(&theirs.confinement) {
            if ours != other {
                let what = ours.split(':').next().unwrap_or("");
                return Some(format!(
                    "the other end differs in what it may do ({what}: {other:?}, here {ours:?})"
                ));
            }
        }
        None
    }

    /// Whether this process is confined in a way a peer's equal status lines cannot show
    /// (a Landlock domain needs no_new_privs; a seccomp filter's rules are not visible): such
    /// a client runs its step itself, within its confinement.
    pub fn confined(&self) -> Option<String> {
        self.confinement
            .iter()
            .find(|l| {
                (l.starts_with("NoNewPrivs:") && l != &"NoNewPrivs: 0")
                    || (l.starts_with("Seccomp:") && l != &"Seccomp: 0")
            })
            .map(|l| format!("the client is confined ({l}): it runs its step itself"))
    }

    /// Whether the process is still the one identified (its pid not reused since).
    pub fn still_there(&self) -> bool {
        start_time(&self.pid.to_string()).is_ok_and(|s| s == self.start)
    }
}

/// A small `/proc` file, read whole in (usually) one system call: `fs::read_to_string` sizes
/// its reads from the file's size, which `/proc` gives as 0, and so reads it 32 bytes, then
/// 64, and so on (eight calls for a status). Each end reads three such files per request.
fn read_proc(path: &str) -> io::Result<String> {
    use std::io::Read as _;
    // Status is about 1.5 KiB; a larger file is read on by `read_to_end`.
    let mut bytes = Vec::with_capacity(4096);
    std::fs::File::open(path)?.read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn start_time(proc_name: &str) -> io::Result<u64> {
    let stat = read_proc(&format!("/proc/{proc_name}/stat"))?;
    // The command name (field 2) may hold spaces and parentheses: fields count from the last ')'.
    let after = stat
        .rfind(')')
        .map(|at| &stat[at + 1..])
        .ok_or_else(|| io::Error::other("no ')' in stat"))?;
    after
        .split_whitespace()
        .nth(19)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| io::Error::other("no start time in stat"))
}

/// `SO_PEERCRED` read as the kernel gives it (a pid of 0 when the peer is not visible in our
/// pid namespace, which a non-zero pid type could not hold).
fn peer_cred(sock: &impl AsFd) -> io::Result<(i32, u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred and `len` its size, as SO_PEERCRED expects; the
    // descriptor is borrowed for the call.
    let r = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid, cred.gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ends_of_a_pair_in_one_process_are_the_same() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let me = Identity::of_self().unwrap();
        let peer = Identity::of_peer(&a).unwrap();
        assert_eq!(me.differences(&peer), None);
        assert!(peer.still_there());
    }

    #[test]
    fn a_difference_is_named() {
        let me = Identity::of_self().unwrap();
        let mut other = me.clone();
        other.confinement[6] = "NoNewPrivs: 1".into();
        let why = me.differences(&other).unwrap();
        assert!(why.contains("NoNewPrivs"), "{why}");
        assert!(other.confined().is_some());
        let mut other = me.clone();
        other.namespaces[1] = "net:[1]".into();
        assert!(me.differences(&other).unwrap().contains("net namespace"));
        let mut other = me.clone();
        other.start += 1;
        assert!(!other.still_there());
    }
}
