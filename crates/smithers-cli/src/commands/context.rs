//! What every orchestrator-facing command shares: where the database is, opening the store,
//! building the orchestrator with its runtimes, crash recovery at start, resolving sandbox
//! ids, and the patch summary of a bundle.

use crate::output::say;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use serde_json::{json, Value};
use smithers_errors::ErrorCode;
use smithers_orchestrator::{Orchestrator, RecoveredSandbox};
use smithers_store::{SandboxRow, Store};

use super::backend;
use crate::output::{coded_error, inert, Coded};

/// The database file under `<root>/.smithers/` when `--db` is not given. The native runtime
/// keeps its bundles in the same directory (`.smithers/sandboxes/<run>/<sandbox>/result`), so
/// one project's sandboxes, rows and bundles live together.
pub const DEFAULT_DB_FILE: &str = "sandbox.db";

/// Where the store is: `--db`, else `<root>/.smithers/sandbox.db`.
#[derive(Debug, Args, Clone)]
pub struct StoreArgs {
    /// The project directory (default: the current directory). Its `.smithers/sandbox.db`
    /// is the database unless --db is given.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// The SQLite database (overrides the one under --root).
    #[arg(long, value_name = "PATH", env = "SMITHERS_DB")]
    pub db: Option<PathBuf>,
}

impl StoreArgs {
    /// The project root, canonical: `--root`, else found upward from the current directory
    /// as git finds a repository ([`find_project_root`]).
    pub fn root_dir(&self) -> anyhow::Result<PathBuf> {
        let root = match &self.root {
            Some(r) => r.clone(),
            None => {
                let cwd = std::env::current_dir().context("current directory")?;
                let cwd = std::fs::canonicalize(&cwd)
                    .with_context(|| format!("current directory {}", cwd.display()))?;
                return Ok(find_project_root(&cwd));
            }
        };
        std::fs::canonicalize(&root).map_err(|e| {
            coded_error(
                ErrorCode::InvalidInput,
                format!("--root {}: {e}", root.display()),
                json!({ "root": root }),
            )
        })
    }

    /// Where the current directory is inside the project found upward (`None` with `--root`,
    /// at the root itself, or outside it): `run` starts the step in the same place under
    /// /workspace, as `git` commands run from a subdirectory act on the whole repository.
    pub fn subdir_of_cwd(&self, root: &Path) -> Option<PathBuf> {
        if self.root.is_some() {
            return None;
        }
        let cwd = std::fs::canonicalize(std::env::current_dir().ok()?).ok()?;
        let rel = cwd.strip_prefix(root).ok()?;
        (!rel.as_os_str().is_empty()).then(|| rel.to_path_buf())
    }

    /// Where the database is (`--db`, else `<root>/.smithers/sandbox.db`); nothing created.
    pub fn db_location(&self) -> anyhow::Result<PathBuf> {
        Ok(match &self.db {
            Some(db) => db.clone(),
            None => self
                .root_dir()?
                .join(smithers_runtime::STATE_DIR_NAME)
                .join(DEFAULT_DB_FILE),
        })
    }

    /// The database file (its directory is created when missing: the project's state
    /// directory through `ensure_state_dir`, which makes git ignore it).
    pub fn db_path(&self) -> anyhow::Result<PathBuf> {
        if self.db.is_none() {
            let root = self.root_dir()?;
            smithers_runtime::ensure_state_dir(&root)
                .with_context(|| format!("creating {}/.smithers", root.display()))?;
        }
        let path = self.db_location()?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        Ok(path)
    }

    /// The flags that point another command at the same database (for printed hints).
    pub fn hint_flags(&self, root: &Path) -> String {
        match &self.db {
            Some(db) => format!(" --db {}", shell_quote(&db.display().to_string())),
            None => format!(" --root {}", shell_quote(&root.display().to_string())),
        }
    }
}

/// The project a command run in `cwd` (canonical) acts on: the nearest directory, from `cwd`
/// upward, that holds a `.smithers` state directory of this user or a `.git` (a repository's
/// top, or a worktree's); `cwd` itself when none does. The nearest wins, as in git, so a
/// `.smithers` left in a home directory does not capture every project below it. A `.smithers`
/// that is a link or belongs to another user (a shared `/tmp/.smithers`, say) is passed over:
/// it must not decide where a step's changes land.
pub fn find_project_root(cwd: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    for dir in cwd.ancestors() {
        let state = std::fs::symlink_metadata(dir.join(smithers_runtime::STATE_DIR_NAME));
        if state.is_ok_and(|m| m.is_dir() && Some(m.uid()) == me) {
            return dir.to_path_buf();
        }
        // `.git` is a directory at a repository's top and a file (`gitdir: ...`) in a worktree.
        if std::fs::symlink_metadata(dir.join(".git")).is_ok() {
            return dir.to_path_buf();
        }
    }
    cwd.to_path_buf()
}

/// Quotes a word for a POSIX shell when it needs it (printed commands must paste cleanly).
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// An open store with its orchestrator, after crash recovery ran.
pub struct Ctx {
    pub orchestrator: Arc<Orchestrator>,
    pub db_path: PathBuf,
    /// Sandboxes this start found orphaned and failed.
    pub recovered: Vec<RecoveredSandbox>,
    /// Sandboxes whose cleanup and lease release come after their step was answered (the
    /// resident service's): started once the answer is given, awaited before the next step
    /// and before the context goes.
    finishing: std::sync::Mutex<Vec<Finishing>>,
    /// The async runtime the orchestrator calls run on (`None` only once dropped).
    rt: Option<tokio::runtime::Runtime>,
}

impl Ctx {
    /// The store.
    pub fn store(&self) -> &Store {
        self.orchestrator.store()
    }

    /// The async runtime the orchestrator calls run on.
    pub fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt
            .as_ref()
            .expect("the runtime lives as long as the context")
    }
}

/// A sandbox's cleanup and lease release (`Orchestrator::execute_then_finish`).
enum Finishing {
    /// Not started: its step's answer is still being given.
    Waiting(smithers_orchestrator::Finish),
    Started(tokio::task::JoinHandle<()>),
}

impl Ctx {
    /// Keeps a sandbox's cleanup (`Orchestrator::execute_then_finish`), to be started once
    /// the step is answered ([`Ctx::start_finishing`]).
    pub fn finishing(&self, finish: smithers_orchestrator::Finish) {
        self.finishing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Finishing::Waiting(finish));
    }

    /// Starts the cleanups kept, in the async runtime's tasks.
    pub fn start_finishing(&self) {
        let mut kept = self.finishing.lock().unwrap_or_else(|p| p.into_inner());
        *kept = self
            .started(std::mem::take(&mut *kept))
            .into_iter()
            .map(Finishing::Started)
            .collect();
    }

    /// Runs or waits for the cleanups kept (from a thread outside the async runtime).
    pub fn wait_finishing(&self) {
        let kept = std::mem::take(&mut *self.finishing.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some(rt) = &self.rt {
            for task in self.started(kept) {
                let _ = rt.block_on(task);
            }
        }
    }

    /// `kept`'s cleanups, each in a task of the async runtime (started now if it was not):
    /// a cleanup that panics is contained there (reported by tokio) rather than unwinding
    /// through whoever waits for it (a drop, maybe). None without the runtime (dropped).
    fn started(&self, kept: Vec<Finishing>) -> Vec<tokio::task::JoinHandle<()>> {
        let Some(rt) = &self.rt else {
            return Vec::new();
        };
        kept.into_iter()
            .map(|f| match f {
                Finishing::Waiting(finish) => rt.spawn(finish),
                Finishing::Started(task) => task,
            })
            .collect()
    }
}

impl Drop for Ctx {
    /// The command's work is done once its context goes (cleanups still going on are
    /// awaited first): its runtime's idle threads are left to end with the process rather
    /// than woken and joined one by one (about a millisecond of every short command).
    fn drop(&mut self) {
        self.wait_finishing();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// The async runtime of a command. Multi-threaded: the orchestrator makes short blocking
/// SQLite calls on its tasks, and the progress display ticks next to the step.
pub fn async_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Opens the store and runs crash recovery (cheap when nothing is orphaned: one query).
/// Recovered sandboxes are reported on stderr unless `quiet`.
pub fn open(args: &StoreArgs, quiet: bool) -> anyhow::Result<Ctx> {
    open_with(args, quiet, backend::workspace_from_env()?, None)
}

/// [`open`] for a command that only reads or decides on what exists: no database is created
/// where there is none (`ls` in any directory must not leave a `.smithers` behind).
/// `Ok(None)` when there is no database.
pub fn open_existing(args: &StoreArgs, quiet: bool) -> anyhow::Result<Option<Ctx>> {
    if args.db_location()?.exists() {
        open(args, quiet).map(Some)
    } else {
        Ok(None)
    }
}

/// [`open_existing`] where a missing database is an error naming where it was looked for.
pub fn open_required(args: &StoreArgs, quiet: bool) -> anyhow::Result<Ctx> {
    let place = args.db_location()?;
    open_existing(args, quiet)?.ok_or_else(|| {
        coded_error(
            ErrorCode::InvalidInput,
            format!(
                "no database at {}: nothing has run here (run a step first, or point --root/--db at the project)",
                inert(&place.display().to_string())
            ),
            json!({ "db": place }),
        )
    })
}

/// A sandbox's directory in the project, `.smithers/sandboxes/<runId>/<sandboxId>` (relative
/// to the root), for ids checked to be plain names first: they come from a command line or a
/// database that may be crafted, and become a path.
pub fn sandbox_rel_dir(run_id: &str, sandbox_id: &str) -> anyhow::Result<PathBuf> {
    smithers_runtime::config::validate_id("runId", run_id).coded()?;
    smithers_runtime::config::validate_id("sandboxId", sandbox_id).coded()?;
    Ok(Path::new(smithers_runtime::STATE_DIR_NAME)
        .join("sandboxes")
        .join(run_id)
        .join(sandbox_id))
}

/// [`open`] whose native runtime uses `workspace` (`run --workspace`).
pub fn open_with(
    args: &StoreArgs,
    quiet: bool,
    workspace: smithers_runtime_native::WorkspaceMode,
    prestart: Option<&smithers_runtime::Controls>,
) -> anyhow::Result<Ctx> {
    let db_path = args.db_path()?;
    let orchestrator = Arc::new(backend::orchestrator_with(&db_path, workspace, prestart)?);
    open_over(orchestrator, db_path, quiet)
}

/// The context over an orchestrator made by the caller (a session's holder registers its
/// own runtime), after crash recovery ran.
pub fn open_over(
    orchestrator: Arc<Orchestrator>,
    db_path: PathBuf,
    quiet: bool,
) -> anyhow::Result<Ctx> {
    let rt = async_runtime()?;
    let recovered = rt.block_on(orchestrator.recover()).coded()?;
    report_recovered(&recovered, quiet);
    Ok(Ctx {
        orchestrator,
        db_path,
        recovered,
        finishing: Default::default(),
        rt: Some(rt),
    })
}

/// Says what the recovery pass found (unless `quiet`).
fn report_recovered(recovered: &[RecoveredSandbox], quiet: bool) {
    if quiet {
        return;
    }
    for r in recovered {
        if r.review_opened {
            say!(
                "recovered lost session {}:{} ({}): its holder is gone; its change awaits review",
                inert(&r.run_id),
                inert(&r.sandbox_id),
                inert(&r.runtime)
            );
            continue;
        }
        // Ids and runtime come from the database: inert.
        say!(
            "{} orphaned sandbox {}:{} ({}){}",
            if r.marked_failed {
                "recovered"
            } else {
                "found (database not ours to act on: reported only)"
            },
            inert(&r.run_id),
            inert(&r.sandbox_id),
            inert(&r.runtime),
            match &r.cleanup_error {
                None if r.marked_failed => ": marked failed, leftovers cleaned up".to_string(),
                None => String::new(),
                Some(e) => format!(": cleanup not done: {}", inert(e)),
            }
        );
    }
}

/// A context for one command: its own, or one the resident service keeps open across
/// requests (with the recovery pass of this request).
pub enum CtxHandle {
    Own(Ctx),
    Shared(Arc<Ctx>, Vec<RecoveredSandbox>),
}

impl std::ops::Deref for CtxHandle {
    type Target = Ctx;
    fn deref(&self) -> &Ctx {
        match self {
            CtxHandle::Own(ctx) => ctx,
            CtxHandle::Shared(ctx, _) => ctx,
        }
    }
}

impl CtxHandle {
    /// What this request's recovery pass found.
    pub fn recovered(&self) -> &[RecoveredSandbox] {
        match self {
            CtxHandle::Own(ctx) => &ctx.recovered,
            CtxHandle::Shared(_, recovered) => recovered,
        }
    }
}

/// The projects the resident service keeps open: each one's store, async runtime and native
/// runtime, whose warm pool prepares (and, for a configuration that repeats, arms) the next
/// step's sandbox while the service waits.
pub struct ContextCache {
    /// Sandboxes each project's pool keeps prepared.
    warm: usize,
    entries: Vec<CachedCtx>,
}

struct CachedCtx {
    db_path: PathBuf,
    workspace: smithers_runtime_native::WorkspaceMode,
    /// The database file's (device, inode) when it was opened: a database removed or
    /// replaced since (`rm -r .smithers`) is opened anew, never written through a
    /// descriptor of a file nobody will read again.
    file: (u64, u64),
    ctx: Arc<Ctx>,
    /// The context's native runtime (the orchestrator holds it too), for its pool's status.
    native: Arc<smithers_runtime_native::NativeRuntime>,
    used: std::time::Instant,
}

/// The most projects kept open at once (the least recently used is closed first).
pub const MAX_CACHED_PROJECTS: usize = 4;

impl ContextCache {
    pub fn new(warm: usize) -> ContextCache {
        ContextCache {
            warm,
            entries: Vec::new(),
        }
    }

    /// The warm pools' state, project by project.
    pub fn warm_status(&self) -> Vec<(PathBuf, Option<smithers_runtime_native::WarmStatus>)> {
        self.entries
            .iter()
            .map(|e| (e.db_path.clone(), e.native.warm_status()))
            .collect()
    }

    /// The step served is over (its client has its answer): its sandbox's cleanup starts,
    /// and the warm pools may prepare the next sandboxes now.
    pub fn step_over(&self) {
        for e in &self.entries {
            e.ctx.start_finishing();
            e.native.steps_over();
        }
    }

    /// Closes every project (their warm sandboxes are killed and removed).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// The context of the project `args` names, opened when it is not kept yet (or its
    /// database file changed), with a recovery pass either way.
    pub fn get(
        &mut self,
        args: &StoreArgs,
        quiet: bool,
        workspace: smithers_runtime_native::WorkspaceMode,
    ) -> anyhow::Result<CtxHandle> {
        let db_path = args.db_path()?;
        let file_now = file_id(&db_path);
        if let Some(at) = self
            .entries
            .iter()
            .position(|e| e.db_path == db_path && e.workspace == workspace)
        {
            if file_now == Some(self.entries[at].file) {
                let entry = &mut self.entries[at];
                entry.used = std::time::Instant::now();
                let ctx = entry.ctx.clone();
                // The last step's cleanup is over before this one starts (it is, by now,
                // almost always).
                ctx.wait_finishing();
                let recovered = ctx.rt().block_on(ctx.orchestrator.recover()).coded()?;
                report_recovered(&recovered, quiet);
                return Ok(CtxHandle::Shared(ctx, recovered));
            }
            self.entries.remove(at);
        }
        if self.entries.len() >= MAX_CACHED_PROJECTS {
            if let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i)
            {
                self.entries.remove(oldest);
            }
        }
        let native = Arc::new(backend::native_runtime_resident(workspace, self.warm)?);
        let orchestrator = Arc::new(backend::orchestrator_over(&db_path, native.clone())?);
        let rt = async_runtime()?;
        let recovered = rt.block_on(orchestrator.recover()).coded()?;
        report_recovered(&recovered, quiet);
        let file = file_id(&db_path).with_context(|| {
            format!(
                "the database {} vanished as it was opened",
                db_path.display()
            )
        })?;
        let ctx = Arc::new(Ctx {
            orchestrator,
            db_path: db_path.clone(),
            recovered: Vec::new(),
            finishing: Default::default(),
            rt: Some(rt),
        });
        self.entries.push(CachedCtx {
            db_path,
            workspace,
            file,
            ctx: ctx.clone(),
            native,
            used: std::time::Instant::now(),
        });
        Ok(CtxHandle::Shared(ctx, recovered))
    }
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Recovered sandboxes as JSON (for `--json` documents).
pub fn recovered_json(recovered: &[RecoveredSandbox]) -> Value {
    Value::Array(
        recovered
            .iter()
            .map(|r| {
                json!({
                    "runId": r.run_id,
                    "sandboxId": r.sandbox_id,
                    "runtime": r.runtime,
                    "cleanedUp": r.cleaned_up,
                    "cleanupError": r.cleanup_error,
                    "markedFailed": r.marked_failed,
                    "reviewOpened": r.review_opened,
                })
            })
            .collect(),
    )
}

/// Every run id in the database. The store lists sandboxes per run only, so the run ids are
/// read through a second, read-only connection to the same file.
pub fn run_ids(db_path: &Path) -> anyhow::Result<Vec<String>> {
    let conn = rusqlite::Connection::open_with_flags(
        db_path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening {} read-only", db_path.display()))?;
    conn.busy_timeout(smithers_store::BUSY_TIMEOUT)?;
    let mut stmt = conn.prepare(
        "SELECT run_id FROM _smithers_sandboxes GROUP BY run_id ORDER BY MIN(COALESCE(shipped_at_ms, heartbeat_at_ms, 0)), run_id",
    )?;
    let ids = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ids)
}

/// Every sandbox row of the database, run by run.
pub fn all_sandboxes(ctx: &Ctx) -> anyhow::Result<Vec<SandboxRow>> {
    let mut out = Vec::new();
    for run in run_ids(&ctx.db_path)? {
        out.extend(ctx.store().list_sandboxes(&run).coded()?);
    }
    Ok(out)
}

/// Resolves `<sandboxId>` (unique over the database) or `<runId>:<sandboxId>`.
pub fn resolve(ctx: &Ctx, id: &str) -> anyhow::Result<SandboxRow> {
    if let Some((run, sid)) = id.split_once(':') {
        if let Some(row) = ctx.store().get_sandbox(run, sid).coded()? {
            return Ok(row);
        }
    }
    let all = all_sandboxes(ctx)?;
    let mut matches: Vec<SandboxRow> = all.iter().filter(|r| r.sandbox_id == id).cloned().collect();
    // Short ids, as git takes them: a unique prefix (`sbx-1a2324`), or a unique end of at
    // least 4 characters (the random part, `5dcd3`). Ambiguity is an error listing them.
    if matches.is_empty() && id.len() >= 4 {
        matches = all
            .iter()
            .filter(|r| r.sandbox_id.starts_with(id))
            .cloned()
            .collect();
        if matches.is_empty() {
            matches = all
                .iter()
                .filter(|r| r.sandbox_id.ends_with(id))
                .cloned()
                .collect();
        }
    }
    match matches.len() {
        1 => Ok(matches.into_iter().next().expect("one match")),
        0 => Err(coded_error(
            ErrorCode::InvalidInput,
            format!(
                "no sandbox {id:?} in {} (use `smithers-sandbox ls` to list them)",
                ctx.db_path.display()
            ),
            json!({ "sandboxId": id, "db": ctx.db_path }),
        )),
        _ => Err(coded_error(
            ErrorCode::InvalidInput,
            format!(
                "sandbox id {id:?} matches {} sandboxes; say which with a longer id or <runId>:<sandboxId>",
                matches.len()
            ),
            json!({
                "sandboxId": id,
                "candidates": matches.iter().map(|r| format!("{}:{}", r.run_id, r.sandbox_id)).collect::<Vec<_>>(),
            }),
        )),
    }
}

/// Resolves a run as `events` takes it: its full id, a unique prefix or a unique end of at
/// least 4 characters, or any form of one of its sandboxes' ids ([`resolve`]), as `run`'s
/// summary prints that. An id no run has is returned as it is (the caller says it is unknown).
pub fn resolve_run(ctx: &Ctx, id: &str) -> anyhow::Result<String> {
    let runs = run_ids(&ctx.db_path)?;
    if runs.iter().any(|r| r == id) {
        return Ok(id.to_string());
    }
    let mut matches: Vec<&String> = Vec::new();
    if id.len() >= 4 {
        matches = runs.iter().filter(|r| r.starts_with(id)).collect();
        if matches.is_empty() {
            matches = runs.iter().filter(|r| r.ends_with(id)).collect();
        }
    }
    match matches.len() {
        1 => return Ok(matches[0].clone()),
        0 => {}
        n => {
            return Err(coded_error(
                ErrorCode::InvalidInput,
                format!("run id {id:?} matches {n} runs; say which with a longer id"),
                json!({ "runId": id, "candidates": matches }),
            ))
        }
    }
    // A sandbox's id names its run too.
    match resolve(ctx, id) {
        Ok(row) => Ok(row.run_id),
        Err(_) => Ok(id.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/tmp/a-b_c.d"), "/tmp/a-b_c.d");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
