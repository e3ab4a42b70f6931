//! P1 of a session and its spawners. A command is started by a **spawner**, a child of P1
//! confined as a step's P1 is (Landlock, then seccomp; see
//! [`crate::privileges::confine_spawner`]), which serves the exec channel ([`super::serve`]).
//! P1 itself only reaps and waits: for its spawner's end, and, after a `handover` (a layer
//! flip under way: the runtime swaps the overlay at `/workspace`), for the `respawn`, when it
//! starts the next spawner, whose Landlock rules are made over the new mount (rules are bound
//! to the mount they were made on, so the old spawner's would refuse every write to the new
//! one). Any other end of a spawner ends the sandbox: every process killed, P1 gone.

use std::os::fd::{AsRawFd, OwnedFd};

use super::{LibcHost, HANDED_OVER};
use crate::control::{report, report_error};
use crate::plan::{InitPlan, SessionReport, SessionRequest, MAX_SESSION_MESSAGE};
use crate::privileges::confine_spawner;
use crate::sys;

/// P1 of a session once set up (privileges dropped, see
/// [`crate::privileges::restrict_session_init`]). Returns P1's exit code.
pub(crate) fn serve_as_init(channel: OwnedFd, plan: &InitPlan) -> i32 {
    // The first spawner reports `ready` (as a step's P1 does); each later one answers the
    // `respawn` that started it.
    let mut answer: Option<u64> = None;
    loop {
        // SAFETY: P1 is single-threaded (the init refuses to start otherwise); the child runs
        // the spawner and exits, never returning here.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            report_error(
                "session",
                &sys::SysError {
                    op: "fork the spawner".into(),
                    errno: sys::errno(),
                },
            );
            break;
        }
        if pid == 0 {
            std::process::exit(run_spawner(&channel, plan, answer));
        }
        if wait_for(pid) != Some(HANDED_OVER) {
            break;
        }
        match await_respawn(&channel) {
            Some(id) => {
                // The handover held every process still; P1, in whose domain they all are,
                // lets them go (the next spawner's domain is not theirs).
                // SAFETY: kill(-1) from pid 1 reaches every other process of the namespace.
                unsafe { libc::kill(-1, libc::SIGCONT) };
                answer = Some(id);
            }
            None => break,
        }
    }
    kill_all_and_reap();
    0
}

/// The spawner: confined, then serving the channel. Returns its exit code.
fn run_spawner(channel: &OwnedFd, plan: &InitPlan, answer: Option<u64>) -> i32 {
    let ready = match confine_spawner(plan) {
        Ok(ready) => ready,
        Err((stage, err)) => {
            match answer {
                None => report_error(stage, &err),
                Some(id) => send(
                    channel,
                    &SessionReport::Refused {
                        id: Some(id),
                        message: format!("the new spawner could not be confined: {err}"),
                    },
                ),
            }
            return 1;
        }
    };
    let Ok(ours) = channel.try_clone() else {
        return 1;
    };
    let mut host = match LibcHost::new(ours) {
        Ok(h) => h,
        Err(e) => {
            report_error("session", &e);
            return 1;
        }
    };
    match answer {
        None => report(ready),
        Some(id) => {
            // The processes the handover held still go on.
            // SAFETY: kill(-1) reaches every process of the sandbox's pid namespace but P1
            // and this one.
            unsafe { libc::kill(-1, libc::SIGCONT) };
            send(channel, &SessionReport::Respawned { id });
        }
    }
    super::serve(&mut host)
}

/// Waits for the spawner `pid` to end, reaping every orphan meanwhile; its exit code (`None`
/// when killed, or waiting failed).
fn wait_for(pid: libc::pid_t) -> Option<i32> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if r == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if r < 0 && sys::errno() != libc::EINTR {
            return None;
        }
    }
}

/// After a handover, P1 reads the channel itself: the `respawn`'s id, or `None` for a stop,
/// the channel's end or a failure (anything else asked meanwhile is refused: the runtime
/// sends nothing else between the two).
fn await_respawn(channel: &OwnedFd) -> Option<u64> {
    let mut buf = vec![0u8; MAX_SESSION_MESSAGE];
    loop {
        let datagram = match crate::channel::recv(channel.as_raw_fd(), &mut buf, 0) {
            Ok(Some(d)) => d,
            Ok(None) | Err(_) => return None,
        };
        match serde_json::from_slice::<SessionRequest>(&datagram.bytes) {
            Ok(SessionRequest::Respawn { id }) => return Some(id),
            Ok(SessionRequest::Stop) => {
                kill_all_and_reap();
                send(channel, &SessionReport::Stopped);
                return None;
            }
            Ok(request) => send(
                channel,
                &SessionReport::Refused {
                    id: request_id(&request),
                    message: "the session is being handed over; only a respawn or a stop now"
                        .into(),
                },
            ),
            Err(e) => send(
                channel,
                &SessionReport::Refused {
                    id: None,
                    message: format!("a request that is not valid: {e}"),
                },
            ),
        }
    }
}

fn request_id(request: &SessionRequest) -> Option<u64> {
    match request {
        SessionRequest::Exec { id, .. }
        | SessionRequest::Signal { id, .. }
        | SessionRequest::Pause { id }
        | SessionRequest::Resume { id }
        | SessionRequest::Handover { id }
        | SessionRequest::Respawn { id } => Some(*id),
        SessionRequest::Stop => None,
    }
}

fn send(channel: &OwnedFd, report: &SessionReport) {
    let bytes = serde_json::to_vec(report).unwrap_or_default();
    // SAFETY: sends a valid buffer; MSG_NOSIGNAL: a runtime that is gone is an EPIPE.
    let _ = unsafe {
        libc::send(
            channel.as_raw_fd(),
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_NOSIGNAL,
        )
    };
}

/// The sandbox's end: every process but P1 killed and reaped.
fn kill_all_and_reap() {
    // SAFETY: kill(-1) from pid 1 of the pid namespace reaches every other process in it.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    loop {
        // SAFETY: waitpid with a null status pointer.
        let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::__WALL) };
        if r < 0 && sys::errno() != libc::EINTR {
            break;
        }
    }
}
