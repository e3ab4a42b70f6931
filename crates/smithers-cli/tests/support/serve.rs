//! A real `smithers-sandbox serve` child process on 127.0.0.1:0: the sandbox host, out of the
//! test process, for the tests that talk to it as remote clients (codeplane suites, load).
//! Its stderr is drained into a buffer (shown when something fails); it is stopped with
//! SIGTERM (a graceful drain) when dropped, and dies with the thread that spawned it
//! (`PR_SET_PDEATHSIG`), so a killed test run leaves no server behind.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// How to start the server.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    pub token: String,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// Extra arguments after `serve` (`--orphan-timeout-ms`, ...).
    pub args: Vec<String>,
    /// Extra environment (e.g. `TMPDIR`, so the native runtime's state is where we look).
    pub env: Vec<(String, String)>,
    /// A command the server is started through (`ip netns exec NAME`), which must exec it
    /// (so the pid and the death signal stay the server's).
    pub wrapper: Vec<String>,
}

/// A running server.
#[derive(Debug)]
pub struct ServeChild {
    pub addr: SocketAddr,
    pub pid: u32,
    child: Option<Child>,
    stderr: Arc<Mutex<String>>,
}

impl ServeChild {
    /// Starts the server and waits (bounded) for it to print its address.
    pub fn start(options: &ServeOptions) -> Result<ServeChild, String> {
        let bin = env!("CARGO_BIN_EXE_smithers-sandbox");
        let mut cmd = match options.wrapper.split_first() {
            None => Command::new(bin),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
        };
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&options.data_dir)
            .args(&options.args)
            .env("SMITHERS_SANDBOX_TOKEN", &options.token)
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec and only calls
        // async-signal-safe functions (prctl, getppid, _exit); it touches no locks or heap.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before the prctl took effect.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start smithers-sandbox serve: {e}"))?;
        let pid = child.id();
        let pipe = child.stderr.take().expect("piped stderr");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel::<SocketAddr>();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("serving on http://").nth(1) {
                    if let (Some(tx), Some(addr)) = (
                        tx.take(),
                        rest.split_whitespace()
                            .next()
                            .and_then(|a| a.parse::<SocketAddr>().ok()),
                    ) {
                        let _ = tx.send(addr);
                    }
                }
                let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                // Bounded: keep the first and the latest lines of a chatty server.
                if s.len() > 256 * 1024 {
                    s.truncate(128 * 1024);
                    s.push_str("\n[... stderr truncated ...]\n");
                }
                s.push_str(&line);
                s.push('\n');
            }
        });
        let mut server = ServeChild {
            addr: "127.0.0.1:0".parse().expect("addr"),
            pid,
            child: Some(child),
            stderr,
        };
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(addr) => {
                server.addr = addr;
                Ok(server)
            }
            Err(_) => {
                let status = server.stop();
                Err(format!(
                    "smithers-sandbox serve printed no address ({status:?}):\n{}",
                    server.stderr()
                ))
            }
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What the server printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// SIGTERM, then waits for the exit (the server drains: running steps get its grace).
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        child.wait().ok()
    }

    /// Hands the process over to be kept alive elsewhere (see [`keep_for_process`]).
    fn into_child(mut self) -> Child {
        self.child.take().expect("running child")
    }
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts a server for the rest of this test process: spawned from a thread that lives as long
/// as the process (the parent-death signal follows the spawning thread, and test threads end
/// with their test), so the server is stopped with SIGTERM only when the test binary exits.
pub fn keep_for_process(options: ServeOptions) -> Result<(SocketAddr, u32), String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || match ServeChild::start(&options) {
        Ok(server) => {
            let info = (server.addr, server.pid);
            let mut child = server.into_child();
            let _ = tx.send(Ok(info));
            let _ = child.wait();
        }
        Err(e) => {
            let _ = tx.send(Err(e));
        }
    });
    rx.recv()
        .map_err(|_| "the server keeper thread died".to_string())?
}

/// A data directory under `base` for a server of this process: `<prefix>-<pid>`. Leftovers of
/// earlier test processes that are gone are removed first.
pub fn data_dir(base: &Path, prefix: &str) -> PathBuf {
    if let Ok(entries) = std::fs::read_dir(base) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let stale = name
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_prefix('-'))
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
            if stale {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = base.join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}
