//! `session exec -t`: a session's command on a terminal of its own (the engine's, made in the
//! sandbox), shown on the client's.
//!
//! The client's own terminal never reaches the holder: the client passes three sockets, and
//! relays them itself: the keys it reads from its terminal (in raw mode, a read that stops
//! with the command), what the command's terminal shows (through the same filter as `run -t`,
//! on the client's side), and each size its window takes (4 bytes: rows, columns).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use smithers_runtime::{ExecRequest, StepStdin, TerminalRequest, TerminalSize};
use smithers_terminal::vt::VtFilter;

use super::fd_sink::FdSink;
use super::holder::{run_exec, Holder};
use super::wire::error_json;
use crate::commands::run_terminal::{restore_terminal, say_kept, window_size, Keys, RawMode};

/// The holder's side: the command on a terminal of `size`, its keys, output and sizes the
/// three descriptors that came with the request.
pub(super) fn exec_answer(
    holder: &Holder,
    conn: &UnixStream,
    mut request: ExecRequest,
    fds: Vec<OwnedFd>,
    size: [u16; 2],
) -> Value {
    let Ok([keys, out, sizes]) = <[OwnedFd; 3]>::try_from(fds) else {
        return error_json(
            "INVALID_INPUT",
            "a command on a terminal needs its keys, output and sizes",
            json!({}),
        );
    };
    let Ok(out_again) = out.try_clone() else {
        return error_json(
            "INVALID_INPUT",
            "the output descriptor cannot be kept",
            json!({}),
        );
    };
    let first = TerminalSize {
        rows: size[0].max(1),
        cols: size[1].max(1),
    };
    let (tx, rx) = tokio::sync::watch::channel(first);
    std::thread::spawn(move || {
        let mut sizes = File::from(sizes);
        let mut b = [0u8; 4];
        while sizes.read_exact(&mut b).is_ok() {
            let rows = u16::from_be_bytes([b[0], b[1]]).max(1);
            let cols = u16::from_be_bytes([b[2], b[3]]).max(1);
            if tx.send(TerminalSize { rows, cols }).is_err() {
                break;
            }
        }
    });
    request.stdin = StepStdin::from_reader(File::from(keys));
    request.terminal = Some(TerminalRequest { size: rx });
    let cancel = holder.exec_token();
    let sink = FdSink::new(File::from(out), File::from(out_again), cancel.clone());
    let ran = run_exec(holder, conn, request, &sink, cancel);
    sink.finish();
    match ran {
        Ok(exit) => json!({ "ok": true, "exit": exit }),
        Err(message) => error_json("SANDBOX_EXECUTION_FAILED", &message, json!({})),
    }
}

/// The client's side, around `ask` (the request, with the three descriptors it is given):
/// our terminal in raw mode, the relays running until the answer, then all put back and what
/// the filter kept out said.
///
/// `ask` is given the connection's hang-up: a clone of its connection, shut down when `~.` is
/// typed (the holder then kills the command); the answer is then `None`.
pub(super) fn on_our_terminal(
    ask: impl FnOnce(&[std::os::fd::BorrowedFd<'_>], &dyn Fn(UnixStream)) -> anyhow::Result<Value>,
) -> anyhow::Result<Option<Value>> {
    let (keys_ours, keys_theirs) = UnixStream::pair()?;
    let (out_ours, out_theirs) = UnixStream::pair()?;
    let (sizes_ours, sizes_theirs) = UnixStream::pair()?;
    let running = Arc::new(AtomicBool::new(true));
    let connection: Arc<Mutex<Option<UnixStream>>> = Arc::default();
    let escaped = Arc::new(AtomicBool::new(false));
    let raw = RawMode::enter();
    let typing = {
        let running = running.clone();
        let (connection, escaped) = (connection.clone(), escaped.clone());
        let mut to = keys_ours;
        std::thread::spawn(move || {
            let mut keys = Keys::new(running, move || {
                let mut registered = lock(&connection);
                escaped.store(true, Ordering::SeqCst);
                if let Some(c) = registered.take() {
                    let _ = c.shutdown(std::net::Shutdown::Both);
                }
            });
            let mut b = [0u8; 4096];
            while let Ok(n) = keys.read(&mut b) {
                if n == 0 || to.write_all(&b[..n]).is_err() {
                    break;
                }
            }
        })
    };
    let showing = std::thread::spawn(move || {
        let mut from = out_ours;
        let mut filter = VtFilter::new();
        let mut b = vec![0u8; 64 << 10];
        let mut shown = Vec::new();
        while let Ok(n) = from.read(&mut b) {
            if n == 0 {
                break;
            }
            shown.clear();
            filter.feed(&b[..n], &mut shown);
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&shown);
            let _ = out.flush();
        }
        filter
    });
    let sizing = {
        let running = running.clone();
        let mut to = sizes_ours;
        std::thread::spawn(move || {
            let mut last = window_size();
            while running.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                let now = window_size();
                if now != last {
                    last = now;
                    let mut b = [0u8; 4];
                    b[..2].copy_from_slice(&now.rows.to_be_bytes());
                    b[2..].copy_from_slice(&now.cols.to_be_bytes());
                    if to.write_all(&b).is_err() {
                        break;
                    }
                }
            }
        })
    };
    // Decided under the lock the escape takes: a `~.` typed before the connection was
    // registered hangs it up at once.
    let hang_up = |c: UnixStream| {
        let mut registered = lock(&connection);
        match escaped.load(Ordering::SeqCst) {
            true => {
                let _ = c.shutdown(std::net::Shutdown::Both);
            }
            false => *registered = Some(c),
        }
    };
    let answer = ask(
        &[
            keys_theirs.as_fd(),
            out_theirs.as_fd(),
            sizes_theirs.as_fd(),
        ],
        &hang_up,
    );
    running.store(false, Ordering::SeqCst);
    drop((keys_theirs, out_theirs, sizes_theirs));
    let _ = typing.join();
    let _ = sizing.join();
    let filter = showing.join().unwrap_or_default();
    restore_terminal(&filter);
    drop(raw);
    say_kept(&filter);
    // An answer that came is the command's end, even with `~.` typed as it came.
    match answer {
        Err(_) if escaped.load(Ordering::SeqCst) => Ok(None),
        answer => answer.map(Some),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The size our window has now, as the request carries it.
pub(super) fn our_size() -> [u16; 2] {
    let s = window_size();
    [s.rows, s.cols]
}
