use super::compile::*;
use super::table::*;
use super::*;
use crate::plan::BpfInstruction;

/// Runs the classic BPF subset `compile` emits on one `seccomp_data`.
fn run(program: &[BpfInstruction], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
    let mut data = Vec::new();
    data.extend(nr.to_ne_bytes());
    data.extend(arch.to_ne_bytes());
    data.extend(0u64.to_ne_bytes()); // instruction pointer
    for a in args {
        data.extend(a.to_ne_bytes());
    }
    let (mut pc, mut acc) = (0usize, 0u32);
    loop {
        let (code, jt, jf, k) = program[pc];
        pc += 1;
        let jump = |taken: bool| if taken { jt as usize } else { jf as usize };
        match code {
            LD_W_ABS => {
                let at = k as usize;
                acc = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
            }
            AND_K => acc &= k,
            JA => pc += k as usize,
            JEQ_K => pc += jump(acc == k),
            JGE_K => pc += jump(acc >= k),
            JSET_K => pc += jump(acc & k != 0),
            RET_K => return k,
            other => panic!("unexpected opcode {other:#x}"),
        }
    }
}

fn names(list: &[(&'static str, i64)]) -> Vec<&'static str> {
    list.iter().map(|(n, _)| *n).collect()
}

#[test]
fn the_lists_name_what_they_must() {
    let denied = names(&denied_syscalls());
    for required in [
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "ptrace",
        "bpf",
        "keyctl",
        "add_key",
        "request_key",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "unshare",
        "setns",
        "perf_event_open",
        "userfaultfd",
        "open_by_handle_at",
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "quotactl",
        "fsopen",
        "open_tree",
        "move_mount",
        "mount_setattr",
        "io_uring_setup",
        "io_uring_enter",
        "process_vm_readv",
        "pidfd_getfd",
    ] {
        assert!(denied.contains(&required), "{required} not denied");
    }
    let allowed = names(&allowed_syscalls());
    for essential in [
        "read",
        "write",
        "openat",
        "close",
        "execve",
        "exit_group",
        "clone",
        "wait4",
        "futex",
        "mmap",
        "rt_sigreturn",
        "restart_syscall",
        "epoll_pwait",
        "statx",
        "getdents64",
        "socket",
        "socketpair",
        "ioctl",
        "prctl",
        "seccomp",
        "rseq",
        "pidfd_open",
        "close_range",
        "openat2",
        "memfd_create",
        "copy_file_range",
    ] {
        assert!(allowed.contains(&essential), "{essential} not allowed");
    }
    // The names are the constants' names (the macro cuts `SYS_`).
    assert!(allowed
        .iter()
        .all(|n| !n.starts_with("SYS_") && !n.is_empty()));
    // Hundreds of calls, each number once (table() checks it).
    assert!(allowed.len() > 250, "{}", allowed.len());
    table().expect("each number listed once");
}

#[test]
fn each_number_gets_its_listed_verdict_and_the_rest_are_refused() {
    let prog = &compile().expect("compile");
    let arch = audit_arch().unwrap();
    let allowed: Vec<u32> = allowed_syscalls().iter().map(|e| e.1 as u32).collect();
    let checked: Vec<u32> = checked().iter().map(|e| e.1 as u32).collect();
    for nr in 0..2048u32 {
        let got = run(prog, arch, nr, [0; 6]);
        let want = if nr == nr::SYS_clone3 as u32 || nr > NEWEST_KNOWN {
            errno(libc::ENOSYS)
        } else if allowed.contains(&nr) {
            RET_ALLOW
        } else {
            errno(libc::EPERM)
        };
        // With all-zero arguments every checked call is allowed except socket(AF_UNSPEC).
        let want = if nr == nr::SYS_socket as u32 || nr == nr::SYS_socketpair as u32 {
            errno(libc::EAFNOSUPPORT)
        } else {
            want
        };
        assert_eq!(
            got,
            want,
            "syscall {nr} (checked: {})",
            checked.contains(&nr)
        );
    }
    for (name, nr) in denied_syscalls() {
        assert_eq!(
            run(prog, arch, nr as u32, [0; 6]),
            errno(libc::EPERM),
            "{name}"
        );
    }
    // Far above the list, and the largest number: ENOSYS.
    assert_eq!(run(prog, arch, 0x3fff_ffff, [0; 6]), errno(libc::ENOSYS));
    #[cfg(target_arch = "x86_64")]
    for nr in [X32_SYSCALL_BIT, X32_SYSCALL_BIT | 1, u32::MAX] {
        assert_eq!(
            run(prog, arch, nr, [0; 6]),
            errno(libc::EPERM),
            "x32 {nr:#x}"
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    assert_eq!(run(prog, arch, u32::MAX, [0; 6]), errno(libc::ENOSYS));
    // Another architecture's calls kill the process.
    assert_eq!(run(prog, 0x4000_0003, 0, [0; 6]), RET_KILL_PROCESS);
}

#[test]
fn the_program_is_small_and_its_search_shallow() {
    let prog = compile().unwrap();
    let runs = runs(&table().unwrap());
    // One conditional jump per level of the search, a handful of checks at the end.
    assert!(prog.len() < 512, "{} instructions", prog.len());
    assert!(runs.len() < 160, "{} runs", runs.len());
    let depth = usize::BITS - (runs.len() - 1).leading_zeros();
    println!(
        "{} instructions, {} runs, depth {depth}",
        prog.len(),
        runs.len()
    );
    assert!(depth <= 8, "depth {depth}");
}

#[test]
fn a_far_split_jumps_unconditionally() {
    // Enough runs that the lower half of the top split is over 255 instructions.
    let runs: Vec<(u32, Verdict)> = (0..400u32)
        .map(|i| {
            (
                i,
                if i % 2 == 0 {
                    Verdict::Allow
                } else {
                    Verdict::Eperm
                },
            )
        })
        .collect();
    let code = search(&runs).unwrap();
    assert!(code.iter().any(|i| i.0 == JA));
    let mut prog = vec![(LD_W_ABS, 0, 0, DATA_NR)];
    prog.extend(code);
    for nr in 0..400 {
        let want = if nr % 2 == 0 {
            RET_ALLOW
        } else {
            errno(libc::EPERM)
        };
        assert_eq!(run(&prog, 0, nr, [0; 6]), want, "{nr}");
    }
}

fn call(nr: i64, args: [u64; 6]) -> u32 {
    let prog = compile().unwrap();
    run(&prog, audit_arch().unwrap(), nr as u32, args)
}

#[test]
// The ioctl request constants are u64 on some targets and not on others.
#[allow(clippy::unnecessary_cast)]
fn clone_ioctl_and_personality_are_judged_by_their_arguments() {
    // What fork and pthread_create pass is allowed; any namespace flag is not.
    let thread_flags = (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES) as u64;
    assert_eq!(
        call(nr::SYS_clone, [thread_flags, 0, 0, 0, 0, 0]),
        RET_ALLOW
    );
    assert_eq!(
        call(nr::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
        RET_ALLOW
    );
    for flag in [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWCGROUP,
        0x80,
    ] {
        let flags = thread_flags | flag as u64;
        assert_eq!(
            call(nr::SYS_clone, [flags, 0, 0, 0, 0, 0]),
            errno(libc::EPERM),
            "clone with {flag:#x}"
        );
    }
    for request in [libc::TIOCSTI as u64, libc::TIOCLINUX as u64] {
        assert_eq!(
            call(nr::SYS_ioctl, [0, request, 0, 0, 0, 0]),
            errno(libc::EPERM)
        );
        // The kernel reads the request as 32 bits: high bits do not hide it.
        let high = request | 0xffff_0000_0000_0000;
        assert_eq!(
            call(nr::SYS_ioctl, [0, high, 0, 0, 0, 0]),
            errno(libc::EPERM)
        );
    }
    for request in [
        libc::TIOCGWINSZ as u64,
        libc::TIOCSPGRP as u64,
        libc::FIONREAD as u64,
    ] {
        assert_eq!(call(nr::SYS_ioctl, [0, request, 0, 0, 0, 0]), RET_ALLOW);
    }
    let personality = |p: u64| call(nr::SYS_personality, [p, 0, 0, 0, 0, 0]);
    for ok in [
        0,
        0xffff_ffff,
        0x0008,
        0x0002_0000,
        0x0004_0000,
        0x0002_0008,
    ] {
        assert_eq!(personality(ok), RET_ALLOW, "{ok:#x}");
    }
    // READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, another execution domain (PER_SVR4).
    for denied in [0x0040_0000, 0x0010_0000, 0x0001] {
        assert_eq!(personality(denied), errno(libc::EPERM), "{denied:#x}");
    }
    assert_eq!(call(nr::SYS_clone3, [0; 6]), errno(libc::ENOSYS));
}

#[test]
fn sockets_only_of_the_families_the_namespace_scopes() {
    let socket = |domain: i32, ty: i32, protocol: i32| {
        call(
            nr::SYS_socket,
            [domain as u64, ty as u64, protocol as u64, 0, 0, 0],
        )
    };
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    for (domain, ty, protocol) in [
        (libc::AF_UNIX, libc::SOCK_STREAM, 0),
        (libc::AF_UNIX, libc::SOCK_DGRAM | flags, 0),
        (libc::AF_UNIX, libc::SOCK_SEQPACKET, 0),
        (libc::AF_INET, libc::SOCK_STREAM, 0),
        (libc::AF_INET, libc::SOCK_STREAM | flags, libc::IPPROTO_TCP),
        (
            libc::AF_INET6,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        ),
        (libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_ICMP),
        (libc::AF_INET6, libc::SOCK_DGRAM, libc::IPPROTO_ICMPV6),
        (
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        ),
    ] {
        assert_eq!(
            socket(domain, ty, protocol),
            RET_ALLOW,
            "{domain} {ty} {protocol}"
        );
    }
    for domain in [
        libc::AF_PACKET,
        libc::AF_VSOCK,
        libc::AF_ALG,
        libc::AF_KEY,
        libc::AF_BLUETOOTH,
        libc::AF_XDP,
        libc::AF_RDS,
        libc::AF_UNSPEC,
        // A family the kernel adds later.
        200,
    ] {
        assert_eq!(
            socket(domain, libc::SOCK_STREAM, 0),
            errno(libc::EAFNOSUPPORT)
        );
        assert_eq!(socket(domain, libc::SOCK_RAW, 0), errno(libc::EAFNOSUPPORT));
    }
    for (domain, ty) in [
        (libc::AF_INET, libc::SOCK_RAW),
        (libc::AF_INET6, libc::SOCK_RAW | libc::SOCK_CLOEXEC),
        (libc::AF_INET, 10), // SOCK_PACKET, obsolete
        (libc::AF_INET, libc::SOCK_SEQPACKET),
    ] {
        assert_eq!(socket(domain, ty, 0), errno(libc::EPERM), "{domain} {ty}");
    }
    for (domain, protocol) in [
        (libc::AF_INET, libc::IPPROTO_SCTP),
        (libc::AF_INET6, libc::IPPROTO_MPTCP),
        (libc::AF_INET, libc::IPPROTO_UDPLITE),
        (libc::AF_NETLINK, libc::NETLINK_AUDIT),
        (libc::AF_NETLINK, libc::NETLINK_KOBJECT_UEVENT),
        (libc::AF_NETLINK, libc::NETLINK_GENERIC),
        (libc::AF_NETLINK, libc::NETLINK_SOCK_DIAG),
    ] {
        let ty = if domain == libc::AF_NETLINK {
            libc::SOCK_RAW
        } else {
            libc::SOCK_STREAM
        };
        assert_eq!(
            socket(domain, ty, protocol),
            errno(libc::EPROTONOSUPPORT),
            "{protocol}"
        );
    }
    // High bits do not hide a family: the kernel reads an int.
    assert_eq!(
        call(
            nr::SYS_socket,
            [libc::AF_PACKET as u64 | 1 << 32, 3, 0, 0, 0, 0]
        ),
        errno(libc::EAFNOSUPPORT)
    );
    let socketpair = |domain: i32| {
        call(
            nr::SYS_socketpair,
            [domain as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0],
        )
    };
    assert_eq!(socketpair(libc::AF_UNIX), RET_ALLOW);
    for domain in [
        libc::AF_INET,
        libc::AF_INET6,
        libc::AF_NETLINK,
        libc::AF_VSOCK,
    ] {
        assert_eq!(socketpair(domain), errno(libc::EAFNOSUPPORT));
    }
}

#[test]
fn summary_counts_the_list() {
    let s = summary();
    assert!(s.starts_with(&format!(
        "allow-list of {} syscalls",
        allowed_syscalls().len()
    )));
    assert!(s.contains("unix, inet and inet6"));
    println!("{s}");
}
