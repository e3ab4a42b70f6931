//! The hosted sandboxes: one [`Entry`] each, with its state machine and its event log.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use smithers_runtime::{
    CancellationToken, OutputEvent, OutputSink, OutputStream, Room, Runtime, SandboxHandle,
};
use smithers_wire::wire::{
    ResultInfo, SandboxInfo, SandboxState, SeqEvent, WireEvent, MAX_OUTPUT_EVENT_BYTES,
};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::config::{Limits, ServerConfig};
use crate::metrics::Metrics;

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Bytes of regular files in a collected bundle (0 when it cannot be read).
pub(crate) async fn bundle_size(path: &std::path::Path) -> u64 {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || smithers_wire::archive::tree_size(&path))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Shared by every handler.
#[derive(Debug)]
pub(crate) struct AppState {
    pub runtime: Arc<dyn Runtime>,
    /// The same backend's engine, for sessions (`crate::session`); none: sessions refused.
    pub engine: Option<Arc<dyn smithers_runtime::Engine>>,
    /// Serves the review endpoints when attached.
    pub orchestrator: Option<Arc<smithers_orchestrator::Orchestrator>>,
    pub config: ServerConfig,
    /// The client tokens (digests), compared in constant time.
    pub tokens: crate::policy::TokenSet,
    pub sandboxes: Mutex<HashMap<String, Arc<Entry>>>,
    pub metrics: Metrics,
    /// Set once shutdown began: no new sandboxes or executions.
    pub draining: AtomicBool,
    /// Fired at the very end of shutdown: ends event streams still open.
    pub streams_end: CancellationToken,
    /// The running executions, drained on shutdown.
    pub tasks: TaskTracker,
}

impl AppState {
    /// The caller's sandbox `id` (404 for another token's, exactly as for an unknown id), its
    /// idle time started again.
    pub fn owned(&self, id: &str, owner: &Owner) -> Result<Arc<Entry>, crate::error::ApiError> {
        let e = self
            .get(id, owner)
            .ok_or_else(|| crate::error::ApiError::not_found(id))?;
        e.touch();
        Ok(e)
    }

    /// A step's or a session's bundle collected: the sandbox completed with its result, the
    /// metrics, and the terminal event (which closes its log).
    pub(crate) fn record_completed(
        &self,
        e: &Entry,
        outcome: smithers_runtime::ExecOutcome,
        report: &smithers_runtime::CollectReport,
        size: u64,
        status: &str,
    ) {
        let result = ResultInfo {
            patch_count: report.patch_count,
            ignored_paths: report.ignored_paths.clone(),
            bundle_size_bytes: size,
        };
        {
            let mut inner = lock(&e.inner);
            inner.state = SandboxState::Completed;
            inner.result = Some(result.clone());
            inner.bundle_path = Some(report.bundle_path.clone());
        }
        self.metrics.bundle_size_bytes(size as f64);
        self.metrics.patch_count(report.patch_count as f64);
        self.metrics
            .sandbox_completed(self.runtime.kind().as_str(), status);
        e.events.push(WireEvent::Completed {
            outcome: Box::new(outcome),
            result,
        });
    }

    /// The runtime failed after the sandbox ran: failed, the metric, the terminal event.
    pub(crate) fn record_failed(&self, e: &Entry, err: &smithers_runtime::RuntimeError) {
        lock(&e.inner).state = SandboxState::Failed;
        self.metrics
            .sandbox_completed(self.runtime.kind().as_str(), "failed");
        e.events.push(WireEvent::Failed {
            error: smithers_errors::CodedError::report(err),
        });
    }

    /// The sandbox `id` if `owner` created it: another token's sandbox is as absent as one
    /// that never existed.
    pub fn get(&self, id: &str, owner: &Owner) -> Option<Arc<Entry>> {
        lock(&self.sandboxes)
            .get(id)
            .filter(|e| e.owner == owner.0)
            .cloned()
    }
}

/// The name of the token a request authenticated with (empty on a server without tokens),
/// put in the request's extensions by the auth middleware.
#[derive(Debug, Clone)]
pub(crate) struct Owner(pub String);

/// The directory of the sandbox a workspace was uploaded to: the workspace is the lower layer
/// of that sandbox and of every fork started from its sessions (and theirs), so the
/// directory goes with the last of them: a sandbox removed while a fork still uses its
/// workspace leaves the directory to this, dropped with the fork's entry.
#[derive(Debug)]
pub(crate) struct Project {
    /// `<data>/sandboxes/<id of the first sandbox>`.
    pub dir: PathBuf,
}

impl Drop for Project {
    fn drop(&mut self) {
        let dir = std::mem::take(&mut self.dir);
        if dir.as_os_str().is_empty() {
            return;
        }
        // Gone already when its own sandbox's removal took it (nothing shared it then).
        let remove = move || {
            let _ = std::fs::remove_dir_all(&dir);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(remove);
            }
            Err(_) => remove(),
        }
    }
}

/// Mutable part of an entry.
#[derive(Debug)]
pub(crate) struct Inner {
    pub state: SandboxState,
    pub exec_key: Option<String>,
    pub cancel: CancellationToken,
    /// The request JSON shipped (to answer a retried identical PUT).
    pub request: Option<serde_json::Value>,
    pub result: Option<ResultInfo>,
    pub bundle_path: Option<PathBuf>,
}

/// One hosted sandbox.
#[derive(Debug)]
pub(crate) struct Entry {
    pub id: String,
    pub run_id: String,
    pub sandbox_id: String,
    pub created_at_ms: u64,
    /// The name of the token that created it (never the secret): only that token sees it.
    pub owner: String,
    /// When a request last touched it (or its step ended): the idle expiry counts from here.
    pub last_active_ms: AtomicU64,
    /// `<data>/sandboxes/<id>`: everything the host keeps for it.
    pub dir: PathBuf,
    /// `<dir>/workspace`, or for a fork the workspace of the sandbox it was forked from: the
    /// runtime's rootDir.
    pub workspace: PathBuf,
    /// The directory holding `workspace`, shared with the forks over it.
    pub project: Arc<Project>,
    /// What the sandbox was created with (a fork is created with its parent's).
    pub config: smithers_runtime::SandboxConfig,
    pub handle: SandboxHandle,
    /// Serialises the verbs that change the sandbox (upload, ship, delete).
    pub op: tokio::sync::Mutex<()>,
    /// Serialises the final swap of an uploaded workspace into place.
    pub swap: Mutex<()>,
    pub inner: Mutex<Inner>,
    pub events: EventLog,
    /// Open event streams, and when the last one closed (or the step started): the orphan
    /// watchdog cancels a running step nobody follows.
    pub followers: AtomicUsize,
    pub unfollowed_since_ms: AtomicU64,
    /// A live session's checkpoints by name: the engine's snapshots, which never leave the
    /// host.
    pub checkpoints: smithers_runtime::Checkpoints,
    /// The client's secrets' values, held for the sandbox's life (see `crate::secrets`):
    /// never read here (the runtime opens them by the paths their bindings name), only kept
    /// open until the entry goes.
    #[allow(dead_code)]
    pub secret_files: crate::secrets::SecretFiles,
}

impl Entry {
    pub fn info(&self, runtime: smithers_runtime::RuntimeKind) -> SandboxInfo {
        let inner = lock(&self.inner);
        SandboxInfo {
            id: self.id.clone(),
            run_id: self.run_id.clone(),
            sandbox_id: self.sandbox_id.clone(),
            runtime,
            state: inner.state,
            created_at_ms: self.created_at_ms,
            last_seq: self.events.last_seq(),
            result: inner.result.clone(),
        }
    }

    pub fn state(&self) -> SandboxState {
        lock(&self.inner).state
    }

    /// Records activity: the idle expiry starts again.
    pub fn touch(&self) {
        self.last_active_ms
            .store(now_ms(), std::sync::atomic::Ordering::SeqCst);
    }
}

#[derive(Debug, Default)]
struct LogInner {
    events: Vec<Arc<SeqEvent>>,
    closed: bool,
    /// Output bytes (`output` events) in `events[..=i]`, for each `i`.
    output_upto: Vec<u64>,
    /// The `output` events still holding their bytes, oldest first (index, stream, offset,
    /// bytes), and the bytes they hold.
    held: std::collections::VecDeque<(usize, OutputStream, u64, u64)>,
    held_bytes: u64,
    /// Each open event stream's cursor (the next seq it sends), by follower id.
    followers: HashMap<u64, u64>,
    next_follower: u64,
    /// Where the last follower to leave stood (0 before any came): the low water mark while
    /// none is connected, so that output waits for the client that comes back.
    parked: u64,
}

impl LogInner {
    /// Output bytes in `events[..seq]`.
    fn output_before(&self, seq: u64) -> u64 {
        let seq = (seq as usize).min(self.events.len());
        seq.checked_sub(1).map_or(0, |i| self.output_upto[i])
    }

    fn output_total(&self) -> u64 {
        self.output_upto.last().copied().unwrap_or(0)
    }

    /// The seq every follower has been sent up to (the slowest one's cursor).
    fn low_water(&self) -> u64 {
        self.followers
            .values()
            .copied()
            .min()
            .unwrap_or(self.parked)
    }

    /// Output bytes past the low water mark: what the slowest follower has yet to be sent.
    fn unsent(&self) -> u64 {
        self.output_total() - self.output_before(self.low_water())
    }

    /// Drops the bytes of the oldest `output` events every follower was sent while more than
    /// `window` bytes of them are held: each becomes an `outputLost` of the same seq, which
    /// only a follower starting (or resuming) from before it ever reads.
    fn evict(&mut self, window: u64) {
        let low = self.low_water() as usize;
        let after_low = self.output_total() - self.output_before(low as u64);
        while self.held_bytes.saturating_sub(after_low) > window {
            let Some(&(index, stream, offset, bytes)) = self.held.front() else {
                return;
            };
            if index >= low {
                return;
            }
            self.held.pop_front();
            self.held_bytes -= bytes;
            let seq = self.events[index].seq;
            let timestamp_ms = match &self.events[index].event {
                WireEvent::Output { timestamp_ms, .. } => *timestamp_ms,
                _ => 0,
            };
            self.events[index] = Arc::new(SeqEvent {
                seq,
                event: WireEvent::OutputLost {
                    stream,
                    offset,
                    bytes,
                    timestamp_ms,
                },
            });
        }
    }
}

/// Append-only, gap-free event log of one sandbox, with a watch channel announcing appends.
/// Bounded: the line events by the runtime's caps (`maxOutputBytes`, `maxOutputLines`), state
/// events are a handful, and of the step's whole output (`output` events) only `window` bytes
/// every follower was sent are held for a follower that resumes, besides what a follower has
/// yet to be sent, which [`EventLog::room`] keeps within `window` by holding the step back.
#[derive(Debug)]
pub(crate) struct EventLog {
    inner: Mutex<LogInner>,
    tx: watch::Sender<u64>,
    /// Told when a follower moves on or leaves (what [`EventLog::room`] waits for).
    progress: tokio::sync::Notify,
    window: u64,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog::new(Limits::default().output_window_bytes)
    }
}

impl EventLog {
    /// A log holding at most `window` bytes of output every follower was sent.
    pub fn new(window: u64) -> Self {
        EventLog {
            inner: Mutex::new(LogInner::default()),
            tx: watch::channel(0).0,
            progress: tokio::sync::Notify::new(),
            window,
        }
    }

    /// Appends an event; a terminal one closes the log. Appends to a closed log are dropped
    /// (output racing the end of a run).
    pub fn push(&self, event: WireEvent) {
        let mut inner = lock(&self.inner);
        if inner.closed {
            return;
        }
        let seq = inner.events.len() as u64;
        let terminal = event.is_terminal();
        let output = match &event {
            WireEvent::Output { stream, offset, .. } => event
                .output_bytes()
                .map(|b| (*stream, *offset, b.len() as u64)),
            _ => None,
        };
        let before = inner.output_total();
        let added = output.map_or(0, |(_, _, n)| n);
        inner.output_upto.push(before + added);
        if let Some((stream, offset, bytes)) = output {
            inner.held.push_back((seq as usize, stream, offset, bytes));
            inner.held_bytes += bytes;
        }
        inner.events.push(Arc::new(SeqEvent { seq, event }));
        if terminal {
            inner.closed = true;
        }
        inner.evict(self.window);
        drop(inner);
        self.tx.send_replace(seq + 1);
    }

    /// Events with `seq >= from`, and whether the log is closed.
    pub fn read_from(&self, from: u64) -> (Vec<Arc<SeqEvent>>, bool) {
        let inner = lock(&self.inner);
        let start = (from as usize).min(inner.events.len());
        (inner.events[start..].to_vec(), inner.closed)
    }

    pub fn is_closed(&self) -> bool {
        lock(&self.inner).closed
    }

    pub fn last_seq(&self) -> Option<u64> {
        (lock(&self.inner).events.len() as u64).checked_sub(1)
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    /// A new follower starting at `cursor`; its id.
    pub fn follow(&self, cursor: u64) -> u64 {
        let mut inner = lock(&self.inner);
        let id = inner.next_follower;
        inner.next_follower += 1;
        inner.followers.insert(id, cursor);
        id
    }

    /// Follower `id` has been sent everything before `cursor`.
    pub fn advance(&self, id: u64, cursor: u64) {
        let mut inner = lock(&self.inner);
        if let Some(c) = inner.followers.get_mut(&id) {
            *c = cursor;
        }
        inner.evict(self.window);
        drop(inner);
        self.progress.notify_waiters();
    }

    /// Follower `id` left.
    pub fn unfollow(&self, id: u64) {
        let mut inner = lock(&self.inner);
        if let Some(cursor) = inner.followers.remove(&id) {
            if inner.followers.is_empty() {
                inner.parked = cursor;
            }
        }
        drop(inner);
        self.progress.notify_waiters();
    }

    /// Resolves while the slowest follower (or, with none connected, the last one to leave;
    /// before any came, the start) has at most `window` bytes of output still to be sent, or
    /// once the log is closed: the step's output pump waits for it, so a client that reads
    /// slowly slows the step down instead of growing this log. A step nobody comes back for
    /// is ended by the orphan watchdog, its timeout or its cancel.
    pub async fn room(&self) {
        loop {
            let progressed = self.progress.notified();
            {
                let inner = lock(&self.inner);
                if inner.closed || inner.unsent() <= self.window {
                    return;
                }
            }
            // Checked again now and then: a follower's progress is also told by its drop.
            let _ = tokio::time::timeout(std::time::Duration::from_millis(250), progressed).await;
        }
    }
}

/// How long output may wait in [`LogSink`] before it goes into the log, and how much of it.
const OUTPUT_FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(20);
const OUTPUT_FLUSH_BYTES: usize = 32 * 1024;

/// Output of one stream not yet in the log, and how many bytes of it went before.
#[derive(Debug, Default)]
struct Pending {
    bytes: Vec<u8>,
    offset: u64,
    timestamp_ms: u64,
}

/// Forwards the runtime's live output into the event log. The step's bytes are gathered for
/// up to [`OUTPUT_FLUSH_AFTER`] or [`OUTPUT_FLUSH_BYTES`] into one `output` event (so that a
/// step writing a byte at a time does not make an event per byte); [`LogSink::flush`] puts
/// the rest in, and the server calls it on a tick and before the step's terminal event.
pub(crate) struct LogSink {
    entry: Arc<Entry>,
    pending: Mutex<(Pending, Pending, std::time::Instant)>,
}

impl LogSink {
    pub fn new(entry: Arc<Entry>) -> Self {
        LogSink {
            entry,
            pending: Mutex::new((
                Pending::default(),
                Pending::default(),
                std::time::Instant::now(),
            )),
        }
    }

    /// Puts the gathered output into the log.
    pub fn flush(&self) {
        let mut p = lock(&self.pending);
        let (out, err, last) = &mut *p;
        for (stream, pending) in [(OutputStream::Stdout, out), (OutputStream::Stderr, err)] {
            for piece in pending.bytes.chunks(MAX_OUTPUT_EVENT_BYTES) {
                self.entry.events.push(WireEvent::output(
                    stream,
                    pending.offset,
                    piece,
                    pending.timestamp_ms,
                ));
                pending.offset += piece.len() as u64;
            }
            pending.bytes.clear();
        }
        *last = std::time::Instant::now();
    }

    /// [`LogSink::flush`] once output waited [`OUTPUT_FLUSH_AFTER`].
    pub fn flush_if_due(&self) {
        let due = lock(&self.pending).2.elapsed() >= OUTPUT_FLUSH_AFTER;
        if due {
            self.flush();
        }
    }

    fn gather(&self, stream: OutputStream, bytes: &[u8], timestamp_ms: u64) {
        let full = {
            let mut p = lock(&self.pending);
            let pending = match stream {
                OutputStream::Stdout => &mut p.0,
                OutputStream::Stderr => &mut p.1,
            };
            if pending.bytes.is_empty() {
                pending.timestamp_ms = timestamp_ms;
            }
            pending.bytes.extend_from_slice(bytes);
            pending.bytes.len() >= OUTPUT_FLUSH_BYTES || p.2.elapsed() >= OUTPUT_FLUSH_AFTER
        };
        if full {
            self.flush();
        }
    }
}

impl OutputSink for LogSink {
    fn event(&self, event: OutputEvent) {
        let wire = match event {
            OutputEvent::Output {
                stream,
                bytes,
                timestamp_ms,
            } => return self.gather(stream, &bytes, timestamp_ms),
            // Made by a relay, never by a runtime this server drives.
            OutputEvent::OutputLost { .. } => return,
            OutputEvent::Stdout { line, timestamp_ms } => WireEvent::Stdout { line, timestamp_ms },
            OutputEvent::Stderr { line, timestamp_ms } => WireEvent::Stderr { line, timestamp_ms },
            OutputEvent::Heartbeat {
                progress,
                timestamp_ms,
            } => WireEvent::Heartbeat {
                progress,
                timestamp_ms,
            },
            OutputEvent::Egress {
                record,
                timestamp_ms,
            } => WireEvent::Egress {
                record,
                timestamp_ms,
            },
        };
        self.entry.events.push(wire);
    }

    fn room(&self) -> Room<'_> {
        Box::pin(self.entry.events.room())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn output(log: &EventLog, offset: u64, len: usize) {
        log.push(WireEvent::output(
            OutputStream::Stdout,
            offset,
            &vec![b'x'; len],
            0,
        ));
    }

    fn lost(log: &EventLog) -> Vec<u64> {
        let (events, _) = log.read_from(0);
        events
            .iter()
            .filter(|e| matches!(e.event, WireEvent::OutputLost { .. }))
            .map(|e| e.seq)
            .collect()
    }

    /// Nothing a follower has yet to be sent is dropped; of what every follower was sent,
    /// at most the window is held, the oldest dropped first (as `outputLost` of its seq).
    #[test]
    fn the_log_holds_what_followers_need_and_a_window_more() {
        let log = EventLog::new(100);
        for i in 0..5 {
            output(&log, i * 60, 60);
        }
        assert!(
            lost(&log).is_empty(),
            "no follower yet: all kept for the first"
        );
        let f = log.follow(0);
        log.advance(f, 3);
        // 180 bytes sent, at most 100 of them held for a resume: the first two events go.
        assert_eq!(lost(&log), vec![0, 1]);
        log.advance(f, 5);
        assert_eq!(lost(&log), vec![0, 1, 2, 3]);
        let (events, _) = log.read_from(0);
        match &events[0].event {
            WireEvent::OutputLost { offset, bytes, .. } => assert_eq!((*offset, *bytes), (0, 60)),
            e => panic!("{e:?}"),
        }
        // A follower that leaves parks the low water mark where it stood.
        log.unfollow(f);
        output(&log, 300, 60);
        assert_eq!(lost(&log), vec![0, 1, 2, 3]);
    }

    /// The step's pump waits while the slowest follower (or, with none, where the last one
    /// stood) is more than the window behind, and goes on once it catches up or the log
    /// closes.
    #[tokio::test]
    async fn room_waits_for_the_slowest_follower() {
        let log = Arc::new(EventLog::new(100));
        output(&log, 0, 80);
        tokio::time::timeout(Duration::from_millis(50), log.room())
            .await
            .expect("within the window");
        output(&log, 80, 80);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), log.room())
                .await
                .is_err(),
            "160 bytes nobody was sent"
        );
        let f = log.follow(0);
        let waiting = {
            let log = log.clone();
            tokio::spawn(async move { log.room().await })
        };
        log.advance(f, 1);
        tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("the follower caught up")
            .unwrap();
        output(&log, 160, 200);
        log.push(WireEvent::Cancelled);
        tokio::time::timeout(Duration::from_millis(50), log.room())
            .await
            .expect("a closed log waits for nobody");
    }

    #[test]
    fn the_sink_gathers_output_into_few_events_with_offsets() {
        let entry = test_entry();
        let sink = LogSink::new(entry.clone());
        for _ in 0..1000 {
            sink.event(OutputEvent::Output {
                stream: OutputStream::Stderr,
                bytes: b"ab".to_vec(),
                timestamp_ms: 1,
            });
        }
        sink.flush();
        let (events, _) = entry.events.read_from(0);
        let mut bytes = Vec::new();
        for e in &events {
            if let WireEvent::Output { offset, .. } = &e.event {
                assert_eq!(*offset, bytes.len() as u64);
                bytes.extend(e.event.output_bytes().unwrap());
            }
        }
        assert_eq!(bytes, b"ab".repeat(1000));
        assert!(
            events.len() < 100,
            "{} events for 1000 writes",
            events.len()
        );
    }

    fn test_entry() -> Arc<Entry> {
        let dir = std::env::temp_dir().join("smithers-state-test");
        Arc::new(Entry {
            id: "sbx-test".into(),
            run_id: "r".into(),
            sandbox_id: "s".into(),
            created_at_ms: 0,
            owner: String::new(),
            last_active_ms: AtomicU64::new(0),
            dir: dir.clone(),
            workspace: dir.join("workspace"),
            project: Arc::new(Project {
                dir: PathBuf::new(),
            }),
            config: smithers_runtime::SandboxConfig {
                run_id: "r".into(),
                sandbox_id: "s".into(),
                runtime: smithers_runtime::RuntimeKind::Bubblewrap,
                root_dir: dir.join("workspace"),
                image: None,
                controls: Default::default(),
                workspace_layers: Vec::new(),
            },
            handle: SandboxHandle {
                runtime: smithers_runtime::RuntimeKind::Bubblewrap,
                run_id: "r".into(),
                sandbox_id: "s".into(),
                sandbox_root: dir.clone(),
                request_path: dir.join("request"),
                result_path: dir.join("result"),
                container_id: None,
                workspace_id: None,
                backend: serde_json::Value::Null,
            },
            op: tokio::sync::Mutex::new(()),
            swap: Mutex::new(()),
            inner: Mutex::new(Inner {
                state: SandboxState::Running,
                exec_key: None,
                cancel: CancellationToken::new(),
                request: None,
                result: None,
                bundle_path: None,
            }),
            events: EventLog::new(1 << 20),
            followers: AtomicUsize::new(0),
            unfollowed_since_ms: AtomicU64::new(0),
            checkpoints: Default::default(),
            secret_files: Default::default(),
        })
    }
}
