//! What a client and the service exchange over the socket.
//!
//! The client sends one frame: a 4-byte little-endian length, then fields, each a 4-byte
//! length and its bytes: the protocol, the build, the kind of request, then for `run` the
//! umask, the arguments and the environment. With it go four descriptors (`SCM_RIGHTS`):
//! stdin, stdout, stderr and the working directory (for `status` and `stop`, none). The
//! service speaks with lines:
//!
//! | service → client | meaning |
//! |---|---|
//! | `prove <n>` | first, as soon as the client is accepted: the client reads the link `/proc/<service>/fd/<n>` and sends back the nonce it names ([`crate::peer::Challenge`]) |
//! | `no <reason>` | declined: the client runs the step itself |
//! | `ok` | admitted: the service waits for the client's `g` (go) before it starts |
//! | `exit <n>` | the step is over; the client exits with `n` |
//! | `status <json>` | the answer to `status` |
//!
//! The client sends its frame at once, without waiting for the `prove` line (the service
//! writes it while the client sends), then its proof: [`PROOF_LEN`] bytes, the nonce, or as
//! many `-` when it could not read it. The service reads the frame, then the proof, and
//! declines a wrong one before anything else. Then the client sends single bytes: `g` (go)
//! once, then `i` for a Ctrl-C. The service reads a closed connection as a cancellation. The
//! `g` closes a race: a client that gave up waiting for the answer closes the socket, and a
//! request that was never confirmed is never started.
//!
//! Everything read is bounded before it is read (the frame, each field, their number, each
//! answer line), the frame is read to its length and no further (the proof follows it), and
//! a frame must carry exactly the descriptors its kind has.

use std::ffi::{OsStr, OsString};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// The protocol's name and version: a client and service of different versions never meet
/// (it is part of the socket's name too), and a frame of another one is declined.
pub const PROTOCOL: &str = "smithers-resident/2";

/// The service's first line to a client it accepted: `prove <n>`.
pub const PROVE: &str = "prove";

pub use crate::peer::PROOF_LEN;

/// The proof of a client that could not read the challenge: it is declined, with the reason.
pub const NO_PROOF: [u8; PROOF_LEN] = [b'-'; PROOF_LEN];

/// The largest frame: argv and environment together (Linux's own limit for both is about
/// 2 MiB by default).
pub const MAX_FRAME: usize = 4 << 20;
/// The most fields a frame may have.
const MAX_FIELDS: usize = 1 << 16;
/// The longest answer line.
pub const MAX_LINE: usize = 64 << 10;
/// The descriptors a `run` request carries: stdin, stdout, stderr, working directory.
pub const RUN_FDS: usize = 4;

/// A request.
#[derive(Debug)]
pub enum Ask {
    Run(RunRequest),
    Status,
    Stop,
}

/// A client's `run`: what the service needs to run it as the client would have.
#[derive(Debug)]
pub struct RunRequest {
    /// The whole command line, argv\[0\] included.
    pub argv: Vec<OsString>,
    /// `KEY=VALUE` entries, in the client's order.
    pub env: Vec<OsString>,
    pub umask: u32,
    /// stdin, stdout, stderr, the working directory.
    pub fds: Vec<OwnedFd>,
}

/// A frame as the client builds it.
#[derive(Debug)]
pub struct Frame {
    bytes: Vec<u8>,
}

impl Frame {
    fn new(build: &str, kind: &str) -> Frame {
        let mut f = Frame { bytes: vec![0; 4] };
        f.field(PROTOCOL.as_bytes());
        f.field(build.as_bytes());
        f.field(kind.as_bytes());
        f
    }

    /// `status` or `stop`.
    pub fn control(build: &str, kind: &str) -> Frame {
        Frame::new(build, kind)
    }

    /// A `run`.
    pub fn run<A: AsRef<OsStr>>(build: &str, argv: &[A], env: &[OsString], umask: u32) -> Frame {
        let mut f = Frame::new(build, "run");
        f.field(umask.to_string().as_bytes());
        f.field(argv.len().to_string().as_bytes());
        for a in argv {
            f.field(a.as_ref().as_bytes());
        }
        for e in env {
            f.field(e.as_bytes());
        }
        f
    }

    fn field(&mut self, bytes: &[u8]) {
        self.bytes
            .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(bytes);
    }

    /// Sends the frame with `fds` attached to its first byte. A frame over [`MAX_FRAME`] is
    /// not sent (the service would refuse it).
    pub fn send(mut self, sock: &UnixStream, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if self.bytes.len() > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the request is {} bytes, over the {MAX_FRAME} a request may have",
                    self.bytes.len()
                ),
            ));
        }
        let len = (self.bytes.len() - 4) as u32;
        self.bytes[..4].copy_from_slice(&len.to_le_bytes());
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(RUN_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(io::Error::other("too many descriptors for one request"));
        }
        let sent = sendmsg(
            sock,
            &[IoSlice::new(&self.bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        // A stream socket may take a large frame in parts: the descriptors went with the
        // first, the rest follows plainly.
        (&*sock).write_all(&self.bytes[sent..])
    }
}

/// Reads one request: the frame, bounded, and its descriptors, which must be exactly those
/// its kind carries. `build`: ours; a frame of another build or protocol is an error.
pub fn read_request(sock: &UnixStream, build: &str) -> Result<Ask, String> {
    // The length alone first, with the descriptors (they come with the frame's first byte):
    // a read of more could take in the proof that follows the frame.
    let mut head = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(RUN_FDS + 1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut head)],
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
    if got.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err("the request carried more descriptors than any request has".into());
    }
    if got.bytes == 0 {
        return Err("the request ended before its length".into());
    }
    (&*sock)
        .read_exact(&mut head[got.bytes..])
        .map_err(|_| "the request ended before its length".to_string())?;
    let len = u32::from_le_bytes(head) as usize;
    if len + 4 > MAX_FRAME {
        return Err(format!("the request is {len} bytes, over {MAX_FRAME}"));
    }
    let mut body = Vec::with_capacity(len);
    sock.take(len as u64)
        .read_to_end(&mut body)
        .map_err(|e| format!("reading the request: {e}"))?;
    if body.len() != len {
        return Err("the request ended early".into());
    }
    let fields = split_fields(&body)?;
    let [protocol, their_build, kind, rest @ ..] = fields.as_slice() else {
        return Err("the request has no header".into());
    };
    if *protocol != PROTOCOL.as_bytes() {
        return Err(format!(
            "the client speaks {:?}, not {PROTOCOL}",
            String::from_utf8_lossy(protocol)
        ));
    }
    if *their_build != build.as_bytes() {
        return Err("the client is another build of smithers-sandbox".into());
    }
    let want_fds = if *kind == b"run" { RUN_FDS } else { 0 };
    if fds.len() != want_fds {
        return Err(format!(
            "the request carried {} descriptors, not {want_fds}",
            fds.len()
        ));
    }
    match *kind {
        b"status" => Ok(Ask::Status),
        b"stop" => Ok(Ask::Stop),
        b"run" => {
            let [umask, argc, rest @ ..] = rest else {
                return Err("the run request is cut short".into());
            };
            let umask = number(umask).filter(|m| *m <= 0o777).ok_or("a bad umask")? as u32;
            let argc = number(argc).ok_or("a bad argument count")? as usize;
            if argc == 0 || argc > rest.len() {
                return Err("a bad argument count".into());
            }
            let (argv, env) = rest.split_at(argc);
            Ok(Ask::Run(RunRequest {
                argv: argv
                    .iter()
                    .map(|a| OsString::from_vec(a.to_vec()))
                    .collect(),
                env: env.iter().map(|e| OsString::from_vec(e.to_vec())).collect(),
                umask,
                fds,
            }))
        }
        other => Err(format!(
            "an unknown request {:?}",
            String::from_utf8_lossy(other)
        )),
    }
}

fn number(field: &[u8]) -> Option<u64> {
    std::str::from_utf8(field).ok()?.parse().ok()
}

fn split_fields(mut body: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut fields = Vec::new();
    while !body.is_empty() {
        if fields.len() == MAX_FIELDS {
            return Err(format!("the request has over {MAX_FIELDS} fields"));
        }
        if body.len() < 4 {
            return Err("a field ends before its length".into());
        }
        let n = u32::from_le_bytes(body[..4].try_into().expect("four bytes")) as usize;
        body = &body[4..];
        if n > body.len() {
            return Err("a field is longer than the request".into());
        }
        fields.push(&body[..n]);
        body = &body[n..];
    }
    Ok(fields)
}

/// Reads one line (without its newline) of at most [`MAX_LINE`] bytes, a byte at a time so
/// nothing after it is consumed. `None` at a clean end of the stream.
pub fn read_line(sock: &UnixStream) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match (&*sock).read(&mut byte)? {
            0 if line.is_empty() => return Ok(None),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            _ if byte[0] == b'\n' => break,
            _ if line.len() == MAX_LINE => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "an answer line is too long",
                ))
            }
            _ => line.push(byte[0]),
        }
    }
    String::from_utf8(line)
        .map(Some)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "an answer is not UTF-8"))
}

/// Writes one answer line. A newline inside `text` is replaced: one answer is one line.
pub fn write_line(sock: &UnixStream, text: &str) -> io::Result<()> {
    let mut line = text.replace('\n', " ");
    line.push('\n');
    rustix::net::send(sock.as_fd(), line.as_bytes(), SendFlags::NOSIGNAL)
        .map_err(io::Error::from)
        .and_then(|n| {
            if n == line.len() {
                Ok(())
            } else {
                (&*sock).write_all(&line.as_bytes()[n..])
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_request_goes_through_with_its_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let argv = [
            OsString::from("smithers-sandbox"),
            OsString::from_vec(b"run\xff".to_vec()),
        ];
        let env = vec![OsString::from("A=1"), OsString::from("B=")];
        let dir = std::fs::File::open("/").unwrap();
        let (i, o, e) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
        let fds = [i.as_fd(), o.as_fd(), e.as_fd(), dir.as_fd()];
        Frame::run("b1", &argv, &env, 0o022).send(&a, &fds).unwrap();
        let Ask::Run(req) = read_request(&b, "b1").unwrap() else {
            panic!("not a run")
        };
        assert_eq!(req.argv, argv);
        assert_eq!(req.env, env);
        assert_eq!(req.umask, 0o022);
        assert_eq!(req.fds.len(), RUN_FDS);
    }

    #[test]
    fn another_build_wrong_descriptors_and_lies_are_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        Frame::control("b1", "status").send(&a, &[]).unwrap();
        let e = read_request(&b, "b2").unwrap_err();
        assert!(e.contains("another build"), "{e}");

        let (a, b) = UnixStream::pair().unwrap();
        Frame::run("b1", &["x"], &[], 0).send(&a, &[]).unwrap();
        let e = read_request(&b, "b1").unwrap_err();
        assert!(e.contains("descriptors"), "{e}");

        // A length over the limit is refused before anything is allocated for it.
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&(u32::MAX).to_le_bytes()).unwrap();
        let e = read_request(&b, "b1").unwrap_err();
        assert!(e.contains("over"), "{e}");

        // A field that claims more than the frame holds.
        let (a, b) = UnixStream::pair().unwrap();
        let mut bytes = 8u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(&1000u32.to_le_bytes());
        bytes.extend_from_slice(b"abcd");
        (&a).write_all(&bytes).unwrap();
        let e = read_request(&b, "b1").unwrap_err();
        assert!(e.contains("longer than"), "{e}");

        // An argument count beyond the fields.
        let (a, b) = UnixStream::pair().unwrap();
        let mut f = Frame::new("b1", "run");
        f.field(b"18");
        f.field(b"5");
        f.field(b"only-one");
        let dir = std::fs::File::open("/").unwrap();
        let fds = [dir.as_fd(), dir.as_fd(), dir.as_fd(), dir.as_fd()];
        f.send(&a, &fds).unwrap();
        let e = read_request(&b, "b1").unwrap_err();
        assert!(e.contains("argument count"), "{e}");
    }

    #[test]
    fn the_proof_after_a_frame_is_left_for_its_own_read() {
        // Sent back to back, as a client does: the frame's read must not take the proof in,
        // with descriptors (the frame's first part carries them) or without.
        let proof = [b'7'; PROOF_LEN];
        let (a, b) = UnixStream::pair().unwrap();
        Frame::control("b1", "status").send(&a, &[]).unwrap();
        (&a).write_all(&proof).unwrap();
        assert!(matches!(read_request(&b, "b1").unwrap(), Ask::Status));
        let mut got = [0u8; PROOF_LEN];
        (&b).read_exact(&mut got).unwrap();
        assert_eq!(got, proof);

        let (a, b) = UnixStream::pair().unwrap();
        let dir = std::fs::File::open("/").unwrap();
        let fds = [dir.as_fd(), dir.as_fd(), dir.as_fd(), dir.as_fd()];
        let env = vec![OsString::from(format!("BIG={}", "x".repeat(300 << 10)))];
        // Larger than the socket's buffer: sent while it is read.
        std::thread::scope(|scope| {
            scope.spawn(|| {
                Frame::run("b1", &["x"], &env, 0o22).send(&a, &fds).unwrap();
                (&a).write_all(&proof).unwrap();
            });
            let Ask::Run(req) = read_request(&b, "b1").unwrap() else {
                panic!("not a run")
            };
            assert_eq!(req.env[0].len(), 4 + (300 << 10));
            (&b).read_exact(&mut got).unwrap();
            assert_eq!(got, proof);
        });
    }

    #[test]
    fn answer_lines_are_bounded_and_single() {
        let (a, b) = UnixStream::pair().unwrap();
        write_line(&a, "no two\nlines").unwrap();
        assert_eq!(read_line(&b).unwrap().unwrap(), "no two lines");
        (&a).write_all(&vec![b'x'; MAX_LINE + 1]).unwrap();
        assert!(read_line(&b).is_err());
    }
}
