//! A step's egress policy on the docker runtime. The step's container joins the network
//! namespace of a **holder** container (`NetworkMode=container:<holder>`): a container of the
//! same image with `NetworkMode=none`, whose only process is this build's own init in
//! `--egress-holder` mode: the binary bound read-only and run as it is when it is static (as
//! the workspace builds it), else run with the host's dynamic loader and C library bound
//! read-only (so any image will do). The holder binds the egress listeners in that namespace (DNS,
//! HTTP proxy, SOCKS5, one capture listener per allowed port; the namespace's
//! `ip_unprivileged_port_start` is 0, so it needs no capability), sends them over a unix
//! socket bound into it, and then only holds the namespace until we close the socket. This
//! process serves the listeners with [`smithers_egress::Engine`], as the native runtime does:
//! the same decisions and the same records. The step sees our `resolv.conf` and `hosts` and
//! the proxy variables; it shares the holder's network namespace only (not its pids, mounts
//! or user), so it can neither reach the holder's process nor its sockets.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::CreateContainerOptions;
use bollard::Docker;
use smithers_egress::engine::EngineOptions;
use smithers_egress::secrets::SecretSpec;
use smithers_egress::{EgressRecord, Engine, Listeners, Policy};
use smithers_runtime::{Controls, OutputSink, RuntimeError};
use smithers_sandbox_init::plan::EgressListen;

use crate::plan::BackendState;
use crate::pump::now_ms;

/// How long the holder may take to send its listeners.
const HOLDER_WAIT: Duration = Duration::from_secs(30);

/// The dynamic loader of this build's target, whose directory holds the C library the
/// holder binary needs.
#[cfg(target_arch = "x86_64")]
const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";
#[cfg(target_arch = "aarch64")]
const LOADER: &str = "/lib/ld-linux-aarch64.so.1";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const LOADER: &str = "";

/// The step's policy, checked; `None` without one.
pub(crate) fn policy(c: &Controls) -> Result<Option<Policy>, RuntimeError> {
    let Some(v) = &c.egress_policy else {
        return Ok(None);
    };
    smithers_egress::sandbox::checked_policy(v)
        .map(Some)
        .map_err(|reason| RuntimeError::InvalidControl {
            control: "egressPolicy",
            reason,
        })
}

/// Why this runtime cannot hold a namespace here, if it cannot: the holder binary must be
/// there, and the host's loader too unless the binary is static.
pub(crate) fn unavailable(holder: Option<&Path>) -> Option<String> {
    let Some(bin) = holder else {
        return Some("the runtime was given no smithers-sandbox binary to hold the sandbox's network namespace (DockerOptions::egress_holder)".into());
    };
    if !bin.is_file() {
        return Some(format!("the holder binary {} is not there", bin.display()));
    }
    let needs_loader = !is_static_executable(bin).unwrap_or(false);
    if needs_loader && (LOADER.is_empty() || !Path::new(LOADER).exists()) {
        return Some(format!(
            "this host has no dynamic loader at {LOADER:?} to run the holder with"
        ));
    }
    None
}

/// Whether `path` is a 64-bit little-endian ELF executable without a `PT_INTERP` program
/// header: one the kernel runs on its own, with no dynamic loader or shared library (a
/// static or static-pie build). Anything else, or an ELF file it cannot read whole, is `false`
/// (the holder then runs through the host's loader, as any dynamic binary would).
fn is_static_executable(path: &Path) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    const PT_INTERP: u32 = 3;
    const PHDR_SIZE: usize = 56;
    let mut f = std::fs::File::open(path)?;
    let mut ehdr = [0u8; 64];
    f.read_exact(&mut ehdr)?;
    // ELF magic, ELFCLASS64, ELFDATA2LSB.
    if ehdr[..4] != *b"\x7fELF" || ehdr[4] != 2 || ehdr[5] != 1 {
        return Ok(false);
    }
    let u16_at = |at: usize| u16::from_le_bytes([ehdr[at], ehdr[at + 1]]);
    let phoff = u64::from_le_bytes(ehdr[0x20..0x28].try_into().unwrap_or_default());
    let (phentsize, phnum) = (usize::from(u16_at(0x36)), usize::from(u16_at(0x38)));
    // A real executable has a few dozen program headers of 56 bytes at most.
    if phentsize != PHDR_SIZE || phnum == 0 || phnum > 256 {
        return Ok(false);
    }
    let mut phdrs = vec![0u8; PHDR_SIZE * phnum];
    f.seek(SeekFrom::Start(phoff))?;
    f.read_exact(&mut phdrs)?;
    Ok(phdrs
        .chunks_exact(PHDR_SIZE)
        .all(|ph| u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) != PT_INTERP))
}

/// The name of a sandbox's holder container.
pub(crate) fn holder_name(state: &BackendState) -> String {
    format!("{}-net", state.container_name)
}

/// A running holder and the engine serving its listeners.
pub(crate) struct Holder {
    pub name: String,
    pub engine: Engine,
    /// Kept open: the holder exits when it closes.
    conn: std::os::unix::net::UnixStream,
    /// The `/etc` files the step's container binds.
    pub etc_dir: PathBuf,
    pub live: tokio::sync::mpsc::UnboundedReceiver<EgressRecord>,
    /// With secrets: their placeholders and the variables naming the run's authority, for
    /// the step's environment.
    pub secret_env: Vec<(String, String)>,
}

impl Holder {
    /// Ends the engine (every connection) and lets the holder exit.
    pub async fn stop(self) -> (smithers_egress::Summary, Vec<EgressRecord>) {
        let summary = self.engine.stop().await;
        drop(self.conn);
        let mut live = self.live;
        let mut rest = Vec::new();
        while let Ok(r) = live.try_recv() {
            rest.push(r);
        }
        (summary, rest)
    }
}

fn bind(source: &Path, target: &str) -> Mount {
    Mount {
        target: Some(target.to_string()),
        source: Some(source.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(true),
        ..Default::default()
    }
}

/// Starts the holder for `state` and the engine on what it sends, with `controls`' secrets.
pub(crate) async fn start_holder(
    docker: &Docker,
    state: &BackendState,
    (policy, controls): (Policy, &Controls),
    holder_bin: &Path,
    labels: HashMap<String, String>,
    request_dir: &Path,
) -> Result<Holder, RuntimeError> {
    // The secrets first: a value that cannot be read refuses the step before any container.
    let specs = (controls.secret_values()?.into_iter())
        .map(|s| SecretSpec {
            name: s.name,
            hosts: s.hosts,
            value: s.value,
        })
        .collect();
    let secrets = smithers_egress::sandbox::secrets_for(specs, request_dir).map_err(|reason| {
        RuntimeError::InvalidControl {
            control: "secrets",
            reason,
        }
    })?;
    let secret_env = (secrets.as_deref())
        .map(|s| smithers_egress::sandbox::secrets_env(s, crate::plan::REQUEST_DIR))
        .unwrap_or_default();
    let dir = state.state_dir.join("egress");
    std::fs::create_dir_all(&dir).map_err(|e| holder_err("its directory", e.to_string()))?;
    let etc_dir = smithers_egress::sandbox::write_etc_files(&dir.join("etc"))
        .map_err(|e| holder_err("the /etc files", e.to_string()))?;
    let sock_path = dir.join("holder.sock");
    let _ = std::fs::remove_file(&sock_path);
    let listener = std::os::unix::net::UnixListener::bind(&sock_path)
        .map_err(|e| holder_err("its socket", e.to_string()))?;
    let listen = EgressListen {
        dns: true,
        http_port: smithers_egress::sandbox::HTTP_PROXY_PORT,
        socks_port: smithers_egress::sandbox::SOCKS_PORT,
        capture_ports: smithers_egress::sandbox::capture_ports(&policy)
            .map_err(|e| holder_err("ports", e))?,
    };
    let bin =
        std::fs::canonicalize(holder_bin).map_err(|e| holder_err("the binary", e.to_string()))?;
    let (entrypoint, mut mounts) = loader_entrypoint(&bin)?;
    mounts.extend([
        bind(&bin, "/smithers-host/smithers-sandbox"),
        bind(&dir, "/smithers-egress"),
    ]);
    let listen_json =
        serde_json::to_string(&listen).map_err(|e| holder_err("the listeners", e.to_string()))?;
    let (uid, gid) = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    let name = holder_name(state);
    crate::engine::remove_container(docker, &name).await?;
    let body = holder_body(state, entrypoint, listen_json, (uid, gid), labels, mounts);
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.clone()),
                platform: String::new(),
            }),
            body,
        )
        .await
        .map_err(|e| holder_err("create the holder container", crate::engine::describe(&e)))?;
    docker
        .start_container(&name, None)
        .await
        .map_err(|e| holder_err("start the holder container", crate::engine::describe(&e)))?;
    // The holder connects once, sends one line with the descriptors, and waits.
    let (conn, line, fds) = accept_holder(listener).await?;
    let _ = std::fs::remove_file(&sock_path);
    let v: serde_json::Value = serde_json::from_slice(&line)
        .map_err(|e| holder_err("read the holder's line", e.to_string()))?;
    let names: Vec<String> = v["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    let listeners =
        Listeners::from_named(&names, fds).map_err(|e| holder_err("its listeners", e))?;
    let denials = request_dir.join(smithers_egress::sandbox::DENIALS_FILE);
    let _ = std::fs::write(&denials, b"");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let engine = Engine::start(
        policy,
        listeners,
        EngineOptions {
            denials_file: Some(denials),
            live: Some(tx),
            secrets,
            ..Default::default()
        },
    )
    .map_err(|e| holder_err("start the engine", e.to_string()))?;
    Ok(Holder {
        name,
        engine,
        conn,
        etc_dir,
        live: rx,
        secret_env,
    })
}

/// A holder failure: `what` could not be made or read.
fn holder_err(what: &str, e: String) -> RuntimeError {
    RuntimeError::Spawn {
        operation: format!("hold the sandbox's network namespace ({what})"),
        reason: e,
    }
}

/// The entrypoint prefix and mounts that run the holder binary `bin` in the step's image.
fn loader_entrypoint(bin: &Path) -> Result<(Vec<String>, Vec<Mount>), RuntimeError> {
    // A static binary runs as it is; a dynamic one through the host's loader, with the
    // loader's directory (the host's C library) bound read-only beside it.
    let mut entrypoint = Vec::new();
    let mut mounts = Vec::new();
    if !is_static_executable(bin).unwrap_or(false) {
        let loader =
            std::fs::canonicalize(LOADER).map_err(|e| holder_err("the loader", e.to_string()))?;
        let lib_dir = loader.parent().unwrap_or(Path::new("/")).to_path_buf();
        let loader_name = loader
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        entrypoint.extend([
            format!("/smithers-host/lib/{loader_name}"),
            "--library-path".into(),
            "/smithers-host/lib".into(),
        ]);
        mounts.push(bind(&lib_dir, "/smithers-host/lib"));
    }
    Ok((entrypoint, mounts))
}

/// Where this build's binary is bound in a container (the holder's, a started sandbox's).
pub(crate) const HOST_BINARY: &str = "/smithers-host/smithers-sandbox";

/// The command prefix and the read-only mounts that run this build's binary `bin` as its
/// init in a container of any image, as the holder runs it: `[loader...] HOST_BINARY
/// __sandbox-init`.
pub(crate) fn bound_binary(bin: &Path) -> Result<(Vec<String>, Vec<Mount>), RuntimeError> {
    let bin = std::fs::canonicalize(bin).map_err(|e| RuntimeError::Spawn {
        operation: format!("bind {} into the sandbox", bin.display()),
        reason: e.to_string(),
    })?;
    let (mut prefix, mut mounts) = loader_entrypoint(&bin)?;
    mounts.push(bind(&bin, HOST_BINARY));
    prefix.extend([
        HOST_BINARY.to_string(),
        smithers_runtime_native_init_subcommand().to_string(),
    ]);
    Ok((prefix, mounts))
}

/// The holder's container: `smithers-sandbox`'s init as the egress holder (behind
/// `entrypoint`'s loader, if any) in the step's image, run as `uid:gid` with
/// `NetworkMode=none`, no capabilities and small limits.
fn holder_body(
    state: &BackendState,
    entrypoint: Vec<String>,
    listen_json: String,
    (uid, gid): (u32, u32),
    labels: HashMap<String, String>,
    mounts: Vec<Mount>,
) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(state.image.clone()),
        entrypoint: Some(
            entrypoint
                .into_iter()
                .chain([
                    "/smithers-host/smithers-sandbox".into(),
                    smithers_runtime_native_init_subcommand().into(),
                    "--egress-holder".into(),
                    "/smithers-egress/holder.sock".into(),
                    listen_json,
                ])
                .collect(),
        ),
        cmd: Some(vec![]),
        // Our own uid: the socket's directory is ours, and the holder needs no privilege.
        user: Some(format!("{uid}:{gid}")),
        env: Some(vec![]),
        labels: Some(labels),
        network_disabled: Some(false),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            // Ports under 1024 (DNS, 443, 22) without a capability.
            sysctls: Some(HashMap::from([(
                "net.ipv4.ip_unprivileged_port_start".to_string(),
                "0".to_string(),
            )])),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges:true".into()]),
            readonly_rootfs: Some(true),
            pids_limit: Some(16),
            memory: Some(64 << 20),
            memory_swap: Some(64 << 20),
            auto_remove: Some(false),
            mounts: Some(mounts),
            log_config: Some(bollard::models::HostConfigLogConfig {
                typ: Some("none".to_string()),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Waits (at most [`HOLDER_WAIT`]) for the holder's one connection and reads its line and the
/// listeners' descriptors sent with it.
async fn accept_holder(
    listener: UnixListener,
) -> Result<(UnixStream, Vec<u8>, Vec<OwnedFd>), RuntimeError> {
    tokio::task::spawn_blocking(move || {
        listener.set_nonblocking(true)?;
        let started = std::time::Instant::now();
        let conn = loop {
            match listener.accept() {
                Ok((c, _)) => break c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if started.elapsed() > HOLDER_WAIT {
                        return Err(std::io::Error::other(format!(
                            "the holder did not connect within {}s",
                            HOLDER_WAIT.as_secs()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e),
            }
        };
        conn.set_nonblocking(false)?;
        conn.set_read_timeout(Some(HOLDER_WAIT))?;
        let (line, fds) = smithers_egress::fdpass::recv_line_with_fds(conn.as_raw_fd(), 64 << 10)?;
        Ok((conn, line, fds))
    })
    .await
    .map_err(|e| holder_err("wait for the holder", e.to_string()))?
    .map_err(|e| holder_err("receive the listeners", e.to_string()))
}

/// The smithers-sandbox binary's subcommand that is the init (the native runtime's
/// `INIT_SUBCOMMAND`; named here because a backend does not depend on another).
fn smithers_runtime_native_init_subcommand() -> &'static str {
    "__sandbox-init"
}

/// An egress record, as a live event.
pub(crate) fn forward_egress(output: &dyn OutputSink, r: smithers_egress::EgressRecord) {
    if let Ok(record) = serde_json::to_value(&r) {
        output.event(smithers_runtime::OutputEvent::Egress {
            record,
            timestamp_ms: r.timestamp_ms,
        });
    }
}

/// The engine's records, after the step's own, in the log that becomes the bundle's.
pub(crate) fn append_records(log: &Path, summary: &smithers_egress::Summary) {
    use std::io::Write;
    let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(log) else {
        return;
    };
    for r in &summary.records {
        if let Ok(line) = serde_json::to_string(r) {
            let _ = writeln!(f, "{line}");
        }
    }
    if summary.records_dropped > 0 {
        let _ = writeln!(
            f,
            "{}",
            serde_json::json!({"type": "egressRecordsDropped", "timestampMs": now_ms(), "count": summary.records_dropped})
        );
    }
}

#[cfg(test)]
mod tests {
    use super::is_static_executable;

    #[test]
    fn a_static_executable_is_told_from_a_dynamic_one_and_from_other_files() {
        // This test binary is built as the workspace builds everything (.cargo/config.toml).
        let me = std::env::current_exe().unwrap();
        assert_eq!(
            is_static_executable(&me).unwrap(),
            cfg!(target_feature = "crt-static")
        );
        // The host's shell goes through the dynamic loader.
        assert!(!is_static_executable(std::path::Path::new("/bin/sh")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("script");
        std::fs::write(&text, format!("#!/bin/sh\n{}\n", "x".repeat(100))).unwrap();
        assert!(!is_static_executable(&text).unwrap());
        let short = dir.path().join("short");
        std::fs::write(&short, b"\x7fELF").unwrap();
        assert!(is_static_executable(&short).is_err());
    }
}
