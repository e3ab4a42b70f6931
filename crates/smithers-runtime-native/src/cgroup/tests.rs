use super::detect::top_level_parent;
use super::sandbox::read_key;
use super::*;

const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
const HYBRID_OWN: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
";

#[test]
fn hybrid_host_uses_v1_controllers_under_own_cgroup() {
    let host = CgroupHost::parse(HYBRID_MOUNTINFO, HYBRID_OWN);
    assert_eq!(
        host.v1.get("memory"),
        Some(&PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
    );
    assert_eq!(
        host.v1.get("pids"),
        Some(&PathBuf::from("/sys/fs/cgroup/pids/"))
    );
    assert_eq!(host.v2, Some(PathBuf::from("/sys/fs/cgroup/unified/")));
    assert!(matches!(host.source("cpu"), Some(ControllerSource::V1(_))));
}

#[test]
fn comounted_cpu_cpuacct() {
    let mi = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
    let own = "3:cpuacct,cpu:/user.slice\n";
    let host = CgroupHost::parse(mi, own);
    assert_eq!(
        host.v1.get("cpu"),
        Some(&PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/user.slice"))
    );
    assert_eq!(host.v1.get("cpu"), host.v1.get("cpuacct"));
}

#[test]
fn pure_v2_host() {
    let mi = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
    let own = "0::/user.slice/user-1000.slice/session-2.scope\n";
    let mut host = CgroupHost::parse(mi, own);
    assert!(host.v1.is_empty());
    assert_eq!(
        host.v2,
        Some(PathBuf::from(
            "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"
        ))
    );
    assert_eq!(host.source("memory"), None);
    host.v2_controllers = ["memory", "pids", "cpu"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert!(matches!(
        host.source("memory"),
        Some(ControllerSource::V2(_))
    ));
    assert!(matches!(
        host.source("cpuacct"),
        Some(ControllerSource::V2(_))
    ));
}

#[test]
fn cgroup_namespace_root_hides_own_path() {
    // Inside a container the mount root is our own cgroup.
    let mi = "30 23 0:26 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
    let own = "4:memory:/docker/abc/sub\n";
    let host = CgroupHost::parse(mi, own);
    assert_eq!(
        host.v1.get("memory"),
        Some(&PathBuf::from("/sys/fs/cgroup/memory/sub"))
    );
}

#[test]
fn the_v2_mount_is_kept_for_the_top_level_parent() {
    let mi = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
    let own = "0::/system.slice/shared.service\n";
    let host = CgroupHost::parse(mi, own);
    assert_eq!(host.v2_mount, Some(PathBuf::from("/sys/fs/cgroup")));
    // A hybrid host's v2 tree is found too (where it is mounted).
    let host = CgroupHost::parse(HYBRID_MOUNTINFO, HYBRID_OWN);
    assert_eq!(host.v2_mount, Some(PathBuf::from("/sys/fs/cgroup/unified")));
}

#[test]
fn fixes_name_systemd_only_where_it_runs() {
    for root in [true, false] {
        assert!(delegate_fix_for(true, root).contains("systemd-run"));
        assert!(busy_fix_for(true, root, Path::new("/x")).contains("systemd-run"));
        let fix = delegate_fix_for(false, root);
        assert!(
            !fix.contains("systemd-run") && fix.contains("no systemd"),
            "{fix}"
        );
        let busy = busy_fix_for(false, root, Path::new("/sys/fs/cgroup/a.service"));
        assert!(
            !busy.contains("systemd-run") && busy.contains("no systemd"),
            "{busy}"
        );
    }
    assert!(delegate_fix_for(false, true).contains(TOP_LEVEL_DIR));
    assert!(delegate_fix_for(false, false).contains("chown"));
}

/// On a directory tree standing in for the hierarchy (plain files: the kernel's own
/// semantics, a write of `+memory` adding to the set, are not there), the parent is made
/// at the top and what its `cgroup.subtree_control` holds is what its children get.
#[test]
fn the_top_level_parent_is_made_at_the_top() {
    let top = tempfile::tempdir().unwrap();
    std::fs::write(
        top.path().join("cgroup.controllers"),
        "cpu memory pids io\n",
    )
    .unwrap();
    std::fs::write(
        top.path().join("cgroup.subtree_control"),
        "cpu memory pids\n",
    )
    .unwrap();
    let parent = top.path().join(TOP_LEVEL_DIR);
    std::fs::create_dir(&parent).unwrap();
    std::fs::write(parent.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
    std::fs::write(parent.join("cgroup.subtree_control"), "memory pids cpu\n").unwrap();
    let (made, enabled) = top_level_parent(top.path(), &["memory", "pids", "cpu"]).unwrap();
    assert_eq!(made, parent);
    assert_eq!(
        enabled.into_iter().collect::<Vec<_>>(),
        ["cpu", "memory", "pids"]
    );
    // Idempotent: a second runtime shares the directory.
    assert!(top_level_parent(top.path(), &["memory"]).is_ok());
}

#[test]
fn key_value_files() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("memory.oom_control");
    std::fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").unwrap();
    assert_eq!(read_key(&f, "oom_kill"), Some(2));
    assert_eq!(read_key(&f, "missing"), None);
}
