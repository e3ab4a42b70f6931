//! Embedded, versioned migrations.
//!
//! The version applied so far lives in `PRAGMA user_version` (the JavaScript package does not
//! use it; it keeps its own migration table). All pending migrations run in ONE `BEGIN
//! IMMEDIATE` transaction together with the version bump, so two processes opening a fresh
//! file at once cannot both migrate, and a failed migration leaves the file as it was.

use rusqlite::{Connection, TransactionBehavior};

use crate::error::StoreError;

type Migration = fn(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>;

/// The migrations, in order; migration `i` brings the schema to version `i + 1`.
/// Never edit a released entry: append a new one.
const MIGRATIONS: &[Migration] = &[v1_tables, v2_active_index, v3_review_digest, v4_runs_table];

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The two Smithers-compatible tables, column for column as the JavaScript package creates
/// them (`CREATE TABLE IF NOT EXISTS`: a database the JavaScript package made is adopted as
/// it is), plus the tables of our own.
fn v1_tables(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS _smithers_sandboxes (
            run_id TEXT NOT NULL,
            sandbox_id TEXT NOT NULL,
            runtime TEXT NOT NULL DEFAULT 'bubblewrap',
            remote_run_id TEXT,
            workspace_id TEXT,
            container_id TEXT,
            config_json TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending',
            heartbeat_at_ms INTEGER,
            shipped_at_ms INTEGER,
            completed_at_ms INTEGER,
            bundle_path TEXT,
            PRIMARY KEY (run_id, sandbox_id)
        );
        CREATE TABLE IF NOT EXISTS _smithers_events (
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            timestamp_ms INTEGER NOT NULL,
            type TEXT NOT NULL,
            payload_json TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        );",
    )?;
    // Databases made by JavaScript releases before heartbeats lack this column (the JavaScript
    // migration adds it the same way).
    let has_heartbeat: bool = tx.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info('_smithers_sandboxes') WHERE name = 'heartbeat_at_ms'",
        [],
        |r| r.get(0),
    )?;
    if !has_heartbeat {
        tx.execute_batch("ALTER TABLE _smithers_sandboxes ADD COLUMN heartbeat_at_ms INTEGER")?;
    }
    tx.execute_batch(
        "CREATE INDEX IF NOT EXISTS _smithers_events_dedupe_idx
            ON _smithers_events (run_id, timestamp_ms, type);
        CREATE INDEX IF NOT EXISTS _smithers_sandboxes_status_idx
            ON _smithers_sandboxes (status);

        CREATE TABLE IF NOT EXISTS _smithers_sandbox_leases (
            run_id TEXT NOT NULL,
            sandbox_id TEXT NOT NULL,
            owner_host TEXT NOT NULL,
            owner_boot_id TEXT NOT NULL,
            owner_pid INTEGER NOT NULL,
            owner_start_time INTEGER NOT NULL,
            handle_json TEXT,
            acquired_at_ms INTEGER NOT NULL,
            released_at_ms INTEGER,
            release_reason TEXT,
            PRIMARY KEY (run_id, sandbox_id),
            FOREIGN KEY (run_id, sandbox_id)
                REFERENCES _smithers_sandboxes (run_id, sandbox_id) ON DELETE CASCADE
        );
        CREATE TABLE IF NOT EXISTS _smithers_sandbox_reviews (
            run_id TEXT NOT NULL,
            sandbox_id TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('pending', 'accepted', 'rejected', 'applied')),
            reason TEXT,
            root_dir TEXT NOT NULL,
            bundle_path TEXT NOT NULL,
            bundle_status TEXT NOT NULL,
            remote_run_id TEXT,
            patch_count INTEGER NOT NULL,
            total_diff_lines INTEGER NOT NULL,
            duration_ms REAL NOT NULL,
            requested_at_ms INTEGER NOT NULL,
            decided_at_ms INTEGER,
            applied_at_ms INTEGER,
            apply_error TEXT,
            PRIMARY KEY (run_id, sandbox_id),
            FOREIGN KEY (run_id, sandbox_id)
                REFERENCES _smithers_sandboxes (run_id, sandbox_id) ON DELETE CASCADE
        );
        CREATE INDEX IF NOT EXISTS _smithers_sandbox_reviews_state_idx
            ON _smithers_sandbox_reviews (state);
        CREATE TABLE IF NOT EXISTS _smithers_sandbox_patches (
            run_id TEXT NOT NULL,
            sandbox_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            path TEXT NOT NULL,
            operation TEXT NOT NULL CHECK (operation IN ('add', 'modify', 'delete')),
            base_hash TEXT,
            new_hash TEXT,
            patch_path TEXT NOT NULL,
            PRIMARY KEY (run_id, sandbox_id, idx),
            FOREIGN KEY (run_id, sandbox_id)
                REFERENCES _smithers_sandboxes (run_id, sandbox_id) ON DELETE CASCADE
        );",
    )
}

/// The gate counts active sandboxes on every admission; history (terminal rows) grows
/// forever, so the count must not scan it. A partial index holds exactly the active rows;
/// its WHERE clause is the same text as `ACTIVE_SQL` in lib.rs (SQLite only uses a partial
/// index for a query that repeats its condition).
fn v2_active_index(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE INDEX IF NOT EXISTS _smithers_sandboxes_active_idx
            ON _smithers_sandboxes (run_id)
            WHERE status NOT IN ('finished', 'failed', 'cancelled', 'review');",
    )
}

/// A review records the digest of the bundle it was opened on, so that accept applies exactly
/// the bytes that were reviewed (NULL for reviews opened before: they cannot be accepted
/// without one; see the orchestrator's accept).
fn v3_review_digest(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    let has: bool = tx.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info('_smithers_sandbox_reviews') WHERE name = 'bundle_digest'",
        [],
        |r| r.get(0),
    )?;
    if !has {
        tx.execute_batch("ALTER TABLE _smithers_sandbox_reviews ADD COLUMN bundle_digest TEXT;")?;
    }
    Ok(())
}

/// Smithers' own run table, column for column as `@smithers-orchestrator/db` 0.32 creates it
/// (`sql-message-storage.js`; later Smithers versions add columns with their own migrations,
/// which adopt this table as they find it), so that runs our CLI starts are rows Smithers'
/// tools list (`smithers ps`, `inspect`). Only rows our CLI made are ever updated by us
/// (see `Store::settle_cli_run`).
fn v4_runs_table(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS _smithers_runs (
            run_id TEXT PRIMARY KEY,
            parent_run_id TEXT,
            workflow_name TEXT NOT NULL,
            workflow_path TEXT,
            workflow_hash TEXT,
            status TEXT NOT NULL,
            created_at_ms INTEGER NOT NULL,
            started_at_ms INTEGER,
            finished_at_ms INTEGER,
            heartbeat_at_ms INTEGER,
            runtime_owner_id TEXT,
            cancel_requested_at_ms INTEGER,
            pause_requested_at_ms INTEGER,
            hijack_requested_at_ms INTEGER,
            hijack_target TEXT,
            vcs_type TEXT,
            vcs_root TEXT,
            vcs_revision TEXT,
            error_json TEXT,
            config_json TEXT
        );
        CREATE INDEX IF NOT EXISTS _smithers_runs_status_heartbeat_idx
            ON _smithers_runs (status, heartbeat_at_ms);",
    )?;
    // Who applies an accepted review: NULL, this tool (accept applies the patches); `caller`,
    // the one that held the bundle for review (the Smithers provider, whose engine applies the
    // bundle's diffBundle once a person accepted it here).
    let has: bool = tx.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info('_smithers_sandbox_reviews') WHERE name = 'applied_by'",
        [],
        |r| r.get(0),
    )?;
    if !has {
        tx.execute_batch("ALTER TABLE _smithers_sandbox_reviews ADD COLUMN applied_by TEXT;")?;
    }
    Ok(())
}

/// Brings the schema to [`SCHEMA_VERSION`]; a no-op when it is there already.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|source| StoreError::Migrate { version: 0, source })?;
    let current: u32 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|source| StoreError::Migrate { version: 0, source })?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found: current,
            supported: SCHEMA_VERSION,
        });
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = index as u32 + 1;
        migration(&tx).map_err(|source| StoreError::Migrate { version, source })?;
        // PRAGMA takes no bound parameters; `version` is our own integer.
        tx.execute_batch(&format!("PRAGMA user_version = {version}"))
            .map_err(|source| StoreError::Migrate { version, source })?;
    }
    tx.commit().map_err(|source| StoreError::Migrate {
        version: SCHEMA_VERSION,
        source,
    })
}
