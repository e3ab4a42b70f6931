//! The step's git objects, taken only under the names their content gives them.
//!
//! A git object's name is the SHA-1 of its content, but git does not check that when it
//! reads a loose object or looks a name up in a pack's index. The scratch repository that
//! collect reads the series in has the host's objects as an alternate, and git reads its own
//! objects first: an object of the step's named after a host commit (a stash, another
//! branch) would stand in for it there, so the review would describe a commit the host has
//! under made-up content, and accept would then put the host's real one in the branch. So a
//! loose object is copied only when its content hashes to its name, and a pack's index is
//! rebuilt from the pack by `git index-pack`.

use std::io::Read;
use std::path::Path;
use std::process::Command;

/// The largest object inflated to check its name (a larger one is not taken: the series
/// then cannot be read and is left out, named).
const MAX_INFLATED_BYTES: u64 = 1 << 30;

/// Whether the loose object file at `path` inflates to content whose SHA-1 is `name`.
pub(crate) fn loose_object_named_right(path: &Path, name: &str) -> bool {
    use sha1::{Digest, Sha1};
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let mut inflated = flate2::read::ZlibDecoder::new(file).take(MAX_INFLATED_BYTES + 1);
    let mut hasher = Sha1::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        match inflated.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                total += n as u64;
                hasher.update(&buf[..n]);
            }
            Err(_) => return false,
        }
    }
    if total > MAX_INFLATED_BYTES {
        return false;
    }
    let got: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    got == name
}

/// Builds the index of every pack in `<repo>/objects/pack` from the pack's own content
/// (`git index-pack`, which hashes each object), through `git` (a host git in the repo).
pub(crate) fn index_packs(repo: &Path, git: impl Fn(&[&str]) -> Command) -> Result<(), String> {
    let dir = repo.join("objects").join("pack");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("pack") {
            continue;
        }
        let pack = path.to_string_lossy().into_owned();
        let out = git(&["index-pack", &pack])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .output()
            .map_err(|e| format!("git index-pack: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "a pack of the step's could not be indexed: {}",
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .chars()
                    .take(300)
                    .collect::<String>()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn loose(content: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("obj");
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(content).unwrap();
        std::fs::write(&path, z.finish().unwrap()).unwrap();
        (dir, path)
    }

    #[test]
    fn a_loose_object_is_taken_only_under_its_own_name() {
        // `printf hello | git hash-object --stdin` = b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0
        let (_d, path) = loose(b"blob 5\0hello");
        assert!(loose_object_named_right(
            &path,
            "b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0"
        ));
        assert!(!loose_object_named_right(
            &path,
            "0000000000000000000000000000000000000000"
        ));
        let garbage = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(garbage.path(), b"not zlib").unwrap();
        assert!(!loose_object_named_right(
            garbage.path(),
            "b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0"
        ));
    }
}
