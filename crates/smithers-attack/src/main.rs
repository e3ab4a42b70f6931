//! `smithers-attack`: the hostile half of the containment suite
//! (`smithers_test_support::containment`).
//!
//! It runs INSIDE a sandbox and tries what security.md says must fail: reaching the network,
//! writing outside the workspace, reading host secrets, signalling host processes, gaining
//! privileges, exhausting resources, outliving the sandbox, touching devices. Each attempt
//! prints exactly one JSON line on stdout:
//!
//! ```text
//! {"attempt":"connect-tcp","ok":false,"errno":111,"error":"Connection refused", ...}
//! ```
//!
//! `ok` always means "the attack got through" (so a contained sandbox prints `"ok":false`);
//! `errno` is the OS error of the failed step, or `null`. Several attempts can run in one
//! process, separated by a lone `+`:
//!
//! ```text
//! smithers-attack read-file /etc/shadow + open-device /dev/mem + unshare user
//! ```
//!
//! The tool only ever targets loopback addresses it is given (UDP route checks send nothing;
//! `resolve` runs only where no route exists), and every attempt that could
//! succeed undoes itself (an accidental tmpfs mount is unmounted, a bpf map closed, a traced
//! process detached), so running it on an unconfined host does no lasting damage.
//!
//! It is linked statically, as every binary of the workspace is (`.cargo/config.toml`), so it
//! runs in images without glibc (busybox) as it is; `resolve`'s `getaddrinfo` then reads the
//! image's `/etc/nsswitch.conf` and hosts files through glibc's built-in `files` and `dns`.

use std::ffi::CString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde_json::{json, Map, Value};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args[0] == "--help" || args[0] == "-h" {
        eprintln!("usage: smithers-attack ATTEMPT [ARGS...] [+ ATTEMPT [ARGS...]]...");
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    let mut status = 0;
    for attempt in args.split(|a| a == "+") {
        if attempt.is_empty() {
            continue;
        }
        let line = run(attempt);
        if line.get("usage").is_some() {
            status = 2;
        }
        emit(&line);
    }
    std::process::exit(status);
}

const USAGE: &str = "attempts: connect-tcp HOST PORT | udp-route ADDR PORT | net-info | \
resolve NAME | write-file PATH CONTENT | append-file PATH CONTENT | open-write PATH | read-file PATH [NEEDLE] | list-dir PATH | \
stat PATH | kill PID SIGNAL | find-proc MARKER (needles may be given as rev:REVERSED) | status | mount-tmpfs DIR | unshare KIND | \
setns PATH | ptrace-parent | bpf | keyctl | init-module | setuid-root | open-device PATH | \
mknod PATH MAJOR MINOR | fork-bomb MAX | memory-hog MIB | fill-disk PATH MIB | \
flood BYTES stdout|stderr | daemonize MARKER SECONDS | sleep MARKER SECONDS | \
deep-json PATH DEPTH | big-result PATH BYTES | many-files DIR COUNT | symlink TARGET LINK | env";

fn emit(line: &Value) {
    let mut out = io::stdout().lock();
    // Ignore write errors: a closed or capped stdout is itself a legitimate outcome.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Builds one result line.
fn report(attempt: &str, ok: bool, err: Option<&io::Error>, extra: Value) -> Value {
    let mut map = Map::new();
    map.insert("attempt".into(), json!(attempt));
    map.insert("ok".into(), json!(ok));
    map.insert("errno".into(), json!(err.and_then(io::Error::raw_os_error)));
    if let Some(e) = err {
        map.insert("error".into(), json!(e.to_string()));
    }
    if let Value::Object(extra) = extra {
        map.extend(extra);
    }
    Value::Object(map)
}

/// A result from a call that returns -1 and sets errno on failure.
fn check(ret: libc::c_long) -> Result<libc::c_long, io::Error> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap_or_else(|_| CString::new("invalid").unwrap_or_default())
}

fn usage(attempt: &str) -> Value {
    json!({"attempt": attempt, "ok": false, "errno": null, "usage": USAGE})
}

fn arg(a: &[String], i: usize) -> Option<&str> {
    a.get(i).map(String::as_str)
}

fn run(a: &[String]) -> Value {
    let name = a[0].as_str();
    let r = match name {
        "connect-tcp" => arg(a, 1).zip(arg(a, 2)).map(|(h, p)| connect_tcp(h, p)),
        "udp-route" => arg(a, 1).zip(arg(a, 2)).map(|(h, p)| udp_route(h, p)),
        "net-info" => Some(net_info()),
        "resolve" => arg(a, 1).map(resolve),
        "write-file" => arg(a, 1)
            .zip(arg(a, 2))
            .map(|(p, c)| write_file(name, p, c, false)),
        "append-file" => arg(a, 1)
            .zip(arg(a, 2))
            .map(|(p, c)| write_file(name, p, c, true)),
        "open-write" => arg(a, 1).map(open_write),
        "read-file" => arg(a, 1).map(|p| read_file(p, arg(a, 2).map(needle).as_deref())),
        "list-dir" => arg(a, 1).map(list_dir),
        "stat" => arg(a, 1).map(stat),
        "kill" => arg(a, 1).zip(arg(a, 2)).map(|(p, s)| kill(p, s)),
        "find-proc" => arg(a, 1).map(|m| find_proc(&needle(m))),
        "status" => Some(status()),
        "mount-tmpfs" => arg(a, 1).map(mount_tmpfs),
        "unshare" => arg(a, 1).map(unshare),
        "setns" => arg(a, 1).map(setns),
        "ptrace-parent" => Some(ptrace_parent()),
        "bpf" => Some(bpf()),
        "keyctl" => Some(keyctl()),
        "init-module" => Some(init_module()),
        "setuid-root" => Some(setuid_root()),
        "open-device" => arg(a, 1).map(open_device),
        "mknod" => match (arg(a, 1), arg(a, 2), arg(a, 3)) {
            (Some(p), Some(ma), Some(mi)) => Some(mknod(p, ma, mi)),
            _ => None,
        },
        "fork-bomb" => arg(a, 1).and_then(|m| m.parse().ok()).map(fork_bomb),
        "memory-hog" => arg(a, 1).and_then(|m| m.parse().ok()).map(memory_hog),
        "fill-disk" => arg(a, 1)
            .zip(arg(a, 2).and_then(|m| m.parse().ok()))
            .map(|(p, m)| fill_disk(p, m)),
        "flood" => arg(a, 1)
            .and_then(|b| b.parse().ok())
            .zip(arg(a, 2))
            .map(|(b, s)| flood(b, s)),
        "daemonize" => arg(a, 2).and_then(|s| s.parse().ok()).map(daemonize),
        "sleep" => arg(a, 2).and_then(|s| s.parse().ok()).map(sleep),
        "deep-json" => arg(a, 1)
            .zip(arg(a, 2).and_then(|d| d.parse().ok()))
            .map(|(p, d)| deep_json(p, d)),
        "big-result" => arg(a, 1)
            .zip(arg(a, 2).and_then(|d| d.parse().ok()))
            .map(|(p, n)| big_result(p, n)),
        "many-files" => arg(a, 1)
            .zip(arg(a, 2).and_then(|d| d.parse().ok()))
            .map(|(p, n)| many_files(p, n)),
        "symlink" => arg(a, 1).zip(arg(a, 2)).map(|(t, l)| symlink(t, l)),
        "env" => Some(env()),
        _ => None,
    };
    r.unwrap_or_else(|| usage(name))
}

/// A needle given as `rev:<reversed text>` is reversed first, so the text searched for does not
/// appear literally in the argv of this process (or of a sandbox init that carries our argv).
fn needle(arg: &str) -> String {
    match arg.strip_prefix("rev:") {
        Some(r) => r.chars().rev().collect(),
        None => arg.to_string(),
    }
}

fn connect_tcp(host: &str, port: &str) -> Value {
    let target = format!("{host}:{port}");
    // Only literal addresses: resolving a name could send a DNS query off the machine.
    let addr: std::net::SocketAddr = match target.parse() {
        Ok(a) => a,
        Err(_) => return usage("connect-tcp"),
    };
    let r = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5));
    match r {
        Ok(_) => report("connect-tcp", true, None, json!({"target": target})),
        Err(e) => report("connect-tcp", false, Some(&e), json!({"target": target})),
    }
}

/// `connect()` on a UDP socket only looks up a route; no packet leaves. So a success here
/// proves a route exists without sending any traffic to the (TEST-NET) address.
fn udp_route(host: &str, port: &str) -> Value {
    let target = format!("{host}:{port}");
    let addr: std::net::SocketAddr = match target.parse() {
        Ok(a) => a,
        Err(_) => return usage("udp-route"),
    };
    let bind = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let r = std::net::UdpSocket::bind(bind).and_then(|s| s.connect(addr));
    match r {
        Ok(()) => report("udp-route", true, None, json!({"target": target})),
        Err(e) => report("udp-route", false, Some(&e), json!({"target": target})),
    }
}

/// Interfaces other than `lo` and routing entries: `ok` when the sandbox has any way out.
fn net_info() -> Value {
    let mut interfaces = Vec::new();
    if let Ok(text) = std::fs::read_to_string("/proc/net/dev") {
        for line in text.lines().skip(2) {
            if let Some((name, _)) = line.split_once(':') {
                interfaces.push(name.trim().to_string());
            }
        }
    }
    let mut routes = Vec::new();
    if let Ok(text) = std::fs::read_to_string("/proc/net/route") {
        routes.extend(text.lines().skip(1).map(|l| l.to_string()));
    }
    if let Ok(text) = std::fs::read_to_string("/proc/net/ipv6_route") {
        routes.extend(
            text.lines()
                .filter(|l| !l.trim_end().ends_with(" lo"))
                .map(|l| l.to_string()),
        );
    }
    let outside = interfaces.iter().any(|i| i != "lo") || !routes.is_empty();
    report(
        "net-info",
        outside,
        None,
        json!({"interfaces": interfaces, "routes": routes}),
    )
}

/// Resolves `name` with the system resolver, but only where the sandbox has no interface but
/// `lo` and no route: then no query can leave the machine, whatever the resolver is configured
/// to ask. Elsewhere the attempt refuses to run (`"skipped": true`, `ok` true: a way out exists).
fn resolve(name: &str) -> Value {
    let info = net_info();
    if info["ok"] == true {
        return report(
            "resolve",
            true,
            None,
            json!({"name": name, "skipped": true, "reason": "a route exists; not sending a query"}),
        );
    }
    let host = cstr(name);
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: host is a valid C string, hints may be null, res is a valid out pointer; the
    // list returned is freed below exactly once.
    let rc =
        unsafe { libc::getaddrinfo(host.as_ptr(), std::ptr::null(), std::ptr::null(), &mut res) };
    if rc == 0 {
        // SAFETY: res was set by a successful getaddrinfo.
        unsafe { libc::freeaddrinfo(res) };
    }
    report(
        "resolve",
        rc == 0,
        None,
        json!({"name": name, "gai_error": rc}),
    )
}

fn write_file(attempt: &str, path: &str, content: &str, append: bool) -> Value {
    let r = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .and_then(|mut f| f.write_all(content.as_bytes()));
    match r {
        Ok(()) => report(attempt, true, None, json!({"path": path})),
        Err(e) => report(attempt, false, Some(&e), json!({"path": path})),
    }
}

/// Opens an existing file for appending and writes nothing: proves write access to a file
/// (e.g. /etc/passwd) without damaging it if the sandbox fails to protect it.
fn open_write(path: &str) -> Value {
    let r = std::fs::OpenOptions::new().append(true).open(path);
    match r {
        Ok(_) => report("open-write", true, None, json!({"path": path})),
        Err(e) => report("open-write", false, Some(&e), json!({"path": path})),
    }
}

fn read_file(path: &str, needle: Option<&str>) -> Value {
    match std::fs::read(path) {
        Ok(bytes) => {
            let contains =
                needle.map(|n| !n.is_empty() && bytes.windows(n.len()).any(|w| w == n.as_bytes()));
            report(
                "read-file",
                true,
                None,
                json!({"path": path, "bytes": bytes.len(), "contains_needle": contains}),
            )
        }
        Err(e) => report("read-file", false, Some(&e), json!({"path": path})),
    }
}

fn list_dir(path: &str) -> Value {
    match std::fs::read_dir(path) {
        Ok(entries) => {
            let names: Vec<String> = entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .take(1000)
                .collect();
            report(
                "list-dir",
                true,
                None,
                json!({"path": path, "entries": names}),
            )
        }
        Err(e) => report("list-dir", false, Some(&e), json!({"path": path})),
    }
}

fn stat(path: &str) -> Value {
    match std::fs::symlink_metadata(path) {
        Ok(m) => report(
            "stat",
            true,
            None,
            json!({"path": path, "is_dir": m.is_dir(), "len": m.len()}),
        ),
        Err(e) => report("stat", false, Some(&e), json!({"path": path})),
    }
}

fn kill(pid: &str, signal: &str) -> Value {
    let (Ok(pid), Ok(sig)) = (pid.parse::<libc::pid_t>(), signal.parse::<libc::c_int>()) else {
        return usage("kill");
    };
    if pid <= 0 {
        // kill(0)/kill(-1) would signal whole groups: never what a probe means.
        return usage("kill");
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    let r = check(unsafe { libc::kill(pid, sig) } as libc::c_long);
    match r {
        Ok(_) => report("kill", true, None, json!({"pid": pid, "signal": sig})),
        Err(e) => report("kill", false, Some(&e), json!({"pid": pid, "signal": sig})),
    }
}

/// Pids whose command line contains `marker`, other than this process.
fn find_proc(marker: &str) -> Value {
    let me = std::process::id().to_string();
    let mut pids = Vec::new();
    let mut seen = 0usize;
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            seen += 1;
            if name == me {
                continue;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if !marker.is_empty()
                && cmdline
                    .windows(marker.len())
                    .any(|w| w == marker.as_bytes())
            {
                pids.push(name);
            }
        }
    }
    report(
        "find-proc",
        !pids.is_empty(),
        None,
        json!({"pids": pids, "processes_visible": seen}),
    )
}

/// Capabilities, no_new_privs and seccomp mode: `ok` when the process holds any effective
/// capability or could gain privileges through a setuid binary (no_new_privs unset).
fn status() -> Value {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
            .unwrap_or_default()
    };
    let cap_eff = field("CapEff:");
    let cap_prm = field("CapPrm:");
    let cap_bnd = field("CapBnd:");
    let cap_amb = field("CapAmb:");
    let nnp = field("NoNewPrivs:");
    let seccomp = field("Seccomp:");
    let uid = field("Uid:");
    let zero = |c: &str| u64::from_str_radix(c, 16).map(|v| v == 0).unwrap_or(false);
    let privileged = !zero(&cap_eff) || !zero(&cap_prm) || !zero(&cap_amb) || nnp != "1";
    report(
        "status",
        privileged,
        None,
        json!({"cap_eff": cap_eff, "cap_prm": cap_prm, "cap_bnd": cap_bnd, "cap_amb": cap_amb,
               "no_new_privs": nnp, "seccomp": seccomp, "uid": uid}),
    )
}

fn mount_tmpfs(dir: &str) -> Value {
    let _ = std::fs::create_dir_all(dir);
    let target = cstr(dir);
    let fstype = cstr("tmpfs");
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call; data is null.
    let r = check(unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    } as libc::c_long);
    match r {
        Ok(_) => {
            // SAFETY: target is a valid C string; undoes the mount we just made.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            report("mount-tmpfs", true, None, json!({"dir": dir}))
        }
        Err(e) => report("mount-tmpfs", false, Some(&e), json!({"dir": dir})),
    }
}

fn unshare(kind: &str) -> Value {
    let flag = match kind {
        "user" => libc::CLONE_NEWUSER,
        "mount" => libc::CLONE_NEWNS,
        "net" => libc::CLONE_NEWNET,
        "pid" => libc::CLONE_NEWPID,
        "uts" => libc::CLONE_NEWUTS,
        "ipc" => libc::CLONE_NEWIPC,
        "cgroup" => libc::CLONE_NEWCGROUP,
        _ => return usage("unshare"),
    };
    // SAFETY: unshare(2) takes a flag word; this process is single-threaded, as CLONE_NEWUSER
    // requires, and it affects only this process.
    let r = check(unsafe { libc::unshare(flag) } as libc::c_long);
    let attempt = format!("unshare-{kind}");
    match r {
        Ok(_) => report(&attempt, true, None, json!({})),
        Err(e) => report(&attempt, false, Some(&e), json!({})),
    }
}

fn setns(path: &str) -> Value {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return report("setns", false, Some(&e), json!({"path": path})),
    };
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is open for the duration of the call; nstype 0 accepts any namespace.
    let r = check(unsafe { libc::setns(file.as_raw_fd(), 0) } as libc::c_long);
    match r {
        Ok(_) => report("setns", true, None, json!({"path": path})),
        Err(e) => report("setns", false, Some(&e), json!({"path": path})),
    }
}

/// PTRACE_SEIZE does not stop the tracee, and we detach at once, so even a success is harmless.
fn ptrace_parent() -> Value {
    // SAFETY: getppid(2) cannot fail and touches no memory.
    let parent = unsafe { libc::getppid() };
    // SAFETY: PTRACE_SEIZE with null addr/data reads no memory of ours.
    let r = check(unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            parent,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    });
    match r {
        Ok(_) => {
            // SAFETY: detaching the tracee we just seized; null addr/data.
            unsafe {
                libc::ptrace(
                    libc::PTRACE_DETACH,
                    parent,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                )
            };
            report("ptrace-parent", true, None, json!({"pid": parent}))
        }
        Err(e) => report("ptrace-parent", false, Some(&e), json!({"pid": parent})),
    }
}

/// BPF_MAP_CREATE of a tiny array map: needs CAP_BPF (or unprivileged bpf, off by default).
fn bpf() -> Value {
    // union bpf_attr for BPF_MAP_CREATE starts with map_type, key_size, value_size,
    // max_entries (all u32); the rest must be zero. 128 bytes covers the fields the kernel reads.
    let mut attr = [0u32; 32];
    attr[0] = 2; // BPF_MAP_TYPE_ARRAY
    attr[1] = 4;
    attr[2] = 4;
    attr[3] = 1;
    // SAFETY: attr is a valid, zero-initialised buffer of the size we pass; BPF_MAP_CREATE = 0.
    let r = check(unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0 as libc::c_long,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr) as libc::c_long,
        )
    });
    match r {
        Ok(fd) => {
            // SAFETY: fd was just returned to us by the kernel and is closed once.
            unsafe { libc::close(fd as libc::c_int) };
            report("bpf", true, None, json!({}))
        }
        Err(e) => report("bpf", false, Some(&e), json!({})),
    }
}

fn keyctl() -> Value {
    let name = cstr("smithers-attack");
    // KEYCTL_JOIN_SESSION_KEYRING = 1.
    // SAFETY: the name is a valid C string that outlives the call.
    let r = check(unsafe { libc::syscall(libc::SYS_keyctl, 1 as libc::c_long, name.as_ptr()) });
    match r {
        Ok(_) => report("keyctl", true, None, json!({})),
        Err(e) => report("keyctl", false, Some(&e), json!({})),
    }
}

/// Loads a garbage module. `ok` means the capability check was passed (the kernel then rejects
/// the garbage with ENOEXEC/EINVAL, so nothing is ever loaded).
fn init_module() -> Value {
    let image = [0u8; 64];
    let params = cstr("");
    // SAFETY: image and params are valid for the lengths passed and outlive the call.
    let r = check(unsafe {
        libc::syscall(
            libc::SYS_init_module,
            image.as_ptr(),
            image.len() as libc::c_long,
            params.as_ptr(),
        )
    });
    match r {
        Ok(_) => report("init-module", true, None, json!({})),
        Err(e) => {
            let denied = matches!(
                e.raw_os_error(),
                Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENOSYS)
            );
            report("init-module", !denied, Some(&e), json!({}))
        }
    }
}

fn setuid_root() -> Value {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    let before = unsafe { libc::geteuid() };
    // SAFETY: setresuid(2) takes plain integers.
    let r = check(unsafe { libc::setresuid(0, 0, 0) } as libc::c_long);
    // SAFETY: as above.
    let after = unsafe { libc::geteuid() };
    let gained = before != 0 && after == 0;
    report(
        "setuid-root",
        gained,
        r.as_ref().err(),
        json!({"euid_before": before, "euid_after": after}),
    )
}

fn open_device(path: &str) -> Value {
    use std::os::unix::fs::OpenOptionsExt;
    let r = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
    match r {
        Ok(_) => report("open-device", true, None, json!({"path": path})),
        Err(e) => report("open-device", false, Some(&e), json!({"path": path})),
    }
}

fn mknod(path: &str, major: &str, minor: &str) -> Value {
    let (Ok(ma), Ok(mi)) = (major.parse::<u32>(), minor.parse::<u32>()) else {
        return usage("mknod");
    };
    let p = cstr(path);
    let dev = libc::makedev(ma, mi);
    // SAFETY: p is a valid C string that outlives the call.
    let r = check(unsafe { libc::mknod(p.as_ptr(), libc::S_IFBLK | 0o600, dev) } as libc::c_long);
    match r {
        Ok(_) => {
            let opened = std::fs::File::open(path);
            let _ = std::fs::remove_file(path);
            match opened {
                Ok(_) => report("mknod", true, None, json!({"path": path, "opened": true})),
                Err(e) => report(
                    "mknod",
                    false,
                    Some(&e),
                    json!({"path": path, "created": true, "opened": false}),
                ),
            }
        }
        Err(e) => report("mknod", false, Some(&e), json!({"path": path})),
    }
}

/// Forks children that wait until killed, until fork fails or `max` is reached; then reaps
/// them. `ok` means nothing capped the bomb.
fn fork_bomb(max: u32) -> Value {
    let mut children = Vec::new();
    let mut failure = None;
    while children.len() < max as usize {
        // SAFETY: this process is single-threaded, so the child may run arbitrary code; it
        // only calls async-signal-safe pause/_exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            loop {
                // SAFETY: pause(2) just waits for a signal.
                unsafe { libc::pause() };
            }
        }
        if pid < 0 {
            failure = Some(io::Error::last_os_error());
            break;
        }
        children.push(pid);
    }
    let forked = children.len();
    for pid in &children {
        // SAFETY: each pid is a child we forked and have not reaped yet.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    for pid in &children {
        let mut st = 0;
        // SAFETY: st is a valid out pointer; pid is our unreaped child.
        unsafe { libc::waitpid(*pid, &mut st, 0) };
    }
    report(
        "fork-bomb",
        failure.is_none(),
        failure.as_ref(),
        json!({"forked": forked, "max": max}),
    )
}

/// Allocates and touches `mib` MiB. Prints only if it survives.
fn memory_hog(mib: usize) -> Value {
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for i in 0..mib {
        let mut block = vec![0u8; 1 << 20];
        // Touch every page so the memory is really committed, not just reserved.
        for page in block.chunks_mut(4096) {
            page[0] = (i & 0xff) as u8 | 1;
        }
        blocks.push(block);
    }
    let touched: usize = blocks.iter().map(|b| b[0] as usize).sum();
    report(
        "memory-hog",
        true,
        None,
        json!({"mib": mib, "checksum": touched}),
    )
}

fn fill_disk(path: &str, mib: u64) -> Value {
    let mut written: u64 = 0;
    let block = vec![b'x'; 1 << 20];
    let mut err = None;
    match std::fs::File::create(path) {
        Ok(mut f) => {
            for _ in 0..mib {
                match f.write(&block) {
                    Ok(n) => {
                        written += n as u64;
                        if n < block.len() {
                            // A short write is the filesystem being full; the next write
                            // reports why.
                            if let Err(e) = f.write_all(&block[n..]) {
                                err = Some(e);
                                break;
                            }
                            written += (block.len() - n) as u64;
                        }
                    }
                    Err(e) => {
                        err = Some(e);
                        break;
                    }
                }
            }
            if err.is_none() {
                if let Err(e) = f.sync_all() {
                    err = Some(e);
                }
            }
        }
        Err(e) => err = Some(e),
    }
    report(
        "fill-disk",
        err.is_none(),
        err.as_ref(),
        json!({"path": path, "written": written, "requested": mib << 20}),
    )
}

/// Writes `bytes` of output to one stream; the JSON line goes to the other stream (stderr
/// for a stdout flood) so it survives the cap.
fn flood(bytes: u64, stream: &str) -> Value {
    let line = [b'A'; 1023];
    let mut sent: u64 = 0;
    let mut err = None;
    {
        let mut out: Box<dyn Write> = if stream == "stderr" {
            Box::new(io::stderr().lock())
        } else {
            Box::new(io::stdout().lock())
        };
        while sent < bytes {
            let r = out.write_all(&line).and_then(|_| out.write_all(b"\n"));
            if let Err(e) = r {
                err = Some(e);
                break;
            }
            sent += 1024;
        }
        let _ = out.flush();
    }
    let v = report(
        "flood",
        err.is_none(),
        err.as_ref(),
        json!({"sent": sent, "stream": stream}),
    );
    if stream != "stderr" {
        eprintln!("{v}");
    }
    v
}

fn ignore_termination_signals() {
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT, libc::SIGQUIT] {
        // SAFETY: installing SIG_IGN for catchable signals has no memory-safety implications.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// Leaves behind two processes that try to outlive the sandbox: a background child ignoring
/// SIGTERM, and a double-forked, setsid'd grandchild (reparented away from us) ignoring
/// SIGTERM/SIGHUP. Both keep this process's argv, so the caller's marker identifies them.
fn daemonize(seconds: u32) -> Value {
    // SAFETY: single-threaded process; the child only calls async-signal-safe functions.
    let background = unsafe { libc::fork() };
    if background == 0 {
        ignore_termination_signals();
        sleep_forever(seconds);
    }
    let (read_fd, write_fd) = {
        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two ints.
        unsafe { libc::pipe(fds.as_mut_ptr()) };
        (fds[0], fds[1])
    };
    // SAFETY: as above.
    let first = unsafe { libc::fork() };
    if first == 0 {
        // SAFETY: setsid/fork/write/_exit are async-signal-safe; write_fd is a valid pipe end.
        unsafe {
            libc::setsid();
            let grandchild = libc::fork();
            if grandchild == 0 {
                ignore_termination_signals();
                libc::close(write_fd);
                libc::close(read_fd);
                sleep_forever(seconds);
            }
            let bytes = grandchild.to_ne_bytes();
            libc::write(write_fd, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(0);
        }
    }
    let mut buf = [0u8; 4];
    // SAFETY: buf is valid for 4 bytes; read_fd is our pipe end.
    unsafe {
        libc::close(write_fd);
        libc::read(read_fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(read_fd);
    }
    let daemon = i32::from_ne_bytes(buf);
    let mut st = 0;
    // SAFETY: first is our child; st a valid out pointer.
    unsafe { libc::waitpid(first, &mut st, 0) };
    report(
        "daemonize",
        background > 0 && daemon > 0,
        None,
        json!({"background": background, "daemon": daemon}),
    )
}

fn sleep_forever(seconds: u32) -> ! {
    let mut left = seconds;
    while left > 0 {
        // SAFETY: sleep(3) touches no memory of ours.
        left = unsafe { libc::sleep(left) };
    }
    // SAFETY: _exit(2) never returns.
    unsafe { libc::_exit(0) }
}

/// Prints a ready line, then sleeps ignoring SIGTERM (only SIGKILL or a dying namespace ends it).
fn sleep(seconds: u32) -> Value {
    ignore_termination_signals();
    emit(&report(
        "sleep",
        true,
        None,
        json!({"ready": true, "pid": std::process::id()}),
    ));
    sleep_forever(seconds)
}

fn write_out(path: &str, data: &[u8]) -> io::Result<()> {
    if path == "-" {
        let mut out = io::stdout().lock();
        out.write_all(data)?;
        out.write_all(b"\n")?;
        out.flush()
    } else {
        std::fs::write(path, data)
    }
}

/// `{"status":"finished","outputs":[[[...]]]}` nested `depth` arrays deep.
fn deep_json(path: &str, depth: usize) -> Value {
    let mut s = String::with_capacity(depth * 2 + 64);
    s.push_str("{\"status\":\"finished\",\"outputs\":");
    s.extend(std::iter::repeat_n('[', depth));
    s.extend(std::iter::repeat_n(']', depth));
    s.push('}');
    let r = write_out(path, s.as_bytes());
    report(
        "deep-json",
        r.is_ok(),
        r.as_ref().err(),
        json!({"path": path, "depth": depth}),
    )
}

/// A result JSON whose one output string is `bytes` long.
fn big_result(path: &str, bytes: usize) -> Value {
    let mut s = String::with_capacity(bytes + 64);
    s.push_str("{\"status\":\"finished\",\"outputs\":{\"big\":\"");
    s.extend(std::iter::repeat_n('x', bytes));
    s.push_str("\"}}");
    let r = write_out(path, s.as_bytes());
    report(
        "big-result",
        r.is_ok(),
        r.as_ref().err(),
        json!({"path": path, "bytes": bytes}),
    )
}

fn many_files(dir: &str, count: usize) -> Value {
    let mut made = 0usize;
    let mut err = std::fs::create_dir_all(dir).err();
    if err.is_none() {
        for i in 0..count {
            if let Err(e) = std::fs::write(Path::new(dir).join(format!("f{i:05}.txt")), b"x") {
                err = Some(e);
                break;
            }
            made += 1;
        }
    }
    report(
        "many-files",
        err.is_none(),
        err.as_ref(),
        json!({"dir": dir, "made": made}),
    )
}

fn symlink(target: &str, link: &str) -> Value {
    let r = std::os::unix::fs::symlink(target, link);
    report(
        "symlink",
        r.is_ok(),
        r.as_ref().err(),
        json!({"target": target, "link": link}),
    )
}

fn env() -> Value {
    let vars: Map<String, Value> = std::env::vars_os()
        .map(|(k, v)| {
            (
                String::from_utf8_lossy(k.as_bytes()).into_owned(),
                json!(String::from_utf8_lossy(v.as_bytes())),
            )
        })
        .collect();
    report("env", true, None, json!({"env": vars}))
}
