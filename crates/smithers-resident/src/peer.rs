//! Who is at the other end of the socket, as both ends check it.
//!
//! A step served by the service runs with the service's credentials, namespaces, root and
//! confinement. So the service serves a client only when these are the client's own, and the
//! client hands its request (its environment, its stdio, a descriptor of its working
//! directory) only to a service whose are its own: a process of the same user in a container
//! that shares `/tmp` or `$XDG_RUNTIME_DIR` could otherwise bind the socket's name and receive
//! them.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// The namespaces both ends must share: a step served sees the service's file systems,
/// network, users, processes and cgroups.
const NAMESPACES: &[&str] = &["mnt", "net", "user", "pid", "ipc", "uts", "cgroup"];

/// The lines of `/proc/<pid>/status` that say what a process may do: its groups, its
/// capabilities, and whether it is confined (no_new_privs; a seccomp filter). A Landlock
/// domain shows in none of them (a process with `CAP_SYS_ADMIN` enters one without
/// no_new_privs): that is what a [`Challenge`] answers.
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
    /// (a seccomp filter's rules are not visible; no_new_privs, which an ordinary user's
    /// Landlock domain needs): such a client runs its step itself, within its confinement.
    /// A Landlock domain entered without no_new_privs is caught by the [`Challenge`].
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

/// The length of a proof: a 128-bit nonce in hexadecimal.
pub const PROOF_LEN: usize = 32;

/// A challenge's descriptor is named this, then its nonce.
const PROOF_NAME: &str = "smithers-resident-proof:";

/// The service's question to one client: "what is the name of my descriptor `n`?"
///
/// Everything else a client is compared on is in `/proc`; its Landlock domain is not, and a
/// process with `CAP_SYS_ADMIN` (root) enters one without no_new_privs, so a confined root
/// client looks exactly like its service. A step served for it would run with the service's
/// access (a `--mount` of what its domain forbids it, say). What the kernel does enforce is a
/// domain's rule for inspecting other processes: a process in a Landlock domain gets no ptrace
/// access, in any mode, to a process outside it (the tracer's domain must be the tracee's or
/// one of its ancestors). Reading the link `/proc/<pid>/fd/<n>` needs that access
/// (`PTRACE_MODE_READ_FSCREDS`), which a process of the same user, capabilities and label
/// otherwise has, and which Yama leaves alone (its `ptrace_scope` restricts attaching only).
///
/// So the service makes, per connection, an empty memfd whose name holds a fresh random nonce
/// and tells the client its descriptor's number; the client reads the link and sends the
/// nonce back. A client that can is in the service's Landlock domain or an ancestor of it: it
/// may do at least what the service may. One that cannot (a narrower domain, or a security
/// module that keeps it from inspecting the service) is declined and runs its step itself,
/// inside its confinement. The memfd is closed with the challenge, once answered.
#[derive(Debug)]
pub struct Challenge {
    memfd: OwnedFd,
    nonce: [u8; PROOF_LEN],
}

impl Challenge {
    /// A challenge with a fresh nonce (`getrandom`: nothing a client saw before predicts it).
    pub fn new() -> io::Result<Challenge> {
        let mut random = [0u8; PROOF_LEN / 2];
        // SAFETY: `random` is a writable buffer of exactly the length given; with no flags
        // getrandom blocks only until the kernel's pool is first initialised (at boot).
        let got = unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
        if got != random.len() as isize {
            return Err(io::Error::last_os_error());
        }
        let mut nonce = [0u8; PROOF_LEN];
        for (pair, byte) in nonce.chunks_exact_mut(2).zip(random) {
            pair[0] = HEX[usize::from(byte >> 4)];
            pair[1] = HEX[usize::from(byte & 0xf)];
        }
        let mut name = PROOF_NAME.as_bytes().to_vec();
        name.extend_from_slice(&nonce);
        // Close-on-exec: the processes a step starts never hold it.
        let memfd = rustix::fs::memfd_create(name.as_slice(), rustix::fs::MemfdFlags::CLOEXEC)?;
        Ok(Challenge { memfd, nonce })
    }

    /// The descriptor's number in the service, which the client is told.
    pub fn descriptor(&self) -> i32 {
        self.memfd.as_raw_fd()
    }

    /// Whether `proof` is the nonce. Compared in constant time: how long a wrong guess takes
    /// says nothing about how much of it was right.
    pub fn verify(&self, proof: &[u8]) -> bool {
        if proof.len() != PROOF_LEN {
            return false;
        }
        let diff = self
            .nonce
            .iter()
            .zip(proof)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The client's answer to a challenge: the nonce in the name of descriptor `fd` of process
/// `pid` (the service). An error when the link cannot be read (the client may not inspect the
/// service) or is not a challenge's.
pub fn answer_challenge(pid: i32, fd: i32) -> io::Result<[u8; PROOF_LEN]> {
    use std::os::unix::ffi::OsStrExt;
    let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))?;
    let link = link.as_os_str().as_bytes();
    // The link reads `/memfd:<name> (deleted)`.
    let nonce = link
        .windows(PROOF_NAME.len())
        .position(|w| w == PROOF_NAME.as_bytes())
        .and_then(|at| link.get(at + PROOF_NAME.len()..at + PROOF_NAME.len() + PROOF_LEN))
        .ok_or_else(|| {
            io::Error::other(format!("descriptor {fd} of process {pid} is no challenge"))
        })?;
    let mut proof = [0u8; PROOF_LEN];
    proof.copy_from_slice(nonce);
    Ok(proof)
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
    fn a_challenge_is_answered_by_reading_its_descriptor_and_only_so() {
        let challenge = Challenge::new().unwrap();
        let me = std::process::id() as i32;
        let proof = answer_challenge(me, challenge.descriptor()).unwrap();
        assert!(challenge.verify(&proof));
        assert!(!challenge.verify(&crate::wire::NO_PROOF));
        assert!(!challenge.verify(&proof[1..]));
        let mut wrong = proof;
        wrong[PROOF_LEN - 1] ^= 1;
        assert!(!challenge.verify(&wrong));
        // Every challenge has its own nonce.
        let other = Challenge::new().unwrap();
        assert!(!other.verify(&proof));
        // A descriptor that is not a challenge's answers nothing.
        let file = std::fs::File::open("/").unwrap();
        assert!(answer_challenge(me, file.as_raw_fd()).is_err());
    }

    /// What the service relies on: a process in a Landlock domain of its own cannot read the
    /// link of a descriptor of a process outside its domain, whatever the domain forbids (here
    /// only executing files; no root needed: no_new_privs first). A process, not a thread: a
    /// thread always has access to its own process, before any security module is asked.
    #[test]
    fn a_landlocked_process_cannot_answer_a_challenge() {
        let challenge = Challenge::new().unwrap();
        let (me, fd) = (std::process::id() as i32, challenge.descriptor());
        let path = std::ffi::CString::new(format!("/proc/{me}/fd/{fd}")).unwrap();
        match read_link_landlocked(&path) {
            Err(why) => {
                smithers_test_support::skip_or_fail(&format!("Landlock is not available: {why}"));
            }
            Ok(errno) => assert_eq!(errno, libc::EACCES),
        }
        // Outside the domain, the same read works.
        assert!(challenge.verify(&answer_challenge(me, fd).unwrap()));
    }

    /// The errno of `readlink(path)` in a child process that first puts itself in a Landlock
    /// domain forbidding only executing files (0 when it read the link).
    fn read_link_landlocked(path: &std::ffi::CStr) -> Result<i32, String> {
        #[repr(C)]
        struct RulesetAttr {
            handled_access_fs: u64,
        }
        const LANDLOCK_ACCESS_FS_EXECUTE: u64 = 1;
        const NO_LANDLOCK: i32 = 200;
        let attr = RulesetAttr {
            handled_access_fs: LANDLOCK_ACCESS_FS_EXECUTE,
        };
        // SAFETY: the child makes system calls only (no allocation, no lock: the test process
        // has other threads), on memory prepared before the fork, and ends with _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: as above; `attr` and `path` live through the calls, which read them.
            unsafe {
                let ruleset = libc::syscall(
                    libc::SYS_landlock_create_ruleset,
                    &attr as *const RulesetAttr,
                    std::mem::size_of::<RulesetAttr>(),
                    0u32,
                );
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || ruleset < 0
                    || libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) != 0
                {
                    libc::_exit(NO_LANDLOCK);
                }
                let mut buf = [0u8; 256];
                let n = libc::readlink(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
                let errno = *libc::__errno_location();
                libc::_exit(if n >= 0 {
                    0
                } else {
                    errno.min(NO_LANDLOCK - 1)
                });
            }
        }
        if child < 0 {
            return Err(format!("fork: {}", io::Error::last_os_error()));
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked; `status` is writable.
        if unsafe { libc::waitpid(child, &mut status, 0) } != child || !libc::WIFEXITED(status) {
            return Err("the child did not exit".into());
        }
        match libc::WEXITSTATUS(status) {
            NO_LANDLOCK => Err("landlock_create_ruleset or landlock_restrict_self failed".into()),
            errno => Ok(errno),
        }
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
