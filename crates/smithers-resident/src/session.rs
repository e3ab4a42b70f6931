//! What a held session's clients and its holder say to each other over the holder's socket
//! (the CLI's `session` verbs, its MCP server, the benchmark).
//!
//! The socket is `<sessions dir>/<id>.sock`, in a directory only this user can enter
//! ([`crate::place::sessions_dir`]): whoever reaches it is this user. A client
//! connects, sends one request (a JSON object on one line, at most [`MAX_REQUEST`] bytes) with
//! its stdin, stdout and stderr attached as descriptors where the request moves bytes (so a
//! command's output goes to exactly where the client's would, never through a copy in
//! between), and reads one JSON line back: the answer. A client that goes away before the
//! answer cancels what it asked for.

use std::io::{BufRead, BufReader, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};

/// The most descriptors a request carries (stdin, stdout, stderr).
pub const MAX_FDS: usize = 3;

/// The largest request line (argv and env included).
pub const MAX_REQUEST: usize = 256 << 10;
/// The largest answer line.
pub const MAX_ANSWER: usize = 1 << 20;

/// One request to a holder.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// Is the session there, and what is it.
    Ping,
    /// Run a command; descriptors: stdin (or none: `/dev/null`), stdout, stderr.
    #[serde(rename_all = "camelCase")]
    Exec {
        argv: Vec<String>,
        cwd: Option<String>,
        env: Vec<(String, String)>,
        timeout_ms: Option<u64>,
        /// Whether the first descriptor is the command's stdin.
        stdin: bool,
        /// On a terminal of its own of this size (rows, columns): then the descriptors are
        /// the keys typed into it, where what it shows goes, and its later sizes (4 bytes
        /// each: rows, columns, big-endian).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        terminal: Option<[u16; 2]>,
    },
    /// A file's bytes to the client's stdout (descriptors: stdout, stderr).
    Read { path: String },
    /// The client's stdin into a file (descriptors: stdin, stderr).
    Write { path: String },
    /// The change so far, collected into a bundle of its own (`bundlePath` in the answer);
    /// the session's own bundle is made at its end.
    Diff,
    /// End the session; the answer is its outcome (the review it opened).
    Stop,
    /// Freeze the workspace as it is now (`checkpoint` in the answer: its name).
    Checkpoint,
    /// Put the workspace back to a checkpoint of this session.
    Restore { checkpoint: String },
    /// What a fork starts from: the layers of `checkpoint`, or of one made now, and how
    /// this session was started (`layers`, `checkpoint`, `startOptions`, `rootDir`).
    Fork { checkpoint: Option<String> },
}

/// The session's state, as a ping answers it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    pub session_id: String,
    pub run_id: String,
    pub root_dir: PathBuf,
    pub runtime: String,
    pub pid: u32,
    pub started_ms: i64,
    pub execs: u64,
    pub running: u64,
    pub idle_timeout_ms: u64,
}

/// Where the sockets of this user's sessions are, made if asked.
pub fn sessions_dir(create: bool) -> std::io::Result<PathBuf> {
    crate::place::sessions_dir(create)
}

/// Sends `request` with `fds` attached, on a new connection to `socket`.
pub fn send(
    socket: &std::path::Path,
    request: &Request,
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<UnixStream> {
    let stream = UnixStream::connect(socket)?;
    let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    line.push(b'\n');
    if line.len() > MAX_REQUEST {
        return Err(std::io::Error::other(format!(
            "the request is {} bytes, over the {MAX_REQUEST} a session takes",
            line.len()
        )));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other(
            "too many descriptors for one request",
        ));
    }
    let sent = sendmsg(
        &stream,
        &[IoSlice::new(&line)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    // A stream socket may take the line in parts: the descriptors went with the first.
    (&stream).write_all(&line[sent..])?;
    Ok(stream)
}

/// Reads one request and the descriptors that came with it. Bounded: a line over
/// [`MAX_REQUEST`], or more than [`MAX_FDS`] descriptors, is refused.
pub fn receive(stream: &UnixStream) -> Result<(Request, Vec<OwnedFd>), String> {
    let mut buf = vec![0u8; 64 << 10];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| format!("reading the request: {e}"))?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    // (The control buffer is rounded up, so more than MAX_FDS can arrive untruncated.)
    if got.flags.contains(rustix::net::ReturnFlags::CTRUNC) || fds.len() > MAX_FDS {
        return Err("the request carried more descriptors than a request has".into());
    }
    if got.bytes == 0 {
        return Err("the client sent nothing".into());
    }
    let mut line = buf[..got.bytes].to_vec();
    while !line.ends_with(b"\n") {
        if line.len() > MAX_REQUEST {
            return Err(format!("the request is over {MAX_REQUEST} bytes"));
        }
        let n = (&*stream)
            .read(&mut buf)
            .map_err(|e| format!("reading the request: {e}"))?;
        if n == 0 {
            return Err("the request ended before its end of line".into());
        }
        line.extend_from_slice(&buf[..n]);
    }
    let request = serde_json::from_slice(&line).map_err(|e| format!("the request: {e}"))?;
    Ok((request, fds))
}

/// Writes one answer line.
pub fn answer(stream: &UnixStream, value: &serde_json::Value) -> std::io::Result<()> {
    let mut line = value.to_string().into_bytes();
    line.push(b'\n');
    (&*stream).write_all(&line)
}

/// Reads the answer line (bounded).
pub fn read_answer(stream: &UnixStream) -> std::io::Result<serde_json::Value> {
    let mut line = Vec::new();
    BufReader::new(stream.take(MAX_ANSWER as u64)).read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the session ended without answering",
        ));
    }
    serde_json::from_slice(&line).map_err(std::io::Error::other)
}

/// A refusal or failure, as an answer: `{ok: false, error: {code, message, details}}` (the
/// codes are the CLI's stable ones).
pub fn error_json(code: &str, message: &str, details: serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "ok": false, "error": { "code": code, "message": message, "details": details } })
}

/// The sessions directory's admission lock (`.admission.lock`), held (exclusive `flock`)
/// until the returned file is closed: holders starting at once count the user's sessions one
/// after another.
pub fn admission_lock(dir: &std::path::Path) -> std::io::Result<std::fs::File> {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".admission.lock"))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)?;
    Ok(lock)
}
