//! The store itself: a pool of connections to one database file, opened (and tried again
//! while another process sets a new file up) with the settings every connection shares, and
//! made durable at drop.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::Connection;

use crate::error::{Result, StoreError};
use crate::{owner, schema};

/// How long a writer waits for another one's lock before failing (the JavaScript package
/// uses the same 30 s).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

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
pub(crate) struct Pooled<'a> {
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
    pub(crate) fn conn(&self) -> Result<Pooled<'_>> {
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
}
