//! Rows of Smithers' own `_smithers_runs` table for the runs our CLI starts, so that Smithers'
//! tools (`smithers ps`, `inspect`) see them beside the workflows' runs.
//!
//! A row is ours when its `workflow_name` is [`CLI_WORKFLOW_NAME`]. The database may be
//! Smithers' own (`--db smithers.db`), where a run id of a workflow's run already has a row: it
//! is never overwritten (`INSERT OR IGNORE`), and status changes touch only rows that are ours.

use rusqlite::params;

use crate::error::{Result, StoreError};
use crate::store::{CachedSql as _, Store};

/// `workflow_name` of a run our CLI started (Smithers allows 256 characters here).
pub const CLI_WORKFLOW_NAME: &str = "smithers-sandbox run";

/// A run's status, as Smithers' `DB_RUN_ALLOWED_STATUSES` spells them (the subset a CLI run
/// goes through).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    /// The step ended and its changes wait in review (`accept` or `reject` settles it).
    WaitingApproval,
    Finished,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::WaitingApproval => "waiting-approval",
            RunStatus::Finished => "finished",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// The run status of a step that ended with bundle status `status` (finished, failed,
    /// cancelled; anything else is failed).
    pub fn of_bundle_status(status: &str) -> RunStatus {
        match status {
            "finished" => RunStatus::Finished,
            "cancelled" => RunStatus::Cancelled,
            _ => RunStatus::Failed,
        }
    }

    const fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Finished | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

/// What is known of a CLI run when it starts.
#[derive(Debug, Clone, Default)]
pub struct CliRunStart {
    pub run_id: String,
    pub at_ms: i64,
    /// `git` when the project is a repository, with its top and HEAD's commit.
    pub vcs_type: Option<String>,
    pub vcs_root: Option<String>,
    pub vcs_revision: Option<String>,
    /// JSON: what the run is (runtime, sandbox id); no secrets (no environment values).
    pub config_json: Option<String>,
}

impl Store {
    /// Records that our CLI started run `start.run_id` (status `running`). Returns false, and
    /// writes nothing, when the run id already has a row (ours from an earlier call, or a
    /// workflow's).
    pub fn begin_cli_run(&self, start: &CliRunStart) -> Result<bool> {
        let n = self
            .conn()?
            .exec(
                "INSERT OR IGNORE INTO _smithers_runs
                    (run_id, workflow_name, status, created_at_ms, started_at_ms, heartbeat_at_ms,
                     vcs_type, vcs_root, vcs_revision, config_json)
                 VALUES (?1, ?2, 'running', ?3, ?3, ?3, ?4, ?5, ?6, ?7)",
                params![
                    start.run_id,
                    CLI_WORKFLOW_NAME,
                    start.at_ms,
                    start.vcs_type,
                    start.vcs_root,
                    start.vcs_revision,
                    start.config_json,
                ],
            )
            .map_err(StoreError::query("begin_cli_run"))?;
        Ok(n == 1)
    }

    /// Moves a run our CLI started to `status` (a terminal one sets `finished_at_ms`, and
    /// `error_json` when given). A run that is not ours (no row, or a workflow's) is left
    /// alone: returns false.
    pub fn settle_cli_run(
        &self,
        run_id: &str,
        status: RunStatus,
        at_ms: i64,
        error_json: Option<&str>,
    ) -> Result<bool> {
        let finished = status.is_terminal().then_some(at_ms);
        let n = self
            .conn()?
            .exec(
                "UPDATE _smithers_runs
                    SET status = ?3, heartbeat_at_ms = ?4, finished_at_ms = ?5,
                        error_json = COALESCE(?6, error_json)
                  WHERE run_id = ?1 AND workflow_name = ?2",
                params![
                    run_id,
                    CLI_WORKFLOW_NAME,
                    status.as_str(),
                    at_ms,
                    finished,
                    error_json
                ],
            )
            .map_err(StoreError::query("settle_cli_run"))?;
        Ok(n == 1)
    }
}
