//! The control socket, the init's fd 0: the runtime's prelude and plan come in on it, one
//! JSON line each, and the status lines (`ready`, `exit`, `error`, `initExit`) go back on it.

use serde_json::{json, Value};

use crate::plan::{InitPlan, Prelude, WarmPlan, PLAN_VERSION};
use crate::sys::{self, SysError, SysResult};

/// The control/status socket the runtime passes as stdin.
pub(crate) const CONTROL_FD: libc::c_int = 0;

pub(crate) fn report(value: Value) {
    let mut line = value.to_string();
    line.push('\n');
    // Nothing useful can be done if the runtime is gone; P0 notices EOF separately.
    let _ = sys::write_all_fd(CONTROL_FD, line.as_bytes());
}

pub(crate) fn report_error(stage: &str, err: &SysError) {
    report(json!({
        "event": "error",
        "stage": stage,
        "errno": err.errno,
        "message": err.to_string(),
    }));
}

/// Fd 0 read line by line: the prelude, then the plan; what follows the plan (control bytes
/// sent early) is kept for `supervise`.
#[derive(Default)]
pub(crate) struct ControlReader {
    pub(crate) buf: Vec<u8>,
}

impl ControlReader {
    /// The next line, without its newline.
    fn line(&mut self, what: &str) -> Result<Vec<u8>, String> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let rest = self.buf.split_off(pos + 1);
                let mut line = std::mem::replace(&mut self.buf, rest);
                line.pop();
                return Ok(line);
            }
            if self.buf.len() > 64 << 20 {
                return Err(format!("the {what} exceeds 64 MiB"));
            }
            // SAFETY: `chunk` is a valid writable buffer of the given length.
            let n = unsafe { libc::read(CONTROL_FD, chunk.as_mut_ptr().cast(), chunk.len()) };
            if n < 0 {
                if sys::errno() == libc::EINTR {
                    continue;
                }
                return Err(format!(
                    "reading the {what}: {}",
                    std::io::Error::last_os_error()
                ));
            }
            if n == 0 {
                return Err(format!(
                    "the runtime closed the control socket before sending the {what}"
                ));
            }
            self.buf.extend_from_slice(&chunk[..n as usize]);
        }
    }

    pub(crate) fn prelude(&mut self) -> Result<Prelude, String> {
        let line = self.line("prelude")?;
        // The version first: a prelude from another build may not parse as ours at all, and
        // "another build" is what the user needs to hear.
        #[derive(serde::Deserialize)]
        struct Version {
            version: u32,
        }
        let version = serde_json::from_slice::<Version>(&line)
            .map_err(|e| format!("the prelude is not valid: {e}"))?
            .version;
        if version != PLAN_VERSION {
            return Err(format!(
                "plan version {version} but this init speaks {PLAN_VERSION}: the init binary is from another build of smithers-sandbox than the runtime (rebuild it, or remove a stale smithers-sandbox-init next to the runtime, or point ${} at the right one)",
                crate::plan::INIT_ENV
            ));
        }
        serde_json::from_slice(&line).map_err(|e| format!("the prelude is not valid: {e}"))
    }

    /// The plan's line, unparsed: P1 parses it (see `start`).
    pub(crate) fn plan(&mut self) -> Result<Vec<u8>, String> {
        self.line("plan")
    }
}

/// A warm P1's read of its step's plan: the next line of fd 0, not a byte further (what
/// follows, a `k`, is P0's to read). Peeks to find the newline, then reads up to it.
pub(crate) fn read_step_line() -> Result<Vec<u8>, String> {
    let mut line = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: `chunk` is a valid writable buffer of the given length.
        let n = unsafe {
            libc::recv(
                CONTROL_FD,
                chunk.as_mut_ptr().cast(),
                chunk.len(),
                libc::MSG_PEEK,
            )
        };
        if n < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            return Err(format!(
                "reading the step's plan: {}",
                std::io::Error::last_os_error()
            ));
        }
        if n == 0 {
            return Err("the runtime closed the warm sandbox without a step".to_string());
        }
        let peeked = &chunk[..n as usize];
        let (take, whole) = match peeked.iter().position(|b| *b == b'\n') {
            Some(pos) => (pos + 1, true),
            None => (peeked.len(), false),
        };
        let mut got = 0;
        while got < take {
            // SAFETY: the range lies within `chunk`.
            let r =
                unsafe { libc::read(CONTROL_FD, chunk[got..take].as_mut_ptr().cast(), take - got) };
            if r < 0 && sys::errno() == libc::EINTR {
                continue;
            }
            if r <= 0 {
                return Err("reading the step's plan: the socket ended".to_string());
            }
            got += r as usize;
        }
        line.extend_from_slice(&chunk[..take]);
        if whole {
            line.pop();
            return Ok(line);
        }
        if line.len() > 64 << 20 {
            return Err("the step's plan exceeds 64 MiB".to_string());
        }
    }
}

pub(crate) fn parse_plan(line: &[u8]) -> Result<InitPlan, String> {
    serde_json::from_slice(line).map_err(|e| format!("the plan is not valid: {e}"))
}

/// The command of a plan sent with [`crate::plan::InitPlan::exec_follows`].
pub(crate) fn parse_exec(line: &[u8]) -> Result<crate::plan::ExecSpec, String> {
    serde_json::from_slice(line).map_err(|e| format!("the command is not valid: {e}"))
}

pub(crate) fn parse_warm_plan(line: &[u8]) -> Result<WarmPlan, String> {
    serde_json::from_slice(line).map_err(|e| format!("the warm plan is not valid: {e}"))
}

pub(crate) fn report_plan_error(message: String) -> i32 {
    report(json!({"event": "error", "stage": "plan", "errno": 0, "message": message}));
    1
}

pub(crate) type StageResult<T> = Result<T, (&'static str, SysError)>;

pub(crate) fn stage<T>(name: &'static str, r: SysResult<T>) -> StageResult<T> {
    r.map_err(|e| (name, e))
}
