//! A command's stream read through a pipe up to a bound (the rest counted and dropped, so the
//! command is never blocked on it).

use std::io::Read;

pub use smithers_mcp::Captured;

/// Reads `pipe` (a socket pair's end: a pipe of the oldest Rust this builds with) to its end on a thread of its own, keeping the first `limit` bytes.
pub fn spawn_reader(
    mut pipe: std::os::unix::net::UnixStream,
    limit: usize,
) -> std::thread::JoinHandle<Captured> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut total = 0u64;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    let room = limit.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        Captured { bytes: kept, total }
    })
}

/// Reads `pipe` up to `limit` bytes and one more (to know there were more), then closes it:
/// the writer learns its reader is gone. `total` is what was read.
pub fn spawn_bounded_reader(
    pipe: std::os::unix::net::UnixStream,
    limit: usize,
) -> std::thread::JoinHandle<Captured> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let _ = (&pipe).take(limit as u64 + 1).read_to_end(&mut kept);
        let total = kept.len() as u64;
        kept.truncate(limit);
        drop(pipe);
        Captured { bytes: kept, total }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_past_its_bound_is_kept_to_it_and_counted_whole() {
        let (r, mut w) = std::os::unix::net::UnixStream::pair().unwrap();
        let reader = spawn_reader(r, 10);
        std::io::Write::write_all(&mut w, &[7u8; 100_000]).unwrap();
        drop(w);
        let c = reader.join().unwrap();
        assert_eq!((c.bytes.len(), c.total, c.truncated()), (10, 100_000, true));
    }
}
