//! One truth across configurations: the same step over the same project gives byte-identical
//! patches whether it ran in a native overlay, a native copy, a native session (the engine's
//! path), a native session with checkpoints in the middle (a stack of frozen layers folded at
//! the end), or a Docker container. Needs native sandboxes; Docker where it is (`SKIP`
//! otherwise; both fail under `CI=true`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

mod support;

use support::native::{bin, git, sandboxes_usable};

/// What the step does, in two halves (a checkpoint may come between): text changed, binary
/// bytes written, a file deleted, a mode changed, a link made, a file renamed, a nested
/// directory with an awkward name, and a file made then removed.
const FIRST: &str = "printf 'changed\\n' > a.txt && printf '\\000\\001\\377bin' > data.bin \
    && rm gone.txt && chmod +x tool.sh && mkdir -p 'deep/dir with space'";
const SECOND: &str = "ln -s a.txt link && mv old.txt new.txt \
    && printf 'x\\n' > 'deep/dir with space/f\u{e9}.txt' && printf t > tmp && rm tmp \
    && printf 'more\\n' >> a.txt";

fn project(dir: &Path) -> PathBuf {
    let root = dir.join("project");
    std::fs::create_dir_all(&root).unwrap();
    for (name, body) in [
        ("a.txt", "a\n"),
        ("gone.txt", "bye\n"),
        ("tool.sh", "#!/bin/sh\necho hi\n"),
        ("old.txt", "old\n"),
    ] {
        std::fs::write(root.join(name), body).unwrap();
    }
    git(&root, &["init", "-q"]);
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-qm", "base"]);
    root
}

fn cli(root: &Path, sessions: &Path) -> Command {
    let mut c = bin();
    c.env("SMITHERS_RESIDENT", "off")
        .env("SMITHERS_RESIDENT_DIR", sessions)
        .current_dir(root)
        .stdin(Stdio::null());
    c
}

fn json(c: &mut Command) -> Value {
    let out = c.output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Every patch file of a bundle, by name, as bytes.
fn patches(bundle: &Path) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<(String, Vec<u8>)> = std::fs::read_dir(bundle.join("patches"))
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    all.sort();
    all
}

/// The step run once with `run`'s `flags`; its patches.
fn by_run(dir: &Path, flags: &[&str]) -> Vec<(String, Vec<u8>)> {
    let name: String = flags
        .join("_")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let root = project(&dir.join(name));
    let sessions = root.with_file_name("sessions");
    let script = format!("{FIRST} && {SECOND}");
    let doc = json(
        cli(&root, &sessions)
            .args(["--json", "run"])
            .args(flags)
            .args(["--", "sh", "-c", &script]),
    );
    assert_eq!(doc["exitCode"], 0, "{flags:?}: {doc}");
    patches(Path::new(doc["bundlePath"].as_str().unwrap()))
}

/// The step run in a session, in two commands, with `checkpoints` between them.
fn by_session(dir: &Path, name: &str, checkpoints: usize) -> Vec<(String, Vec<u8>)> {
    let root = project(&dir.join(name));
    let sessions = root.with_file_name("sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sessions, std::fs::Permissions::from_mode(0o700)).unwrap();
    let id = json(cli(&root, &sessions).args(["--json", "session", "start"]));
    let id = id["sessionId"].as_str().unwrap().to_string();
    let exec = |script: &str| {
        let out = cli(&root, &sessions)
            .args(["session", "exec", &id, "-n", "--", "sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    exec(FIRST);
    for _ in 0..checkpoints {
        let cp = json(cli(&root, &sessions).args(["--json", "session", "checkpoint", &id]));
        assert!(cp["checkpoint"].is_string(), "{cp}");
        exec("printf n >> note && rm note");
    }
    exec(SECOND);
    let stop = json(cli(&root, &sessions).args(["--json", "session", "stop", &id]));
    assert_eq!(stop["status"], "review", "{stop}");
    patches(Path::new(stop["bundlePath"].as_str().unwrap()))
}

#[test]
fn the_same_step_gives_the_same_patches_in_every_configuration() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let overlay = by_run(dir.path(), &["--workspace", "overlay"]);
    assert!(
        overlay.len() >= 7,
        "{:?}",
        overlay.iter().map(|p| &p.0).collect::<Vec<_>>()
    );
    let others = [
        ("copy", by_run(dir.path(), &["--workspace", "copy"])),
        ("session", by_session(dir.path(), "session", 0)),
        (
            "session with checkpoints",
            by_session(dir.path(), "checkpoints", 3),
        ),
    ];
    for (name, got) in others {
        assert!(
            got == overlay,
            "{name} differs from overlay:\n{}",
            show(&got, &overlay)
        );
    }
    let docker = Command::new("docker")
        .args(["image", "inspect", "smithers-test:busybox"])
        .output()
        .is_ok_and(|o| o.status.success());
    if docker || !smithers_test_support::skip_or_fail("no Docker engine with smithers-test:busybox")
    {
        let got = by_run(
            dir.path(),
            &["--runtime", "docker", "--image", "smithers-test:busybox"],
        );
        assert!(
            got == overlay,
            "docker differs from overlay:\n{}",
            show(&got, &overlay)
        );
    }
}

fn show(a: &[(String, Vec<u8>)], b: &[(String, Vec<u8>)]) -> String {
    let text = |v: &[(String, Vec<u8>)]| {
        v.iter()
            .map(|(n, p)| format!("== {n}\n{}", String::from_utf8_lossy(p)))
            .collect::<String>()
    };
    format!("{}\n---- vs ----\n{}", text(a), text(b))
}
