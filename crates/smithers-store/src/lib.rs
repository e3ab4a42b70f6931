//! The durable state of smithers-sandbox: one SQLite file (WAL, embedded, no server).
//!
//! - `_smithers_sandboxes` and `_smithers_events`, column for column the tables of the
//!   JavaScript package (spec section 6), so either side reads what the other wrote.
//! - Tables of our own: owner leases (crash recovery), reviews and their patches.
//! - The atomic concurrency gate ([`Store::try_admit`]): count and insert in ONE `BEGIN
//!   IMMEDIATE` transaction, so N parallel starts never exceed the limit.
//!
//! A [`Store`] keeps a small pool of connections: each call takes one of its own (opening
//! another when all are in use) and gives it back, so callers on different threads do not
//! wait for each other's calls: WAL lets readers go on beside a writer, and a write waiting
//! for another one's lock holds only its own connection. It is `Send + Sync` and meant to be
//! shared in an `Arc`. Several processes (or several `Store`s, or several connections of one)
//! may use the same file at once: every write that reads before it writes runs in an
//! IMMEDIATE transaction, and `busy_timeout` makes the others wait instead of failing.
//!
//! Durability: commits run with `synchronous = NORMAL` (written to the WAL, not synced), and
//! a closing connection does not checkpoint; instead dropping a [`Store`] (or
//! [`Store::sync_wal`]) fsyncs the WAL, so what a store committed survives a power loss once
//! it is dropped, at one fsync per process instead of a checkpoint's two and the WAL's
//! unlink and re-creation. SQLite's automatic checkpoint at commit keeps the WAL bounded.
#![forbid(unsafe_code)]

mod error;
mod field;
mod owner;
mod redact;
mod runs;
mod schema;

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rusqlite::types::Value as SqlValue;
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};
use serde::{Deserialize, Serialize};

pub use error::{GateScope, StoreError};
pub use field::Field;
pub use owner::{effective_uid, Liveness, OwnerIdentity};
pub use redact::{redact_config, RedactedConfig, REDACTED};
pub use runs::{CliRunStart, RunStatus, CLI_WORKFLOW_NAME};
pub use schema::SCHEMA_VERSION;

/// Result alias of this crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// How long a writer waits for another one's lock before failing (the JavaScript package
/// uses the same 30 s).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Poll interval of [`Store::wait_for_events`].
pub const EVENT_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Default of `SMITHERS_MAX_CONCURRENT_SANDBOXES`.
pub const DEFAULT_MAX_CONCURRENT_SANDBOXES: u32 = 10;

/// Parses `SMITHERS_MAX_CONCURRENT_SANDBOXES` exactly like the JavaScript package
/// (`Number(raw)`, then non-finite or `<= 0` → 10, else `Math.floor`): unset, empty,
/// non-numeric, `0`, negative or infinite → 10; `2.9` → 2; `0x10` → 16; ` 5 ` → 5;
/// `0.5` → 0 (JavaScript floors after the `<= 0` check, so a fraction below 1 admits nothing).
pub fn parse_max_concurrent(raw: Option<&str>) -> u32 {
    parse_limit(raw, DEFAULT_MAX_CONCURRENT_SANDBOXES)
}

/// [`parse_max_concurrent`]'s rules with another default (for other limits read from the
/// environment, such as the host-wide one).
pub fn parse_limit(raw: Option<&str>, default: u32) -> u32 {
    let Some(raw) = raw else {
        return default;
    };
    let parsed = js_number(raw);
    if !parsed.is_finite() || parsed <= 0.0 {
        return default;
    }
    // `as` saturates at u32::MAX for huge values, which is what "no practical limit" means.
    parsed.floor() as u32
}

/// JavaScript's `Number(string)`: trimmed; empty → 0; `0x`/`0o`/`0b` integer prefixes;
/// otherwise a decimal literal (`Infinity` allowed); anything else NaN.
fn js_number(raw: &str) -> f64 {
    let s = raw.trim();
    if s.is_empty() {
        return 0.0;
    }
    for (prefix, radix) in [
        ("0x", 16),
        ("0X", 16),
        ("0o", 8),
        ("0O", 8),
        ("0b", 2),
        ("0B", 2),
    ] {
        if let Some(digits) = s.strip_prefix(prefix) {
            return u128::from_str_radix(digits, radix)
                .map(|v| v as f64)
                .unwrap_or(f64::NAN);
        }
    }
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    if unsigned == "Infinity" {
        return if s.starts_with('-') {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
    }
    // Rust also accepts "inf"/"nan"/"infinity" in any case, which JavaScript does not; only
    // digits, one dot and an exponent are JavaScript decimal literals.
    if !unsigned
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
        || !unsigned.chars().any(|c| c.is_ascii_digit())
    {
        return f64::NAN;
    }
    s.parse().unwrap_or(f64::NAN)
}

/// Status of a sandbox row. The strings are shared with the JavaScript package, except
/// `review`, which is ours (a finished step whose patches wait for a decision).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxStatus {
    Pending,
    Shipped,
    /// Waiting for a review decision. Holds no runtime resources, so it takes no slot in the
    /// gate and is never "recovered" when its owner dies: a review survives restarts.
    Review,
    Finished,
    Failed,
    Cancelled,
    /// A status written by someone else (kept, counted as active like the JavaScript gate does).
    Other(String),
}

impl SandboxStatus {
    /// The stored string.
    pub fn as_str(&self) -> &str {
        match self {
            SandboxStatus::Pending => "pending",
            SandboxStatus::Shipped => "shipped",
            SandboxStatus::Review => "review",
            SandboxStatus::Finished => "finished",
            SandboxStatus::Failed => "failed",
            SandboxStatus::Cancelled => "cancelled",
            SandboxStatus::Other(s) => s,
        }
    }

    /// Parses a stored string.
    pub fn parse(s: &str) -> SandboxStatus {
        match s {
            "pending" => SandboxStatus::Pending,
            "shipped" => SandboxStatus::Shipped,
            "review" => SandboxStatus::Review,
            "finished" => SandboxStatus::Finished,
            "failed" => SandboxStatus::Failed,
            "cancelled" => SandboxStatus::Cancelled,
            other => SandboxStatus::Other(other.to_string()),
        }
    }

    /// finished, failed or cancelled.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            SandboxStatus::Finished | SandboxStatus::Failed | SandboxStatus::Cancelled
        )
    }

    /// Takes a slot in the concurrency gate: neither terminal nor awaiting review.
    pub fn is_active(&self) -> bool {
        !self.is_terminal() && *self != SandboxStatus::Review
    }
}

/// SQL fragment selecting rows that take a gate slot (kept next to [`SandboxStatus::is_active`]).
const ACTIVE_SQL: &str = "status NOT IN ('finished', 'failed', 'cancelled', 'review')";

/// The active sandboxes with their leases: the recovery pass's candidates. Unordered, so that
/// SQLite reads them through the partial index of active rows (a few) rather than the table.
fn orphan_candidates_sql() -> String {
    let sandbox_cols = SANDBOX_COLUMNS
        .split(", ")
        .map(|c| format!("s.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let lease_cols = LEASE_COLUMNS
        .split(", ")
        .map(|c| format!("l.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "SELECT {sandbox_cols}, {lease_cols} FROM _smithers_sandboxes s
         JOIN _smithers_sandbox_leases l
           ON l.run_id = s.run_id AND l.sandbox_id = s.sandbox_id
         WHERE s.{ACTIVE_SQL}"
    )
}

/// An upsert of one `_smithers_sandboxes` row keyed by (run_id, sandbox_id).
///
/// NOT NULL columns are `Option` (absent or set; they cannot be cleared), nullable ones are
/// [`Field`] (absent, cleared or set). Inserting a new row without `config` fails: the column
/// is NOT NULL without a default, as in the JavaScript schema.
#[derive(Debug, Clone, Default)]
pub struct SandboxUpsert {
    pub run_id: String,
    pub sandbox_id: String,
    pub runtime: Option<String>,
    pub remote_run_id: Field<String>,
    pub workspace_id: Field<String>,
    pub container_id: Field<String>,
    /// Redacted by construction (see [`RedactedConfig`]).
    pub config: Option<RedactedConfig>,
    pub status: Option<SandboxStatus>,
    pub shipped_at_ms: Field<i64>,
    pub completed_at_ms: Field<i64>,
    pub bundle_path: Field<String>,
    pub heartbeat_at_ms: Field<i64>,
}

impl SandboxUpsert {
    /// An upsert that touches nothing but the key.
    pub fn key(run_id: impl Into<String>, sandbox_id: impl Into<String>) -> Self {
        SandboxUpsert {
            run_id: run_id.into(),
            sandbox_id: sandbox_id.into(),
            ..Default::default()
        }
    }

    fn columns(&self) -> Vec<(&'static str, SqlValue)> {
        fn text(f: &Field<String>) -> Option<SqlValue> {
            match f {
                Field::Absent => None,
                Field::Null => Some(SqlValue::Null),
                Field::Value(v) => Some(SqlValue::Text(v.clone())),
            }
        }
        fn int(f: &Field<i64>) -> Option<SqlValue> {
            match f {
                Field::Absent => None,
                Field::Null => Some(SqlValue::Null),
                Field::Value(v) => Some(SqlValue::Integer(*v)),
            }
        }
        let candidates: [(&'static str, Option<SqlValue>); 12] = [
            ("run_id", Some(SqlValue::Text(self.run_id.clone()))),
            ("sandbox_id", Some(SqlValue::Text(self.sandbox_id.clone()))),
            ("runtime", self.runtime.clone().map(SqlValue::Text)),
            ("remote_run_id", text(&self.remote_run_id)),
            ("workspace_id", text(&self.workspace_id)),
            ("container_id", text(&self.container_id)),
            (
                "config_json",
                self.config
                    .as_ref()
                    .map(|c| SqlValue::Text(c.as_json().to_string())),
            ),
            (
                "status",
                self.status
                    .as_ref()
                    .map(|s| SqlValue::Text(s.as_str().to_string())),
            ),
            ("shipped_at_ms", int(&self.shipped_at_ms)),
            ("completed_at_ms", int(&self.completed_at_ms)),
            ("bundle_path", text(&self.bundle_path)),
            ("heartbeat_at_ms", int(&self.heartbeat_at_ms)),
        ];
        candidates
            .into_iter()
            .filter_map(|(c, v)| v.map(|v| (c, v)))
            .collect()
    }
}

/// One `_smithers_sandboxes` row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRow {
    pub run_id: String,
    pub sandbox_id: String,
    pub runtime: String,
    pub remote_run_id: Option<String>,
    pub workspace_id: Option<String>,
    pub container_id: Option<String>,
    pub config_json: String,
    pub status: SandboxStatus,
    pub heartbeat_at_ms: Option<i64>,
    pub shipped_at_ms: Option<i64>,
    pub completed_at_ms: Option<i64>,
    pub bundle_path: Option<String>,
}

const SANDBOX_COLUMNS: &str = "run_id, sandbox_id, runtime, remote_run_id, workspace_id, \
     container_id, config_json, status, heartbeat_at_ms, shipped_at_ms, completed_at_ms, bundle_path";

fn sandbox_row(r: &Row<'_>) -> rusqlite::Result<SandboxRow> {
    Ok(SandboxRow {
        run_id: r.get(0)?,
        sandbox_id: r.get(1)?,
        runtime: r.get(2)?,
        remote_run_id: r.get(3)?,
        workspace_id: r.get(4)?,
        container_id: r.get(5)?,
        config_json: r.get(6)?,
        status: SandboxStatus::parse(&r.get::<_, String>(7)?),
        heartbeat_at_ms: r.get(8)?,
        shipped_at_ms: r.get(9)?,
        completed_at_ms: r.get(10)?,
        bundle_path: r.get(11)?,
    })
}

/// An event to append to `_smithers_events`.
#[derive(Debug, Clone, Copy)]
pub struct NewEvent<'a> {
    pub run_id: &'a str,
    pub timestamp_ms: i64,
    /// The event `type` (e.g. `SandboxCreated`).
    pub event_type: &'a str,
    /// The whole event as JSON (`{type, runId, sandboxId, timestampMs, ...}`).
    pub payload_json: &'a str,
}

/// One `_smithers_events` row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventRow {
    pub run_id: String,
    pub seq: i64,
    pub timestamp_ms: i64,
    #[serde(rename = "type")]
    pub event_type: String,
    pub payload_json: String,
}

/// A request to start a sandbox through the gate.
#[derive(Debug, Clone)]
pub struct AdmitRequest {
    pub run_id: String,
    pub sandbox_id: String,
    pub runtime: String,
    pub config: RedactedConfig,
    /// Limit per run (`SMITHERS_MAX_CONCURRENT_SANDBOXES`, see [`parse_max_concurrent`]).
    pub per_run_max: u32,
    /// Limit over every run in this database.
    pub host_max: u32,
    /// The process that will run the sandbox (recorded in the lease for crash recovery).
    pub owner: OwnerIdentity,
    pub now_ms: i64,
}

/// What the gate saw when it admitted a sandbox (counts BEFORE the new row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    pub active_in_run: u64,
    pub active_on_host: u64,
}

/// The lease of a sandbox: who runs it and the runtime handle to clean it up.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub run_id: String,
    pub sandbox_id: String,
    pub owner: OwnerIdentity,
    /// The runtime handle as plain JSON (set once the runtime created the sandbox).
    pub handle_json: Option<String>,
    pub acquired_at_ms: i64,
    pub released_at_ms: Option<i64>,
    pub release_reason: Option<String>,
}

/// A non-terminal sandbox whose owner is dead (see [`Store::orphaned_sandboxes`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Orphan {
    pub sandbox: SandboxRow,
    pub lease: Lease,
}

/// State of a durable review.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReviewState {
    /// Waiting for a person.
    Pending,
    /// Accepted; the patches are being (or failed to be) applied.
    Accepted,
    /// Rejected; nothing was applied.
    Rejected,
    /// Accepted and applied to the root directory.
    Applied,
}

impl ReviewState {
    /// The stored string.
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewState::Pending => "pending",
            ReviewState::Accepted => "accepted",
            ReviewState::Rejected => "rejected",
            ReviewState::Applied => "applied",
        }
    }

    fn parse(s: &str) -> ReviewState {
        match s {
            "accepted" => ReviewState::Accepted,
            "rejected" => ReviewState::Rejected,
            "applied" => ReviewState::Applied,
            // The CHECK constraint admits nothing else.
            _ => ReviewState::Pending,
        }
    }
}

/// A review to open (the sandbox row moves to `review` in the same transaction).
#[derive(Debug, Clone, PartialEq)]
pub struct NewReview {
    pub run_id: String,
    pub sandbox_id: String,
    /// Where accepted patches are applied.
    pub root_dir: String,
    pub bundle_path: String,
    /// The step's own status from the bundle manifest (finished/failed/cancelled).
    pub bundle_status: String,
    pub remote_run_id: Option<String>,
    pub patch_count: u64,
    pub total_diff_lines: u64,
    /// Execution duration, reported by SandboxCompleted once the review is decided.
    pub duration_ms: f64,
    pub requested_at_ms: i64,
    /// The digest of the bundle's README.md and patch files as they were when the review was
    /// opened; accept refuses a bundle whose digest differs.
    pub bundle_digest: String,
    /// Who applies the bundle once accepted: `None`, our accept; [`APPLIED_BY_CALLER`], the
    /// caller that held it for review (accept then records the decision and applies nothing).
    pub applied_by: Option<String>,
}

/// [`NewReview::applied_by`] of a bundle the caller applies itself (the Smithers provider's
/// durable review: Smithers applies the diffBundle a person accepted here).
pub const APPLIED_BY_CALLER: &str = "caller";

/// A stored review.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewRow {
    pub run_id: String,
    pub sandbox_id: String,
    pub state: ReviewState,
    pub reason: Option<String>,
    pub root_dir: String,
    pub bundle_path: String,
    pub bundle_status: String,
    pub remote_run_id: Option<String>,
    pub patch_count: u64,
    pub total_diff_lines: u64,
    pub duration_ms: f64,
    pub requested_at_ms: i64,
    pub decided_at_ms: Option<i64>,
    pub applied_at_ms: Option<i64>,
    /// Why the last accept could not apply the patches (the review is then `pending` again,
    /// so the accept can be retried once the cause is fixed, or the review rejected).
    pub apply_error: Option<String>,
    /// See [`NewReview::bundle_digest`]; `None` for a review opened by an older version.
    pub bundle_digest: Option<String>,
    /// See [`NewReview::applied_by`].
    pub applied_by: Option<String>,
}

impl ReviewRow {
    /// True when the caller that held the bundle applies it, not our accept.
    pub fn applied_by_caller(&self) -> bool {
        self.applied_by.as_deref() == Some(APPLIED_BY_CALLER)
    }
}

const REVIEW_COLUMNS: &str = "run_id, sandbox_id, state, reason, root_dir, bundle_path, \
     bundle_status, remote_run_id, patch_count, total_diff_lines, duration_ms, requested_at_ms, \
     decided_at_ms, applied_at_ms, apply_error, bundle_digest, applied_by";

fn review_row(r: &Row<'_>) -> rusqlite::Result<ReviewRow> {
    Ok(ReviewRow {
        run_id: r.get(0)?,
        sandbox_id: r.get(1)?,
        state: ReviewState::parse(&r.get::<_, String>(2)?),
        reason: r.get(3)?,
        root_dir: r.get(4)?,
        bundle_path: r.get(5)?,
        bundle_status: r.get(6)?,
        remote_run_id: r.get(7)?,
        patch_count: r.get(8)?,
        total_diff_lines: r.get(9)?,
        duration_ms: r.get(10)?,
        requested_at_ms: r.get(11)?,
        decided_at_ms: r.get(12)?,
        applied_at_ms: r.get(13)?,
        apply_error: r.get(14)?,
        bundle_digest: r.get(15)?,
        applied_by: r.get(16)?,
    })
}

/// What a patch does to its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PatchOperation {
    Add,
    Modify,
    Delete,
}

impl PatchOperation {
    /// `add`, `modify` or `delete` (the DiffBundle vocabulary).
    pub fn as_str(self) -> &'static str {
        match self {
            PatchOperation::Add => "add",
            PatchOperation::Modify => "modify",
            PatchOperation::Delete => "delete",
        }
    }

    fn parse(s: &str) -> PatchOperation {
        match s {
            "add" => PatchOperation::Add,
            "delete" => PatchOperation::Delete,
            _ => PatchOperation::Modify,
        }
    }
}

/// One recorded patch of a review, per file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatchRecord {
    /// File path relative to the root directory.
    pub path: String,
    pub operation: PatchOperation,
    /// Hash of the file the patch expects (None for `add`).
    pub base_hash: Option<String>,
    /// Hash of the file after the patch (None for `delete`).
    pub new_hash: Option<String>,
    /// The patch file, relative to the bundle (`patches/...`).
    pub patch_path: String,
}

/// Connections kept for reuse when idle; more are opened while that many are in use at
/// once, and closed when given back to a full pool.
const IDLE_CONNECTIONS: usize = 8;

/// The store: a pool of SQLite connections to one database file.
#[derive(Debug)]
pub struct Store {
    /// Idle connections, each set up by [`connect`].
    idle: Mutex<Vec<Connection>>,
    path: PathBuf,
    /// Whether a connection was in use since the last [`Store::sync_wal`] (set when one is
    /// taken and when it is given back, so a call that straddles a sync counts after it):
    /// the sync at drop is skipped when nothing could have been written since.
    unsynced: AtomicBool,
}

/// Above this size, [`Store::sync_wal`] checkpoints the WAL into the database and truncates
/// it instead of fsyncing it. The next process's first connection rebuilds the WAL index by
/// reading and checksumming every frame (about 2.6 µs a frame here: a WAL grown to SQLite's
/// automatic checkpoint, 1000 frames, made opening the store 1–4 ms of a 17 ms `run`); a
/// checkpoint costs the database's fsync besides the WAL's, once every few `run`s (one adds
/// about 40 frames).
const WAL_CHECKPOINT_BYTES: u64 = 512 << 10;

/// A connection taken from the pool for one call; given back when dropped. A transaction
/// is dropped (rolled back if not committed) before its connection, so what is given back
/// never holds one.
struct Pooled<'a> {
    store: &'a Store,
    conn: Option<Connection>,
}

impl Deref for Pooled<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("a pooled connection is held until drop")
    }
}

impl DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
            .as_mut()
            .expect("a pooled connection is held until drop")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        // A connection left inside a transaction (it cannot be, see above) is not reused.
        if !conn.is_autocommit() {
            return;
        }
        self.store.unsynced.store(true, Ordering::SeqCst);
        let mut idle = self.store.idle();
        if idle.len() < IDLE_CONNECTIONS {
            idle.push(conn);
        }
    }
}

/// Statements through the connection's cache of prepared statements: preparing one (parsing
/// and planning its SQL) cost more than running it, several times per step's transaction.
pub(crate) trait CachedSql {
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;
}

impl CachedSql for Connection {
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// Whether `e` is SQLite's busy or locked answer while opening the store.
fn is_locked(e: &StoreError) -> bool {
    let source = match e {
        StoreError::Open { source, .. } | StoreError::Migrate { source, .. } => source,
        _ => return false,
    };
    matches!(
        source.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Enough for every statement a step's lifecycle runs (the default, 16, was not).
const STATEMENT_CACHE: usize = 64;

/// Opens one connection to `path` with the settings every connection of a store has:
/// `busy_timeout` (first, so that a connection opened while another holds a lock waits
/// instead of failing), foreign keys on, `synchronous = NORMAL`. The WAL journal mode is the
/// file's, set once by [`Store::open`].
fn connect(path: &Path) -> Result<Connection> {
    let open_err = |source| StoreError::Open {
        path: path.display().to_string(),
        source,
    };
    let conn = Connection::open(path).map_err(open_err)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL;")
        .map_err(open_err)?;
    // No checkpoint when the last connection closes: it cost two fsyncs (WAL, database),
    // the unlink of the WAL and, at the next open, its re-creation (a directory fsync) on
    // every short-lived `smithers-sandbox` process. Durability at close comes from one fsync
    // of the WAL instead ([`Store`]'s drop); the WAL stays bounded by SQLite's automatic
    // checkpoint at commit (1000 pages).
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .map_err(open_err)?;
    Ok(conn)
}

impl Drop for Store {
    /// Closes the connections, then makes every transaction they committed durable: with
    /// `synchronous = NORMAL` a commit is written to the WAL but not synced, and the close
    /// no longer checkpoints (see [`connect`]), so the WAL is fsync'd here (all committed
    /// frames are in it; SQLite's recovery replays them after a power loss). Best effort, as
    /// the checkpoint on close it replaces was: a drop cannot report.
    fn drop(&mut self) {
        self.idle().clear();
        if self.unsynced.load(Ordering::SeqCst) {
            let _ = self.sync_wal();
        }
    }
}

impl Store {
    /// Opens (creating if needed) the database at `path`: WAL, `busy_timeout` 30 s, foreign
    /// keys on, migrations applied. Processes that open a new database at once can meet
    /// SQLite's "database is locked" while one of them sets the WAL mode up, which the busy
    /// handler does not wait out (seen with six `run`s started together on a loaded
    /// machine): such an open is tried again, with backoff, within [`BUSY_TIMEOUT`].
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(5);
        loop {
            match Store::open_once(path.as_ref()) {
                Err(e) if is_locked(&e) && started.elapsed() + pause < BUSY_TIMEOUT => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(250));
                }
                other => return other,
            }
        }
    }

    fn open_once(path: &Path) -> Result<Store> {
        let path = path.to_path_buf();
        let open_err = |source| StoreError::Open {
            path: path.display().to_string(),
            source,
        };
        let mut conn = connect(&path)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(open_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            // Fail closed: without WAL, readers (events --follow) block writers.
            return Err(open_err(rusqlite::Error::InvalidParameterName(format!(
                "journal_mode is {mode}, WAL could not be enabled"
            ))));
        }
        schema::migrate(&mut conn)?;
        Ok(Store {
            idle: Mutex::new(vec![conn]),
            path,
            unsynced: AtomicBool::new(true),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes every transaction committed so far durable (survives a power loss): fsyncs the
    /// WAL, where a `synchronous = NORMAL` commit is written but not synced; or, once the WAL
    /// has grown past [`WAL_CHECKPOINT_BYTES`], checkpoints it into the database and
    /// truncates it (which syncs both), so that the next process opens a short WAL. Also run
    /// when the store is dropped, unless no connection was used since the last sync. Nothing
    /// to do when there is no WAL yet (nothing was written).
    pub fn sync_wal(&self) -> Result<()> {
        self.unsynced.store(false, Ordering::SeqCst);
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let grown = std::fs::metadata(&wal).is_ok_and(|m| m.len() > WAL_CHECKPOINT_BYTES);
        if grown && self.checkpoint_truncate()? {
            return Ok(());
        }
        // Reported as the I/O error SQLite's own fsync of the WAL would have given.
        let io_err = |what: &str, e: std::io::Error| {
            StoreError::query("sync_wal")(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR_FSYNC),
                Some(format!("{what} {}: {e}", wal.display())),
            ))
        };
        match std::fs::File::open(&wal) {
            Ok(f) => f.sync_data().map_err(|e| io_err("fsync", e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("open", e)),
        }
    }

    /// `PRAGMA wal_checkpoint(TRUNCATE)`: every frame copied into the database, both synced,
    /// the WAL emptied. `false` when another connection's reader or writer kept it from
    /// completing (SQLite's busy flag): the WAL then still holds frames to sync.
    /// A connection of its own, not the pool's: taking a pooled one would mark the store
    /// unsynced again.
    fn checkpoint_truncate(&self) -> Result<bool> {
        let conn = connect(&self.path)?;
        let busy: i64 = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .map_err(StoreError::query("wal_checkpoint"))?;
        Ok(busy == 0)
    }

    /// Why this database must not be trusted to name host objects, or `None`: it lives in
    /// the project tree (`<project>/.smithers/sandbox.db`), so a cloned repository can ship
    /// one, and a file owned by another user than this process's effective uid was not made
    /// by us. Also `Some` when the owner cannot be told (fail closed).
    pub fn foreign_owner(&self) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let me = match owner::effective_uid() {
            Some(uid) => uid,
            None => return Some("this process's uid cannot be read from /proc".into()),
        };
        match std::fs::metadata(&self.path) {
            Ok(m) if m.uid() == me => None,
            Ok(m) => Some(format!(
                "{} is owned by uid {}, not by this process's uid {me}",
                self.path.display(),
                m.uid()
            )),
            Err(e) => Some(format!("{}: {e}", self.path.display())),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        // The lock is held only to push or pop a connection, never across a call, so a
        // poisoned one (a panic in push or pop) holds nothing half-done.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection for one call: an idle one, or a new one when all are in use.
    fn conn(&self) -> Result<Pooled<'_>> {
        let idle = self.idle().pop();
        let conn = match idle {
            Some(conn) => conn,
            None => connect(&self.path)?,
        };
        Ok(Pooled {
            store: self,
            conn: Some(conn),
        })
    }

    /// `PRAGMA user_version` of the file.
    pub fn schema_version(&self) -> Result<u32> {
        self.conn()?
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(StoreError::query("schema_version"))
    }

    /// Upserts a sandbox row: present fields are written (a [`Field::Null`] clears the
    /// column), absent ones are left as they are (or take the column default on insert).
    pub fn upsert_sandbox(&self, row: &SandboxUpsert) -> Result<()> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::query("upsert_sandbox"))?;
        upsert_sandbox_on(&tx, row)?;
        tx.commit().map_err(StoreError::query("upsert_sandbox"))
    }

    /// One sandbox row.
    pub fn get_sandbox(&self, run_id: &str, sandbox_id: &str) -> Result<Option<SandboxRow>> {
        self.conn()?
            .row(
                &format!(
                    "SELECT {SANDBOX_COLUMNS} FROM _smithers_sandboxes WHERE run_id = ?1 AND sandbox_id = ?2"
                ),
                params![run_id, sandbox_id],
                sandbox_row,
            )
            .optional()
            .map_err(StoreError::query("get_sandbox"))
    }

    /// Every sandbox of a run, by sandbox id.
    pub fn list_sandboxes(&self, run_id: &str) -> Result<Vec<SandboxRow>> {
        let conn = self.conn()?;
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {SANDBOX_COLUMNS} FROM _smithers_sandboxes WHERE run_id = ?1 ORDER BY sandbox_id"
            ))
            .map_err(StoreError::query("list_sandboxes"))?;
        let rows = stmt
            .query_map([run_id], sandbox_row)
            .and_then(|r| r.collect())
            .map_err(StoreError::query("list_sandboxes"));
        rows
    }

    /// Records a heartbeat (the JavaScript `heartbeatSandbox`): only for a non-terminal row and
    /// never moving the time backwards. Returns whether a row was updated.
    pub fn heartbeat_sandbox(&self, run_id: &str, sandbox_id: &str, at_ms: i64) -> Result<bool> {
        heartbeat_on(&*self.conn()?, run_id, sandbox_id, at_ms)
    }

    /// Appends an event and returns its `seq`. Seqs start at 0 per run and have no gaps, also
    /// with many writers (processes or connections): the next seq is read and the row written
    /// in one IMMEDIATE transaction. Inserting an identical (run_id, timestamp_ms, type,
    /// payload_json) again writes nothing and returns the existing seq.
    pub fn insert_event(&self, event: &NewEvent<'_>) -> Result<i64> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::query("insert_event"))?;
        let seq = insert_event_on(&tx, event)?;
        tx.commit().map_err(StoreError::query("insert_event"))?;
        Ok(seq)
    }

    /// [`Store::upsert_sandbox`] and [`Store::insert_event`] in one transaction: a state
    /// change and the event that says it, both or neither (and one commit, not two, on the
    /// step's critical path). Returns the event's `seq`.
    pub fn upsert_sandbox_with_event(
        &self,
        row: &SandboxUpsert,
        event: &NewEvent<'_>,
    ) -> Result<i64> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::query("upsert_sandbox_with_event"))?;
        upsert_sandbox_on(&tx, row)?;
        let seq = insert_event_on(&tx, event)?;
        tx.commit()
            .map_err(StoreError::query("upsert_sandbox_with_event"))?;
        Ok(seq)
    }

    /// [`Store::heartbeat_sandbox`] and [`Store::insert_event`] in one transaction. Returns
    /// whether the row was updated, and the event's `seq`.
    pub fn heartbeat_sandbox_with_event(
        &self,
        run_id: &str,
        sandbox_id: &str,
        at_ms: i64,
        event: &NewEvent<'_>,
    ) -> Result<(bool, i64)> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::query("heartbeat_sandbox_with_event"))?;
        let updated = heartbeat_on(&tx, run_id, sandbox_id, at_ms)?;
        let seq = insert_event_on(&tx, event)?;
        tx.commit()
            .map_err(StoreError::query("heartbeat_sandbox_with_event"))?;
        Ok((updated, seq))
    }

    /// Events of a run with `seq >= from_seq`, in seq order.
    pub fn events_since(&self, run_id: &str, from_seq: i64) -> Result<Vec<EventRow>> {
        let conn = self.conn()?;
        let mut stmt = conn
            .prepare_cached(
                "SELECT run_id, seq, timestamp_ms, type, payload_json FROM _smithers_events
                 WHERE run_id = ?1 AND seq >= ?2 ORDER BY seq",
            )
            .map_err(StoreError::query("events_since"))?;
        let rows = stmt
            .query_map(params![run_id, from_seq], |r| {
                Ok(EventRow {
                    run_id: r.get(0)?,
                    seq: r.get(1)?,
                    timestamp_ms: r.get(2)?,
                    event_type: r.get(3)?,
                    payload_json: r.get(4)?,
                })
            })
            .and_then(|r| r.collect())
            .map_err(StoreError::query("events_since"));
        rows
    }

    /// Waits until the run has an event with `seq >= from_seq` or `timeout` passes, and
    /// returns them (empty on timeout). SQLite has no cross-process notification, so this
    /// polls every [`EVENT_POLL_INTERVAL`] (one indexed range query on the primary key).
    /// For `events --follow`: call in a loop with `from_seq = last seen + 1`.
    pub fn wait_for_events(
        &self,
        run_id: &str,
        from_seq: i64,
        timeout: Duration,
    ) -> Result<Vec<EventRow>> {
        let deadline = Instant::now() + timeout;
        loop {
            let rows = self.events_since(run_id, from_seq)?;
            let now = Instant::now();
            if !rows.is_empty() || now >= deadline {
                return Ok(rows);
            }
            std::thread::sleep(EVENT_POLL_INTERVAL.min(deadline - now));
        }
    }

    /// Number of sandboxes holding a gate slot, in one run or (None) in the whole database.
    pub fn count_active(&self, run_id: Option<&str>) -> Result<u64> {
        count_active_on(&*self.conn()?, run_id)
    }

    /// The atomic concurrency gate. In ONE `BEGIN IMMEDIATE` transaction: refuse if this
    /// sandbox id is already active or in review, count the active sandboxes of the run and of
    /// the whole database, and only when both are below their limits write the `pending` row
    /// (every other column reset as the JavaScript package does) and the owner lease. Two
    /// processes cannot interleave between the count and the insert, because IMMEDIATE takes
    /// the write lock before the count.
    pub fn try_admit(&self, req: &AdmitRequest) -> Result<Admitted> {
        self.admit(req, None)
    }

    /// [`Store::try_admit`] that also appends `created` (the `SandboxCreated` event) in the
    /// same transaction when, and only when, the sandbox is admitted: one commit, not two, at
    /// the start of every step. Returns what the gate saw and the event's `seq`.
    pub fn try_admit_with_event(
        &self,
        req: &AdmitRequest,
        created: &NewEvent<'_>,
    ) -> Result<(Admitted, i64)> {
        let mut seq = None;
        let admitted = self.admit(req, Some((created, &mut seq)))?;
        let seq = seq
            .ok_or_else(|| StoreError::query("try_admit")(rusqlite::Error::QueryReturnedNoRows))?;
        Ok((admitted, seq))
    }

    fn admit(
        &self,
        req: &AdmitRequest,
        created: Option<(&NewEvent<'_>, &mut Option<i64>)>,
    ) -> Result<Admitted> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::query("try_admit"))?;
        let existing: Option<String> = tx
            .row(
                "SELECT status FROM _smithers_sandboxes WHERE run_id = ?1 AND sandbox_id = ?2",
                params![req.run_id, req.sandbox_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(StoreError::query("try_admit"))?;
        if let Some(status) = existing {
            if !SandboxStatus::parse(&status).is_terminal() {
                return Err(StoreError::SandboxAlreadyActive {
                    run_id: req.run_id.clone(),
                    sandbox_id: req.sandbox_id.clone(),
                    status,
                });
            }
        }
        let active_in_run = count_active_on(&tx, Some(&req.run_id))?;
        if active_in_run >= u64::from(req.per_run_max) {
            return Err(StoreError::ConcurrencyLimit {
                scope: GateScope::Run,
                run_id: req.run_id.clone(),
                max_concurrent: req.per_run_max,
                active_sandbox_count: active_in_run,
            });
        }
        let active_on_host = count_active_on(&tx, None)?;
        if active_on_host >= u64::from(req.host_max) {
            return Err(StoreError::ConcurrencyLimit {
                scope: GateScope::Host,
                run_id: req.run_id.clone(),
                max_concurrent: req.host_max,
                active_sandbox_count: active_on_host,
            });
        }
        upsert_sandbox_on(
            &tx,
            &SandboxUpsert {
                run_id: req.run_id.clone(),
                sandbox_id: req.sandbox_id.clone(),
                runtime: Some(req.runtime.clone()),
                remote_run_id: Field::Null,
                workspace_id: Field::Null,
                container_id: Field::Null,
                config: Some(req.config.clone()),
                status: Some(SandboxStatus::Pending),
                shipped_at_ms: Field::Null,
                completed_at_ms: Field::Null,
                bundle_path: Field::Null,
                heartbeat_at_ms: Field::Value(req.now_ms),
            },
        )?;
        // A re-run of a finished sandbox id starts clean: its old review and patches belong to
        // the previous execution (its events stay: they are history).
        for table in ["_smithers_sandbox_reviews", "_smithers_sandbox_patches"] {
            tx.exec(
                &format!("DELETE FROM {table} WHERE run_id = ?1 AND sandbox_id = ?2"),
                params![req.run_id, req.sandbox_id],
            )
            .map_err(StoreError::query("try_admit"))?;
        }
        tx.exec(
            "INSERT OR REPLACE INTO _smithers_sandbox_leases
                (run_id, sandbox_id, owner_host, owner_boot_id, owner_pid, owner_start_time,
                 handle_json, acquired_at_ms, released_at_ms, release_reason)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, ?7, NULL, NULL)",
            params![
                req.run_id,
                req.sandbox_id,
                req.owner.host,
                req.owner.boot_id,
                req.owner.pid,
                req.owner.start_time as i64,
                req.now_ms
            ],
        )
        .map_err(StoreError::query("try_admit"))?;
        if let Some((event, seq)) = created {
            *seq = Some(insert_event_on(&tx, event)?);
        }
        tx.commit().map_err(StoreError::query("try_admit"))?;
        Ok(Admitted {
            active_in_run,
            active_on_host,
        })
    }

    /// Records a start the gate refused, as 0.16 does (row `failed`, completed now), but only
    /// when no execution uses this sandbox id: the check and the write are one IMMEDIATE
    /// transaction, so a concurrent admission of the same id is never overwritten. Returns
    /// whether the row was written.
    pub fn record_refused(
        &self,
        run_id: &str,
        sandbox_id: &str,
        runtime: &str,
        config: &RedactedConfig,
        now_ms: i64,
    ) -> Result<bool> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::query("record_refused"))?;
        let existing: Option<String> = tx
            .row(
                "SELECT status FROM _smithers_sandboxes WHERE run_id = ?1 AND sandbox_id = ?2",
                params![run_id, sandbox_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(StoreError::query("record_refused"))?;
        if existing.is_some_and(|s| !SandboxStatus::parse(&s).is_terminal()) {
            return Ok(false);
        }
        upsert_sandbox_on(
            &tx,
            &SandboxUpsert {
                runtime: Some(runtime.to_string()),
                remote_run_id: Field::Null,
                workspace_id: Field::Null,
                container_id: Field::Null,
                config: Some(config.clone()),
                status: Some(SandboxStatus::Failed),
                heartbeat_at_ms: Field::Value(now_ms),
                shipped_at_ms: Field::Null,
                completed_at_ms: Field::Value(now_ms),
                bundle_path: Field::Null,
                ..SandboxUpsert::key(run_id, sandbox_id)
            },
        )?;
        tx.commit().map_err(StoreError::query("record_refused"))?;
        Ok(true)
    }

    /// Stores the runtime handle (plain JSON) in the lease, so a later process can clean up
    /// what this one leaves behind if it dies.
    pub fn set_handle(&self, run_id: &str, sandbox_id: &str, handle_json: &str) -> Result<()> {
        let n = self
            .conn()?
            .exec(
                "UPDATE _smithers_sandbox_leases SET handle_json = ?3
                 WHERE run_id = ?1 AND sandbox_id = ?2",
                params![run_id, sandbox_id, handle_json],
            )
            .map_err(StoreError::query("set_handle"))?;
        if n == 0 {
            return Err(StoreError::SandboxNotFound {
                run_id: run_id.to_string(),
                sandbox_id: sandbox_id.to_string(),
            });
        }
        Ok(())
    }

    /// Marks the lease released (the sandbox reached a terminal or review state and its
    /// runtime resources were cleaned up).
    pub fn release_lease(
        &self,
        run_id: &str,
        sandbox_id: &str,
        at_ms: i64,
        reason: &str,
    ) -> Result<()> {
        self.conn()?
            .exec(
                "UPDATE _smithers_sandbox_leases SET released_at_ms = ?3, release_reason = ?4
                 WHERE run_id = ?1 AND sandbox_id = ?2 AND released_at_ms IS NULL",
                params![run_id, sandbox_id, at_ms, reason],
            )
            .map_err(StoreError::query("release_lease"))?;
        Ok(())
    }

    /// The lease of a sandbox.
    pub fn lease(&self, run_id: &str, sandbox_id: &str) -> Result<Option<Lease>> {
        self.conn()?
            .row(
                &format!("SELECT {LEASE_COLUMNS} FROM _smithers_sandbox_leases l WHERE run_id = ?1 AND sandbox_id = ?2"),
                params![run_id, sandbox_id],
                |r| lease_row(r, 0),
            )
            .optional()
            .map_err(StoreError::query("lease"))
    }

    /// Sandboxes holding a gate slot whose owner is dead ([`OwnerIdentity::liveness`] says
    /// [`Liveness::Dead`]: gone, pid reused, or host rebooted). Owners on another host are
    /// `Unknown` and never returned; rows without a lease (written by the JavaScript package)
    /// are not ours to judge and are not returned either. Rows in `review` are never orphans.
    pub fn orphaned_sandboxes(&self) -> Result<Vec<Orphan>> {
        let conn = self.conn()?;
        let mut stmt = conn
            .prepare_cached(&orphan_candidates_sql())
            .map_err(StoreError::query("orphaned_sandboxes"))?;
        let mut candidates: Vec<Orphan> = stmt
            .query_map([], |r| {
                Ok(Orphan {
                    sandbox: sandbox_row(r)?,
                    lease: lease_row(r, 12)?,
                })
            })
            .and_then(|r| r.collect())
            .map_err(StoreError::query("orphaned_sandboxes"))?;
        // Sorted here, not by the query: an ORDER BY made SQLite walk the whole table in key
        // order instead of the few active rows of the partial index (every `run` pays this).
        candidates.sort_by(|a, b| {
            (&a.sandbox.run_id, &a.sandbox.sandbox_id)
                .cmp(&(&b.sandbox.run_id, &b.sandbox.sandbox_id))
        });
        Ok(candidates
            .into_iter()
            .filter(|o| o.lease.owner.liveness() == Liveness::Dead)
            .collect())
    }

    /// How SQLite runs the recovery pass's query, one line per step (`EXPLAIN QUERY PLAN`).
    pub fn orphan_query_plan(&self) -> Result<Vec<String>> {
        let conn = self.conn()?;
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", orphan_candidates_sql()))
            .map_err(StoreError::query("orphan_query_plan"))?;
        let plan = stmt
            .query_map([], |r| r.get::<_, String>(3))
            .and_then(|r| r.collect())
            .map_err(StoreError::query("orphan_query_plan"))?;
        Ok(plan)
    }

    /// Compare-and-set for recovery: marks an orphan `failed` (completed now) and its lease
    /// released with reason `orphaned`, but only if the row is still active under the same
    /// owner. Returns false when someone else got there first (two processes recovering at
    /// once: exactly one wins and emits the event).
    pub fn mark_orphan_failed(&self, orphan: &Orphan, now_ms: i64) -> Result<bool> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::query("mark_orphan_failed"))?;
        let n = tx
            .exec(
                &format!(
                    "UPDATE _smithers_sandboxes SET status = 'failed', completed_at_ms = ?3,
                        heartbeat_at_ms = ?3
                     WHERE run_id = ?1 AND sandbox_id = ?2 AND {ACTIVE_SQL}
                       AND EXISTS (SELECT 1 FROM _smithers_sandbox_leases l
                                   WHERE l.run_id = ?1 AND l.sandbox_id = ?2
                                     AND l.owner_pid = ?4 AND l.owner_start_time = ?5
                                     AND l.owner_boot_id = ?6)"
                ),
                params![
                    orphan.sandbox.run_id,
                    orphan.sandbox.sandbox_id,
                    now_ms,
                    orphan.lease.owner.pid,
                    orphan.lease.owner.start_time as i64,
                    orphan.lease.owner.boot_id
                ],
            )
            .map_err(StoreError::query("mark_orphan_failed"))?;
        if n == 1 {
            tx.exec(
                "UPDATE _smithers_sandbox_leases SET released_at_ms = ?3, release_reason = 'orphaned'
                 WHERE run_id = ?1 AND sandbox_id = ?2",
                params![orphan.sandbox.run_id, orphan.sandbox.sandbox_id, now_ms],
            )
            .map_err(StoreError::query("mark_orphan_failed"))?;
        }
        tx.commit()
            .map_err(StoreError::query("mark_orphan_failed"))?;
        Ok(n == 1)
    }

    /// Deletes an ended sandbox's rows (the sandbox, its review, patches and lease) in one
    /// transaction; the run's events stay (they are the run's history). Refused, with nothing
    /// deleted, unless the sandbox's status is terminal: a live one or one awaiting review is
    /// not ours to forget. Returns false when there was no such sandbox.
    pub fn delete_sandbox(&self, run_id: &str, sandbox_id: &str) -> Result<bool> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::query("delete_sandbox"))?;
        let status: Option<String> = tx
            .row(
                "SELECT status FROM _smithers_sandboxes WHERE run_id = ?1 AND sandbox_id = ?2",
                params![run_id, sandbox_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(StoreError::query("delete_sandbox"))?;
        let Some(status) = status else {
            return Ok(false);
        };
        if !SandboxStatus::parse(&status).is_terminal() {
            return Err(StoreError::SandboxAlreadyActive {
                run_id: run_id.to_string(),
                sandbox_id: sandbox_id.to_string(),
                status,
            });
        }
        for table in [
            "_smithers_sandbox_patches",
            "_smithers_sandbox_reviews",
            "_smithers_sandbox_leases",
            "_smithers_sandboxes",
        ] {
            tx.exec(
                &format!("DELETE FROM {table} WHERE run_id = ?1 AND sandbox_id = ?2"),
                params![run_id, sandbox_id],
            )
            .map_err(StoreError::query("delete_sandbox"))?;
        }
        tx.commit().map_err(StoreError::query("delete_sandbox"))?;
        Ok(true)
    }

    /// Opens a durable review: in one transaction the review row (`pending`), its patches and
    /// the sandbox row's status `review` (bundle path set) are written.
    pub fn open_review(&self, review: &NewReview, patches: &[PatchRecord]) -> Result<()> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::query("open_review"))?;
        let n = tx
            .exec(
                "UPDATE _smithers_sandboxes SET status = 'review', bundle_path = ?3
                 WHERE run_id = ?1 AND sandbox_id = ?2",
                params![review.run_id, review.sandbox_id, review.bundle_path],
            )
            .map_err(StoreError::query("open_review"))?;
        if n == 0 {
            return Err(StoreError::SandboxNotFound {
                run_id: review.run_id.clone(),
                sandbox_id: review.sandbox_id.clone(),
            });
        }
        tx.exec(
            &format!(
                "INSERT OR REPLACE INTO _smithers_sandbox_reviews ({REVIEW_COLUMNS})
                 VALUES (?1, ?2, 'pending', NULL, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, NULL, NULL, NULL, ?11, ?12)"
            ),
            params![
                review.run_id,
                review.sandbox_id,
                review.root_dir,
                review.bundle_path,
                review.bundle_status,
                review.remote_run_id,
                review.patch_count as i64,
                review.total_diff_lines as i64,
                review.duration_ms,
                review.requested_at_ms,
                review.bundle_digest,
                review.applied_by
            ],
        )
        .map_err(StoreError::query("open_review"))?;
        tx.exec(
            "DELETE FROM _smithers_sandbox_patches WHERE run_id = ?1 AND sandbox_id = ?2",
            params![review.run_id, review.sandbox_id],
        )
        .map_err(StoreError::query("open_review"))?;
        for (idx, p) in patches.iter().enumerate() {
            tx.exec(
                "INSERT INTO _smithers_sandbox_patches
                    (run_id, sandbox_id, idx, path, operation, base_hash, new_hash, patch_path)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    review.run_id,
                    review.sandbox_id,
                    idx as i64,
                    p.path,
                    p.operation.as_str(),
                    p.base_hash,
                    p.new_hash,
                    p.patch_path
                ],
            )
            .map_err(StoreError::query("open_review"))?;
        }
        tx.commit().map_err(StoreError::query("open_review"))
    }

    /// The review of a sandbox.
    pub fn get_review(&self, run_id: &str, sandbox_id: &str) -> Result<Option<ReviewRow>> {
        self.conn()?
            .row(
                &format!(
                    "SELECT {REVIEW_COLUMNS} FROM _smithers_sandbox_reviews WHERE run_id = ?1 AND sandbox_id = ?2"
                ),
                params![run_id, sandbox_id],
                review_row,
            )
            .optional()
            .map_err(StoreError::query("get_review"))
    }

    /// Reviews, optionally only those in one state, oldest request first.
    pub fn list_reviews(&self, state: Option<ReviewState>) -> Result<Vec<ReviewRow>> {
        let conn = self.conn()?;
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {REVIEW_COLUMNS} FROM _smithers_sandbox_reviews
                 WHERE ?1 IS NULL OR state = ?1 ORDER BY requested_at_ms, run_id, sandbox_id"
            ))
            .map_err(StoreError::query("list_reviews"))?;
        let rows = stmt
            .query_map([state.map(ReviewState::as_str)], review_row)
            .and_then(|r| r.collect())
            .map_err(StoreError::query("list_reviews"));
        rows
    }

    /// The recorded patches of a sandbox, in bundle order.
    pub fn patches(&self, run_id: &str, sandbox_id: &str) -> Result<Vec<PatchRecord>> {
        let conn = self.conn()?;
        let mut stmt = conn
            .prepare_cached(
                "SELECT path, operation, base_hash, new_hash, patch_path
                 FROM _smithers_sandbox_patches WHERE run_id = ?1 AND sandbox_id = ?2 ORDER BY idx",
            )
            .map_err(StoreError::query("patches"))?;
        let rows = stmt
            .query_map(params![run_id, sandbox_id], |r| {
                Ok(PatchRecord {
                    path: r.get(0)?,
                    operation: PatchOperation::parse(&r.get::<_, String>(1)?),
                    base_hash: r.get(2)?,
                    new_hash: r.get(3)?,
                    patch_path: r.get(4)?,
                })
            })
            .and_then(|r| r.collect())
            .map_err(StoreError::query("patches"));
        rows
    }

    /// Moves a review from `from` to `to` (compare-and-set: two people deciding at once, only
    /// one wins; the other gets [`StoreError::ReviewTransition`]). Allowed moves: pending →
    /// accepted | rejected, accepted → applied, and accepted → pending when the patches could
    /// not be applied (the accept can then be retried). `reason` and `apply_error` are written when
    /// given; the decision / apply time is `at_ms`.
    pub fn transition_review(
        &self,
        run_id: &str,
        sandbox_id: &str,
        from: ReviewState,
        to: ReviewState,
        reason: Option<&str>,
        at_ms: i64,
    ) -> Result<ReviewRow> {
        let allowed = matches!(
            (from, to),
            (ReviewState::Pending, ReviewState::Accepted)
                | (ReviewState::Pending, ReviewState::Rejected)
                | (ReviewState::Accepted, ReviewState::Applied)
                | (ReviewState::Accepted, ReviewState::Pending)
        );
        let current =
            self.get_review(run_id, sandbox_id)?
                .ok_or_else(|| StoreError::SandboxNotFound {
                    run_id: run_id.to_string(),
                    sandbox_id: sandbox_id.to_string(),
                })?;
        let refuse = |from: ReviewState| StoreError::ReviewTransition {
            run_id: run_id.to_string(),
            sandbox_id: sandbox_id.to_string(),
            from: from.as_str().to_string(),
            to: to.as_str().to_string(),
        };
        if !allowed {
            return Err(refuse(from));
        }
        let time_column = if to == ReviewState::Applied {
            "applied_at_ms"
        } else {
            "decided_at_ms"
        };
        let n = self
            .conn()?
            .exec(
                &format!(
                    "UPDATE _smithers_sandbox_reviews
                     SET state = ?4, {time_column} = ?5, reason = COALESCE(?6, reason)
                     WHERE run_id = ?1 AND sandbox_id = ?2 AND state = ?3"
                ),
                params![
                    run_id,
                    sandbox_id,
                    from.as_str(),
                    to.as_str(),
                    at_ms,
                    reason
                ],
            )
            .map_err(StoreError::query("transition_review"))?;
        if n == 0 {
            let now = self
                .get_review(run_id, sandbox_id)?
                .map(|r| r.state)
                .unwrap_or(current.state);
            return Err(refuse(now));
        }
        self.get_review(run_id, sandbox_id)?
            .ok_or_else(|| StoreError::SandboxNotFound {
                run_id: run_id.to_string(),
                sandbox_id: sandbox_id.to_string(),
            })
    }

    /// Records why applying an accepted review failed.
    pub fn record_apply_error(&self, run_id: &str, sandbox_id: &str, error: &str) -> Result<()> {
        self.conn()?
            .exec(
                "UPDATE _smithers_sandbox_reviews SET apply_error = ?3
                 WHERE run_id = ?1 AND sandbox_id = ?2",
                params![run_id, sandbox_id, error],
            )
            .map_err(StoreError::query("record_apply_error"))?;
        Ok(())
    }
}

const LEASE_COLUMNS: &str = "run_id, sandbox_id, owner_host, owner_boot_id, owner_pid, \
     owner_start_time, handle_json, acquired_at_ms, released_at_ms, release_reason";

fn lease_row(r: &Row<'_>, base: usize) -> rusqlite::Result<Lease> {
    Ok(Lease {
        run_id: r.get(base)?,
        sandbox_id: r.get(base + 1)?,
        owner: OwnerIdentity {
            host: r.get(base + 2)?,
            boot_id: r.get(base + 3)?,
            pid: r.get(base + 4)?,
            start_time: r.get::<_, i64>(base + 5)? as u64,
        },
        handle_json: r.get(base + 6)?,
        acquired_at_ms: r.get(base + 7)?,
        released_at_ms: r.get(base + 8)?,
        release_reason: r.get(base + 9)?,
    })
}

fn count_active_on(conn: &Connection, run_id: Option<&str>) -> Result<u64> {
    // INDEXED BY the partial index of active rows (migration 2): O(active), not O(history).
    let n: i64 = match run_id {
        Some(run_id) => conn.row(
            &format!(
                "SELECT COUNT(*) FROM _smithers_sandboxes INDEXED BY _smithers_sandboxes_active_idx
                 WHERE {ACTIVE_SQL} AND run_id = ?1"
            ),
            [run_id],
            |r| r.get(0),
        ),
        None => conn.row(
            &format!(
                "SELECT COUNT(*) FROM _smithers_sandboxes INDEXED BY _smithers_sandboxes_active_idx
                 WHERE {ACTIVE_SQL}"
            ),
            [],
            |r| r.get(0),
        ),
    }
    .map_err(StoreError::query("count_active"))?;
    Ok(n as u64)
}

/// [`Store::insert_event`]'s work inside the caller's IMMEDIATE transaction `tx`.
fn insert_event_on(tx: &Connection, event: &NewEvent<'_>) -> Result<i64> {
    // Cached statements: this is the hottest write path (every event of every sandbox).
    let existing: Option<i64> = {
        // INDEXED BY: left alone, the planner walks the primary key backwards to avoid
        // sorting (ORDER BY seq), reading every event of the run on each insert: O(n) per
        // append, measured at 0.85 ms per event after 2000 events.
        let mut st = tx
            .prepare_cached(
                "SELECT seq FROM _smithers_events INDEXED BY _smithers_events_dedupe_idx
                 WHERE run_id = ?1 AND timestamp_ms = ?2 AND type = ?3 AND payload_json = ?4
                 ORDER BY seq DESC LIMIT 1",
            )
            .map_err(StoreError::query("insert_event"))?;
        st.query_row(
            params![
                event.run_id,
                event.timestamp_ms,
                event.event_type,
                event.payload_json
            ],
            |r| r.get(0),
        )
        .optional()
        .map_err(StoreError::query("insert_event"))?
    };
    if let Some(seq) = existing {
        return Ok(seq);
    }
    let seq: i64 = tx
        .prepare_cached("SELECT COALESCE(MAX(seq), -1) + 1 FROM _smithers_events WHERE run_id = ?1")
        .and_then(|mut st| st.query_row([event.run_id], |r| r.get(0)))
        .map_err(StoreError::query("insert_event"))?;
    tx.prepare_cached(
        "INSERT INTO _smithers_events (run_id, seq, timestamp_ms, type, payload_json)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut st| {
        st.execute(params![
            event.run_id,
            seq,
            event.timestamp_ms,
            event.event_type,
            event.payload_json
        ])
    })
    .map_err(StoreError::query("insert_event"))?;
    Ok(seq)
}

/// [`Store::heartbeat_sandbox`]'s statement on `conn` (a connection or a transaction).
fn heartbeat_on(conn: &Connection, run_id: &str, sandbox_id: &str, at_ms: i64) -> Result<bool> {
    let n = conn
        .prepare_cached(
            "UPDATE _smithers_sandboxes SET heartbeat_at_ms = ?3
             WHERE run_id = ?1 AND sandbox_id = ?2
               AND status NOT IN ('finished', 'failed', 'cancelled')
               AND (heartbeat_at_ms IS NULL OR heartbeat_at_ms <= ?3)",
        )
        .and_then(|mut st| st.execute(params![run_id, sandbox_id, at_ms]))
        .map_err(StoreError::query("heartbeat_sandbox"))?;
    Ok(n > 0)
}

/// UPDATE the present columns of an existing row, else INSERT them. Not one `INSERT .. ON
/// CONFLICT DO UPDATE`: SQLite checks NOT NULL on the insert values before it sees the
/// conflict, so a partial update (no config_json) of an existing row would fail. Callers run
/// this inside a transaction, so the two statements are atomic.
fn upsert_sandbox_on(conn: &Connection, row: &SandboxUpsert) -> Result<()> {
    let columns = row.columns();
    let key = params![row.run_id, row.sandbox_id];
    let (keys, sets): (Vec<_>, Vec<_>) = columns
        .iter()
        .partition(|(c, _)| matches!(*c, "run_id" | "sandbox_id"));
    debug_assert_eq!(keys.len(), 2);
    // Column names come from our fixed list, never from input.
    let exists = if sets.is_empty() {
        conn.row(
            "SELECT 1 FROM _smithers_sandboxes WHERE run_id = ?1 AND sandbox_id = ?2",
            key,
            |_| Ok(()),
        )
        .optional()
        .map_err(StoreError::query("upsert_sandbox"))?
        .is_some()
    } else {
        let assignments: Vec<String> = sets
            .iter()
            .enumerate()
            .map(|(i, (c, _))| format!("{c} = ?{}", i + 3))
            .collect();
        let sql = format!(
            "UPDATE _smithers_sandboxes SET {} WHERE run_id = ?1 AND sandbox_id = ?2",
            assignments.join(", ")
        );
        let values = [
            SqlValue::Text(row.run_id.clone()),
            SqlValue::Text(row.sandbox_id.clone()),
        ]
        .into_iter()
        .chain(sets.iter().map(|(_, v)| v.clone()));
        conn.exec(&sql, rusqlite::params_from_iter(values))
            .map_err(StoreError::query("upsert_sandbox"))?
            > 0
    };
    if exists {
        return Ok(());
    }
    let names: Vec<&str> = columns.iter().map(|(c, _)| *c).collect();
    let placeholders: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
    let sql = format!(
        "INSERT INTO _smithers_sandboxes ({}) VALUES ({})",
        names.join(", "),
        placeholders.join(", ")
    );
    conn.exec(
        &sql,
        rusqlite::params_from_iter(columns.into_iter().map(|(_, v)| v)),
    )
    .map_err(StoreError::query("upsert_sandbox"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_concurrent_parsing_matches_javascript_number() {
        let cases: [(Option<&str>, u32); 16] = [
            (None, 10),
            (Some(""), 10),
            (Some("   "), 10),
            (Some("abc"), 10),
            (Some("5abc"), 10),
            (Some("0"), 10),
            (Some("-3"), 10),
            (Some("Infinity"), 10),
            (Some("inf"), 10),
            (Some("NaN"), 10),
            (Some("3"), 3),
            (Some(" 7 "), 7),
            (Some("2.9"), 2),
            (Some("1e1"), 10),
            (Some("0x10"), 16),
            (Some("0.5"), 0),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_max_concurrent(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn status_classification() {
        assert!(SandboxStatus::Pending.is_active());
        assert!(SandboxStatus::Other("weird".into()).is_active());
        assert!(!SandboxStatus::Review.is_active());
        assert!(!SandboxStatus::Review.is_terminal());
        for s in ["finished", "failed", "cancelled"] {
            assert!(SandboxStatus::parse(s).is_terminal());
        }
    }
}
