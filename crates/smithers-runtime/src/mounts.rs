//! Host paths a caller brings into a sandbox (`volumes`, the CLI's `--mount` and
//! `--toolchain`): what they are, and which must not be brought in without an explicit choice.
//!
//! A mount is the one way a step sees the host beyond its read-only root and its copy-on-write
//! `/workspace`, so it is where a caller can hand a hostile step their keys by mistake: `--mount
//! ~` carries `~/.ssh`, `--mount /run` carries the Docker socket (root on the host). Such a
//! mount is refused unless the caller says `allowSensitiveMounts`; a writable mount of (or
//! over, or under) the project is refused always, because the project is written only by an
//! accepted review. A mount is judged by what it is, where it is and what it holds: `~/.cargo`
//! is refused for the `credentials.toml` inside it ([`holds`]).

use std::path::{Component, Path, PathBuf};

mod holds;

/// The name of the enforcement report's row about mounts ([`crate::mount_row::report_row`]).
pub const HOST_MOUNTS: &str = "host-mounts";

/// Credential stores, as paths relative to a home: a mount that is one or is inside one
/// (wherever it is) is sensitive, and so is one that holds one at a home in it (the mount itself,
/// a directory in it, an account's home under it: [`holds`]).
const SECRET_NAMES: &[(&str, &str)] = &[
    (".ssh", "SSH keys"),
    (".gnupg", "GnuPG keys"),
    (".aws", "AWS credentials"),
    (".azure", "Azure credentials"),
    (".kube/config", "Kubernetes credentials"),
    (".kube", "Kubernetes credentials"),
    (".docker/config.json", "Docker registry logins"),
    (".docker", "Docker credentials"),
    (".netrc", "netrc passwords"),
    (".git-credentials", "git credentials"),
    (".npmrc", "npm tokens"),
    (".pypirc", "PyPI tokens"),
    (".password-store", "a password store"),
    (".vault-token", "a Vault token"),
    (".config/gcloud", "Google Cloud credentials"),
    (".config/gh/hosts.yml", "GitHub CLI tokens"),
    (".config/gh", "GitHub CLI tokens"),
    (".cargo/credentials.toml", "cargo registry tokens"),
    (".cargo/credentials", "cargo registry tokens"),
    (".config/git/credentials", "git credentials"),
    (".config/hub", "GitHub tokens of hub"),
    (".config/containers/auth.json", "container registry logins"),
    (".local/share/keyrings", "the desktop keyring"),
    (
        ".terraform.d/credentials.tfrc.json",
        "Terraform Cloud tokens",
    ),
    (".gem/credentials", "RubyGems API keys"),
    (".m2/settings-security.xml", "Maven's master password"),
    (".pgpass", "PostgreSQL passwords"),
    (".s3cfg", "S3 credentials"),
];

/// Whether `path` has the components of `pattern` (`.config/gh`) one after the other.
fn has_components(path: &Path, pattern: &str) -> bool {
    let want: Vec<&std::ffi::OsStr> = Path::new(pattern).iter().collect();
    let have: Vec<&std::ffi::OsStr> = path.iter().collect();
    have.windows(want.len()).any(|w| w == want.as_slice())
}

/// Host directories a mount may not be, contain, or lie inside: kernel and device trees,
/// daemons' sockets, the host's own configuration and boot files.
const SYSTEM_TREES: &[(&str, &str)] = &[
    ("/proc", "the host's processes and kernel settings"),
    ("/sys", "the host's kernel and devices"),
    ("/dev", "the host's devices"),
    ("/boot", "the host's kernel and boot loader"),
    ("/etc", "the host's configuration (passwords, sudoers)"),
    ("/run", "daemons' sockets (Docker, D-Bus, systemd)"),
    ("/var/run", "daemons' sockets (Docker, D-Bus, systemd)"),
    ("/var/lib/docker", "every container's files"),
];

/// `path` made absolute without touching the file system: `.` and `..` resolved by name.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => out.push(name),
            _ => {}
        }
    }
    out
}

/// Why mounting the host path `host` is sensitive, or `None`. `host` is resolved through its
/// links first (a link named `tools` to `~/.ssh` is `~/.ssh`); `home` is the caller's home.
/// A socket or a device node is sensitive wherever it is (a daemon's socket is its whole API).
/// A directory is also looked into, a bounded number of `lstat`s: it may not hold a credential
/// store or a user's home (`/etc/passwd`'s, `/home`'s) at any place a home is known to be.
pub fn sensitive_reason(host: &Path, home: Option<&Path>) -> Option<String> {
    judge(host, &holds::KnownHomes::of_host(home), holds::LIMITS)
}

/// [`sensitive_reason`] against the given homes, so the rule is tried on homes made for it.
fn judge(host: &Path, homes: &holds::KnownHomes, limits: holds::Limits) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    let resolved = std::fs::canonicalize(host).unwrap_or_else(|_| lexical(host));
    let shown = resolved.display();
    if let Ok(meta) = std::fs::metadata(&resolved) {
        let t = meta.file_type();
        if t.is_socket() {
            return Some(format!("{shown} is a socket (a daemon's whole API)"));
        }
        if t.is_block_device() || t.is_char_device() {
            return Some(format!("{shown} is a device"));
        }
    }
    if resolved == Path::new("/") {
        return Some("/ is the whole host".into());
    }
    for (tree, what) in SYSTEM_TREES {
        let tree = Path::new(tree);
        if resolved.starts_with(tree) || tree.starts_with(&resolved) {
            return Some(format!("{shown} overlaps {} ({what})", tree.display()));
        }
    }
    if let Some(home) = homes.own.as_deref() {
        if home.starts_with(&resolved) {
            return Some(format!(
                "{shown} holds the home directory {} (its keys and credentials)",
                home.display()
            ));
        }
    }
    for (name, what) in SECRET_NAMES {
        if has_components(&resolved, name) {
            return Some(format!("{shown} is or is inside a {name} ({what})"));
        }
    }
    holds::holds_reason(&resolved, homes, limits).map(|why| format!("{shown} {why}"))
}

/// Why a writable mount of `host` would let the step write the project (`root`) behind the
/// review's back, or `None`. The project is written only by an accepted review, so this is
/// refused whatever the caller allows; a read-only mount of the project is harmless.
pub fn project_overlap(host: &Path, root: &Path) -> Option<String> {
    let resolved = std::fs::canonicalize(host).unwrap_or_else(|_| lexical(host));
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| lexical(root));
    (resolved.starts_with(&root) || root.starts_with(&resolved)).then(|| {
        format!(
            "a writable mount of {} overlaps the project {}: the project is written only by an accepted review (mount it read-only, or let the step change /workspace)",
            resolved.display(),
            root.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_system_trees_and_homes_are_sensitive() {
        let home = Path::new("/home/u");
        for p in [
            "/",
            "/home",
            "/home/u",
            "/home/u/.ssh",
            "/home/u/.ssh/id_ed25519",
            "/home/other/.aws",
            "/home/u/.config/gcloud",
            "/home/u/.cargo/credentials.toml",
            "/etc",
            "/etc/shadow",
            "/run",
            "/var/run/docker.sock",
            "/proc/1/root",
            "/dev/sda",
            "/home/u/x/../.ssh",
        ] {
            assert!(
                sensitive_reason(Path::new(p), Some(home)).is_some(),
                "{p} should be sensitive"
            );
        }
        for p in [
            "/home/u/.rustup",
            "/root/.rustup",
            "/home/u/.cargo/bin",
            "/home/u/.nvm",
            "/opt/toolchain",
            "/home/u/src/gh/tools",
            "/home/u/credentials",
            "/usr/local/go",
        ] {
            assert_eq!(sensitive_reason(Path::new(p), Some(home)), None, "{p}");
        }
    }

    #[test]
    fn a_link_is_judged_by_what_it_points_at() {
        let dir = tempfile::tempdir().unwrap();
        let ssh = dir.path().join(".ssh");
        std::fs::create_dir(&ssh).unwrap();
        let link = dir.path().join("tools");
        std::os::unix::fs::symlink(&ssh, &link).unwrap();
        assert!(sensitive_reason(&link, None).is_some());
    }

    /// `rel` under `dir`, its parents made; `rel` ending in `/` is a directory, else a file.
    fn make(dir: &Path, rel: &str) -> PathBuf {
        let path = dir.join(rel.trim_end_matches('/'));
        if rel.ends_with('/') {
            std::fs::create_dir_all(&path).unwrap();
        } else {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, "secret").unwrap();
        }
        path
    }

    /// A temporary directory, resolved (the rule compares resolved paths).
    fn scratch() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(dir.path()).unwrap();
        (dir, path)
    }

    fn judged(path: &Path, homes: &holds::KnownHomes) -> Option<String> {
        judge(path, homes, holds::LIMITS)
    }

    #[test]
    fn a_directory_holding_a_credential_store_is_refused_naming_it() {
        let (_dir, t) = scratch();
        let none = holds::KnownHomes::default();
        let cases = [
            (
                ".cargo/credentials.toml",
                ".cargo",
                ".cargo/credentials.toml",
            ),
            (".config/gh/hosts.yml", ".config", ".config/gh/hosts.yml"),
            (".config/gh/config.yml", ".config", ".config/gh"),
            (".ssh/id_ed25519", "", ".ssh"),
            (".docker/config.json", ".docker/..", ".docker/config.json"),
            (
                ".local/share/keyrings/login.keyring",
                ".local",
                ".local/share/keyrings",
            ),
            (
                ".local/share/keyrings/login.keyring",
                ".local/share",
                ".local/share/keyrings",
            ),
            (".npmrc", "", ".npmrc"),
            (
                ".terraform.d/credentials.tfrc.json",
                ".terraform.d",
                ".terraform.d/credentials.tfrc.json",
            ),
        ];
        for (i, (store, mount, named)) in cases.into_iter().enumerate() {
            let home = t.join(format!("home-{i}"));
            make(&home, store);
            let why =
                judged(&home.join(mount), &none).unwrap_or_else(|| panic!("{store} in {mount:?}"));
            let named = home.join(named);
            assert!(
                why.contains(&format!("holds {} (", named.display())),
                "{store} in {mount:?}: {why}"
            );
        }
    }

    #[test]
    fn a_directory_of_homes_and_accounts_homes_at_any_depth_are_looked_into() {
        let (_dir, t) = scratch();
        let none = holds::KnownHomes::default();
        // Homes side by side: each child is looked into.
        make(&t, "homes/alice/notes.txt");
        let key = make(&t, "homes/bob/.ssh/id_ed25519");
        let why = judged(&t.join("homes"), &none).unwrap();
        assert!(
            why.contains(&key.parent().unwrap().display().to_string()),
            "{why}"
        );
        // Deeper than a child: found only as an account's home, not by walking the tree.
        make(&t, "srv/tenants/acme/carol/.aws/credentials");
        assert_eq!(judged(&t.join("srv"), &none), None);
        let homes = holds::KnownHomes {
            accounts: vec![t.join("srv/tenants/acme/carol")],
            ..Default::default()
        };
        let why = judged(&t.join("srv"), &homes).unwrap();
        assert!(why.contains("srv/tenants/acme/carol/.aws ("), "{why}");
        // Mounted itself, the account's home is looked into like any directory.
        assert!(judged(&t.join("srv/tenants/acme/carol"), &none).is_some());
    }

    #[test]
    fn users_homes_may_not_be_mounted_or_held_even_when_empty() {
        let (_dir, t) = scratch();
        make(&t, "people/dave/src/");
        make(&t, "hr/erin/");
        let homes = holds::KnownHomes {
            own: Some(t.join("me")),
            users: vec![(t.join("people/dave"), "dave".into())],
            accounts: vec![t.join("people/dave")],
            home_root: Some(t.join("hr")),
        };
        make(&t, "me/");
        for (path, says) in [
            ("people", "holds the home directory"),
            ("people/dave", "is the home directory of dave"),
            ("hr", "holds the home directory"),
            ("hr/erin", "is a home directory"),
            ("me", "holds the home directory"),
            ("", "holds the home directory"),
        ] {
            let why = judged(&t.join(path), &homes).unwrap_or_else(|| panic!("{path}"));
            assert!(why.contains(says), "{path}: {why}");
        }
        // Inside a home, a directory that holds no store is the caller's business.
        assert_eq!(judged(&t.join("people/dave/src"), &homes), None);
    }

    #[test]
    fn links_are_judged_by_what_they_reach_and_never_followed_out() {
        let (_dir, t) = scratch();
        let none = holds::KnownHomes::default();
        let ssh = make(&t, "home/.ssh/");
        make(&t, "home/.cargo/credentials.toml");
        let link = |target: &Path, at: &str| {
            let at = t.join(at);
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(target, &at).unwrap();
            at
        };
        // A child link to a store outside the mount: the mount holds the store.
        let keys = link(&ssh, "data/keys");
        let why = judged(&t.join("data"), &none).unwrap();
        assert!(
            why.contains(&format!(
                "holds {}, a link to {}",
                keys.display(),
                ssh.display()
            )),
            "{why}"
        );
        // A child link to the caller's home.
        link(&t.join("home"), "data2/me");
        let own = holds::KnownHomes {
            own: Some(t.join("home")),
            ..Default::default()
        };
        assert!(judged(&t.join("data2"), &own)
            .unwrap()
            .contains("home directory"));
        // A link on a store's path that leaves the mount is not followed: beyond it is not in
        // the mount.
        link(&t.join("home/.cargo"), "tools/.cargo");
        assert_eq!(judged(&t.join("tools"), &none), None);
        // One that stays inside is followed.
        make(&t, "dots/real-config/gh/hosts.yml");
        link(&t.join("dots/real-config"), "dots/.config");
        let why = judged(&t.join("dots"), &none).unwrap();
        assert!(why.contains("dots/real-config/gh/hosts.yml ("), "{why}");
        // A store's name as a dangling link counts; a loop ends.
        link(Path::new("/nonexistent/key"), "dangling/.ssh");
        assert!(judged(&t.join("dangling"), &none).is_some());
        link(&t.join("loop/.config"), "loop/.config");
        link(&t.join("loop/a"), "loop/a");
        assert_eq!(judged(&t.join("loop"), &none), None);
    }

    #[test]
    fn ordinary_directories_are_accepted_and_the_look_is_bounded() {
        let (_dir, t) = scratch();
        let none = holds::KnownHomes::default();
        make(&t, "proj/src/main.rs");
        make(&t, "proj/.cargo/config.toml");
        make(&t, "proj/target/debug/");
        make(&t, "tool/.cargo/bin/cargo");
        make(&t, "tool/.local/bin/pipx");
        for path in [
            "proj",
            "proj/.cargo",
            "tool/.cargo/bin",
            "tool/.local/bin",
            "tool",
        ] {
            assert_eq!(judged(&t.join(path), &none), None, "{path}");
        }
        // A store far down an ordinary tree is not searched for (no walk of the tree).
        let mut deep = t.join("deep");
        for i in 0..64 {
            deep.push(format!("d{i}"));
        }
        make(&deep, ".ssh/id_ed25519");
        assert_eq!(judged(&t.join("deep"), &none), None);
        // Past the bounds the mount is refused, not half-checked.
        for i in 0..5 {
            make(&t, &format!("wide/d{i}/"));
        }
        let small = holds::Limits {
            entries: 10,
            dirs: 3,
        };
        let why = judge(&t.join("wide"), &none, small).unwrap();
        assert!(why.contains("more than 3 directories"), "{why}");
        let small = holds::Limits {
            entries: 4,
            dirs: 10,
        };
        let why = judge(&t.join("wide"), &none, small).unwrap();
        assert!(why.contains("more than 4 entries"), "{why}");
        assert_eq!(judged(&t.join("wide"), &none), None);
    }

    #[test]
    fn passwd_accounts_are_read_with_their_login_shells() {
        let text = b"root:x:0:0:root:/root:/bin/bash\n\
            daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
            systemd-network:x:998:998::/:/usr/sbin/nologin\n\
            short:x:1:1\n\
            rel:x:5:5::home/rel:/bin/sh\n\
            ann:x:1000:1000:Ann:/home/ann:\n\
            # a comment\n";
        let accounts = holds::parse_passwd(text);
        let got: Vec<(&str, &str, bool)> = accounts
            .iter()
            .map(|a| (a.name.as_str(), a.home.to_str().unwrap(), a.login))
            .collect();
        assert_eq!(
            got,
            [
                ("root", "/root", true),
                ("daemon", "/usr/sbin", false),
                ("ann", "/home/ann", true)
            ]
        );
    }

    #[test]
    fn writable_mounts_over_the_project_are_named() {
        let root = Path::new("/srv/project");
        assert!(project_overlap(Path::new("/srv/project"), root).is_some());
        assert!(project_overlap(Path::new("/srv/project/target"), root).is_some());
        assert!(project_overlap(Path::new("/srv"), root).is_some());
        assert_eq!(project_overlap(Path::new("/srv/cache"), root), None);
    }
}
