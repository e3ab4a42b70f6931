//! `hold` (issue 18): a bundle a caller collected (the Smithers provider, from a `serve`
//! host) waits in the project's durable review. It must be one of the project's sandbox
//! directories, reached through no link, and change something; accept records the decision
//! against the reviewed digest and applies nothing (the caller applies it); a bundle changed
//! after it was held is refused.

mod support;

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use support::native::{bin, sandboxes_usable};

fn cli(root: &Path, args: &[&str]) -> Output {
    bin()
        .arg("--json")
        .args(args)
        .arg("--root")
        .arg(root)
        .output()
        .unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn a_held_bundle_is_reviewed_here_and_applied_by_its_caller() {
    if !sandboxes_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("a.txt"), "one\n").unwrap();
    // A real bundle: a step's, whose review we reject (its bundle stays).
    let out = bin()
        .args(["--json", "run", "--root"])
        .arg(root)
        .args(["--", "sh", "-c", "echo two > a.txt"])
        .output()
        .unwrap();
    let doc = json(&out);
    let source = Path::new(doc["bundlePath"].as_str().unwrap()).to_path_buf();
    assert!(cli(
        root,
        &[
            "reject",
            doc["sandboxId"].as_str().unwrap(),
            "--reason",
            "x"
        ]
    )
    .status
    .success());

    // As the provider keeps it: under .smithers/sandboxes/<run>/<sandbox>/.
    let place = root.join(".smithers/sandboxes/wf-run/edit");
    copy_dir(&source, &place.join("result-review"));
    let hold = |bundle: &Path| {
        cli(
            root,
            &[
                "hold",
                "--run-id",
                "wf-run",
                "--sandbox-id",
                "edit",
                "--remote-id",
                "sbx-x",
                bundle.to_str().unwrap(),
            ],
        )
    };

    // Refused: outside the project's sandbox directory, through a link, or another sandbox's.
    let elsewhere = tempfile::tempdir().unwrap();
    copy_dir(&source, &elsewhere.path().join("b"));
    let out = hold(&elsewhere.path().join("b"));
    assert!(!out.status.success());
    assert_eq!(json(&out)["code"], "INVALID_INPUT");
    std::os::unix::fs::symlink(elsewhere.path().join("b"), place.join("linked")).unwrap();
    let out = hold(&place.join("linked"));
    assert!(!out.status.success(), "a link is never followed: {out:?}");
    let other = root.join(".smithers/sandboxes/wf-run/other/result-review");
    copy_dir(&source, &other);
    assert!(
        !hold(&other).status.success(),
        "another sandbox's directory"
    );

    // Held: pending, caller-applied, listed like any review.
    let out = hold(&place.join("result-review"));
    assert!(out.status.success(), "{out:?}");
    let held = json(&out);
    assert_eq!(held["review"]["state"], "pending");
    assert_eq!(held["review"]["patchCount"], 1);
    let shown = json(&cli(root, &["show", "wf-run:edit"]));
    assert_eq!(shown["review"]["state"], "pending");
    assert_eq!(shown["review"]["appliedBy"], "caller");

    // A bundle changed after it was held is refused at accept; put back, it is accepted,
    // and nothing is applied here (the caller applies it).
    let patch = std::fs::read_dir(place.join("result-review/patches"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let original = std::fs::read(&patch).unwrap();
    std::fs::write(&patch, b"tampered").unwrap();
    let out = cli(root, &["accept", "wf-run:edit"]);
    assert!(
        !out.status.success(),
        "a changed bundle must be refused: {out:?}"
    );
    std::fs::write(&patch, &original).unwrap();
    let out = cli(root, &["accept", "wf-run:edit", "--branch", "b"]);
    assert!(
        !out.status.success(),
        "--branch cannot be honoured by a caller-applied review"
    );
    let out = cli(root, &["accept", "wf-run:edit"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(json(&out)["review"], "accepted");
    assert_eq!(json(&out)["appliedPatches"], 0);
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(
        json(&cli(root, &["show", "wf-run:edit"]))["review"]["state"],
        "accepted"
    );

    // A bundle that changes nothing has nothing to review.
    let empty = root.join(".smithers/sandboxes/wf-run/empty/result-review");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(
        empty.join("README.md"),
        r#"{"outputs":null,"status":"finished","patches":[]}"#,
    )
    .unwrap();
    let out = cli(
        root,
        &[
            "hold",
            "--run-id",
            "wf-run",
            "--sandbox-id",
            "empty",
            empty.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    assert!(json(&out)["message"]
        .as_str()
        .unwrap()
        .contains("nothing to review"));
}
