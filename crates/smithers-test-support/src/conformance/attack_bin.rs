//! Where the hostile half of the containment suite, the `smithers-attack` binary, is found
//! on the host (or built once).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::ATTACK_BIN_ENV;

/// Finds the host `smithers-attack` binary: `$SMITHERS_ATTACK_BIN`, else next to the running
/// test executable (`target/<profile>/` when `cargo test --workspace` built it), else builds
/// it once with cargo into a target directory of its own (a nested cargo must not wait on the
/// lock of the build that is running these tests).
pub fn locate_attack_bin() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    if let Some(p) = std::env::var_os(ATTACK_BIN_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("${ATTACK_BIN_ENV} = {} is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<host tuple>/debug/deps/<test> → target/<host tuple>/debug/smithers-attack
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let sibling = profile_dir.join("smithers-attack");
    if sibling.is_file() {
        return Ok(sibling);
    }
    BUILT
        .get_or_init(|| {
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("smithers-attack")
                .join("Cargo.toml");
            let target_dir = profile_dir
                .parent()
                .map(|t| t.join("suite-attack"))
                .unwrap_or_else(|| std::env::temp_dir().join("smithers-suite-attack"));
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let status = std::process::Command::new(cargo)
                .arg("build")
                .arg("--quiet")
                .arg("--manifest-path")
                .arg(&manifest)
                .arg("--target-dir")
                .arg(&target_dir)
                .status()
                .map_err(|e| format!("cannot run cargo to build smithers-attack: {e}"))?;
            // Under <target dir>/<host tuple>/debug, as the workspace's cargo configuration
            // names the target (.cargo/config.toml), or under <target dir>/debug without it.
            let host = profile_dir
                .parent()
                .and_then(Path::file_name)
                .unwrap_or_default();
            let bin = [target_dir.join(host), target_dir.clone()]
                .into_iter()
                .map(|dir| dir.join("debug").join("smithers-attack"))
                .find(|bin| bin.is_file())
                .unwrap_or_default();
            if status.success() && bin.is_file() {
                Ok(bin)
            } else {
                Err(format!(
                    "smithers-attack not found next to {} and building it failed ({status}); \
                     build it with `cargo build -p smithers-attack` or set ${ATTACK_BIN_ENV}",
                    exe.display()
                ))
            }
        })
        .clone()
}
