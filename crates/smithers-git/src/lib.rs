//! The commits a step made in the project's repository, brought back for review and added
//! to the host's repository on accept.
//!
//! The project's `.git` is part of the sandbox's copy-on-write view, so what a step's `git
//! commit` writes (objects, refs, its index) lands in the workspace layer, never in the host's
//! repository. At collect, [`collect`] reads the sandbox's HEAD from the layer (falling back to
//! the host's files it did not touch), copies the layer's objects (loose objects and packs,
//! regular files only: no link followed, no `info/alternates` of the step's) into a fresh
//! bare repository of our own, with the host's object directory as a read-only alternate, and
//! runs the host's `git` there to list the series and pack it as a git bundle. Nothing of the
//! step's configuration, hooks or index is ever read by a host `git`.
//!
//! On accept, [`check`] refuses a series whose base is no longer the host's HEAD, [`fetch`]
//! adds the bundle's objects to the host's repository with git's strict object checks, and
//! after the working-tree patches are applied, [`advance`] moves the branch (compare-and-swap
//! from the base) and updates the index entries of the files the commits changed, directly
//! (`update-index --index-info`: no checkout, no filter, no hook runs).
//!
//! Every host `git` here runs without the system or global configuration, with no pager,
//! hooks, fsmonitor, automatic gc or prompts: the project's own repository may be crafted.

use std::io::Write;
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

pub use smithers_bundle::{CommitFile, CommitInfo, CommitSeries, COMMITS_BUNDLE_FILE};
pub use verify::{
    compare_allowing, compare_with_review, refused_path, tip_only_differences, ReviewedFile,
    ReviewedState, SeriesChange, MAX_TIP_DIFFERS,
};

mod objects;
mod verify;

/// At most this many commits make a series; more are left out (their files still come back
/// as patches).
pub const MAX_COMMITS: usize = 1000;
/// At most this many bytes of objects are read from the step's layer.
pub const MAX_OBJECT_BYTES: u64 = 256 << 20;
/// The largest git bundle a result bundle carries.
pub const MAX_GIT_BUNDLE_BYTES: u64 = 64 << 20;
/// A commit message body is cut here.
const MAX_BODY_BYTES: usize = 4096;
/// Files listed per commit.
const MAX_FILES_LISTED: usize = 200;

/// What [`collect`] found.
#[derive(Debug)]
pub enum Collected {
    /// The step made no commit (or the project is not a repository).
    Nothing,
    /// A series, and its git bundle's bytes.
    Series {
        series: CommitSeries,
        bundle: Vec<u8>,
        /// What the series changes from its base to its tip, paths from the project: the
        /// caller checks them against the patches ([`compare_with_review`]) before it brings
        /// the series back.
        changes: Vec<SeriesChange>,
        /// The scratch repository the series was read in, for [`SeriesRepo::tip_diff`].
        repo: Box<SeriesRepo>,
    },
    /// The step changed the repository's history in a way that is not applied: why.
    LeftOut(String),
}

/// A host `git` with nothing of the system's or the user's configuration, and the settings
/// that keep a crafted repository from running anything.
fn git() -> Command {
    let mut c = Command::new("git");
    c.env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
        )
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_PAGER", "cat")
        .env("GIT_LITERAL_PATHSPECS", "1")
        .env("HOME", "/nonexistent")
        .env("LC_ALL", "C")
        .args([
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "gc.auto=0",
            "-c",
            "maintenance.auto=false",
            "-c",
            "core.quotePath=false",
        ])
        .stdin(Stdio::null());
    c
}

/// The address space of a `git` that reads the step's objects: an object's header declares
/// its size, and git allocates it before inflating, so a crafted object could otherwise make
/// the host's git take whatever memory it names. Over the bound git fails, and the series is
/// left out with its error.
const GIT_MEMORY_BYTES: u64 = 4 << 30;

fn bound_memory(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls setrlimit,
    // which is async-signal-safe; it touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: GIT_MEMORY_BYTES,
                rlim_max: GIT_MEMORY_BYTES,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Runs `cmd`, returning its stdout (at most `max` bytes) or its stderr as the error.
fn run(mut cmd: Command, what: &str, max: u64) -> Result<Vec<u8>, String> {
    let out = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("{what}: cannot run git: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{what}: {}",
            err.trim().chars().take(500).collect::<String>()
        ));
    }
    if out.stdout.len() as u64 > max {
        return Err(format!("{what}: more than {max} bytes of output"));
    }
    Ok(out.stdout)
}

/// Runs `cmd` with `input` on its stdin (written from a thread, so a large input cannot
/// deadlock against the command's own output), its stderr as the error.
fn run_with_input(cmd: Command, input: Vec<u8>, what: &str) -> Result<(), String> {
    run_with_output(cmd, input, what, 0).map(drop)
}

/// [`run_with_input`], returning the command's stdout (refused over `max` bytes).
fn run_with_output(
    mut cmd: Command,
    input: Vec<u8>,
    what: &str,
    max: u64,
) -> Result<Vec<u8>, String> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(if max == 0 {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: cannot run git: {e}"))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| format!("{what}: no stdin"))?;
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{what}: {e}"))?;
    let _ = writer.join();
    if !out.status.success() {
        return Err(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    if max > 0 && out.stdout.len() as u64 > max {
        return Err(format!("{what}: more than {max} bytes of output"));
    }
    Ok(out.stdout)
}

/// What the series changes, from its base to its tip, in the host's repository (paths from
/// the repository's top).
fn series_changes(project: &Path, series: &CommitSeries) -> Result<Vec<SeriesChange>, String> {
    raw_changes(in_project(project, &[]), &series.base, &series.tip)
}

/// `diff-tree --raw` from `base` to `tip` through `cmd` (a host `git` in some repository).
fn raw_changes(mut cmd: Command, base: &str, tip: &str) -> Result<Vec<SeriesChange>, String> {
    cmd.args([
        "diff-tree",
        "-r",
        "-z",
        "--no-renames",
        "--no-ext-diff",
        "--raw",
        base,
        tip,
    ]);
    Ok(verify::parse_raw(&run(
        cmd,
        "the series' files",
        256 << 20,
    )?))
}

/// Refuses a series one of whose commits changes a path [`refused_path`] refuses, or a path
/// outside `prefix` (the project's place in its repository, `dir/`; empty at the top): each
/// commit against its first parent, through `cmd` (a host `git` in the repository that has
/// the series' objects).
fn check_series_paths(
    cmd: Command,
    commits: &[(String, Option<String>)],
    prefix: &str,
) -> Result<(), String> {
    let mut cmd = cmd;
    cmd.args([
        "diff-tree",
        "--stdin",
        "--always",
        "--root",
        "-r",
        "-z",
        "--no-renames",
        "--name-only",
    ]);
    let mut input = String::new();
    for (oid, parent) in commits {
        input.push_str(oid);
        if let Some(p) = parent {
            input.push(' ');
            input.push_str(p);
        }
        input.push('\n');
    }
    let listing = run_with_output(cmd, input.into_bytes(), "the commits' files", 256 << 20)?;
    let ids: Vec<String> = commits.iter().map(|(oid, _)| oid.clone()).collect();
    verify::check_commit_paths(&listing, &ids, prefix.as_bytes())
}

fn is_oid(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// A ref name we accept from a sandbox: `refs/` and plain components of a conservative
/// alphabet (no `..`, no leading `-` or `.`, no `.lock`). Anything else is not followed.
fn safe_ref(name: &str) -> bool {
    name.starts_with("refs/heads/")
        && name.len() > "refs/heads/".len()
        && name.len() < 256
        && !name.ends_with('/')
        && !name.contains("//")
        && Path::new(name).components().all(|c| match c {
            Component::Normal(s) => {
                let s = s.to_str().unwrap_or("");
                !s.is_empty()
                    && !s.starts_with('.')
                    && !s.starts_with('-')
                    && !s.ends_with(".lock")
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
            }
            _ => false,
        })
        && !name.contains("..")
}

/// What a layer says of a file: there, deleted (an overlay whiteout: a 0/0 character
/// device), or not touched.
enum InLayer {
    File(Vec<u8>),
    Deleted,
    Untouched,
}

/// Reads a small regular file (no link followed), or says it was deleted or not touched.
fn read_small(path: &Path, max: u64) -> InLayer {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() && m.len() <= max => match std::fs::read(path) {
            Ok(b) => InLayer::File(b),
            Err(_) => InLayer::Untouched,
        },
        Ok(m) if m.file_type().is_char_device() => InLayer::Deleted,
        Ok(_) => InLayer::Deleted, // a link, a directory, an oversized file: not a ref
        Err(_) => InLayer::Untouched,
    }
}

/// What HEAD names.
enum Head {
    Branch(String),
    Detached(String),
}

fn parse_head(bytes: &[u8]) -> Option<Head> {
    let text = std::str::from_utf8(bytes).ok()?.trim();
    if let Some(name) = text.strip_prefix("ref: ") {
        return safe_ref(name).then(|| Head::Branch(name.to_string()));
    }
    is_oid(text).then(|| Head::Detached(text.to_string()))
}

/// The oid of `refname` in a `packed-refs` file's text.
fn in_packed_refs(bytes: &[u8], refname: &str) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.lines().find_map(|line| {
        let (oid, name) = line.split_once(' ')?;
        (name == refname && is_oid(oid)).then(|| oid.to_string())
    })
}

/// The value of `refname` as the sandbox sees it: the layer's loose ref, else (unless the
/// layer deleted it) the host's, else the layer's `packed-refs`, else the host's.
fn sandbox_ref(host_git: &Path, upper_git: &Path, refname: &str) -> Option<String> {
    let loose = |dir: &Path| read_small(&dir.join(refname), 256);
    let oid_of = |b: Vec<u8>| {
        let t = String::from_utf8(b).ok()?;
        let t = t.trim();
        is_oid(t).then(|| t.to_string())
    };
    match loose(upper_git) {
        InLayer::File(b) => return oid_of(b),
        InLayer::Deleted => {}
        InLayer::Untouched => {
            if let InLayer::File(b) = loose(host_git) {
                return oid_of(b);
            }
        }
    }
    let packed = |dir: &Path| read_small(&dir.join("packed-refs"), 64 << 20);
    match packed(upper_git) {
        InLayer::File(b) => in_packed_refs(&b, refname),
        InLayer::Deleted => None,
        InLayer::Untouched => match packed(host_git) {
            InLayer::File(b) => in_packed_refs(&b, refname),
            _ => None,
        },
    }
}

/// Copies the layer's objects (loose objects and pack files; regular files only) into
/// `dest`, at most [`MAX_OBJECT_BYTES`].
fn copy_objects(from: &Path, dest: &Path) -> Result<(), String> {
    let mut total = 0u64;
    let mut copy = |src: &Path, dst: &Path| -> Result<(), String> {
        let m = std::fs::symlink_metadata(src).map_err(|e| e.to_string())?;
        if !m.is_file() {
            return Ok(());
        }
        total += m.len();
        if total > MAX_OBJECT_BYTES {
            return Err(format!(
                "the step's git objects exceed {} MiB",
                MAX_OBJECT_BYTES >> 20
            ));
        }
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::copy(src, dst).map_err(|e| format!("{}: {e}", src.display()))?;
        Ok(())
    };
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir {
            continue;
        }
        if name.len() == 2 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            for o in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                let f = o.file_name();
                let Some(f) = f.to_str() else { continue };
                if f.len() == 38 && f.bytes().all(|b| b.is_ascii_hexdigit()) {
                    // git trusts a loose object's name on read: one named after a host
                    // commit, with other content, would be read in its place (and described
                    // in the review), while the host keeps its own. Only objects whose
                    // content hashes to their name are copied.
                    if objects::loose_object_named_right(&o.path(), &format!("{name}{f}")) {
                        copy(&o.path(), &dest.join(name).join(f))?;
                    }
                }
            }
        } else if name == "pack" {
            for o in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                let f = o.file_name();
                let Some(f) = f.to_str() else { continue };
                // Only the pack: its index, which names the objects, is made anew from the
                // pack's content by `git index-pack` (see `index_packs`), never the step's.
                let ok = f.starts_with("pack-")
                    && f.ends_with(".pack")
                    && f.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b));
                if ok {
                    copy(&o.path(), &dest.join("pack").join(f))?;
                }
            }
        }
    }
    Ok(())
}

/// A layer path that holds nothing (for reading the host's own refs with [`sandbox_ref`]).
fn scratch_none() -> PathBuf {
    PathBuf::from("/nonexistent/smithers-git-no-layer")
}

/// A git worktree's directories (`<project>/.git` is a file `gitdir: <dir>`): its own git
/// directory (HEAD, index) and the repository's common directory (objects, refs), which the
/// worktree's `commondir` file names. `None` for anything else, or a layout that is not the
/// one `git worktree add` makes (the git directory inside the common one).
pub fn worktree_dirs(project: &Path) -> Option<(PathBuf, PathBuf)> {
    let InLayer::File(bytes) = read_small(&project.join(".git"), 4096) else {
        return None;
    };
    let text = std::str::from_utf8(&bytes).ok()?;
    let dir = text.trim().strip_prefix("gitdir: ")?;
    let gitdir = std::fs::canonicalize(project.join(dir)).ok()?;
    let InLayer::File(common) = read_small(&gitdir.join("commondir"), 4096) else {
        return None;
    };
    let common = std::str::from_utf8(&common).ok()?.trim().to_string();
    let common = std::fs::canonicalize(gitdir.join(common)).ok()?;
    let is_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    (is_dir(&gitdir)
        && is_dir(&common.join("objects"))
        && gitdir.starts_with(&common)
        && gitdir != common
        && !common.starts_with(project))
    .then_some((gitdir, common))
}

/// The plain repository a project directory lies below (the nearest ancestor whose `.git` is
/// a real directory), and the project's path from its top; `None` when the project has a
/// `.git` of its own, lies in no repository or below a worktree, or in a directory the
/// repository ignores.
pub fn enclosing_repository(project: &Path) -> Option<(PathBuf, String)> {
    if std::fs::symlink_metadata(project.join(".git")).is_ok() {
        return None;
    }
    let top = project
        .ancestors()
        .skip(1)
        .find(|a| std::fs::symlink_metadata(a.join(".git")).is_ok())?;
    std::fs::symlink_metadata(top.join(".git"))
        .is_ok_and(|m| m.is_dir())
        .then_some(())?;
    let rel = project.strip_prefix(top).ok()?.to_str()?.to_string();
    // A project inside a directory the repository ignores (a build tree's `target/`, a home
    // directory under a dotfiles repository ignoring `*`) is not part of it.
    // (check-ignore refuses literal pathspecs: `rel` is a plain path of ours, from the
    // project's own location, checked without them.)
    let ignored = in_project(
        top,
        &["check-ignore", "-q", "--no-index", "--", &format!("{rel}/")],
    )
    .env_remove("GIT_LITERAL_PATHSPECS")
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .status()
    .is_ok_and(|s| s.success());
    (!ignored).then(|| (top.to_path_buf(), rel))
}

/// Prepares the index a step below its repository's top sees ([`enclosing_repository`]):
/// the host's index, copied into the layer over `.git` (`git_upper`), with every entry
/// outside the project marked skip-worktree, so that the step's git does not take the files
/// it cannot see for deleted ones (`git add -A`, `commit -a` leave them as they are). The
/// host's index is not written.
pub fn prepare_subdir_index(top: &Path, rel: &str, git_upper: &Path) -> Result<(), String> {
    let host_index = top.join(".git/index");
    let InLayer::File(bytes) = read_small(&host_index, 256 << 20) else {
        return Ok(()); // no index yet: nothing is tracked
    };
    let index = git_upper.join("index");
    std::fs::write(&index, bytes).map_err(|e| format!("{}: {e}", index.display()))?;
    let with_index = |args: &[&str]| {
        let mut c = git();
        c.env("GIT_DIR", top.join(".git"))
            .env("GIT_INDEX_FILE", &index)
            .args(args);
        c
    };
    let listed = run(
        with_index(&["ls-files", "-z"]),
        "the index's files",
        512 << 20,
    )?;
    let lead = format!("{rel}/");
    let mut outside = Vec::new();
    for path in listed.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        if !path.starts_with(lead.as_bytes()) {
            outside.extend_from_slice(path);
            outside.push(0);
        }
    }
    if outside.is_empty() {
        return Ok(());
    }
    run_with_input(
        with_index(&["update-index", "-z", "--skip-worktree", "--stdin"]),
        outside,
        "marking the files outside the project",
    )
}

/// Where a repository's files are on the host and in the step's layers: the git directory
/// (HEAD) and the common directory (objects, refs), each with the layer that holds what the
/// step wrote over it. A plain repository has both at `<project>/.git`, in the workspace
/// layer's `.git`; a worktree has its git directory inside the common one, which the sandbox
/// sees through a layer of its own.
#[derive(Debug, Clone)]
pub struct GitLayers {
    pub host_gitdir: PathBuf,
    pub host_common: PathBuf,
    pub upper_gitdir: PathBuf,
    pub upper_common: PathBuf,
    /// For a project below its repository's top: its path from the top. The step's
    /// commits must change nothing outside it.
    pub within: Option<String>,
}

impl GitLayers {
    /// A plain repository at `<project>/.git` whose step wrote into `<upper>/.git`.
    pub fn plain(project: &Path, upper: &Path) -> GitLayers {
        GitLayers {
            host_gitdir: project.join(".git"),
            host_common: project.join(".git"),
            upper_gitdir: upper.join(".git"),
            upper_common: upper.join(".git"),
            within: None,
        }
    }

    /// A project below its repository's top ([`enclosing_repository`]) whose step saw the
    /// top's `.git` through the layer `git_upper`.
    pub fn enclosing(project: &Path, git_upper: &Path) -> Option<GitLayers> {
        let (top, rel) = enclosing_repository(project)?;
        Some(GitLayers {
            host_gitdir: top.join(".git"),
            host_common: top.join(".git"),
            upper_gitdir: git_upper.to_path_buf(),
            upper_common: git_upper.to_path_buf(),
            within: Some(rel),
        })
    }

    /// A worktree of `project` ([`worktree_dirs`]) whose common directory the step saw
    /// through the layer `common_upper`.
    pub fn worktree(project: &Path, common_upper: &Path) -> Option<GitLayers> {
        let (gitdir, common) = worktree_dirs(project)?;
        let rel = gitdir.strip_prefix(&common).ok()?.to_path_buf();
        Some(GitLayers {
            upper_gitdir: common_upper.join(&rel),
            host_gitdir: gitdir,
            host_common: common,
            upper_common: common_upper.to_path_buf(),
            within: None,
        })
    }
}

/// Reads the commits the step made. `project` is the host's project (its `.git` a real
/// directory), `upper` the step's workspace layer (overlay upper: `upper/.git` holds what the
/// step's git wrote). Nothing is written to the host's repository.
pub fn collect(
    project: &Path,
    upper: &Path,
    flag: &dyn Fn(&str) -> bool,
) -> Result<Collected, String> {
    let real_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    if !real_dir(&project.join(".git")) {
        return Ok(Collected::Nothing);
    }
    collect_from(&GitLayers::plain(project, upper), flag)
}

/// [`collect`] for any [`GitLayers`] (a worktree's too).
/// `flag` says which files a commit changes must be listed even past the per-commit cap
/// (the files the host runs by itself: the review marks them).
pub fn collect_from(layers: &GitLayers, flag: &dyn Fn(&str) -> bool) -> Result<Collected, String> {
    let (branch, base, tip) = match series_ends(layers) {
        ControlFlow::Continue(ends) => ends,
        ControlFlow::Break(answer) => return Ok(answer),
    };
    let (host_common, upper_common) = (&layers.host_common, &layers.upper_common);
    let scratch = tempfile::Builder::new()
        .prefix("smithers-git-")
        .tempdir()
        .map_err(|e| format!("a scratch directory: {e}"))?;
    let repo = scratch.path().join("repo.git");
    let mut init = git();
    init.args(["init", "--bare", "-q"]).arg(&repo);
    run(init, "git init", 1 << 20)?;
    if let Err(e) = copy_objects(&upper_common.join("objects"), &repo.join("objects")) {
        return Ok(Collected::LeftOut(e));
    }
    if let Err(e) = objects::index_packs(&repo, |args| {
        let mut c = git();
        c.env("GIT_DIR", &repo).args(args);
        bound_memory(&mut c);
        c
    }) {
        return Ok(Collected::LeftOut(e));
    }
    let host_objects = std::fs::canonicalize(host_common.join("objects"))
        .map_err(|e| format!("the project's git objects: {e}"))?;
    let in_repo = |args: &[&str]| {
        let mut c = git();
        c.env("GIT_DIR", &repo)
            .env("GIT_ALTERNATE_OBJECT_DIRECTORIES", &host_objects)
            .args(args);
        bound_memory(&mut c);
        c
    };
    let ancestor = in_repo(&["merge-base", "--is-ancestor", &base, &tip])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("git merge-base: {e}"))?;
    if !ancestor.success() {
        return Ok(Collected::LeftOut(format!(
            "the step's HEAD ({}) does not build on the host's ({}): a rewritten or reset history is not applied",
            &tip[..12],
            &base[..12]
        )));
    }
    let exclude = format!("^{base}");
    let oids = match series_oids(&in_repo, &tip, &exclude)? {
        ControlFlow::Continue(oids) => oids,
        ControlFlow::Break(answer) => return Ok(answer),
    };
    let mut commits = Vec::with_capacity(oids.len());
    for oid in &oids {
        commits.push(commit_info(&in_repo, oid, flag)?);
    }
    let prefix = layers
        .within
        .as_ref()
        .map_or(String::new(), |rel| format!("{rel}/"));
    let firsts: Vec<(String, Option<String>)> = commits
        .iter()
        .map(|c| (c.oid.clone(), c.parents.first().cloned()))
        .collect();
    if let Err(why) = check_series_paths(in_repo(&[]), &firsts, &prefix) {
        return Ok(Collected::LeftOut(why));
    }
    let changes: Vec<SeriesChange> = raw_changes(in_repo(&[]), &base, &tip)?
        .into_iter()
        .filter_map(|c| c.within(prefix.as_bytes()))
        .collect();
    let bundle = match series_bundle(&in_repo, scratch.path(), &tip, &exclude)? {
        ControlFlow::Continue(bundle) => bundle,
        ControlFlow::Break(answer) => return Ok(answer),
    };
    Ok(Collected::Series {
        series: CommitSeries {
            branch: branch.map(|b| b.trim_start_matches("refs/heads/").to_string()),
            base: base.clone(),
            tip: tip.clone(),
            commits,
            tip_differs: Vec::new(),
        },
        bundle,
        changes,
        repo: Box::new(SeriesRepo {
            _scratch: scratch,
            repo,
            host_objects,
            base,
            tip,
            prefix,
        }),
    })
}

/// The ends of the step's series: the branch the step's HEAD names (None: detached), the
/// host's HEAD commit (the base) and the step's (the tip). `Break`: the answer when there is
/// no series to read (nothing, or left out and why).
fn series_ends(layers: &GitLayers) -> ControlFlow<Collected, (Option<String>, String, String)> {
    let real_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    let (host_git, upper_git) = (&layers.host_gitdir, &layers.upper_gitdir);
    let (host_common, upper_common) = (&layers.host_common, &layers.upper_common);
    if !real_dir(host_git) || !real_dir(upper_common) {
        return ControlFlow::Break(Collected::Nothing);
    }
    let head_bytes = match read_small(&upper_git.join("HEAD"), 4096) {
        InLayer::File(b) => b,
        _ => match read_small(&host_git.join("HEAD"), 4096) {
            InLayer::File(b) => b,
            _ => return ControlFlow::Break(Collected::Nothing),
        },
    };
    let host_head = match read_small(&host_git.join("HEAD"), 4096) {
        InLayer::File(b) => parse_head(&b),
        _ => None,
    };
    let base = match &host_head {
        // The host's own value: a layer that holds nothing.
        Some(Head::Branch(r)) => sandbox_ref(host_common, &scratch_none(), r),
        Some(Head::Detached(o)) => Some(o.clone()),
        None => None,
    };
    let Some(base) = base else {
        // An unborn branch (no commit yet): nothing to build on.
        return ControlFlow::Break(Collected::Nothing);
    };
    let (branch, tip) = match parse_head(&head_bytes) {
        Some(Head::Branch(r)) => match sandbox_ref(host_common, upper_common, &r) {
            Some(tip) => (Some(r), tip),
            None => return ControlFlow::Break(Collected::Nothing),
        },
        Some(Head::Detached(o)) => (None, o),
        None => {
            return ControlFlow::Break(Collected::LeftOut(
                "the step left HEAD naming something other than a plain branch or commit".into(),
            ))
        }
    };
    if tip == base {
        return ControlFlow::Break(Collected::Nothing);
    }
    ControlFlow::Continue((branch, base, tip))
}

/// The step's commits after the base (`exclude`: `^base`) up to `tip`, oldest first. `Err`: the
/// `Break`: the answer when there is none, or too many.
fn series_oids(
    in_repo: &dyn Fn(&[&str]) -> Command,
    tip: &str,
    exclude: &str,
) -> Result<ControlFlow<Collected, Vec<String>>, String> {
    let listed = run(
        in_repo(&[
            "rev-list",
            "--reverse",
            "--topo-order",
            &format!("--max-count={}", MAX_COMMITS + 1),
            tip,
            exclude,
        ]),
        "git rev-list",
        1 << 20,
    )?;
    let oids: Vec<String> = String::from_utf8_lossy(&listed)
        .lines()
        .filter(|l| is_oid(l))
        .map(str::to_string)
        .collect();
    if oids.is_empty() {
        return Ok(ControlFlow::Break(Collected::Nothing));
    }
    if oids.len() > MAX_COMMITS {
        return Ok(ControlFlow::Break(Collected::LeftOut(format!(
            "the step made more than {MAX_COMMITS} commits"
        ))));
    }
    Ok(ControlFlow::Continue(oids))
}

/// The series' objects, as a git bundle whose prerequisite is the base (written in `scratch`,
/// read back). `Break`: the answer when it is over [`MAX_GIT_BUNDLE_BYTES`].
fn series_bundle(
    in_repo: &dyn Fn(&[&str]) -> Command,
    scratch: &Path,
    tip: &str,
    exclude: &str,
) -> Result<ControlFlow<Collected, Vec<u8>>, String> {
    run(
        in_repo(&["update-ref", "refs/heads/series", tip]),
        "git update-ref",
        1 << 10,
    )?;
    let bundle_file = scratch.join("commits.bundle");
    let bundle_path = bundle_file.to_string_lossy().into_owned();
    run(
        in_repo(&[
            "bundle",
            "create",
            "-q",
            &bundle_path,
            "refs/heads/series",
            exclude,
        ]),
        "git bundle create",
        1 << 20,
    )?;
    let size = std::fs::metadata(&bundle_file).map_or(0, |m| m.len());
    if size > MAX_GIT_BUNDLE_BYTES {
        return Ok(ControlFlow::Break(Collected::LeftOut(format!(
            "the step's commits take {} MiB as a git bundle, over {} MiB",
            size >> 20,
            MAX_GIT_BUNDLE_BYTES >> 20
        ))));
    }
    let bundle = std::fs::read(&bundle_file).map_err(|e| format!("the git bundle: {e}"))?;
    Ok(ControlFlow::Continue(bundle))
}

/// The scratch repository [`collect_from`] read a series in (removed when dropped).
#[derive(Debug)]
pub struct SeriesRepo {
    _scratch: tempfile::TempDir,
    repo: PathBuf,
    host_objects: PathBuf,
    base: String,
    tip: String,
    /// The project's place in its repository (`dir/`, or empty).
    prefix: String,
}

impl SeriesRepo {
    /// The diff from the series' base to its tip of `paths` (from the project): what HEAD
    /// and the index get of those files, for the review ([`SERIES_PATCH_FILE`]).
    pub fn tip_diff(&self, paths: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        let mut c = git();
        c.env("GIT_DIR", &self.repo)
            .env("GIT_ALTERNATE_OBJECT_DIRECTORIES", &self.host_objects);
        bound_memory(&mut c);
        tip_diff_with(c, &self.base, &self.tip, &self.prefix, paths)
    }
}

/// Where a bundle keeps [`SeriesRepo::tip_diff`]'s output.
pub use smithers_bundle::SERIES_PATCH_FILE;

/// At most this many bytes of [`SeriesRepo::tip_diff`]: a larger one leaves the series out.
pub use smithers_bundle::MAX_SERIES_PATCH_BYTES;

/// `diff-tree -p` from `base` to `tip` of `paths` (from the project at `prefix`), with the
/// paths made relative to the project, through `cmd` (a host git in a repository that has
/// both commits).
fn tip_diff_with(
    mut cmd: Command,
    base: &str,
    tip: &str,
    prefix: &str,
    paths: &[Vec<u8>],
) -> Result<Vec<u8>, String> {
    cmd.args([
        "diff-tree",
        "-p",
        "-r",
        "--binary",
        "--full-index",
        "--no-renames",
        "--no-ext-diff",
        "--no-textconv",
        "--no-color",
    ]);
    if !prefix.is_empty() {
        cmd.arg(format!("--relative={prefix}"));
    }
    cmd.args([base, tip, "--"]);
    for p in paths {
        let mut full = prefix.as_bytes().to_vec();
        full.extend_from_slice(p);
        cmd.arg(std::ffi::OsStr::from_bytes(&full));
    }
    run(cmd, "the commits' diff", MAX_SERIES_PATCH_BYTES)
}

/// [`SeriesRepo::tip_diff`] on the host's repository after [`fetch`], to check at accept
/// that the bundle's [`SERIES_PATCH_FILE`] (what the review showed) is what the branch gets.
pub fn tip_diff_in_project(
    project: &Path,
    series: &CommitSeries,
    paths: &[Vec<u8>],
) -> Result<Vec<u8>, String> {
    let prefix = project_prefix(project)?;
    // From the repository's top, as collect's scratch repository sees the paths: a git
    // started in a subdirectory would read the pathspecs relative to it.
    tip_diff_with(
        in_project(&toplevel(project)?, &[]),
        &series.base,
        &series.tip,
        &prefix,
        paths,
    )
}

/// One commit's metadata and changed files.
fn commit_info(
    in_repo: &dyn Fn(&[&str]) -> Command,
    oid: &str,
    flag: &dyn Fn(&str) -> bool,
) -> Result<CommitInfo, String> {
    let raw = run(
        in_repo(&[
            "show",
            "-s",
            "--no-show-signature",
            "--format=%H%x00%P%x00%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%B",
            oid,
        ]),
        "git show",
        1 << 20,
    )?;
    let text = String::from_utf8_lossy(&raw);
    let mut f = text.splitn(8, '\0');
    let mut next = || f.next().unwrap_or("").to_string();
    let (h, parents, an, ae, ad, cn, ce, message) = (
        next(),
        next(),
        next(),
        next(),
        next(),
        next(),
        next(),
        next(),
    );
    if h != oid {
        return Err(format!("git show {oid}: an unexpected answer"));
    }
    let message = message.trim_end();
    let (subject, body) = match message.split_once('\n') {
        Some((s, b)) => (s.to_string(), b.trim_start_matches('\n').to_string()),
        None => (message.to_string(), String::new()),
    };
    let cut = |s: String, max: usize| {
        if s.len() <= max {
            return s;
        }
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}\n[message cut at {max} bytes]", &s[..end])
    };
    let parents: Vec<String> = parents
        .split_whitespace()
        .filter(|p| is_oid(p))
        .map(str::to_string)
        .collect();
    let mut args = vec![
        "diff-tree",
        "-r",
        "-z",
        "--no-renames",
        "--no-ext-diff",
        "--numstat",
    ];
    let first_parent = parents.first().cloned();
    match &first_parent {
        Some(p) => args.push(p),
        None => args.push("--root"),
    }
    args.push(oid);
    let stats = run(in_repo(&args), "git diff-tree", 64 << 20)?;
    let mut files = Vec::new();
    let mut unlisted = 0u64;
    // -z numstat: "added\tremoved\tpath\0" ("-\t-\t" for a binary file).
    for rec in stats.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        let rec = String::from_utf8_lossy(rec);
        let mut parts = rec.splitn(3, '\t');
        let (a, r, path) = (parts.next(), parts.next(), parts.next());
        let (Some(a), Some(r), Some(path)) = (a, r, path) else {
            continue;
        };
        // Past the cap a file is still listed when the review must mark it.
        if files.len() >= MAX_FILES_LISTED && !flag(path) {
            unlisted += 1;
            continue;
        }
        files.push(CommitFile {
            path: path.to_string(),
            added: a.parse().ok(),
            removed: r.parse().ok(),
        });
    }
    Ok(CommitInfo {
        oid: h,
        parents,
        author: cut(an, 256),
        author_email: cut(ae, 256),
        author_date: cut(ad, 64),
        committer: cut(cn, 256),
        committer_email: cut(ce, 256),
        subject: cut(subject, 1024),
        body: cut(body, MAX_BODY_BYTES),
        files,
        files_unlisted: unlisted,
    })
}

/// A host `git` in the project.
fn in_project(project: &Path, args: &[&str]) -> Command {
    let mut c = git();
    c.arg("-C").arg(project).args(args);
    c
}

/// The host's HEAD: (its branch ref, or `None` when detached; its commit).
fn host_head(project: &Path) -> Result<(Option<String>, String), String> {
    let oid = run(
        in_project(project, &["rev-parse", "--verify", "-q", "HEAD^{commit}"]),
        "the host's HEAD",
        1 << 10,
    )?;
    let oid = String::from_utf8_lossy(&oid).trim().to_string();
    let branch = in_project(project, &["symbolic-ref", "-q", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    Ok((branch, oid))
}

/// Refuses a series that no longer fits the host: its HEAD moved since the step started, or
/// is on another branch than the step's. Writes nothing.
pub fn check(project: &Path, series: &CommitSeries) -> Result<(), String> {
    let (branch, oid) = host_head(project)?;
    if oid != series.base {
        return Err(format!(
            "the host's HEAD moved since the step started (it was {}, it is {}): the step's {} commit(s) would not apply on top of it",
            short(&series.base),
            short(&oid),
            series.commits.len()
        ));
    }
    let want = series.branch.as_ref().map(|b| format!("refs/heads/{b}"));
    if branch != want {
        let hint = match &series.branch {
            Some(b) => format!(
                "; `accept --branch {b}` puts them on a new branch {b} without touching the working tree, or check out {b} and accept again"
            ),
            None => "; `accept --branch NAME` puts them on a new branch without touching the working tree".into(),
        };
        return Err(format!(
            "the host is on {} but the step committed on {}{hint}",
            branch.as_deref().unwrap_or("a detached HEAD"),
            want.as_deref().unwrap_or("a detached HEAD")
        ));
    }
    Ok(())
}

fn short(oid: &str) -> &str {
    &oid[..oid.len().min(12)]
}

/// Adds the objects of the git bundle at `bundle_file` to the host's repository, each
/// checked by git (`transfer.fsckObjects`: malformed objects, `.git` or `..` in trees), and
/// verifies the series' tip is then there. Moves no ref.
pub fn fetch(project: &Path, series: &CommitSeries, bundle_file: &Path) -> Result<(), String> {
    let bundle = bundle_file.to_string_lossy().into_owned();
    run(
        in_project(
            project,
            &[
                "-c",
                "transfer.fsckObjects=true",
                "-c",
                "fetch.fsckObjects=true",
                "fetch",
                "-q",
                "--no-tags",
                "--no-write-fetch-head",
                "--no-auto-gc",
                &bundle,
                "refs/heads/series",
            ],
        ),
        "adding the step's commits",
        1 << 20,
    )?;
    let tip = format!("{}^{{commit}}", series.tip);
    run(
        in_project(project, &["cat-file", "-e", &tip]),
        "the step's last commit",
        1 << 10,
    )?;
    Ok(())
}

/// The series' commits as the host's repository has them after [`fetch`] (each with its
/// first parent), not as the bundle lists them: what is checked is what the branch gets.
fn host_series(
    project: &Path,
    series: &CommitSeries,
) -> Result<Vec<(String, Option<String>)>, String> {
    let exclude = format!("^{}", series.base);
    let listed = run(
        in_project(
            project,
            &[
                "rev-list",
                "--parents",
                &format!("--max-count={}", MAX_COMMITS + 1),
                &series.tip,
                &exclude,
            ],
        ),
        "the step's commits",
        1 << 20,
    )?;
    let text = String::from_utf8_lossy(&listed);
    let commits: Vec<(String, Option<String>)> = text
        .lines()
        .filter_map(|l| {
            let mut ids = l.split(' ').filter(|s| is_oid(s));
            Some((ids.next()?.to_string(), ids.next().map(str::to_string)))
        })
        .collect();
    if commits.len() > MAX_COMMITS {
        return Err(format!("the step made more than {MAX_COMMITS} commits"));
    }
    Ok(commits)
}

/// The project's place in its repository, as `git rev-parse --show-prefix` says it (`dir/`,
/// or empty at the top).
fn project_prefix(project: &Path) -> Result<String, String> {
    let prefix = run(
        in_project(project, &["rev-parse", "--show-prefix"]),
        "the project's place in the repository",
        4096,
    )?;
    Ok(String::from_utf8_lossy(&prefix).trim().to_string())
}

/// Refuses, after [`fetch`], a series that would write what the review did not show: a
/// commit that changes a refused path ([`refused_path`], or outside the project), or a file
/// the series leaves otherwise than the reviewed patches do ([`compare_with_review`]).
/// `reviewed` are the files the reviewed patches change, paths from the project.
/// `tip_differs` are the files (from the project) the review showed from the tip's diff
/// (`CommitSeries::tip_differs`), and `shown_tip_diff` that diff as the review showed it
/// (the bundle's [`SERIES_PATCH_FILE`], digest-checked): the host's own diff of those files
/// must be byte for byte the same.
pub fn verify_against_review(
    project: &Path,
    series: &CommitSeries,
    reviewed: &[ReviewedFile],
    tip_differs: &[Vec<u8>],
    shown_tip_diff: Option<&[u8]>,
) -> Result<(), String> {
    let changes = verified_changes(project, series)?;
    compare_allowing(&changes, reviewed, tip_differs)?;
    if tip_differs.is_empty() {
        return Ok(());
    }
    let shown = shown_tip_diff
        .ok_or_else(|| format!("the bundle has no {SERIES_PATCH_FILE} for the files the commits leave otherwise than the patches"))?;
    let real = tip_diff_in_project(project, series, tip_differs)?;
    if real != shown {
        return Err(format!(
            "what the commits leave of {} file(s) is not the diff the review showed ({SERIES_PATCH_FILE})",
            tip_differs.len()
        ));
    }
    Ok(())
}

/// The series' changes from its base to its tip, paths from the project, as the host's
/// repository has them after [`fetch`], refused unless the series is there exactly what the
/// review listed: its base an ancestor of its tip, the same commits (the review's metadata
/// was read from objects whose names were checked, and the host's are the real ones), and
/// no commit changing a refused path.
fn verified_changes(project: &Path, series: &CommitSeries) -> Result<Vec<SeriesChange>, String> {
    let ancestor = in_project(
        project,
        &["merge-base", "--is-ancestor", &series.base, &series.tip],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .status()
    .map_err(|e| format!("git merge-base: {e}"))?;
    if !ancestor.success() {
        return Err(format!(
            "the step's last commit {} does not build on the reviewed base {}",
            short(&series.tip),
            short(&series.base)
        ));
    }
    let host = host_series(project, series)?;
    let listed: std::collections::BTreeSet<&str> =
        series.commits.iter().map(|c| c.oid.as_str()).collect();
    let found: std::collections::BTreeSet<&str> = host.iter().map(|(o, _)| o.as_str()).collect();
    if listed != found || host.len() != series.commits.len() {
        let unlisted: Vec<&str> = found.difference(&listed).map(|o| short(o)).collect();
        return Err(format!(
            "the branch would get {} commit(s), the review listed {} (not listed: {})",
            host.len(),
            series.commits.len(),
            if unlisted.is_empty() {
                "none".to_string()
            } else {
                unlisted.join(", ")
            }
        ));
    }
    let prefix = project_prefix(project)?;
    check_series_paths(in_project(project, &[]), &host, &prefix)?;
    let mut changes = Vec::new();
    for c in series_changes(project, series)? {
        let path = String::from_utf8_lossy(&c.path).into_owned();
        changes.push(
            c.within(prefix.as_bytes())
                .ok_or_else(|| format!("the commits change {path:?}, outside the project"))?,
        );
    }
    Ok(changes)
}

/// Moves the host's branch (or detached HEAD) from the series' base to its tip, refused if
/// it moved meanwhile, then sets the index entries of the files the series changed to the
/// tip's (the working tree already holds them: the patches were applied).
pub fn advance(project: &Path, series: &CommitSeries, reason: &str) -> Result<(), String> {
    let target = match &series.branch {
        Some(b) => format!("refs/heads/{b}"),
        None => "HEAD".to_string(),
    };
    run(
        in_project(
            project,
            &[
                "update-ref",
                "-m",
                reason,
                &target,
                &series.tip,
                &series.base,
            ],
        ),
        "moving the branch",
        1 << 10,
    )?;
    let mut info = Vec::new();
    for c in series_changes(project, series)? {
        match &c.after {
            Some(oid) => info.extend_from_slice(format!("{} {oid}\t", c.new_mode).as_bytes()),
            None => info.extend_from_slice(b"0 0000000000000000000000000000000000000000\t"),
        }
        info.extend_from_slice(&c.path);
        info.push(0);
    }
    // Paths from diff-tree are the top's: update the index from there.
    run_with_input(
        in_project(&toplevel(project)?, &["update-index", "-z", "--index-info"]),
        info,
        "updating the index",
    )
}

/// Stages `files` (paths from the project, a plain repository at its top) as the step did
/// (`changeNotes.staged`), after the reviewed patches were applied. Each file present is
/// hashed as it is in the working tree, never through a link: no component of its path may
/// be a link, a symlink (mode 120000) is hashed as its target's name, a regular file through
/// a descriptor opened with `O_NOFOLLOW` (`hash-object --stdin --no-filters`: no filter of the
/// repository's runs), and the result must be the reviewed blob; a deletion is removed from
/// the index. Written with `update-index --index-info`, as [`advance`] does.
pub fn stage(project: &Path, files: &[ReviewedFile]) -> Result<(), String> {
    let mut info = Vec::new();
    for f in files {
        let path = String::from_utf8_lossy(&f.path).into_owned();
        match &f.state {
            ReviewedState::Present { mode, oid } => {
                let Some(oid) = oid else {
                    return Err(format!(
                        "{path:?}: a mode-only change has no reviewed content to stage"
                    ));
                };
                let got = hash_in_tree(project, &f.path, mode)
                    .map_err(|e| format!("staging {path:?}: {e}"))?;
                if got != *oid {
                    return Err(format!(
                        "{path:?} is not the reviewed content on disk, so it was not staged"
                    ));
                }
                info.extend_from_slice(format!("{mode} {got}\t").as_bytes());
            }
            ReviewedState::Absent => {
                info.extend_from_slice(b"0 0000000000000000000000000000000000000000\t")
            }
        }
        info.extend_from_slice(&f.path);
        info.push(0);
    }
    if info.is_empty() {
        return Ok(());
    }
    run_with_input(
        in_project(project, &["update-index", "-z", "--index-info"]),
        info,
        "staging the step's staged files",
    )
}

/// Writes the blob of the working tree's `rel` (from `project`) into the repository and
/// returns its id, reading nothing through a link: see [`stage`].
fn hash_in_tree(project: &Path, rel: &[u8], mode: &str) -> Result<String, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let rel_path = Path::new(std::ffi::OsStr::from_bytes(rel));
    let mut at = project.to_path_buf();
    let parts: Vec<_> = rel_path.components().collect();
    for (i, c) in parts.iter().enumerate() {
        let Component::Normal(name) = c else {
            return Err("not a plain relative path".into());
        };
        at.push(name);
        let m = std::fs::symlink_metadata(&at).map_err(|e| e.to_string())?;
        if i + 1 < parts.len() && !m.is_dir() {
            return Err(format!("{} is not a directory", at.display()));
        }
    }
    let m = std::fs::symlink_metadata(&at).map_err(|e| e.to_string())?;
    let mut cmd = in_project(project, &["hash-object", "-w", "--stdin", "--no-filters"]);
    let out = match mode {
        "120000" if m.file_type().is_symlink() => {
            let target = std::fs::read_link(&at).map_err(|e| e.to_string())?;
            run_with_output(
                cmd,
                target.as_os_str().as_bytes().to_vec(),
                "hash-object",
                1 << 10,
            )?
        }
        "100644" | "100755" if m.is_file() => {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&at)
                .map_err(|e| e.to_string())?;
            if !file.metadata().map_err(|e| e.to_string())?.is_file() {
                return Err("not a regular file".into());
            }
            cmd.stdin(Stdio::from(file));
            run(cmd, "hash-object", 1 << 10)?
        }
        _ => return Err(format!("not a file of mode {mode} in the working tree")),
    };
    Ok(String::from_utf8_lossy(&out).trim().to_string())
}

/// The top of the repository `project` is in.
fn toplevel(project: &Path) -> Result<PathBuf, String> {
    let top = run(
        in_project(project, &["rev-parse", "--show-toplevel"]),
        "the repository's top",
        4096,
    )?;
    Ok(PathBuf::from(
        String::from_utf8_lossy(&top).trim().to_string(),
    ))
}

/// Puts the series on a new branch `name` of the host's repository instead of the current
/// one (`accept --branch`): the objects added as [`fetch`] does, then `refs/heads/<name>`
/// created at the tip (refused if it exists). The host's HEAD, index and working tree are not
/// touched, so this is refused when the step left changes it did not commit: `files`, what
/// the reviewed working-tree patches change, must be exactly what the series changes from
/// its base (mode and blob), checked on the host's copy of the series ([`verify_against_review`]'s
/// checks, both ways).
pub fn onto_branch(
    project: &Path,
    series: &CommitSeries,
    bundle_file: &Path,
    name: &str,
    files: &[ReviewedFile],
) -> Result<(), String> {
    let checked = run(
        in_project(project, &["check-ref-format", "--branch", name]),
        &format!("branch name {name:?}"),
        1 << 10,
    )?;
    let checked = String::from_utf8_lossy(&checked).trim().to_string();
    if checked != name || name.starts_with('-') {
        return Err(format!("{name:?} is not a plain branch name"));
    }
    let target = format!("refs/heads/{name}");
    let exists = in_project(project, &["rev-parse", "--verify", "-q", &target])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("git rev-parse: {e}"))?;
    if exists.success() {
        return Err(format!(
            "branch {name} exists already: name a new one, or accept without --branch"
        ));
    }
    fetch(project, series, bundle_file)?;
    // The branch gets the tip's tree: it must be exactly the reviewed patches, both ways
    // (a file the patches change that the commits do not would be lost).
    let changes = verified_changes(project, series)?;
    compare_with_review(&changes, files)?;
    let committed: std::collections::BTreeSet<&[u8]> =
        changes.iter().map(|c| c.path.as_slice()).collect();
    let uncommitted: Vec<String> = files
        .iter()
        .filter(|f| !committed.contains(f.path.as_slice()))
        .take(10)
        .map(|f| String::from_utf8_lossy(&f.path).into_owned())
        .collect();
    if !uncommitted.is_empty() {
        return Err(format!(
            "the step left changes it did not commit ({}): --branch would lose them; accept without --branch to apply them to the working tree",
            uncommitted.join(", ")
        ));
    }
    let zero = "0".repeat(series.tip.len());
    run(
        in_project(
            project,
            &[
                "update-ref",
                "-m",
                "smithers-sandbox: accept the step's commits onto a branch",
                &target,
                &series.tip,
                &zero,
            ],
        ),
        "creating the branch",
        1 << 10,
    )?;
    Ok(())
}

/// Where [`COMMITS_BUNDLE_FILE`] is in `bundle`.
pub fn bundle_file(bundle: &Path) -> PathBuf {
    bundle.join(COMMITS_BUNDLE_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_from_a_sandbox_are_plain_branch_names() {
        for ok in [
            "refs/heads/main",
            "refs/heads/feature/x-1",
            "refs/heads/v1.2",
        ] {
            assert!(safe_ref(ok), "{ok}");
        }
        for bad in [
            "refs/heads/../../config",
            "refs/heads/.hidden",
            "refs/heads/x.lock",
            "refs/tags/v1",
            "HEAD",
            "refs/heads/-x",
            "refs/heads/a b",
            "refs/heads/",
        ] {
            assert!(!safe_ref(bad), "{bad}");
        }
    }

    #[test]
    fn head_and_packed_refs_parse() {
        assert!(
            matches!(parse_head(b"ref: refs/heads/main\n"), Some(Head::Branch(b)) if b == "refs/heads/main")
        );
        let oid = "0123456789abcdef0123456789abcdef01234567";
        assert!(matches!(parse_head(oid.as_bytes()), Some(Head::Detached(o)) if o == oid));
        assert!(parse_head(b"ref: ../../etc/passwd").is_none());
        let packed = format!("# pack-refs with: peeled\n{oid} refs/heads/main\n^{oid}\n");
        assert_eq!(
            in_packed_refs(packed.as_bytes(), "refs/heads/main").as_deref(),
            Some(oid)
        );
        assert_eq!(in_packed_refs(packed.as_bytes(), "refs/heads/x"), None);
    }
}
