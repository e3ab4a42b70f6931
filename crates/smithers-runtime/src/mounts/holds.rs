//! What a mount holds: the credential stores and users' homes inside a host directory, found
//! by looking at the file system rather than at the mount's name (`~/.cargo` is no secret by
//! its name; the `credentials.toml` in it is).
//!
//! The look is bounded and never walks the tree, so a mount of a huge tree stays cheap: an
//! existence check of each known store path ([`SECRET_NAMES`], relative to a home) at each
//! place a home may be: the mount itself, each of its children (a directory of homes, like
//! `/home`), and every account's home from `/etc/passwd` that lies under the mount at any
//! depth. Everything in the tree is treated as hostile: a link met on the way is never followed
//! out of the mount, and a link that points at a credential store or a home counts as holding
//! it.

use std::ffi::OsStr;
use std::io::Read as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use super::{has_components, SECRET_NAMES};

/// Where homes are kept by convention: each directory in it is taken for a user's home, known
/// to `/etc/passwd` or not (network accounts are not in it).
const HOME_ROOT: &str = "/home";

/// The accounts file: every home it names is looked into when it lies under a mount.
const PASSWD: &str = "/etc/passwd";

/// How much of the accounts file is read, and how many of its homes are resolved: a bound on
/// the work of each check, far above any host's own accounts.
const PASSWD_MAX_BYTES: u64 = 8 << 20;
const PASSWD_MAX_ACCOUNTS: usize = 20_000;

/// Shells of accounts nobody logs in to. Their "home" is often a shared tree (`/usr/sbin`,
/// `/var/www`) that is mounted for good reasons, so it is looked into for credential stores but
/// is not refused for being a home.
const NO_LOGIN_SHELLS: &[&str] = &["nologin", "false", "sync", "shutdown", "halt"];

/// How far a look into a mount's children goes. Past either bound the mount is refused rather
/// than half-checked: a directory padded with entries must not hide the home at its end.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Entries of the mount's own directory listing read.
    pub entries: usize,
    /// Child directories looked into for credential stores (a few `lstat`s each).
    pub dirs: usize,
}

/// The bounds of the real check: about a fifth of a second of `lstat`s at worst.
pub(super) const LIMITS: Limits = Limits {
    entries: 200_000,
    dirs: 10_000,
};

/// The homes of a host that a mount is judged against, every path resolved through its links
/// (a mount is compared in its resolved form too). A parameter rather than read inside the
/// rule, so the rule can be tried on homes made for the purpose.
#[derive(Debug, Default, Clone)]
pub(super) struct KnownHomes {
    /// The invoking user's home (`$HOME`): a mount may not be or hold it.
    pub own: Option<PathBuf>,
    /// Homes of accounts people log in to, with the account's name: a mount may not be or
    /// hold one.
    pub users: Vec<(PathBuf, String)>,
    /// Every existing home `/etc/passwd` names, service accounts' too: looked into for
    /// credential stores when under a mount.
    pub accounts: Vec<PathBuf>,
    /// `/home` when it is a directory: each directory in it is a home.
    pub home_root: Option<PathBuf>,
}

/// One account of `/etc/passwd`: its name, home and whether its shell lets anyone log in.
#[derive(Debug, PartialEq)]
pub(super) struct Account {
    pub name: String,
    pub home: PathBuf,
    pub login: bool,
}

/// The accounts of a `passwd` file's text (`name:pw:uid:gid:gecos:home:shell`). A line that is
/// not seven fields, or whose home is not absolute or is `/`, is skipped: `/` is refused as the
/// whole host anyway, and a relative home means nothing here.
pub(super) fn parse_passwd(text: &[u8]) -> Vec<Account> {
    text.split(|b| *b == b'\n')
        .filter_map(|line| {
            let fields: Vec<&[u8]> = line.split(|b| *b == b':').collect();
            let [name, _, _, _, _, home, shell] = fields.as_slice() else {
                return None;
            };
            let home = Path::new(OsStr::from_bytes(home));
            if !home.is_absolute() || home.parent().is_none() {
                return None;
            }
            let shell = Path::new(OsStr::from_bytes(shell))
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            Some(Account {
                name: String::from_utf8_lossy(name).into_owned(),
                home: home.to_path_buf(),
                login: !NO_LOGIN_SHELLS.contains(&shell.as_str()),
            })
        })
        .take(PASSWD_MAX_ACCOUNTS)
        .collect()
}

impl KnownHomes {
    /// This host's homes: `own` (the caller's `$HOME`), the accounts of `/etc/passwd` and
    /// `/home`. A home that does not exist is left out: there is nothing in it to expose.
    pub(super) fn of_host(own: Option<&Path>) -> Self {
        let mut text = Vec::new();
        if let Ok(file) = std::fs::File::open(PASSWD) {
            // Unreadable or cut short: the homes read so far still count.
            let _ = file.take(PASSWD_MAX_BYTES).read_to_end(&mut text);
        }
        let mut homes = KnownHomes {
            own: own
                .filter(|h| h.is_absolute() && *h != Path::new("/"))
                .map(|h| std::fs::canonicalize(h).unwrap_or_else(|_| h.to_path_buf())),
            home_root: std::fs::canonicalize(HOME_ROOT)
                .ok()
                .filter(|r| r.is_dir() && r.parent().is_some()),
            ..KnownHomes::default()
        };
        for account in parse_passwd(&text) {
            let Ok(home) = std::fs::canonicalize(&account.home) else {
                continue;
            };
            // A home that resolves to `/` (a link) is the whole host: refused by name already.
            if home.parent().is_none() {
                continue;
            }
            if account.login {
                homes.users.push((home.clone(), account.name));
            }
            homes.accounts.push(home);
        }
        homes
    }
}

/// Why the resolved, existing directory `mount` holds a user's home or a credential store, as
/// the end of a sentence that starts with the mount (`holds /x/.ssh (SSH keys, ...)`), or
/// `None`. A file holds nothing: what it is was judged by its name.
pub(super) fn holds_reason(mount: &Path, homes: &KnownHomes, limits: Limits) -> Option<String> {
    if !std::fs::symlink_metadata(mount).is_ok_and(|m| m.is_dir()) {
        return None;
    }
    if let Some(why) = home_in(mount, homes, limits) {
        return Some(why);
    }
    if let Some(why) = store_at(mount, mount) {
        return Some(why);
    }
    if let Some(why) = children(mount, homes, limits) {
        return Some(why);
    }
    // Accounts' homes at any depth: a known list, so no walk is needed to find them.
    homes
        .accounts
        .iter()
        .filter(|home| *home != mount && home.starts_with(mount))
        .find_map(|home| store_at(home, mount))
}

/// Whether `mount` is or holds a user's home (the caller's own is judged by the caller).
fn home_in(mount: &Path, homes: &KnownHomes, limits: Limits) -> Option<String> {
    for (home, name) in &homes.users {
        if home == mount {
            return Some(format!(
                "is the home directory of {name} (its keys and credentials)"
            ));
        }
        if home.starts_with(mount) {
            return Some(format!(
                "holds the home directory {} of {name} (its keys and credentials)",
                home.display()
            ));
        }
    }
    let root = homes.home_root.as_deref()?;
    if mount.parent() == Some(root) {
        return Some(format!(
            "is a home directory (a directory in {}: its keys and credentials)",
            root.display()
        ));
    }
    if root.starts_with(mount) {
        // Named by one home in it; an empty /home holds nobody's.
        let home = std::fs::read_dir(root)
            .ok()?
            .take(limits.entries)
            .flatten()
            .find(|e| e.file_type().is_ok_and(|t| t.is_dir()))?;
        return Some(format!(
            "holds the home directory {} (its keys and credentials)",
            home.path().display()
        ));
    }
    None
}

/// Whether a known credential store is at `base` (a place a home may be, inside `mount`):
/// `base/.ssh`, `base/.cargo/credentials.toml`, ... and, when `base` is itself part way down a
/// store's path, the rest of it (`~/.cargo` holds `credentials.toml`, `~/.config` holds
/// `gh`).
fn store_at(base: &Path, mount: &Path) -> Option<String> {
    // Names found missing in `base`: most stores share a first name (`.config`, `.cargo`), and
    // this runs for each of thousands of children, so each is looked up once.
    let mut missing: Vec<&OsStr> = Vec::new();
    for (rel, what) in SECRET_NAMES {
        let parts: Vec<&OsStr> = Path::new(rel).iter().collect();
        for k in 0..parts.len() {
            if k > 0 && !base.ends_with(parts[..k].iter().collect::<PathBuf>()) {
                continue;
            }
            if missing.contains(&parts[k]) {
                continue;
            }
            if std::fs::symlink_metadata(base.join(parts[k])).is_err() {
                missing.push(parts[k]);
                continue;
            }
            if let Some(found) = probe(base, &parts[k..], mount) {
                return Some(format!(
                    "holds {} ({what}, a credential store)",
                    found.display()
                ));
            }
        }
    }
    None
}

/// `base/parts...` when it is there in any form (a file, a directory, a link, even a dangling
/// one: a link named `.ssh` counts), found one `lstat` a component. A link on the way is
/// followed only while it stays inside `mount`; what lies beyond is not in the mount.
fn probe(base: &Path, parts: &[&OsStr], mount: &Path) -> Option<PathBuf> {
    let (last, dirs) = parts.split_last()?;
    let mut at = base.to_path_buf();
    for part in dirs {
        let next = at.join(part);
        let kind = std::fs::symlink_metadata(&next).ok()?.file_type();
        at = if kind.is_dir() {
            next
        } else if kind.is_symlink() {
            // Resolved whole (a loop fails here), then kept only if still inside the mount.
            let target = std::fs::canonicalize(&next).ok()?;
            if !target.starts_with(mount) || !target.is_dir() {
                return None;
            }
            target
        } else {
            return None;
        };
    }
    let found = at.join(last);
    std::fs::symlink_metadata(&found).is_ok().then_some(found)
}

/// Looks into each child of `mount` as a home (a directory of homes is a home's parent). A
/// child link is judged by what it points at and looked into only when that is inside the
/// mount.
fn children(mount: &Path, homes: &KnownHomes, limits: Limits) -> Option<String> {
    let too_many = |what: &str, n: usize| {
        Some(format!(
            "has more than {n} {what}: too many to look into each for a home's credential stores (mount a narrower directory)"
        ))
    };
    let (mut entries, mut dirs) = (0, 0);
    for entry in std::fs::read_dir(mount).ok()? {
        entries += 1;
        if entries > limits.entries {
            return too_many("entries", limits.entries);
        }
        let Ok(entry) = entry else { continue };
        // The listing's own type: a link is seen as a link, not as what it points at.
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        let base = if kind.is_dir() {
            path
        } else if kind.is_symlink() {
            let Ok(target) = std::fs::canonicalize(&path) else {
                continue;
            };
            if let Some(why) = link_reason(&path, &target, homes) {
                return Some(why);
            }
            if !target.starts_with(mount) || !target.is_dir() {
                continue;
            }
            target
        } else {
            continue;
        };
        dirs += 1;
        if dirs > limits.dirs {
            return too_many("directories", limits.dirs);
        }
        if let Some(why) = store_at(&base, mount) {
            return Some(why);
        }
    }
    None
}

/// Why the link `link` (resolved to `target`) is a way into a credential store or a home.
fn link_reason(link: &Path, target: &Path, homes: &KnownHomes) -> Option<String> {
    let shown = || format!("holds {}, a link to {}", link.display(), target.display());
    if let Some((_, what)) = SECRET_NAMES
        .iter()
        .find(|(name, _)| has_components(target, name))
    {
        return Some(format!("{} ({what}, a credential store)", shown()));
    }
    let home = homes
        .own
        .iter()
        .chain(homes.users.iter().map(|(home, _)| home))
        .find(|home| home.starts_with(target));
    if let Some(home) = home {
        return Some(format!(
            "{} (which is or holds the home directory {})",
            shown(),
            home.display()
        ));
    }
    let root = homes.home_root.as_deref()?;
    (target.parent() == Some(root) || root.starts_with(target)).then(|| {
        format!(
            "{} (which is or holds the home directories in {})",
            shown(),
            root.display()
        )
    })
}
