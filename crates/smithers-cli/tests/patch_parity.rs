//! The same step, run with the local (`bubblewrap`) runtime and with `docker`, produces
//! byte-identical patch files: both runtimes present the project through an overlay and hand
//! its upper layer to the same patch generator, and this test holds them to it.
//!
//! Needs native sandboxes and a running Docker engine with the local test image
//! (`scripts/docker-up.sh` builds `smithers-test:busybox`); prints `SKIP` without them, and
//! fails instead under `CI=true`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const IMAGE: &str = "smithers-test:busybox";

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_smithers-sandbox"));
    c.env_remove("SMITHERS_DB").env("NO_COLOR", "1");
    c
}

fn both_runtimes_usable() -> bool {
    for runtime in ["bubblewrap", "docker"] {
        let out = bin()
            .args(["doctor", "--json", "--runtime", runtime])
            .output()
            .unwrap();
        if out.status.code() != Some(0) {
            return smithers_test_support::skip_or_fail(&format!(
                "the {runtime} runtime is unavailable here: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
    }
    let image = Command::new("docker")
        .args(["image", "inspect", IMAGE])
        .output();
    if !image.is_ok_and(|o| o.status.success()) {
        return smithers_test_support::skip_or_fail(&format!(
            "the local image {IMAGE} is missing (scripts/docker-up.sh)"
        ));
    }
    true
}

/// A small project with text, an executable, a directory to delete and a file to delete.
fn project(dir: &Path) {
    std::fs::create_dir_all(dir.join("src/old")).unwrap();
    std::fs::write(dir.join("src/main.sh"), "#!/bin/sh\necho helo\n").unwrap();
    std::fs::write(dir.join("src/old/a.txt"), "a\n").unwrap();
    std::fs::write(dir.join("src/old/b.txt"), "b\n").unwrap();
    std::fs::write(dir.join("delete-me.txt"), "bye\n").unwrap();
    std::fs::write(dir.join("no-newline.txt"), "last line").unwrap();
    std::fs::write(dir.join(".gitignore"), "build/\n").unwrap();
}

/// Modify, add, delete, chmod, symlink, binary, nested, a deleted directory, an ignored file.
const STEP: &str = "sed -i 's/helo/hello/' src/main.sh && chmod +x src/main.sh \
    && printf 'new\\n' > added.txt && mkdir -p deep/er && printf 'x\\n' > deep/er/f.txt \
    && rm delete-me.txt && rm -r src/old && ln -s /etc/passwd link \
    && printf '\\000\\001\\002binary' > blob.bin && printf 'more' >> no-newline.txt \
    && mkdir -p build && echo ignored > build/out.o";

fn run(root: &Path, extra: &[&str]) -> Value {
    let out = bin()
        .args(["run", "--json", "--root"])
        .arg(root)
        .args(extra)
        .args(["--", "sh", "-c", STEP])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(0), "{doc}");
    doc
}

/// bundle-relative patch path → bytes.
fn patch_files(bundle: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![bundle.join("patches")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(bundle)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                files.push((rel, std::fs::read(&path).unwrap()));
            }
        }
    }
    files.sort();
    files
}

#[test]
fn local_and_docker_runtimes_produce_byte_identical_patches() {
    if !both_runtimes_usable() {
        return;
    }
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    project(a.path());
    project(b.path());

    let local = run(a.path(), &["--runtime", "bubblewrap"]);
    let docker = run(b.path(), &["--runtime", "docker", "--image", IMAGE]);

    let local_patches = patch_files(&PathBuf::from(local["bundlePath"].as_str().unwrap()));
    let docker_patches = patch_files(&PathBuf::from(docker["bundlePath"].as_str().unwrap()));
    // The step changed 9 paths (the ignored build output is not one of them).
    assert!(local_patches.len() >= 8, "{local_patches:?}");
    let names = |p: &[(String, Vec<u8>)]| p.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&local_patches), names(&docker_patches));
    for ((name, l), (_, d)) in local_patches.iter().zip(&docker_patches) {
        assert!(
            l == d,
            "{name} differs:\n--- bubblewrap\n{}\n--- docker\n{}",
            String::from_utf8_lossy(l),
            String::from_utf8_lossy(d)
        );
    }
    // And neither host tree was touched before review.
    assert!(a.path().join("delete-me.txt").exists() && b.path().join("delete-me.txt").exists());
}
