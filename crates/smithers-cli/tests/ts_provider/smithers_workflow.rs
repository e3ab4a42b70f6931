//! A real Smithers workflow (issue 18): `smithers up` of Smithers 0.32 on Bun, both from npm
//! (`clients/smithers-provider/e2e`, pinned by its lock file), with Smithers' real SQLite
//! store, runs a `<Sandbox>` step through our provider against a real `serve` child, in a
//! native sandbox:
//!
//! * the step's changes wait in our durable review (no fail-closed retries): `ls` and
//!   `review` show them, `accept` from our CLI lets the task resume, Smithers applies them and
//!   the run finishes, counting each change once (2 files: `patchCount` 2, 3 diff lines);
//! * the upload left out Smithers' database and what `.gitignore` ignores;
//! * a rejected review fails the task once, without a retry, and applies nothing;
//! * a run our CLI starts against Smithers' database is listed by `smithers ps`;
//! * a step that edits two files and exits 3 (`e2e/workflows/failure.tsx`), retried twice,
//!   with and without the durable review: neither edit lands nor is held for review on any
//!   attempt, and every attempt fails with `SANDBOX_EXECUTION_FAILED`, its exit code and the
//!   end of its stderr (the request's env values redacted), never "received undefined";
//! * per-step settings from the workflow (`e2e/workflows/settings.tsx`, in `workspace`): a
//!   `cwd`, an egress policy whose denial the error names, a `timeoutMs` that kills a `sleep`
//!   with the error naming the timeout; and the README's example, run as it is written.
//!
//! And the provider kit's own contract suite (`createSandboxProviderContractSuite`, bun:test)
//! against the kit's command provider on our session (`e2e/contract.test.ts`), every command
//! in a real sandbox of a real `serve`.
//!
//! Without node, npm or native sandboxes the test prints SKIP; under `CI=true` it fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::support::native::sandboxes_usable;
use super::support::serve::{ServeChild, ServeOptions};

const TOKEN: &str = "e2e-token-0123456789abcdef";
/// A bound on each wait, so that a hang fails the test instead of CI (not a timing assertion).
const WAIT: Duration = Duration::from_secs(180);

fn e2e_dir() -> PathBuf {
    super::package_dir().join("e2e")
}

/// Smithers and Bun installed from the lock file (`npm install`, not `ci`: the lock lacks
/// optional platform packages the registry does not have, which `ci` refuses).
fn engine_installed() -> bool {
    // Once for the tests of this binary, which run in parallel: two installs into one
    // directory at once would corrupt it.
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = e2e_dir();
    let modules = dir.join("node_modules");
    // Installed means the engine runs on Bun and the package kit the tests import is there.
    let ready = || {
        modules
            .join("@smithers-orchestrator/sandbox/src/provider-kit/index.js")
            .exists()
            && Command::new(modules.join(".bin/bun"))
                .arg(modules.join(".bin/smithers"))
                .arg("--version")
                .env("SMITHERS_NO_UPDATE_CHECK", "1")
                .stdin(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success())
    };
    if ready() {
        return true;
    }
    // npm 11 now and then loses files while it unpacks (TAR_ENTRY_ERROR ENOENT, seen once in
    // CI, Bun's platform package among them) and still exits 0; installing again over the
    // broken tree did not mend it. So each attempt starts from no node_modules, and one that
    // reports a lost file or leaves the engine unable to run is made again, once.
    for attempt in 1..=2 {
        let _ = std::fs::remove_dir_all(&modules);
        let out = Command::new("npm")
            .args(["install", "--no-save", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .expect("npm");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("$ npm install (e2e, attempt {attempt})\n{said}");
        assert!(
            out.status.success(),
            "npm install of the Smithers engine failed"
        );
        if !said.contains("TAR_ENTRY_ERROR") && ready() {
            return true;
        }
    }
    panic!("npm install left the Smithers engine incomplete twice (see its output above)");
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_smithers-sandbox")
}

/// Our CLI, `--json`, in the project; its parsed stdout.
fn ours(root: &Path, args: &[&str]) -> Value {
    let out = Command::new(bin())
        .arg("--json")
        .args(args)
        .arg("--root")
        .arg(root)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "smithers-sandbox {args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn smithers(root: &Path, url: &str, args: &[&str]) -> Command {
    let modules = e2e_dir().join("node_modules");
    let mut cmd = Command::new(modules.join(".bin/bun"));
    cmd.arg(modules.join(".bin/smithers"))
        .args(args)
        .current_dir(root)
        .env("CODEPLANE_API_URL", url)
        .env("CODEPLANE_API_KEY", TOKEN)
        .env("SMITHERS_SANDBOX_BIN", bin())
        .env("SMITHERS_NO_UPDATE_CHECK", "1")
        .env("NO_COLOR", "1")
        .env_remove("SMITHERS_DB")
        .stdin(Stdio::null());
    cmd
}

/// The project: a repository with two files, a log git ignores, and the engine's modules
/// linked in (ignored too: a link out of the tree the host would refuse).
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("a.txt"), "one\n").unwrap();
    std::fs::write(root.join("b.txt"), "two\n").unwrap();
    std::fs::write(root.join(".gitignore"), "node_modules\n*.log\n").unwrap();
    std::fs::write(root.join("debug.log"), "ignored\n").unwrap();
    std::os::unix::fs::symlink(e2e_dir().join("node_modules"), root.join("node_modules")).unwrap();
    super::support::native::git(root, &["init", "-q", "-b", "main"]);
    super::support::native::git(root, &["add", "-A"]);
    super::support::native::git(root, &["commit", "-q", "-m", "base"]);
    let provider = super::package_dir().join("dist/src/index.js");
    let workflow = WORKFLOW.replace("PROVIDER", &provider.display().to_string());
    std::fs::write(root.join("workflow.tsx"), &workflow).unwrap();
    // The same step, with the run's store somewhere else than Smithers' default, and a step
    // that changes nothing but lists every file it was given.
    let elsewhere = workflow
        .replace(
            "const { Workflow, smithers, outputs } = createSmithers({ result });",
            "const { Workflow, smithers, outputs } = createSmithers({ result }, { dbPath: `${import.meta.dir}/state/runs.sqlite` });",
        )
        .replace(
            "set -e; echo edited > a.txt; echo added > c.txt; ",
            "set -e; ",
        )
        .replace("$(ls -A | sort | tr '\\n' ' ')", "$(find . -path ./.git -prune -o -type f -print | sort | tr '\\n' ' ')");
    assert!(
        elsewhere.contains("dbPath") && elsewhere.contains("find ."),
        "{elsewhere}"
    );
    std::fs::create_dir(root.join("state")).unwrap();
    std::fs::write(root.join("elsewhere.tsx"), elsewhere).unwrap();
    dir
}

/// The workflow: one `<Sandbox>` through our provider with the durable review; the step edits
/// a.txt, adds c.txt and reports what it was given of the project.
const WORKFLOW: &str = r#"/** @jsxImportSource smithers-orchestrator */
import { createSmithers, Sandbox } from "smithers-orchestrator";
import { registerSandboxProvider } from "smithers-orchestrator/sandbox";
import { z } from "zod";
import { createSmithersSandboxProvider } from "PROVIDER";

const provider = createSmithersSandboxProvider({
  durableReview: { pollMs: 100 },
  command: `set -e; echo edited > a.txt; echo added > c.txt; printf '{"status":"finished","outputs":{"summary":"edited a, added c","files":"%s"}}' "$(ls -A | sort | tr '\n' ' ')" > "$SMITHERS_SANDBOX_RESULT_PATH"`,
});
registerSandboxProvider(provider);

const result = z.object({ summary: z.string(), files: z.string() });
const child = createSmithers({ result });
const childWorkflow = child.smithers(() => (
  <child.Workflow name="child"><child.Task id="noop" output={child.outputs.result}>{{ summary: "", files: "" }}</child.Task></child.Workflow>
));
const { Workflow, smithers, outputs } = createSmithers({ result });
export default smithers(() => (
  <Workflow name="sandbox-e2e">
    <Sandbox id="edit" provider={provider.id} workflow={childWorkflow} output={outputs.result} autoAcceptDiffs />
  </Workflow>
));
"#;

/// Waits (bounded) until the project's review holds a pending sandbox; its `runId:sandboxId`.
fn pending_review(root: &Path, up: &mut Child) -> String {
    let start = Instant::now();
    loop {
        if let Some(status) = up.try_wait().unwrap() {
            panic!("smithers up ended ({status}) before its step waited in review");
        }
        if root.join(".smithers/sandbox.db").exists() {
            let listed = ours(root, &["ls"]);
            let rows = listed.as_array().cloned().unwrap_or_default();
            if let Some(r) = rows
                .iter()
                .find(|r| r["review"] == "pending" || r["review"]["state"] == "pending")
            {
                return format!(
                    "{}:{}",
                    r["runId"].as_str().unwrap(),
                    r["sandboxId"].as_str().unwrap()
                );
            }
        }
        assert!(start.elapsed() < WAIT, "no review appeared");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn finish(mut up: Child) -> Output {
    let start = Instant::now();
    while up.try_wait().unwrap().is_none() {
        if start.elapsed() > WAIT {
            let _ = up.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    up.wait_with_output().unwrap()
}

/// `(type, payload)` of the Sandbox* events of `run_id` in Smithers' own store.
fn smithers_events(root: &Path, run_id: &str) -> Vec<(String, Value)> {
    let conn = rusqlite::Connection::open(root.join("smithers.db")).unwrap();
    let mut stmt = conn
        .prepare("SELECT type, payload_json FROM _smithers_events WHERE run_id = ?1 AND type LIKE 'Sandbox%' ORDER BY seq")
        .unwrap();
    stmt.query_map([run_id], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })
    .unwrap()
    .map(|r| {
        let (t, p) = r.unwrap();
        (t, serde_json::from_str(&p).unwrap())
    })
    .collect()
}

fn ps(root: &Path, url: &str) -> Vec<(String, String, String)> {
    let out = smithers(root, url, &["ps", "--json"]).output().unwrap();
    assert!(out.status.success(), "smithers ps: {out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                r["workflow"].as_str().unwrap().to_string(),
                r["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_real_smithers_workflow_runs_a_step_reviewed_and_accepted_from_our_cli() {
    if !super::provider_built() || !sandboxes_usable() || !engine_installed() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let server = ServeChild::start(&ServeOptions {
        token: TOKEN.into(),
        data_dir: data.path().to_path_buf(),
        ..Default::default()
    })
    .unwrap();
    let url = server.url();

    // Accepted from our CLI.
    let dir = project();
    let root = dir.path();
    let mut up = smithers(root, &url, &["up", "workflow.tsx"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = pending_review(root, &mut up);
    let (run_id, sandbox_id) = id.split_once(':').unwrap();
    assert_eq!(sandbox_id, "edit");
    // Nothing is applied while it waits.
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "one\n"
    );
    let review = ours(root, &["review", &id]);
    assert_eq!(review["review"]["state"], "pending");
    assert_eq!(review["review"]["patchCount"], 2);
    assert_eq!(review["review"]["appliedBy"], "caller");
    let accepted = ours(root, &["accept", &id]);
    assert_eq!(accepted["review"], "accepted");
    let out = finish(up);
    assert!(out.status.success(), "smithers up failed: {out:?}");
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "edited\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("c.txt")).unwrap(),
        "added\n"
    );

    let events = smithers_events(root, run_id);
    let types: Vec<&str> = events.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        types,
        [
            "SandboxCreated",
            "SandboxShipped",
            "SandboxBundleReceived",
            "SandboxDiffReviewRequested",
            "SandboxDiffAccepted",
            "SandboxCompleted"
        ],
        "one attempt, reviewed and accepted"
    );
    let payload = |t: &str| &events.iter().find(|(x, _)| x == t).unwrap().1;
    // Each change once: a.txt and c.txt, lines -one +edited +added.
    assert_eq!(payload("SandboxBundleReceived")["patchCount"], 2);
    assert_eq!(payload("SandboxDiffReviewRequested")["patchCount"], 2);
    assert_eq!(payload("SandboxDiffReviewRequested")["totalDiffLines"], 3);
    assert_eq!(payload("SandboxCompleted")["status"], "finished");

    // What the step was given: not Smithers' database (at the project's top, written by
    // this very run), nor what .gitignore ignores.
    let conn = rusqlite::Connection::open(root.join("smithers.db")).unwrap();
    let outputs: String = conn
        .query_row(
            "SELECT files FROM result WHERE run_id = ?1",
            [run_id],
            |r| r.get(0),
        )
        .unwrap_or_else(|e| panic!("the task's output row: {e}"));
    let files: Vec<&str> = outputs.split_whitespace().collect();
    // (`.smithers`, the project's state, is absent from the step's view.)
    assert_eq!(
        files,
        [
            ".git",
            ".gitignore",
            "a.txt",
            "b.txt",
            "c.txt",
            "elsewhere.tsx",
            "state",
            "workflow.tsx"
        ],
        "uploaded: {outputs}"
    );

    assert!(ps(root, &url).contains(&(
        run_id.to_string(),
        "sandbox-e2e".into(),
        "finished".into()
    )));

    // A run our CLI starts against Smithers' database is listed by Smithers' own `ps`.
    let out = Command::new(bin())
        .args(["--json", "run", "--root"])
        .arg(root)
        .arg("--db")
        .arg(root.join("smithers.db"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cli_run = doc["runId"].as_str().unwrap().to_string();
    assert!(
        ps(root, &url).contains(&(cli_run, "smithers-sandbox run".into(), "finished".into())),
        "{:?}",
        ps(root, &url)
    );

    // A store where the workflow says (createSmithers' dbPath) is left out too: the provider
    // asks the workflow's own database handle for its file.
    let out = smithers(root, &url, &["up", "elsewhere.tsx"])
        .output()
        .unwrap();
    assert!(out.status.success(), "smithers up elsewhere.tsx: {out:?}");
    let conn = rusqlite::Connection::open(root.join("state/runs.sqlite")).unwrap();
    let listed: String = conn
        .query_row("SELECT files FROM result", [], |r| r.get(0))
        .unwrap();
    assert!(
        listed.contains("./a.txt") && listed.contains("./elsewhere.tsx"),
        "{listed}"
    );
    assert!(
        !listed.contains("runs.sqlite") && !listed.contains("smithers.db"),
        "a store was uploaded: {listed}"
    );

    // Rejected: the task fails once, no retry, nothing applied.
    let dir = project();
    let root = dir.path();
    let mut up = smithers(root, &url, &["up", "workflow.tsx"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = pending_review(root, &mut up);
    let out = Command::new(bin())
        .args(["reject", &id, "--reason", "not like this", "--root"])
        .arg(root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = finish(up);
    assert!(
        !out.status.success(),
        "a rejected step must fail the run: {out:?}"
    );
    let (run_id, _) = id.split_once(':').unwrap();
    let types: Vec<String> = smithers_events(root, run_id)
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    assert_eq!(
        types,
        ["SandboxCreated", "SandboxShipped", "SandboxFailed"],
        "one attempt only"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "one\n"
    );
    assert!(!root.join("c.txt").exists());
    drop(server);
}

#[test]
fn the_provider_kits_contract_suite_passes_on_our_session() {
    if !super::provider_built() || !sandboxes_usable() || !engine_installed() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let server = ServeChild::start(&ServeOptions {
        token: TOKEN.into(),
        data_dir: data.path().to_path_buf(),
        ..Default::default()
    })
    .unwrap();
    let dir = e2e_dir();
    let out = Command::new(dir.join("node_modules/.bin/bun"))
        .args(["test", "./contract.test.ts"])
        .current_dir(&dir)
        .env("SMITHERS_CONTRACT_URL", server.url())
        .env("SMITHERS_CONTRACT_TOKEN", TOKEN)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    // bun test reports on stderr.
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("$ bun test ./contract.test.ts\n{report}");
    assert!(out.status.success(), "the contract suite failed:\n{report}");
    // It ran the suite's tests (16 in 0.32), not nothing, and none failed or was skipped.
    let count = |what: &str| {
        report
            .lines()
            .find_map(|l| l.trim().strip_suffix(what)?.trim().parse::<u32>().ok())
            .unwrap_or(0)
    };
    assert!(count(" pass") >= 16, "{report}");
    assert_eq!(count(" fail"), 0, "{report}");
    assert_eq!(count(" skip"), 0, "{report}");
    drop(server);
}

/// A project for the workflows of `e2e/workflows/` and the README's example: a repository
/// with `a.txt`, `b.txt` and `src/main.txt`, the engine's modules linked in, and the workflow
/// `source` as `name`, its import of the provider pointed at the built package.
fn workflow_project(name: &str, source: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("a.txt"), "one\n").unwrap();
    std::fs::write(root.join("b.txt"), "two\n").unwrap();
    std::fs::create_dir(root.join("src")).unwrap();
    std::fs::write(root.join("src/main.txt"), "code\n").unwrap();
    std::fs::write(root.join(".gitignore"), "node_modules\n").unwrap();
    std::os::unix::fs::symlink(e2e_dir().join("node_modules"), root.join("node_modules")).unwrap();
    super::support::native::git(root, &["init", "-q", "-b", "main"]);
    super::support::native::git(root, &["add", "-A"]);
    super::support::native::git(root, &["commit", "-q", "-m", "base"]);
    let provider = super::package_dir().join("dist/src/index.js");
    let specifier = "\"smithers-sandbox-provider\"";
    assert!(source.contains(specifier), "{name} imports the provider");
    let workflow = source.replace(specifier, &format!("\"{}\"", provider.display()));
    std::fs::write(root.join(name), workflow).unwrap();
    dir
}

fn e2e_workflow(name: &str) -> String {
    std::fs::read_to_string(e2e_dir().join("workflows").join(name)).unwrap()
}

/// `smithers up` of `args` in `root`, bounded; its output (stdout and stderr) and success.
fn up(root: &Path, url: &str, args: &[&str]) -> (bool, String) {
    let child = smithers(root, url, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = finish(child);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// `(sandboxId, type, payload)` of every Sandbox* event in the project's Smithers store.
fn sandbox_events(root: &Path) -> Vec<(String, String, Value)> {
    let conn = rusqlite::Connection::open(root.join("smithers.db")).unwrap();
    let mut stmt = conn
        .prepare("SELECT type, payload_json FROM _smithers_events WHERE type LIKE 'Sandbox%' ORDER BY seq")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .unwrap()
        .map(|r| {
            let (t, p) = r.unwrap();
            let payload: Value = serde_json::from_str(&p).unwrap();
            (
                payload["sandboxId"].as_str().unwrap_or("").to_string(),
                t,
                payload,
            )
        })
        .collect()
}

/// `(attempt, state, error)` of each attempt of task `node`.
fn attempts(root: &Path, node: &str) -> Vec<(i64, String, Value)> {
    let conn = rusqlite::Connection::open(root.join("smithers.db")).unwrap();
    let mut stmt = conn
        .prepare("SELECT attempt, state, error_json FROM _smithers_attempts WHERE node_id = ?1 ORDER BY attempt")
        .unwrap();
    stmt.query_map([node], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Option<String>>(2)?,
        ))
    })
    .unwrap()
    .map(|r| {
        let (a, s, e) = r.unwrap();
        let error = e.map_or(Value::Null, |e| serde_json::from_str(&e).unwrap());
        (a, s, error)
    })
    .collect()
}

/// The value of the step's API key in `e2e/workflows/failure.tsx`: never in what Smithers shows.
const FAILURE_SECRET: &str = "sk-e2e-0123456789-secret";

#[test]
fn a_failed_step_applies_nothing_on_any_attempt_and_fails_with_its_exit_code_and_stderr() {
    if !super::provider_built() || !sandboxes_usable() || !engine_installed() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let server = ServeChild::start(&ServeOptions {
        token: TOKEN.into(),
        data_dir: data.path().to_path_buf(),
        ..Default::default()
    })
    .unwrap();
    let url = server.url();
    let source = e2e_workflow("failure.tsx");
    // Without and with the durable review: neither may apply nor hold a failed step's edits.
    for provider in ["smithers-sandbox", "smithers-sandbox-review"] {
        let dir = workflow_project("workflow.tsx", &source);
        let root = dir.path();
        let input = format!(r#"{{"provider":"{provider}"}}"#);
        let (ok, said) = up(root, &url, &["up", "workflow.tsx", "--input", &input]);
        assert!(
            !ok,
            "{provider}: a step that exits 3 must fail the run:\n{said}"
        );
        // Neither edit landed, on any of the three attempts.
        assert_eq!(
            std::fs::read_to_string(root.join("a.txt")).unwrap(),
            "one\n",
            "{provider}: a failed step's edit was applied:\n{said}"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("b.txt")).unwrap(),
            "two\n",
            "{provider}: a failed step's edit was applied:\n{said}"
        );
        let dirty =
            super::support::native::git(root, &["status", "--porcelain", "--", "a.txt", "b.txt"]);
        assert_eq!(dirty, "", "{provider}");

        // Three attempts (retries={2}), each created, shipped and failed: no bundle was
        // received, reviewed or completed.
        let events = sandbox_events(root);
        let types: Vec<&str> = events.iter().map(|(_, t, _)| t.as_str()).collect();
        assert_eq!(
            types,
            ["SandboxCreated", "SandboxShipped", "SandboxFailed"].repeat(3),
            "{provider}:\n{said}"
        );
        for (_, t, payload) in events.iter().filter(|(_, t, _)| t == "SandboxFailed") {
            let error = &payload["error"];
            assert_eq!(error["code"], "SANDBOX_EXECUTION_FAILED", "{t}: {payload}");
            assert_eq!(error["details"]["exitCode"], 3, "{payload}");
            assert_eq!(error["details"]["termination"], "exited", "{payload}");
            let message = error["message"].as_str().unwrap();
            assert!(message.contains("exited with code 3"), "{message}");
            assert!(
                message.contains("none of its changes were applied"),
                "{message}"
            );
            // The end of its stderr, with the API key's value redacted.
            assert!(
                message.contains("error: the build broke (3 errors)"),
                "{message}"
            );
            assert!(message.contains("using the key [redacted]"), "{message}");
            assert!(!payload.to_string().contains(FAILURE_SECRET), "{payload}");
        }
        // The task's attempts carry the same error, and so does what `smithers up` printed.
        let tried = attempts(root, "edit");
        assert_eq!(tried.len(), 3, "{tried:?}");
        for (_, state, error) in &tried {
            assert_eq!(state, "failed");
            assert_eq!(error["code"], "SANDBOX_EXECUTION_FAILED", "{error}");
            assert!(
                !error["message"]
                    .as_str()
                    .unwrap()
                    .contains("received undefined"),
                "{error}"
            );
        }
        assert!(said.contains("exited with code 3"), "{said}");
        assert!(said.contains("error: the build broke (3 errors)"), "{said}");
        assert!(
            !said.contains(FAILURE_SECRET),
            "the key's value was shown:\n{said}"
        );

        // Nothing was held for review, nor left where Smithers would read a bundle; the
        // host's bundle was kept aside for a person.
        if root.join(".smithers/sandbox.db").exists() {
            let listed = ours(root, &["ls"]);
            assert_eq!(listed, serde_json::json!([]), "{provider}: {listed}");
        }
        let runs = std::fs::read_dir(root.join(".smithers/sandboxes")).unwrap();
        let run_dirs: Vec<PathBuf> = runs.map(|e| e.unwrap().path()).collect();
        assert_eq!(run_dirs.len(), 1, "{run_dirs:?}");
        let step = run_dirs[0].join("edit");
        assert!(!step.join("result").exists(), "{provider}");
        assert!(!step.join("result-review").exists(), "{provider}");
        assert!(step.join("result-failed/README.md").is_file(), "{provider}");
    }
    drop(server);
}

#[test]
fn per_step_settings_from_a_workflow_reach_the_host() {
    if !super::provider_built() || !sandboxes_usable() || !engine_installed() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    // The operator's egress ceiling, which the step's own policy is confined to.
    let ceiling = data.path().join("ceiling.json");
    std::fs::write(
        &ceiling,
        r#"{"allow":[{"host":"allowed.test","ports":[443]}]}"#,
    )
    .unwrap();
    let server = ServeChild::start(&ServeOptions {
        token: TOKEN.into(),
        data_dir: data.path().join("data"),
        args: vec!["--egress-ceiling".into(), ceiling.display().to_string()],
        ..Default::default()
    })
    .unwrap();
    let url = server.url();
    let dir = workflow_project("workflow.tsx", &e2e_workflow("settings.tsx"));
    let root = dir.path();
    let started = Instant::now();
    let (ok, said) = up(root, &url, &["up", "workflow.tsx"]);
    // `slow` sleeps 120 s; its own timeoutMs (1.5 s) ends it, not the host's hour.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the step's timeoutMs did not reach the host:\n{said}"
    );
    assert!(!ok, "`slow` must fail the run:\n{said}");

    // `where` ran in its own cwd.
    let conn = rusqlite::Connection::open(root.join("smithers.db")).unwrap();
    let dir_of_where: String = conn
        .query_row("SELECT dir FROM result WHERE node_id = 'where'", [], |r| {
            r.get(0)
        })
        .unwrap_or_else(|e| panic!("where's output row: {e}\n{said}"));
    assert_eq!(dir_of_where, "/workspace/src", "{said}");
    // Smithers recorded the settings each step ran with.
    let events = sandbox_events(root);
    let created = events
        .iter()
        .find(|(s, t, _)| s == "where" && t == "SandboxCreated")
        .map(|(_, _, p)| p)
        .unwrap();
    let config: Value = serde_json::from_str(created["configJson"].as_str().unwrap()).unwrap();
    assert_eq!(
        config["workspace"]["smithersSandbox"]["cwd"],
        "/workspace/src"
    );

    let failure = |sandbox: &str| -> Value {
        events
            .iter()
            .find(|(s, t, _)| s == sandbox && t == "SandboxFailed")
            .map(|(_, _, p)| p["error"].clone())
            .unwrap_or_else(|| panic!("no SandboxFailed of {sandbox}: {events:?}\n{said}"))
    };
    // `egress`: its policy denied the name, and its error says so.
    let egress = failure("egress");
    assert_eq!(egress["code"], "SANDBOX_EXECUTION_FAILED", "{egress}");
    assert_eq!(egress["details"]["exitCode"], 6, "{egress}");
    assert_eq!(
        egress["details"]["egressDenied"][0]["host"], "denied.test",
        "{egress}"
    );
    let message = egress["message"].as_str().unwrap();
    assert!(message.contains("egress denied: denied.test"), "{message}");
    assert!(message.contains("cannot resolve denied.test"), "{message}");

    // `slow`: killed by its own timeout, which its error names.
    let slow = failure("slow");
    assert_eq!(slow["code"], "SANDBOX_EXECUTION_FAILED", "{slow}");
    assert_eq!(slow["details"]["termination"], "timeout", "{slow}");
    assert_eq!(slow["details"]["timeoutMs"], 1500, "{slow}");
    let message = slow["message"].as_str().unwrap();
    assert!(message.contains("timed out after 1500 ms"), "{message}");
    assert!(message.contains("going to sleep"), "{message}");
    assert!(said.contains("timed out after 1500 ms"), "{said}");
    drop(server);
}

/// The README's example (its first `tsx` block), run as it is written: the per-step settings
/// it shows reach the host.
#[test]
fn the_readmes_example_runs() {
    if !super::provider_built() || !sandboxes_usable() || !engine_installed() {
        return;
    }
    let readme = std::fs::read_to_string(super::package_dir().join("README.md")).unwrap();
    let start = readme
        .find("```tsx\n")
        .expect("the README has a tsx example")
        + "```tsx\n".len();
    let example = &readme[start..start + readme[start..].find("\n```").unwrap()];
    assert!(example.contains("sandboxSettings("), "{example}");
    let data = tempfile::tempdir().unwrap();
    let server = ServeChild::start(&ServeOptions {
        token: TOKEN.into(),
        data_dir: data.path().to_path_buf(),
        ..Default::default()
    })
    .unwrap();
    let url = server.url();
    let dir = workflow_project("example.tsx", example);
    let root = dir.path();
    let (ok, said) = up(root, &url, &["up", "example.tsx"]);
    assert!(ok, "the README's example failed:\n{said}");
    let conn = rusqlite::Connection::open(root.join("smithers.db")).unwrap();
    let dir_of_report: String = conn
        .query_row("SELECT dir FROM report", [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("the example's output row: {e}\n{said}"));
    assert_eq!(dir_of_report, "/workspace/src");
    drop(server);
}
