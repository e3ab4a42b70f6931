//! `_smithers_sandbox_leases`: who owns each sandbox (crash recovery), its runtime handle,
//! and the orphans a recovery pass finds.

use rusqlite::{params, OptionalExtension, Row, TransactionBehavior};

use crate::error::{Result, StoreError};
use crate::owner::{Liveness, OwnerIdentity};
use crate::sandboxes::{sandbox_row, SandboxRow, ACTIVE_SQL, SANDBOX_COLUMNS};
use crate::store::{CachedSql, Store};

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

/// The active sandboxes with their leases: the recovery pass's candidates. Unordered, so that
/// SQLite reads them through the partial index of active rows (a few) rather than the table.
pub(crate) fn orphan_candidates_sql() -> String {
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

impl Store {
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
}

pub(crate) const LEASE_COLUMNS: &str = "run_id, sandbox_id, owner_host, owner_boot_id, owner_pid, \
     owner_start_time, handle_json, acquired_at_ms, released_at_ms, release_reason";

pub(crate) fn lease_row(r: &Row<'_>, base: usize) -> rusqlite::Result<Lease> {
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
