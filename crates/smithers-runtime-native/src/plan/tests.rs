use super::*;

fn facts() -> HostFacts {
    let mut entries = BTreeMap::new();
    entries.insert(p("/usr"), HostEntry::Dir);
    entries.insert(p("/bin"), HostEntry::Symlink(p("usr/bin")));
    entries.insert(p("/lib64"), HostEntry::Dir);
    entries.insert(p("/etc/passwd"), HostEntry::File);
    entries.insert(p("/etc/ssl"), HostEntry::Dir);
    entries.insert(
        p("/etc/localtime"),
        HostEntry::Symlink(p("/usr/share/zoneinfo/UTC")),
    );
    entries.insert(p("/dev/null"), HostEntry::File);
    entries.insert(p("/dev/urandom"), HostEntry::File);
    HostFacts { entries }
}

fn layout() -> HostLayout {
    HostLayout {
        root_dir: p("/home/u/project"),
        layers: Vec::new(),
        upper: p("/state/s1/layer/upper"),
        work: p("/state/s1/layer/work"),
        workspace_copy: None,
        new_root: p("/state/s1/root"),
        artifacts: p("/state/s1/artifacts"),
        out: p("/state/s1/out"),
        request: p("/home/u/project/.smithers/sandboxes/r/s/request"),
    }
}

fn plan_with(workspace: WorkspaceFacts, allow_network: bool) -> InitPlan {
    plan_with_layout(layout(), workspace, allow_network)
}

fn plan_with_layout(
    layout: HostLayout,
    workspace: WorkspaceFacts,
    allow_network: bool,
) -> InitPlan {
    plan_for_root(layout, workspace, allow_network, false)
}

fn plan_for_root(
    layout: HostLayout,
    workspace: WorkspaceFacts,
    allow_network: bool,
    prepared_root: bool,
) -> InitPlan {
    let host = facts();
    let step_env: BTreeMap<String, String> = [
        ("FOO".to_string(), "bar".to_string()),
        ("PATH".to_string(), "/x".to_string()),
    ]
    .into();
    let host_env: BTreeMap<String, String> = [
        ("TERM".to_string(), "xterm".to_string()),
        ("AWS_SECRET_ACCESS_KEY".to_string(), "s3cr3t".to_string()),
        ("HOME".to_string(), "/root".to_string()),
    ]
    .into();
    let argv = vec!["echo".to_string(), "hi".to_string()];
    compile(&PlanInput {
        home: None,
        stdin: false,
        git_common: None,
        layout: &layout,
        workspace,
        host: &host,
        allow_network,
        tmp_bytes: 1 << 20,
        volumes: &[],
        argv: &argv,
        cwd: None,
        step_env: &step_env,
        host_env: &host_env,
        egress_etc: None,
        seccomp: vec![],
        prepared_root,
    })
}

fn binds(plan: &InitPlan) -> Vec<(&Path, &Path, MountAttrs)> {
    plan.mounts
        .iter()
        .filter_map(|m| match m {
            MountOp::Bind {
                source,
                path,
                attrs,
                ..
            } => Some((source.as_path(), path.as_path(), *attrs)),
            _ => None,
        })
        .collect()
}

#[test]
fn system_dirs_are_read_only_and_symlinks_recreated() {
    let plan = plan_with(WorkspaceFacts::default(), false);
    let b = binds(&plan);
    assert!(b.contains(&(Path::new("/usr"), Path::new("/usr"), MountAttrs::RO)));
    assert!(b.contains(&(Path::new("/lib64"), Path::new("/lib64"), MountAttrs::RO)));
    assert!(!b.iter().any(|(s, _, _)| *s == Path::new("/bin")));
    assert!(plan.mounts.contains(&MountOp::Symlink {
        path: p("/bin"),
        target: p("usr/bin")
    }));
}

#[test]
fn etc_is_filtered_and_secrets_never_bound() {
    let plan = plan_with(WorkspaceFacts::default(), false);
    let mut sources: Vec<&Path> = binds(&plan).iter().map(|(s, _, _)| *s).collect();
    sources.extend(plan.mounts.iter().filter_map(|m| match m {
        MountOp::CopyFile { source, .. } => Some(source.as_path()),
        _ => None,
    }));
    assert!(sources.contains(&Path::new("/etc/passwd")));
    assert!(sources.contains(&Path::new("/etc/ssl")));
    for secret in [
        "/etc/shadow",
        "/etc",
        "/root",
        "/home",
        "/home/u",
        "/",
        "/etc/sudoers",
    ] {
        assert!(!sources.contains(&Path::new(secret)), "{secret} bound");
    }
    assert!(!ETC_ALLOWLIST.contains(&"shadow"));
    assert!(!ETC_ALLOWLIST.contains(&"gshadow"));
    // Only the project (as overlay lower layer), the request dir and our state are
    // visible from the project's tree.
    assert!(!sources.iter().any(|s| s.starts_with("/home/u/project")
        && !s.starts_with("/home/u/project/.smithers/sandboxes/r/s/request")));
}

#[test]
fn dev_is_minimal() {
    let plan = plan_with(WorkspaceFacts::default(), false);
    let dev: Vec<&Path> = binds(&plan)
        .iter()
        .filter(|(_, t, _)| t.starts_with("/dev"))
        .map(|(_, t, _)| *t)
        .collect();
    assert_eq!(dev, vec![Path::new("/dev/null"), Path::new("/dev/urandom")]);
    for (_, t, attrs) in binds(&plan) {
        if t.starts_with("/dev") {
            assert!(!attrs.nodev);
        } else {
            assert!(attrs.nodev, "{} allows devices", t.display());
        }
    }
}

#[test]
fn workspace_is_an_overlay_with_state_hidden_and_git_writable_in_it() {
    let plan = plan_with(WorkspaceFacts { has_git_dir: true }, false);
    let overlay = plan
        .mounts
        .iter()
        .position(|m| matches!(m, MountOp::Overlay { path, .. } if path == Path::new("/workspace")))
        .expect("overlay");
    // `.git` is part of the copy-on-write view (the step may commit): no mount over it,
    // and none over `.smithers` either (absent from the view, not masked).
    assert!(!plan.mounts.iter().any(|m| matches!(m,
        MountOp::Rebind { path, .. } | MountOp::Bind { path, .. } | MountOp::Tmpfs { path, .. }
            if path.starts_with("/workspace/.git") || path.starts_with("/workspace/.smithers"))));
    // upper/work are not inside the project; `.smithers` is whited out in the upper.
    let MountOp::Overlay {
        lower,
        upper,
        work,
        hide,
        ..
    } = &plan.mounts[overlay]
    else {
        unreachable!()
    };
    assert!(!upper.starts_with(lower) && !work.starts_with(lower));
    assert_eq!(hide, &vec![".smithers".to_string()]);
}

#[test]
fn copy_mode_binds_the_copy_and_the_host_git_read_only() {
    let copy = p("/state/s1/layer/copy");
    let plan = plan_with_layout(
        HostLayout {
            workspace_copy: Some(copy.clone()),
            ..layout()
        },
        WorkspaceFacts { has_git_dir: true },
        false,
    );
    assert!(!plan
        .mounts
        .iter()
        .any(|m| matches!(m, MountOp::Overlay { .. })));
    let ws = plan
        .mounts
        .iter()
        .position(|m| {
            matches!(m, MountOp::Bind { source, path, attrs, optional: false, .. }
                if source == &copy && path == Path::new("/workspace") && !attrs.readonly && attrs.nosuid && attrs.nodev)
        })
        .expect("the copy bound read-write at /workspace");
    // The copy holds no `.smithers`: nothing is mounted for it.
    assert!(!plan.mounts.iter().any(|m| matches!(m,
        MountOp::Rebind { path, .. } | MountOp::Bind { path, .. } | MountOp::Tmpfs { path, .. }
            if path.starts_with("/workspace/.smithers"))));
    let git = plan
        .mounts
        .iter()
        .position(|m| {
            matches!(m, MountOp::Bind { source, path, attrs, .. }
                if source == Path::new("/home/u/project/.git") && path == Path::new("/workspace/.git") && attrs.readonly)
        })
        .expect("the host's .git bound read-only");
    assert!(ws < git);
}

#[test]
fn root_is_made_read_only_last() {
    let plan = plan_with(WorkspaceFacts::default(), false);
    assert_eq!(
        plan.mounts.last(),
        Some(&MountOp::Setattr {
            path: p("/"),
            attrs: MountAttrs::RO
        })
    );
}

#[test]
fn a_prepared_root_holds_what_the_tmpfs_root_is_built_with() {
    let tmpfs = plan_with(WorkspaceFacts::default(), false);
    let prepared = plan_for_root(layout(), WorkspaceFacts::default(), false, true);
    // The only difference: /dev is no tmpfs of its own (and so needs no read-only
    // remount); it is read-only with the root.
    let without_dev_mount: Vec<MountOp> = tmpfs
        .mounts
        .iter()
        .filter(|m| {
            !matches!(m, MountOp::Tmpfs { path, .. } | MountOp::Setattr { path, .. }
                if path == Path::new("/dev"))
        })
        .cloned()
        .collect();
    assert_eq!(prepared.mounts, without_dev_mount);
    assert_eq!(prepared.mounts.last(), tmpfs.mounts.last());

    let (files, mounts) = split_prepared(prepared.mounts.clone());
    assert!(files
        .iter()
        .any(|m| matches!(m, MountOp::CopyFile { path, .. } if path == Path::new("/etc/passwd"))));
    assert!(mounts.iter().any(|m| matches!(m, MountOp::Overlay { .. })));
    // Nothing the init mounts lies at or below a symlink or a copied file of the prepared
    // root: making its mount point would fail there, or go through the link.
    let leaves: Vec<&Path> = files
        .iter()
        .filter_map(|m| match m {
            MountOp::Symlink { path, .. } | MountOp::CopyFile { path, .. } => Some(&**path),
            _ => None,
        })
        .collect();
    assert!(leaves.contains(&Path::new("/bin")), "{leaves:?}");
    for m in &mounts {
        if let Some((path, kind, _)) = m.mount_point() {
            assert!(
                !leaves.iter().any(|leaf| path.starts_with(leaf)),
                "{} is at or below a link or a copied file",
                path.display()
            );
            assert!(path.is_absolute() && path != Path::new("/"));
            if path.starts_with("/dev") {
                assert!(
                    kind == TargetKind::File
                        || path == Path::new("/dev/pts")
                        || path == Path::new("/dev/shm")
                );
            }
        }
    }
}

#[test]
fn environment_is_an_allowlist() {
    let plan = plan_with(WorkspaceFacts::default(), false);
    let env = &plan.exec.env;
    assert!(env.contains(&"FOO=bar".to_string()));
    assert!(env.contains(&"TERM=xterm".to_string()));
    assert!(env.contains(&"HOME=/home/sandbox".to_string()));
    assert!(env.contains(&"PATH=/x".to_string()));
    assert_eq!(plan.exec.search_path, "/x");
    assert!(env.contains(&format!(
        "SMITHERS_SANDBOX_REQUEST_PATH={}",
        paths::REQUEST_FILE
    )));
    assert!(!env
        .iter()
        .any(|e| e.contains("s3cr3t") || e == "HOME=/root"));
    assert_eq!(plan.exec.cwd, p("/workspace"));
}

#[test]
fn step_env_cannot_override_sandbox_paths() {
    let mut step_env = BTreeMap::new();
    step_env.insert(
        "SMITHERS_SANDBOX_RESULT_PATH".to_string(),
        "/etc/passwd".to_string(),
    );
    let env = environment(&step_env, &BTreeMap::new());
    assert_eq!(env["SMITHERS_SANDBOX_RESULT_PATH"], paths::RESULT_FILE);
}

#[test]
fn network_is_the_namespace_and_landlock_scopes_only_files() {
    let closed = plan_with(WorkspaceFacts::default(), false);
    assert!(Prelude::new(1000, 1000, CgroupJoin::default(), false).unshare_net);
    let open = plan_with(WorkspaceFacts::default(), true);
    assert!(!Prelude::new(1000, 1000, CgroupJoin::default(), true).unshare_net);
    // Without the network the boundary is the namespace: no Landlock network rule, which
    // would deny TCP on the sandbox's own loopback.
    for plan in [&closed, &open] {
        let ruleset = serde_json::to_value(&plan.landlock).unwrap().to_string();
        assert!(!ruleset.to_ascii_lowercase().contains("tcp"), "{ruleset}");
    }
    assert_eq!(closed.landlock, open.landlock);
    for dir in ["/workspace", "/result", "/tmp"] {
        assert!(closed.landlock.write_dirs.contains(&p(dir)));
    }
    assert!(!closed.landlock.write_dirs.contains(&p("/etc")));
    assert!(!closed.landlock.write_dirs.contains(&p("/")));
}

#[test]
fn plan_round_trips_as_json() {
    let plan = plan_with(WorkspaceFacts::default(), false);
    let text = serde_json::to_string(&plan).unwrap();
    assert!(!text.contains('\n'), "the plan travels as one line");
    let back: InitPlan = serde_json::from_str(&text).unwrap();
    assert_eq!(back, plan);
}
