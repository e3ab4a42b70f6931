//! The atomic concurrency gate: admission (count and insert in one IMMEDIATE transaction)
//! and the record of a refused start.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::error::{GateScope, Result, StoreError};
use crate::events::{insert_event_on, NewEvent};
use crate::field::Field;
use crate::owner::OwnerIdentity;
use crate::redact::RedactedConfig;
use crate::sandboxes::{upsert_sandbox_on, SandboxStatus, SandboxUpsert, ACTIVE_SQL};
use crate::store::{CachedSql, Store};

/// A request to start a sandbox through the gate.
#[derive(Debug, Clone)]
pub struct AdmitRequest {
    pub run_id: String,
    pub sandbox_id: String,
    pub runtime: String,
    pub config: RedactedConfig,
    /// Limit per run (`SMITHERS_MAX_CONCURRENT_SANDBOXES`, see [`parse_max_concurrent`]).
    ///
    /// [`parse_max_concurrent`]: crate::parse_max_concurrent
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

impl Store {
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
}

pub(crate) fn count_active_on(conn: &Connection, run_id: Option<&str>) -> Result<u64> {
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
