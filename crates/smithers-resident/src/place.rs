//! Where the service listens, and which build it is.
//!
//! The socket lives in a directory only this user can enter: `$SMITHERS_RESIDENT_DIR` when
//! set, else `$XDG_RUNTIME_DIR/smithers-sandbox` when that is this user's private directory,
//! else `/tmp/smithers-resident-<uid>`. Before the directory is used it must be a real
//! directory (not a symlink), owned by this user and closed to everyone else: in `/tmp`
//! another user can create the name first, and then the service is refused rather than put
//! where that user can reach it.
//!
//! The socket's name carries the identity of the executable (device, inode, size, mtime):
//! a client reaches only a service of its own build, so a rebuilt or upgraded binary never
//! speaks to an old service (which then goes away at its idle timeout).

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Overrides the service's directory (tests, or a host with an unusual layout).
pub const DIR_ENV: &str = "SMITHERS_RESIDENT_DIR";

/// The service's files for one build of the executable.
#[derive(Debug, Clone)]
pub struct Place {
    /// The private directory.
    pub dir: PathBuf,
    /// The socket clients connect to.
    pub socket: PathBuf,
    /// Held (`flock`) by the one service of this build: a second one refuses to start.
    pub lock: PathBuf,
    /// Where a detached service writes what it has to say.
    pub log: PathBuf,
    /// The build's identity, as in the names above.
    pub build: String,
}

impl Place {
    /// The place of this executable's service. `create`: make the directory when it is
    /// missing (the service); a client only looks. Either way an existing directory must be
    /// private and ours.
    pub fn of_this_build(create: bool) -> io::Result<Place> {
        let dir = private_dir(service_dir()?, create)?;
        let build = build_identity()?;
        Ok(Place {
            socket: dir.join(format!("run-{build}.sock")),
            lock: dir.join(format!("run-{build}.lock")),
            log: dir.join(format!("run-{build}.log")),
            dir,
            build,
        })
    }
}

/// The directory of this user's held sessions (`sessions/` in the service's directory),
/// made when `create`, and checked private either way.
pub fn sessions_dir(create: bool) -> io::Result<PathBuf> {
    let top = private_dir(service_dir()?, create)?;
    private_dir(top.join("sessions"), create)
}

/// `dir`, made (mode 700) when `create` and missing, then checked private.
fn private_dir(dir: PathBuf, create: bool) -> io::Result<PathBuf> {
    if create {
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
        }
    }
    check_private(&dir)?;
    Ok(dir)
}

fn service_dir() -> io::Result<PathBuf> {
    if let Some(dir) = std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        let runtime = PathBuf::from(runtime);
        if check_private(&runtime).is_ok() {
            return Ok(runtime.join("smithers-sandbox"));
        }
    }
    let uid = rustix::process::geteuid().as_raw();
    Ok(PathBuf::from(format!("/tmp/smithers-resident-{uid}")))
}

/// A directory (not a symlink), owned by the effective user, that nobody else can enter or
/// write into.
pub fn check_private(dir: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    let me = rustix::process::geteuid().as_raw();
    let problem = if !meta.file_type().is_dir() {
        Some("not a directory (a symlink is refused)".to_string())
    } else if meta.uid() != me {
        Some(format!(
            "owned by uid {}, not by this user ({me})",
            meta.uid()
        ))
    } else if meta.mode() & 0o077 != 0 {
        Some(format!(
            "of mode {:o}, which lets others in (it must be 700)",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(p) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is {p}", dir.display()),
        )),
    }
}

/// The executable's identity: a hash of its device, inode, size and modification time, and
/// of this crate's version (the protocol's).
pub fn build_identity() -> io::Result<String> {
    let meta = std::fs::metadata("/proc/self/exe")?;
    let mut hash = Fnv::default();
    for part in [
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime() as u64,
        meta.mtime_nsec() as u64,
    ] {
        hash.write(&part.to_le_bytes());
    }
    hash.write(env!("CARGO_PKG_VERSION").as_bytes());
    hash.write(crate::wire::PROTOCOL.as_bytes());
    Ok(format!("{:016x}", hash.0))
}

/// FNV-1a (64 bits): a name, not a secret; who may connect is decided by the directory's mode
/// and the peer's credentials.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_a_private_directory_of_ours_is_used() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        check_private(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = check_private(&dir).unwrap_err().to_string();
        assert!(e.contains("lets others in"), "{e}");
        let link = tmp.path().join("l");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e = check_private(&link).unwrap_err().to_string();
        assert!(e.contains("symlink"), "{e}");
        let file = tmp.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(check_private(&file).is_err());
    }

    #[test]
    fn the_build_identity_is_stable_within_a_build() {
        assert_eq!(build_identity().unwrap(), build_identity().unwrap());
        assert_eq!(build_identity().unwrap().len(), 16);
    }
}
