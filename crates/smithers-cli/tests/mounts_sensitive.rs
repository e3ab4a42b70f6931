//! `run --mount` of a directory that holds a credential store or a home: refused, naming what
//! it holds, unless `--allow-sensitive-mount` is given. The homes here are temporary
//! directories that look like homes by what is in them, so nothing depends on this host's
//! own homes or accounts.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use support::native::{bin, sandboxes_usable};

/// `run --json --root project --mount MOUNT [FLAGS] -- sh -c SCRIPT`, with `$HOME` set to
/// `home` (a directory of its own, so the caller's home is never what is mounted).
fn run_mount(
    project: &Path,
    home: &Path,
    mount: &str,
    flags: &[&str],
    script: &str,
) -> (Output, Value) {
    let out = bin()
        .env("HOME", home)
        .args(["--json", "run", "--no-review", "--root"])
        .arg(project)
        .args(["--mount", mount])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, doc)
}

/// `rel` under `dir` as a file holding `text`, its parents made; the path, resolved.
fn file(dir: &Path, rel: &str, text: &str) -> PathBuf {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    std::fs::canonicalize(path).unwrap()
}

fn mounts_row(doc: &Value) -> Value {
    doc["enforcement"]["protections"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "host-mounts")
        .cloned()
        .unwrap_or(Value::Null)
}

/// No sandbox was made for a refused run.
fn no_sandbox_made(project: &Path) -> bool {
    std::fs::read_dir(project.join(".smithers/sandboxes"))
        .map(|mut d| d.next().is_none())
        .unwrap_or(true)
}

#[test]
fn a_mount_holding_a_credential_store_is_refused_naming_it_unless_allowed() {
    if !sandboxes_usable() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(tmp.path()).unwrap();
    // A home-like directory (not $HOME, in no account): its .cargo and .config hold stores.
    let cargo_token = file(&t, "home-like/.cargo/credentials.toml", "token = \"cio\"\n");
    file(&t, "home-like/.cargo/config.toml", "[build]\n");
    let gh_token = file(&t, "home-like/.config/gh/hosts.yml", "oauth_token: gho\n");
    file(&t, "home-like/.config/git/config", "[user]\n");
    // A directory of homes: another "user's" key two levels down.
    let key = file(&t, "homes/alice/.ssh/id_ed25519", "PRIVATE KEY\n");
    file(&t, "homes/bob/notes.txt", "hello\n");
    let cases = [
        (
            t.join("home-like/.cargo"),
            cargo_token.clone(),
            "credentials.toml",
        ),
        (t.join("home-like/.config"), gh_token, "hosts.yml"),
        (t.join("homes"), key.parent().unwrap().to_path_buf(), ".ssh"),
    ];
    for (mount, held, inside) in &cases {
        // A project of its own, so a sandbox found after the refusal was made by it.
        let project = tempfile::tempdir().unwrap();
        let shown = mount.display().to_string();
        let (out, doc) = run_mount(project.path(), home.path(), &shown, &[], "true");
        assert!(!out.status.success(), "{shown}: {out:?}");
        assert_eq!(doc["code"], "INVALID_INPUT", "{shown}: {doc}");
        let message = doc["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("{shown} holds {}", held.display())),
            "{shown} should be refused naming {}: {doc}",
            held.display()
        );
        assert!(message.contains("--allow-sensitive-mount"), "{doc}");
        assert!(
            no_sandbox_made(project.path()),
            "{shown}: a sandbox was made"
        );
        // Allowed explicitly: the step reads what the mount holds, and the report says so.
        let (out, doc) = run_mount(
            project.path(),
            home.path(),
            &format!("{shown}:/held"),
            &["--allow-sensitive-mount"],
            &format!("find /held | grep -q {inside}"),
        );
        assert_eq!(doc["exitCode"], 0, "{shown} allowed: {out:?}");
        let row = mounts_row(&doc);
        assert_eq!(row["status"], "degraded", "{row}");
        assert!(row["detail"]
            .as_str()
            .unwrap()
            .contains("allowSensitiveMounts"));
    }
    // A link inside a mount to a store outside it is as good as the store.
    let link = t.join("data/keys");
    std::fs::create_dir_all(t.join("data")).unwrap();
    std::os::unix::fs::symlink(key.parent().unwrap(), &link).unwrap();
    let project = tempfile::tempdir().unwrap();
    let (out, doc) = run_mount(
        project.path(),
        home.path(),
        &t.join("data").display().to_string(),
        &[],
        "true",
    );
    assert!(!out.status.success(), "{out:?}");
    assert!(
        doc["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("holds {}, a link to", link.display())),
        "{doc}"
    );
}

#[test]
fn an_ordinary_directory_is_mounted() {
    if !sandboxes_usable() {
        return;
    }
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // A project-like tree, with a cargo configuration that holds no token.
    file(tmp.path(), "src/main.rs", "fn main() {}\n");
    file(tmp.path(), ".cargo/config.toml", "[build]\n");
    file(tmp.path(), "data/a/b/c.txt", "data\n");
    let (out, doc) = run_mount(
        project.path(),
        home.path(),
        &format!("{}:/data", tmp.path().display()),
        &[],
        "test -f /data/data/a/b/c.txt && test -f /data/.cargo/config.toml",
    );
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    assert_eq!(mounts_row(&doc)["status"], "enforced", "{doc}");
}
