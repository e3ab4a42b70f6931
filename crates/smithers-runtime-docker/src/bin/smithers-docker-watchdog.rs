//! Kills a sandbox container when the process that runs it dies.
//!
//! `smithers-docker-watchdog SOCKET CONTAINER_ID`, started by the docker runtime for each
//! `execute` with a pipe as stdin and in a process group of its own (a Ctrl-C or a group kill
//! of the orchestrator does not reach it). The engine keeps containers running whatever
//! happens to their client, so without this a `kill -9` of the orchestrator would leave the
//! step running. When stdin ends without the line `done` (the orchestrator died: the kernel
//! closed its end of the pipe), the watchdog asks the engine to SIGKILL the container, whose
//! init takes every process of its pid namespace with it. `done` means the runtime saw the
//! container stop; the watchdog then exits quietly.
//!
//! Std only, one plain HTTP/1.0 request on the unix socket: it must start in a millisecond
//! and depend on nothing that could fail at the moment it matters.
#![forbid(unsafe_code)]

use std::io::{BufRead, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(socket), Some(id)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: smithers-docker-watchdog SOCKET CONTAINER_ID");
        std::process::exit(2);
    };
    // Container ids are hex; refuse anything that could bend the request line.
    if id.is_empty()
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
    {
        eprintln!("smithers-docker-watchdog: invalid container id {id:?}");
        std::process::exit(2);
    }
    let mut line = String::new();
    let stdin = std::io::stdin();
    let mut lock = stdin.lock();
    loop {
        line.clear();
        match lock.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line.trim() == "done" => return,
            Ok(_) => {}
        }
    }
    for attempt in 0..5 {
        match kill(socket, id) {
            Ok(()) => return,
            Err(e) => {
                eprintln!("smithers-docker-watchdog: kill {id} (attempt {attempt}): {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    std::process::exit(1);
}

fn kill(socket: &str, id: &str) -> std::io::Result<()> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "POST /containers/{id}/kill?signal=KILL HTTP/1.0\r\nHost: docker\r\nContent-Length: 0\r\n\r\n"
    )?;
    let mut response = String::new();
    s.take(64 * 1024).read_to_string(&mut response)?;
    let status = response.split_whitespace().nth(1).unwrap_or("");
    // 204 killed; 404 already removed; 409 not running: all mean nothing runs any more.
    if matches!(status, "204" | "404" | "409") {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "engine answered {:?}",
            response.lines().next().unwrap_or("")
        )))
    }
}
