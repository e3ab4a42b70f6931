//! A fresh temporary project on the host, and snapshots proving a tree untouched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::SuiteEnv;

/// A fresh temporary project on the host, with a few files and the attack binary.
#[derive(Debug)]
pub struct Project {
    _dir: tempfile::TempDir,
    /// The project root (`rootDir`).
    pub root: PathBuf,
    /// A directory beside the project (outside it) for host-side files of the case.
    pub outside: PathBuf,
    /// Where the attack binary appears inside the sandbox.
    pub attack: String,
}

/// Puts the attack binary at `dest` as a hard link to one copy staged per process (a plain
/// copy across file systems). Why not a fresh copy per project: writing an executable while
/// another test thread forks leaves the write descriptor open in that child until it execs,
/// and executing the new file in that window fails with ETXTBSY. The staged copy is written
/// once, before it is ever executed; links never open it for writing.
fn place_attack_bin(bin: &Path, dest: &Path) {
    static STAGED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let staged = STAGED.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("smithers-suite-attack-")
            .tempdir()
            .expect("create a temp dir")
            .keep();
        let staged = dir.join("smithers-attack");
        std::fs::copy(bin, &staged).unwrap_or_else(|e| panic!("stage {}: {e}", bin.display()));
        set_mode(&staged, 0o755);
        staged
    });
    if std::fs::hard_link(staged, dest).is_err() {
        std::fs::copy(staged, dest)
            .unwrap_or_else(|e| panic!("copy {} into the project: {e}", staged.display()));
        set_mode(dest, 0o755);
    }
}

impl Project {
    pub fn new(env: &SuiteEnv) -> Project {
        let dir = tempfile::Builder::new()
            .prefix("smithers-suite-")
            .tempdir()
            .expect("create a temp dir");
        let root = dir.path().join("project");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("src")).expect("mkdir project");
        std::fs::create_dir_all(&outside).expect("mkdir outside");
        std::fs::write(root.join("README.txt"), "hello from the host project\n").expect("write");
        std::fs::write(root.join("src/lib.rs"), "pub fn answer() -> u32 { 42 }\n").expect("write");
        std::fs::write(root.join("src/gone.txt"), "to be deleted\n").expect("write");
        std::fs::write(root.join("data.bin"), [0u8, 1, 2, 255, 0, 7]).expect("write");
        let dest = root.join("smithers-attack");
        place_attack_bin(&env.attack_bin(), &dest);
        Project {
            _dir: dir,
            attack: format!("{}/smithers-attack", env.workspace_dir),
            root,
            outside,
        }
    }

    /// Every file of the host project but the runtime's own `.smithers/` state.
    pub fn snapshot(&self) -> TreeSnapshot {
        TreeSnapshot::of(&self.root, &[".smithers"])
    }

    /// argv running the attack binary with `args` (several attempts joined by `+`).
    pub fn attack_argv(&self, args: &[&str]) -> Vec<String> {
        std::iter::once(self.attack.clone())
            .chain(args.iter().map(|s| s.to_string()))
            .collect()
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Path → (kind, mode, content or link target). Compared with `==` to prove a tree untouched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSnapshot(pub BTreeMap<PathBuf, (char, u32, Vec<u8>)>);

impl TreeSnapshot {
    pub fn of(root: &Path, exclude_top: &[&str]) -> TreeSnapshot {
        use std::os::unix::fs::PermissionsExt;
        let mut map = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.filter_map(Result::ok) {
                let path = entry.path();
                let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
                if dir == root
                    && exclude_top
                        .iter()
                        .any(|x| entry.file_name().to_str() == Some(x))
                {
                    continue;
                }
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    continue;
                };
                let mode = meta.permissions().mode();
                if meta.file_type().is_symlink() {
                    let target = std::fs::read_link(&path).unwrap_or_default();
                    map.insert(
                        rel,
                        ('l', mode, target.as_os_str().as_encoded_bytes().to_vec()),
                    );
                } else if meta.is_dir() {
                    map.insert(rel, ('d', mode, Vec::new()));
                    stack.push(path);
                } else {
                    map.insert(rel, ('f', mode, std::fs::read(&path).unwrap_or_default()));
                }
            }
        }
        TreeSnapshot(map)
    }

    /// Paths added, removed or changed from `self` to `after` (for failure messages).
    pub fn diff(&self, after: &TreeSnapshot) -> Vec<String> {
        let mut out = Vec::new();
        for (path, entry) in &self.0 {
            match after.0.get(path) {
                None => out.push(format!("removed {}", path.display())),
                Some(e) if e != entry => out.push(format!(
                    "changed {} ({}{:o}, {} bytes → {}{:o}, {} bytes)",
                    path.display(),
                    entry.0,
                    entry.1,
                    entry.2.len(),
                    e.0,
                    e.1,
                    e.2.len()
                )),
                Some(_) => {}
            }
        }
        for path in after.0.keys().filter(|p| !self.0.contains_key(*p)) {
            out.push(format!("added {}", path.display()));
        }
        out
    }

    /// Panics with the differences when `after` is not identical.
    pub fn assert_same(&self, after: &TreeSnapshot, what: &str) {
        let diff = self.diff(after);
        assert!(diff.is_empty(), "{what}: {diff:#?}");
    }
}
