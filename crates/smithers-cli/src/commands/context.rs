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
use smithers_orchestrator::{
    AtomicPatchApplier, BundleInspector, BundleValidator, Orchestrator, RecoveredSandbox, Settings,
};
use smithers_runtime_docker::{DockerOptions, DockerRuntime};
use smithers_store::{PatchRecord, SandboxRow, Store};

use crate::output::{coded_error, inert, name, Coded};

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

/// Builds the orchestrator over the store at `db_path` with every runtime this binary has
/// (native as `bubblewrap`, docker), with the limits from the environment.
pub fn orchestrator(db_path: &Path) -> anyhow::Result<Orchestrator> {
    orchestrator_with(db_path, super::run::workspace_from_env()?, None)
}

/// [`orchestrator`] whose native runtime uses `workspace`.
///
/// `prestart`: the controls of the one native step this process is about to run: its
/// sandbox is started before the store is opened, so that the two proceed side by side
/// (`NativeRuntime::prestart`).
pub fn orchestrator_with(
    db_path: &Path,
    workspace: smithers_runtime_native::WorkspaceMode,
    prestart: Option<&smithers_runtime::Controls>,
) -> anyhow::Result<Orchestrator> {
    let native = super::run::native_runtime_with(workspace)?;
    if let Some(controls) = prestart {
        native.prestart(controls);
    }
    orchestrator_over(db_path, Arc::new(native))
}

/// The orchestrator over the store at `db_path` with `native` as its native runtime (and
/// docker, codeplane and ray as the environment configures them).
fn orchestrator_over(
    db_path: &Path,
    native: Arc<smithers_runtime_native::NativeRuntime>,
) -> anyhow::Result<Orchestrator> {
    let store = Arc::new(Store::open(db_path).coded()?);
    // This very binary holds a container step's network namespace for an egress policy.
    let docker = DockerRuntime::new(DockerOptions {
        egress_holder: std::env::current_exe().ok(),
        ..DockerOptions::default()
    });
    let orchestrator = Orchestrator::new(store, Arc::new(AtomicPatchApplier), Settings::from_env())
        .coded()?
        .with_runtime(native)
        .with_runtime(Arc::new(docker));
    // The codeplane runtime (a `smithers-sandbox serve` host) where its URL and token are
    // set; `run --runtime codeplane` says what is missing otherwise.
    let orchestrator = match smithers_runtime_remote::RemoteRuntime::from_env() {
        Ok(remote) => orchestrator.with_runtime(Arc::new(remote)),
        Err(_) => orchestrator,
    };
    // The ray runtime (a fleet) where RAY_ADDRESS is set; `run --runtime ray` says what is
    // missing otherwise.
    Ok(match smithers_runtime_ray::RayRuntime::from_env() {
        Ok(ray) => orchestrator.with_runtime(Arc::new(ray)),
        Err(_) => orchestrator,
    })
}

/// Opens the store and runs crash recovery (cheap when nothing is orphaned: one query).
/// Recovered sandboxes are reported on stderr unless `quiet`.
pub fn open(args: &StoreArgs, quiet: bool) -> anyhow::Result<Ctx> {
    open_with(args, quiet, super::run::workspace_from_env()?, None)
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
    let orchestrator = Arc::new(orchestrator_with(&db_path, workspace, prestart)?);
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
        let native = Arc::new(super::run::native_runtime_resident(workspace, self.warm)?);
        let orchestrator = Arc::new(orchestrator_over(&db_path, native.clone())?);
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

/// One file's change, for summaries.
#[derive(Debug, Clone)]
pub struct FileChange {
    pub path: String,
    pub operation: &'static str,
    pub added: usize,
    pub removed: usize,
    pub binary: bool,
    /// For a deletion and an addition of the same content (git's exact rename): the other
    /// path. The patches still carry a deletion and an addition; this is how they are shown.
    pub renamed: Option<String>,
}

impl FileChange {
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "path": self.path,
            "operation": self.operation,
            "added": self.added,
            "removed": self.removed,
            "binary": self.binary,
        });
        if let Some(other) = &self.renamed {
            let key = if self.operation == "add" {
                "renamedFrom"
            } else {
                "renamedTo"
            };
            v[key] = json!(other);
        }
        v
    }
}

/// The parsed patches of a bundle (validated first: a bundle waiting on disk may have been
/// tampered with), in bundle order.
pub fn bundle_patches(bundle_path: &Path) -> anyhow::Result<Vec<smithers_patch::FilePatch>> {
    bundle_contents(bundle_path).map(|(patches, _)| patches)
}

/// [`bundle_patches`] and the bundle's `changeNotes`, from one validation.
pub fn bundle_contents(
    bundle_path: &Path,
) -> anyhow::Result<(Vec<smithers_patch::FilePatch>, smithers_bundle::ChangeNotes)> {
    let bundle = BundleValidator
        .inspect(bundle_path)
        .map_err(anyhow::Error::new)?;
    let mut out = Vec::new();
    for rel in &bundle.patch_files {
        let path = bundle.bundle_path.join(rel);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        out.extend(smithers_patch::parse_patch(&text).coded()?);
    }
    Ok((out, bundle.change_notes))
}

/// The bundle's `git/series.patch` (what the commits leave of the files they leave
/// otherwise than the patches), read through no link and bounded; `None` without one.
fn read_series_patch(bundle_path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let beneath = smithers_paths::Beneath::open(bundle_path).ok()?;
    let file = beneath
        .open_read(Path::new(smithers_bundle::SERIES_PATCH_FILE))
        .ok()?;
    let mut bytes = Vec::new();
    file.take(smithers_bundle::MAX_SERIES_PATCH_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// [`read_series_patch`], rendered for the review: a diff with the review's findings (files
/// the host runs, control characters), inert; bytes that are not UTF-8 are shown escaped
/// line by line. `None` when the bundle has none.
pub fn render_series_patch(
    bundle_path: &Path,
    hooks_dirs: &[String],
    color: bool,
) -> Option<String> {
    let bytes = read_series_patch(bundle_path)?;
    let parsed = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|t| smithers_patch::parse_patch(t).ok());
    Some(match parsed {
        Some(patches) => {
            let shown = smithers_patch::PatchReview::new(&patches, None);
            let findings = shown.findings(hooks_dirs);
            shown.render(&smithers_patch::ReviewOptions { color }, &findings)
        }
        None => escaped_lines(&bytes),
    })
}

/// Bytes shown line by line with everything that is not plain text escaped.
fn escaped_lines(bytes: &[u8]) -> String {
    bytes
        .split_inclusive(|b| *b == b'\n')
        .map(|l| smithers_terminal::escape_bytes(l, smithers_terminal::Inert::BODY) + "\n")
        .collect()
}

/// [`read_series_patch`] for `--json`: `{diff, exact, findings}` (`diff` the patch text as
/// it is when it is UTF-8, else escaped with `exact: false`), or `Null` without one.
pub fn series_patch_json(bundle_path: &Path, hooks_dirs: &[String]) -> Value {
    let Some(bytes) = read_series_patch(bundle_path) else {
        return Value::Null;
    };
    match std::str::from_utf8(&bytes) {
        Ok(text) => {
            let findings = smithers_patch::parse_patch(text)
                .ok()
                .map(|patches| {
                    let shown = smithers_patch::PatchReview::new(&patches, None);
                    serde_json::to_value(shown.findings(hooks_dirs)).unwrap_or(Value::Null)
                })
                .unwrap_or(Value::Null);
            json!({ "diff": text, "exact": true, "findings": findings })
        }
        Err(_) => json!({ "diff": escaped_lines(&bytes), "exact": false, "findings": Value::Null }),
    }
}

/// What the bundle's log says happened to the step's result and output (a result file that
/// was refused, a stream cut off at a cap, egress records past their bound): at most 20
/// records, read through no link, a bounded line at a time.
pub fn log_notes(bundle_path: &Path) -> Vec<Value> {
    use std::io::{BufRead, Read};
    const MAX_LINE: u64 = 1 << 20;
    let Ok(beneath) = smithers_paths::Beneath::open(bundle_path) else {
        return Vec::new();
    };
    let Ok(file) = beneath.open_read(Path::new("logs/stream.ndjson")) else {
        return Vec::new();
    };
    let mut reader = std::io::BufReader::new(file);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while out.len() < 20 {
        buf.clear();
        match Read::take(&mut reader, MAX_LINE + 1).read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) if buf.len() as u64 > MAX_LINE => {
                let mut rest = Vec::new();
                let _ = reader.read_until(b'\n', &mut rest);
                continue;
            }
            Ok(_) => {}
        }
        let Ok(record) = serde_json::from_slice::<Value>(&buf) else {
            continue;
        };
        if [
            "resultRejected",
            "outputTruncated",
            "egressRecordsDropped",
            "logCut",
        ]
        .contains(&record["type"].as_str().unwrap_or(""))
        {
            out.push(record);
        }
    }
    out
}

/// The bundle's `changeNotes`; empty when the bundle has none or no longer validates
/// (reading its patches says why).
pub fn bundle_notes(bundle_path: &Path) -> smithers_bundle::ChangeNotes {
    BundleValidator
        .inspect(bundle_path)
        .map(|b| b.change_notes)
        .unwrap_or_default()
}

/// Adds the bundle's `changeNotes` (host-changed bases, left-out changes) to the review's
/// findings.
pub fn add_change_notes(
    findings: &mut smithers_patch::ReviewFindings,
    notes: &smithers_bundle::ChangeNotes,
) {
    findings.host_changed = notes.host_changed.clone();
    findings.left_out = notes
        .left_out
        .iter()
        .map(|l| smithers_patch::RiskyPath {
            path: l.path.clone(),
            reason: l.reason.clone(),
        })
        .collect();
    findings.left_out_unlisted = notes.left_out_unlisted;
}

/// The step's commits as the review lists them: the branch, then each commit oldest first
/// (short id, subject, author, date, its files' +/-), everything from the step made inert.
pub fn render_commits(
    series: &smithers_bundle::CommitSeries,
    hooks_dirs: &[String],
    bold: &str,
    reset: &str,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{bold}{} commit(s) on {}{reset}, on top of {} (accept adds them and moves the branch; what they leave at their tip is exactly the patches below, checked when the step ended and again at accept)",
        series.commits.len(),
        inert(series.branch.as_deref().unwrap_or("a detached HEAD")),
        &series.base[..12.min(series.base.len())]
    );
    let mut runs = 0usize;
    for c in &series.commits {
        let _ = writeln!(
            out,
            "  {} {}",
            &c.oid[..12.min(c.oid.len())],
            inert(&c.subject)
        );
        let _ = writeln!(
            out,
            "      {} <{}>, {}",
            inert(&c.author),
            inert(&c.author_email),
            inert(&c.author_date)
        );
        // The body is part of what goes into the history: shown, inert.
        for line in c.body.lines().filter(|l| !l.trim().is_empty()) {
            let _ = writeln!(out, "      | {}", inert(line));
        }
        for f in &c.files {
            let stat = match (f.added, f.removed) {
                (Some(a), Some(r)) => format!("+{a} -{r}"),
                _ => "binary".to_string(),
            };
            let _ = writeln!(
                out,
                "      {stat:>12}  {}",
                smithers_terminal::quote_path(&f.path)
            );
            if let Some(why) = smithers_patch::runs_on_host(&f.path, hooks_dirs) {
                runs += 1;
                let _ = writeln!(
                    out,
                    "      {:>12}  ^ runs on the host: {}",
                    "!",
                    inert(&why)
                );
            }
        }
        if c.files_unlisted > 0 {
            let _ = writeln!(out, "      ... and {} more file(s)", c.files_unlisted);
        }
    }
    if runs > 0 {
        let _ = writeln!(
            out,
            "{bold}warning:{reset} {runs} file(s) the host runs by itself are in the commits' history (marked !); a later checkout, revert or push of those commits brings them back"
        );
    }
    out
}

/// The bundle's `changeNotes` as JSON, for `run --json` and `show --json`: what the bundle
/// left out, and why, is never only in a log.
pub fn change_notes_json(notes: &smithers_bundle::ChangeNotes) -> Value {
    serde_json::to_value(notes).unwrap_or_else(|_| json!({}))
}

/// Per-file +/- statistics of parsed patches.
pub fn changes(patches: &[smithers_patch::FilePatch]) -> Vec<FileChange> {
    changes_from(patches, smithers_patch::diff_stats(patches))
}

/// [`changes`] with the statistics already made (a review's, read against the host tree).
pub fn changes_from(
    patches: &[smithers_patch::FilePatch],
    stats: Vec<smithers_patch::FileStat>,
) -> Vec<FileChange> {
    // The first section of each path (a type change has two), found through a map: a search
    // of `patches` per path made 40k changed files take seconds (quadratic).
    let mut first: std::collections::HashMap<&str, &smithers_patch::FilePatch> =
        std::collections::HashMap::with_capacity(patches.len());
    for p in patches {
        first.entry(p.path.as_str()).or_insert(p);
    }
    let mut out = stats
        .into_iter()
        .map(|s| {
            let operation = first
                .get(s.path.as_str())
                .map(|p| match p.operation() {
                    smithers_patch::Operation::Add => "add",
                    smithers_patch::Operation::Modify => "modify",
                    smithers_patch::Operation::Delete => "delete",
                })
                .unwrap_or("modify");
            FileChange {
                path: s.path,
                operation,
                added: s.added,
                removed: s.removed,
                binary: s.binary.is_some(),
                renamed: None,
            }
        })
        .collect::<Vec<_>>();
    mark_renames(&mut out, patches);
    out
}

/// The per-file changes of a bundle, or of the recorded patches when the bundle is gone.
pub fn changes_of(bundle_path: Option<&str>, recorded: &[PatchRecord]) -> Vec<FileChange> {
    if let Some(p) = bundle_path {
        if let Ok(patches) = bundle_patches(Path::new(p)) {
            return changes(&patches);
        }
    }
    recorded
        .iter()
        .map(|r| FileChange {
            path: r.path.clone(),
            operation: r.operation.as_str(),
            added: 0,
            removed: 0,
            binary: false,
            renamed: None,
        })
        .collect()
}

/// Pairs each deleted file with an added file of the same content (the same blob id, and
/// each used once), as git's exact rename detection does, so that a move is shown as one.
fn mark_renames(changes: &mut [FileChange], patches: &[smithers_patch::FilePatch]) {
    use smithers_patch::Operation;
    let mut deleted: std::collections::HashMap<&str, Vec<&str>> = Default::default();
    for p in patches
        .iter()
        .filter(|p| p.operation() == Operation::Delete)
    {
        if let Some(oid) = p.old_oid.as_deref() {
            deleted.entry(oid).or_default().push(p.path.as_str());
        }
    }
    let mut pairs: Vec<(String, String)> = Vec::new();
    for p in patches.iter().filter(|p| p.operation() == Operation::Add) {
        let from = p
            .new_oid
            .as_deref()
            .and_then(|oid| deleted.get_mut(oid))
            .and_then(Vec::pop);
        if let Some(from) = from {
            pairs.push((from.to_string(), p.path.clone()));
        }
    }
    let index: std::collections::HashMap<&str, usize> = changes
        .iter()
        .enumerate()
        .map(|(i, c)| (c.path.as_str(), i))
        .collect();
    let found: Vec<(usize, usize, String, String)> = pairs
        .into_iter()
        .filter_map(|(from, to)| {
            Some((
                *index.get(from.as_str())?,
                *index.get(to.as_str())?,
                from,
                to,
            ))
        })
        .collect();
    for (i, j, from, to) in found {
        if changes[i].operation == "delete" && changes[j].operation == "add" {
            changes[i].renamed = Some(to);
            changes[j].renamed = Some(from);
        }
    }
}

/// `git diff --stat`-like lines plus the summary line; names quoted as git quotes them, so a
/// name cannot break a line or forge one.
pub fn stat_lines(changes: &[FileChange]) -> Vec<String> {
    let names: Vec<String> = changes.iter().map(|c| name(&c.path)).collect();
    let w = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let mut lines = Vec::new();
    let (mut ins, mut del) = (0, 0);
    for (c, shown) in changes.iter().zip(&names) {
        ins += c.added;
        del += c.removed;
        let pad = w - shown.chars().count();
        let tag = match (c.operation, &c.renamed) {
            ("add", Some(from)) => format!(" (renamed from {})", name(from)),
            ("delete", Some(to)) => format!(" (renamed to {})", name(to)),
            ("add", None) => " (new)".to_string(),
            ("delete", None) => " (deleted)".to_string(),
            _ => String::new(),
        };
        if c.binary {
            lines.push(format!("{shown}{} | Bin{tag}", " ".repeat(pad)));
        } else {
            let bar_total = (c.added + c.removed).max(1);
            let scale = |n: usize| {
                if bar_total > 30 {
                    n * 30 / bar_total
                } else {
                    n
                }
            };
            lines.push(format!(
                "{shown}{} | {:>3} {}{}{tag}",
                " ".repeat(pad),
                c.added + c.removed,
                "+".repeat(scale(c.added)),
                "-".repeat(scale(c.removed)),
            ));
        }
    }
    lines.push(format!(
        "{} file{} changed, {ins} insertion{}(+), {del} deletion{}(-)",
        changes.len(),
        if changes.len() == 1 { "" } else { "s" },
        if ins == 1 { "" } else { "s" },
        if del == 1 { "" } else { "s" },
    ));
    lines
}

/// The outputs recorded in a bundle's manifest (`README.md` is JSON), if readable.
pub fn bundle_outputs(bundle_path: &str) -> Option<Value> {
    BundleValidator
        .inspect(Path::new(bundle_path))
        .ok()
        .and_then(|b| b.outputs)
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

    #[test]
    fn stats_summary() {
        let lines = stat_lines(&[
            FileChange {
                path: "app.py".into(),
                operation: "modify",
                added: 1,
                removed: 1,
                binary: false,
                renamed: None,
            },
            FileChange {
                path: "NOTES.md".into(),
                operation: "add",
                added: 2,
                removed: 0,
                binary: false,
                renamed: None,
            },
        ]);
        assert_eq!(lines[0], "app.py   |   2 +-");
        assert_eq!(lines[1], "NOTES.md |   2 ++ (new)");
        assert_eq!(lines[2], "2 files changed, 3 insertions(+), 1 deletion(-)");
    }

    /// A name with a newline and fake stat text is one quoted line.
    #[test]
    fn stat_lines_quote_forged_names() {
        let lines = stat_lines(&[FileChange {
            path: "x\n y.txt | 9 +++++++++\x1b[1A".into(),
            operation: "add",
            added: 1,
            removed: 0,
            binary: false,
            renamed: None,
        }]);
        assert_eq!(
            lines,
            [
                "\"x\\n y.txt | 9 +++++++++\\033[1A\" |   1 + (new)",
                "1 file changed, 1 insertion(+), 0 deletions(-)"
            ]
        );
    }
}
