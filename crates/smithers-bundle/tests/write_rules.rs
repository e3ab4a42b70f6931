//! Our own write/validate rules beyond the JavaScript package: nothing written on failure,
//! planted symlinks, colliding targets, the diffBundle fallback, limit names in details.

use std::fs;
use std::os::unix::fs::symlink;

use serde_json::json;
use smithers_bundle::{
    holds_only_prepared_dirs, prepare_bundle_dirs, validate_bundle, write_bundle, BundleError,
    BundleFile, BundleStatus, DiffBundle, DiffOperation, DiffPatch, WriteParams,
    SANDBOX_MAX_BUNDLE_BYTES,
};
use smithers_errors::{CodedError, ErrorCode};

fn params(dir: &std::path::Path) -> WriteParams {
    let mut p = WriteParams::new(dir, BundleStatus::Finished);
    p.output = Some(json!({"ok": true}));
    p.patches = vec![BundleFile::new("patches/0001.patch", "+a\n")];
    p.artifacts = vec![BundleFile::new("artifacts/out/report.txt", "r")];
    p
}

#[test]
fn a_planted_symlink_in_a_reused_directory_cannot_redirect_a_write() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let dir = tmp.path().join("b");
    fs::create_dir(&dir).unwrap();
    symlink(&outside, dir.join("patches")).unwrap();
    let err = write_bundle(&params(&dir)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ToolPathEscape, "{err}");
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written through the link"
    );
    assert!(!dir.join("README.md").exists());

    // A symlink at the file itself is replaced, not followed.
    let dir2 = tmp.path().join("b2");
    fs::create_dir_all(dir2.join("artifacts/out")).unwrap();
    let victim = outside.join("victim");
    fs::write(&victim, "keep").unwrap();
    symlink(&victim, dir2.join("artifacts/out/report.txt")).unwrap();
    write_bundle(&params(&dir2)).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
    assert_eq!(
        fs::read_to_string(dir2.join("artifacts/out/report.txt")).unwrap(),
        "r"
    );
    assert!(validate_bundle(&dir2).is_ok());
}

#[test]
fn rewriting_a_bundle_replaces_it_and_leaves_no_temporary_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    write_bundle(&params(&dir)).unwrap();
    let mut p = params(&dir);
    p.status = BundleStatus::Failed;
    write_bundle(&p).unwrap();
    let v = validate_bundle(&dir).unwrap();
    assert_eq!(v.manifest.status, BundleStatus::Failed);
    let names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with(".README")), "{names:?}");
    let readme = fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(
        readme.ends_with('}'),
        "no trailing newline, as JSON.stringify"
    );
}

#[test]
fn colliding_targets_are_refused_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<BundleFile>, &str)> = vec![
        (
            vec![
                BundleFile::new("artifacts/a", ""),
                BundleFile::new("artifacts/./a", ""),
            ],
            "is written twice",
        ),
        (
            vec![
                BundleFile::new("artifacts/a", ""),
                BundleFile::new("artifacts/a/b", ""),
            ],
            "is a directory of another entry",
        ),
        (
            vec![BundleFile::new("README.md", "")],
            "README.md is the manifest",
        ),
        (vec![BundleFile::new(".", "")], "names the bundle directory"),
        (
            vec![BundleFile::new("patches", "")],
            "names a bundle layout directory",
        ),
    ];
    for (i, (artifacts, reason)) in cases.into_iter().enumerate() {
        let dir = tmp.path().join(format!("c{i}"));
        let mut p = params(&dir);
        p.artifacts = artifacts;
        let err = write_bundle(&p).unwrap_err();
        assert!(
            matches!(&err, BundleError::WriteTargetConflict { reason: r, .. } if *r == reason),
            "{err}"
        );
        assert_eq!(err.code(), ErrorCode::InvalidInput);
        assert!(!dir.exists());
    }
}

#[test]
fn a_diff_bundle_is_kept_when_it_fits_and_dropped_when_it_does_not() {
    let tmp = tempfile::tempdir().unwrap();
    let diff = |n: usize| DiffBundle {
        seq: 7,
        base_ref: "abc".into(),
        patches: vec![DiffPatch {
            path: "a".into(),
            operation: DiffOperation::Add,
            diff: "+".repeat(n),
            binary_content: None,
        }],
    };
    let small = tmp.path().join("small");
    let mut p = params(&small);
    p.diff_bundle = Some(diff(10));
    assert!(write_bundle(&p).unwrap().diff_bundle_included);
    let v = validate_bundle(&small).unwrap();
    assert_eq!(v.manifest.diff_bundle().unwrap().unwrap(), diff(10));

    let big = tmp.path().join("big");
    let mut p = params(&big);
    p.diff_bundle = Some(diff(6 * 1024 * 1024));
    assert!(!write_bundle(&p).unwrap().diff_bundle_included);
    assert!(validate_bundle(&big)
        .unwrap()
        .manifest
        .diff_bundle
        .is_none());
}

#[test]
fn errors_name_the_limit_and_the_largest_contributors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    let mut p = params(&dir);
    p.artifacts = vec![
        BundleFile::new(
            "artifacts/big",
            vec![0u8; (SANDBOX_MAX_BUNDLE_BYTES / 2) as usize],
        ),
        BundleFile::new(
            "artifacts/big2",
            vec![0u8; (SANDBOX_MAX_BUNDLE_BYTES / 2) as usize],
        ),
    ];
    let err = write_bundle(&p).unwrap_err();
    assert_eq!(err.to_string(), "Sandbox bundle exceeds 104857600 bytes");
    let d = err.details();
    assert_eq!(d["limit"], json!("SANDBOX_MAX_BUNDLE_BYTES"));
    assert_eq!(d["max"], json!(104857600));
    assert_eq!(
        d["largest"][0]["bytes"],
        json!(SANDBOX_MAX_BUNDLE_BYTES / 2)
    );
    assert!(!dir.exists());

    let mut p = params(&dir);
    p.patches = (0..1001)
        .map(|i| BundleFile::new(format!("patches/{i}.patch"), ""))
        .collect();
    let err = write_bundle(&p).unwrap_err();
    assert_eq!(
        err.report().to_json()["details"],
        json!({"limit": "SANDBOX_MAX_PATCH_FILES", "max": 1000, "actual": 1001, "field": "patches", "maxLength": 1000, "actualLength": 1001})
    );

    // Validation: too many patch files found on disk.
    let dir = tmp.path().join("many");
    write_bundle(&params(&dir)).unwrap();
    for i in 0..1000 {
        fs::write(dir.join(format!("patches/x{i}.patch")), "").unwrap();
    }
    let err = validate_bundle(&dir).unwrap_err();
    assert_eq!(
        err.report().to_json(),
        json!({
            "code": "INVALID_INPUT",
            "message": "Sandbox bundle has too many patch files (max 1000).",
            "details": {"limit": "SANDBOX_MAX_PATCH_FILES", "max": 1000, "actual": 1001, "patchCount": 1001, "maxPatches": 1000},
        })
    );
}

#[test]
fn a_bundle_at_the_filesystem_root_resolves_by_components() {
    // Root `/`: JS's string-prefix check ("//") rejects every path there; ours confines by
    // components. (Lexical only: nothing is written at /.)
    assert!(
        smithers_bundle::assert_patch_path_safe(std::path::Path::new("/"), "patches/a.patch")
            .is_ok()
    );
    assert!(
        smithers_bundle::assert_patch_path_safe(std::path::Path::new("/"), "/patches/a.patch")
            .is_ok()
    );
    assert!(
        smithers_bundle::assert_patch_path_safe(std::path::Path::new("/"), "/etc/passwd").is_err()
    );
}

#[test]
fn deep_and_wide_trees_are_walked_without_recursion() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    write_bundle(&params(&dir)).unwrap();
    let mut deep = dir.join("artifacts");
    for _ in 0..400 {
        deep.push("d");
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("leaf.txt"), "12345").unwrap();
    let mut deep_patch = dir.join("patches");
    for _ in 0..100 {
        deep_patch.push("p");
    }
    fs::create_dir_all(&deep_patch).unwrap();
    fs::write(deep_patch.join("z.patch"), "+\n").unwrap();
    let before = validate_bundle(tmp.path().join("b")).unwrap();
    assert_eq!(before.patch_files.len(), 2);
    assert!(before
        .patch_files
        .contains(&format!("patches/{}z.patch", "p/".repeat(100))));
    // The result round-trips through its JSON form (other crates receive it as JSON).
    let back: smithers_bundle::ValidatedBundle = serde_json::from_value(before.to_json()).unwrap();
    assert_eq!(back, before);
}

#[test]
fn manifest_entries_normalise_to_bundle_relative_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    write_bundle(&params(&dir)).unwrap();
    let abs = dir.join("patches/y.patch").to_string_lossy().into_owned();
    let readme = json!({"status": "finished", "patches": ["./patches/0001.patch", "patches/x/../z.patch", abs]});
    fs::write(dir.join("README.md"), readme.to_string()).unwrap();
    let v = validate_bundle(&dir).unwrap();
    assert_eq!(
        v.manifest_patch_files(),
        vec!["patches/0001.patch", "patches/z.patch", "patches/y.patch"]
    );
}

#[test]
fn directories_prepared_ahead_are_told_from_a_bundle_and_written_into() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sandbox/result");
    prepare_bundle_dirs(&dir).unwrap();
    assert!(holds_only_prepared_dirs(&dir));
    // Made again (a second execute): still only prepared.
    prepare_bundle_dirs(&dir).unwrap();
    assert!(holds_only_prepared_dirs(&dir));
    // A bundle written into them is complete, and no longer "only prepared".
    write_bundle(&params(&dir)).unwrap();
    validate_bundle(&dir).unwrap();
    assert!(!holds_only_prepared_dirs(&dir));
}

#[test]
fn anything_but_the_empty_directories_is_not_only_prepared() {
    let tmp = tempfile::tempdir().unwrap();
    let fresh = |name: &str| {
        let dir = tmp.path().join(name);
        prepare_bundle_dirs(&dir).unwrap();
        dir
    };
    // A file in one of them (a partial bundle).
    let partial = fresh("partial");
    fs::write(partial.join("logs/stream.ndjson"), "{}\n").unwrap();
    assert!(!holds_only_prepared_dirs(&partial));
    // Another entry at the root.
    let extra = fresh("extra");
    fs::write(extra.join(".README.md.1.2.tmp"), "x").unwrap();
    assert!(!holds_only_prepared_dirs(&extra));
    // A link in place of one of them.
    let linked = fresh("linked");
    fs::remove_dir(linked.join("patches")).unwrap();
    symlink(tmp.path(), linked.join("patches")).unwrap();
    assert!(!holds_only_prepared_dirs(&linked));
    // The root itself a link to prepared directories.
    let real = fresh("real");
    let link = tmp.path().join("link");
    symlink(&real, &link).unwrap();
    assert!(!holds_only_prepared_dirs(&link));
    // Nothing there at all.
    assert!(!holds_only_prepared_dirs(&tmp.path().join("absent")));
}

#[test]
fn a_link_planted_where_the_bundle_goes_is_not_followed_by_the_preparation() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    let sandbox = tmp.path().join("sandbox");
    fs::create_dir(&sandbox).unwrap();
    symlink(&elsewhere, sandbox.join("result")).unwrap();
    prepare_bundle_dirs(&sandbox.join("result")).unwrap();
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    assert!(!holds_only_prepared_dirs(&sandbox.join("result")));
}
