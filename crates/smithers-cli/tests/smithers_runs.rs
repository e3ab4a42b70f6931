//! Runs our CLI starts are rows of Smithers' own `_smithers_runs` table (issue 18), so that
//! Smithers' tools list them: the table is created column for column as the installed
//! `@smithers-orchestrator/db` creates it, a run is `running`, then `waiting-approval` while
//! its changes wait in review, then `finished` once accepted or `failed` once rejected; a
//! workflow's row of the same run id in Smithers' own database is never touched.

mod support;

use std::path::{Path, PathBuf};

use rusqlite::Connection;
use serde_json::Value;
use smithers_test_support::skip_or_fail;
use support::native::{bin, sandboxes_usable};

fn run_json(root: &Path, extra: &[&str], script: &str) -> Value {
    let out = bin()
        .args(["--json", "run", "--root"])
        .arg(root)
        .args(extra)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn cli(root: &Path, args: &[&str]) {
    let out = bin().args(args).arg("--root").arg(root).output().unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
}

#[derive(Debug, PartialEq)]
struct RunRow {
    workflow_name: String,
    status: String,
    started: bool,
    finished: bool,
    vcs_type: Option<String>,
    error_code: Option<String>,
}

fn run_row(db: &Path, run_id: &str) -> RunRow {
    let conn = Connection::open(db).unwrap();
    conn.query_row(
        "SELECT workflow_name, status, started_at_ms, finished_at_ms, vcs_type, error_json, created_at_ms
           FROM _smithers_runs WHERE run_id = ?1",
        [run_id],
        |r| {
            let error: Option<String> = r.get(5)?;
            let created: i64 = r.get(6)?;
            assert!(created > 0);
            Ok(RunRow {
                workflow_name: r.get(0)?,
                status: r.get(1)?,
                started: r.get::<_, Option<i64>>(2)?.is_some(),
                finished: r.get::<_, Option<i64>>(3)?.is_some(),
                vcs_type: r.get(4)?,
                error_code: error.map(|e| {
                    let v: Value = serde_json::from_str(&e).unwrap();
                    v["code"].as_str().unwrap_or("").to_string()
                }),
            })
        },
    )
    .unwrap_or_else(|e| panic!("no _smithers_runs row for {run_id}: {e}"))
}

fn row(status: &str, finished: bool, vcs: Option<&str>, error: Option<&str>) -> RunRow {
    RunRow {
        workflow_name: "smithers-sandbox run".into(),
        status: status.into(),
        started: true,
        finished,
        vcs_type: vcs.map(str::to_string),
        error_code: error.map(str::to_string),
    }
}

#[test]
fn a_cli_run_is_a_smithers_run_row_through_review() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join(".git")).unwrap();
    std::fs::write(root.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(root.join("a.txt"), "before\n").unwrap();
    let db = root.join(".smithers/sandbox.db");

    // No changes: finished at once.
    let doc = run_json(root, &[], "true");
    let plain = doc["runId"].as_str().unwrap().to_string();
    assert_eq!(
        run_row(&db, &plain),
        row("finished", true, Some("git"), None)
    );

    // Changes wait in review: waiting-approval, not finished; accept finishes it.
    let doc = run_json(root, &[], "echo after > a.txt");
    let (accepted, sid) = (
        doc["runId"].as_str().unwrap().to_string(),
        doc["sandboxId"].as_str().unwrap().to_string(),
    );
    assert_eq!(
        run_row(&db, &accepted),
        row("waiting-approval", false, Some("git"), None)
    );
    cli(root, &["accept", &sid]);
    assert_eq!(
        run_row(&db, &accepted),
        row("finished", true, Some("git"), None)
    );

    // Rejected: failed, with the rejection as its error.
    let doc = run_json(root, &[], "echo again > a.txt");
    let (rejected, sid) = (
        doc["runId"].as_str().unwrap().to_string(),
        doc["sandboxId"].as_str().unwrap().to_string(),
    );
    cli(root, &["reject", &sid, "--reason", "not this"]);
    let got = run_row(&db, &rejected);
    assert_eq!((got.status.as_str(), got.finished), ("failed", true));
    assert!(got.error_code.is_some_and(|c| !c.is_empty()));

    // A step that fails is a failed run.
    let doc = run_json(root, &[], "exit 3");
    let failed = doc["runId"].as_str().unwrap().to_string();
    assert_eq!(
        run_row(&db, &failed),
        row("failed", true, Some("git"), None)
    );
}

/// Where the installed reference package keeps Smithers' own table statements.
fn smithers_statements() -> Option<String> {
    let home = std::env::var_os("SMITHERS_JS_HOME")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/smithers-js"))
        })?;
    std::fs::read_to_string(
        home.join("node_modules/@smithers-orchestrator/db/src/sql-message-storage.js"),
    )
    .ok()
}

fn columns(conn: &Connection) -> Vec<(String, String, bool, bool)> {
    let mut stmt = conn
        .prepare("SELECT name, type, \"notnull\", pk FROM pragma_table_info('_smithers_runs') ORDER BY cid")
        .unwrap();
    stmt.query_map([], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get::<_, i64>(3)? > 0))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

#[test]
fn the_table_is_smithers_own_and_a_workflows_row_is_left_alone() {
    let Some(source) = smithers_statements() else {
        skip_or_fail("@smithers-orchestrator/db is not installed under SMITHERS_JS_HOME (scripts/setup installs it)");
        return;
    };
    // Smithers' statement, as the package ships it.
    let start = source
        .find("CREATE TABLE IF NOT EXISTS _smithers_runs (")
        .expect("the package creates _smithers_runs");
    let end = start + source[start..].find(")`").expect("the statement ends");
    let statement = &source[start..=end];
    let theirs = Connection::open_in_memory().unwrap();
    theirs.execute_batch(statement).unwrap();

    if !sandboxes_usable() {
        return;
    }
    // Smithers' own database, with a workflow's run in it.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let db = root.join("smithers.db");
    {
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(statement).unwrap();
        conn.execute(
            "INSERT INTO _smithers_runs (run_id, workflow_name, status, created_at_ms) VALUES ('wf-run', 'my-workflow', 'running', 1)",
            [],
        )
        .unwrap();
    }
    // Our CLI adopts it: its run is a row there, and the workflow's row is untouched even when
    // a step runs under the workflow's run id.
    let out = bin()
        .args(["--json", "run", "--root"])
        .arg(root)
        .arg("--db")
        .arg(&db)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        run_row(&db, doc["runId"].as_str().unwrap()).status,
        "finished"
    );
    let out = bin()
        .args(["--json", "run", "--run-id", "wf-run", "--root"])
        .arg(root)
        .arg("--db")
        .arg(&db)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let workflow = run_row(&db, "wf-run");
    assert_eq!(
        (
            workflow.workflow_name.as_str(),
            workflow.status.as_str(),
            workflow.started
        ),
        ("my-workflow", "running", false)
    );

    // Our own database has the same table, column for column.
    let fresh = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["--json", "run", "--root"])
        .arg(fresh.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let ours = Connection::open(fresh.path().join(".smithers/sandbox.db")).unwrap();
    assert_eq!(columns(&ours), columns(&theirs));
}
