//! `_smithers_sandboxes`: one row per sandbox, column for column the JavaScript package's.

use rusqlite::types::Value as SqlValue;
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::events::{insert_event_on, NewEvent};
use crate::field::Field;
use crate::redact::RedactedConfig;
use crate::store::{CachedSql, Store};

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
pub(crate) const ACTIVE_SQL: &str = "status NOT IN ('finished', 'failed', 'cancelled', 'review')";

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

pub(crate) const SANDBOX_COLUMNS: &str = "run_id, sandbox_id, runtime, remote_run_id, workspace_id, \
     container_id, config_json, status, heartbeat_at_ms, shipped_at_ms, completed_at_ms, bundle_path";

pub(crate) fn sandbox_row(r: &Row<'_>) -> rusqlite::Result<SandboxRow> {
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

impl Store {
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
}

/// [`Store::heartbeat_sandbox`]'s statement on `conn` (a connection or a transaction).
pub(crate) fn heartbeat_on(
    conn: &Connection,
    run_id: &str,
    sandbox_id: &str,
    at_ms: i64,
) -> Result<bool> {
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
pub(crate) fn upsert_sandbox_on(conn: &Connection, row: &SandboxUpsert) -> Result<()> {
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
