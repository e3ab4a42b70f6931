//! The `probe` verb and what the runtime finds out once: the init's probe-mode findings,
//! whether overlayfs works here (remembered per boot), and whether a container's confinement
//! lets a sandbox be made at all.

use smithers_runtime::{EnforcementReport, RuntimeError};

use crate::files::{restrict_mode, write_private};
use crate::host::HostCaps;
use crate::host_diag;
use crate::names::RUNTIME;
use crate::report;
use crate::runtime::NativeRuntime;

/// What a successful container probe is remembered by: the build, the boot and kernel, and
/// what confines this process (its mount and user namespaces, its seccomp mode and filter
/// count, no_new_privs and capabilities, from `/proc/self/status`). Another container, or
/// the same one started with other flags, has another key.
fn container_probe_key() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let link = |p: &str| {
        std::fs::read_link(p)
            .map(|l| l.display().to_string())
            .unwrap_or_default()
    };
    let status = read("/proc/self/status");
    let confinement: Vec<&str> = status
        .lines()
        .filter(|l| {
            [
                "Seccomp:",
                "Seccomp_filters:",
                "NoNewPrivs:",
                "CapEff:",
                "CapBnd:",
            ]
            .iter()
            .any(|k| l.starts_with(k))
        })
        .collect();
    format!(
        "{} {} {} {} {} {}",
        env!("CARGO_PKG_VERSION"),
        read("/proc/sys/kernel/random/boot_id").trim(),
        read("/proc/sys/kernel/osrelease").trim(),
        link("/proc/self/ns/mnt"),
        link("/proc/self/ns/user"),
        confinement
            .join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    )
}

impl NativeRuntime {
    /// The `probe` verb: what this host can enforce (found once per runtime).
    pub(crate) async fn probe_host(&self) -> EnforcementReport {
        let caps = self.caps();
        let findings = self.findings().await;
        let mode = self.options.workspace;
        self.probe
            .get_or_init(|| async move { report::probe(&caps, findings, mode) })
            .await
            .clone()
    }

    /// What the init's probe mode found on this host (run once per runtime).
    pub(crate) async fn findings(&self) -> &Result<serde_json::Value, String> {
        let caps = self.caps();
        self.findings
            .get_or_init(|| async move { report::findings(&caps).await })
            .await
    }

    /// Whether a layer flip works here (the probe's `layerFlip`: an unmounted overlay's upper
    /// layer, as a lower layer of a new one, has a directory removed through it): some
    /// kernels' overlayfs answers EIO there, and checkpoints are then refused, never tried.
    pub(crate) async fn check_layer_flips(&self) -> Result<(), smithers_runtime::RuntimeError> {
        let why = match self.findings().await {
            Ok(v) if v["layerFlip"]["ok"] == serde_json::Value::Bool(true) => return Ok(()),
            Ok(v) => v["layerFlip"]["detail"]
                .as_str()
                .unwrap_or("not tried (an earlier probe step failed)")
                .to_string(),
            Err(e) => e.clone(),
        };
        Err(smithers_runtime::RuntimeError::ControlUnsupported {
            runtime: "native",
            control: "checkpoint",
            reason: format!(
                "this kernel's overlayfs cannot stack a session's frozen layer under a new one (probe: {why})"
            ),
        })
    }

    /// Whether overlayfs works here for the layer root: the probe's answer, remembered in the
    /// state root per boot, kernel, layer root and version (read once per runtime: `create`
    /// keeps the answer in `self.overlay`). The probe starts a process and
    /// mounts (about 30 ms), which every `smithers-sandbox run` would otherwise pay at its
    /// first create; the answer cannot change without one of those changing.
    pub(crate) async fn overlay_check(&self, caps: &HostCaps) -> report::OverlayCheck {
        use report::OverlayCheck;
        use std::os::unix::fs::MetadataExt;
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let key = format!(
            "{} {} {} {} {}",
            env!("CARGO_PKG_VERSION"),
            read("/proc/sys/kernel/random/boot_id").trim(),
            read("/proc/sys/kernel/osrelease").trim(),
            caps.layer_root.display(),
            std::fs::metadata(&caps.layer_root)
                .map(|m| m.dev())
                .unwrap_or(0),
        );
        let cache = caps.state_root.join("overlay-check.json");
        let cached: Option<serde_json::Value> = std::fs::read(&cache)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(|v: &serde_json::Value| v["key"] == key.as_str());
        if let Some(v) = cached {
            match v["unusable"].as_str() {
                None => return OverlayCheck::Usable,
                Some(why) => return OverlayCheck::Unusable(why.to_string()),
            }
        }
        let check = report::overlay_check(self.findings().await);
        let remember = match &check {
            OverlayCheck::Usable => Some(serde_json::json!({"key": key})),
            OverlayCheck::Unusable(why) => Some(serde_json::json!({"key": key, "unusable": why})),
            // Not tried: ask again next time.
            OverlayCheck::Unknown(_) => None,
        };
        if let Some(v) = remember {
            // Best effort, written aside and renamed: a reader sees the old answer or the new.
            let tmp = caps
                .state_root
                .join(format!("overlay-check.{}.tmp", std::process::id()));
            if std::fs::create_dir_all(&caps.state_root).is_ok()
                && restrict_mode(&caps.state_root).is_ok()
                && write_private(&tmp, v.to_string().as_bytes()).is_ok()
            {
                let _ = std::fs::rename(&tmp, &cache);
            }
        }
        check
    }

    /// Refuses, with the probe's failure and the fix for this host, when the init's probe
    /// could not make the user namespace or a fresh `/proc`.
    pub(crate) async fn refuse_unless_probe_succeeded(
        &self,
        caps: &HostCaps,
    ) -> Result<(), RuntimeError> {
        // A success is remembered (a probe is a process and two namespaces, ~10 ms of every
        // `run`), per boot, kernel, build, and what confines this process: its mount and
        // user namespaces, seccomp mode and capabilities. A failure is never remembered.
        let cache = caps.state_root.join("container-probe.json");
        let key = container_probe_key();
        let remembered = std::fs::read(&cache)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v["key"] == key.as_str());
        if remembered {
            return Ok(());
        }
        let findings = self.findings().await;
        let failed = |key: &str| -> Option<String> {
            match findings {
                Err(e) => Some(e.clone()),
                Ok(v) if v[key]["ok"] == serde_json::Value::Bool(true) => None,
                Ok(v) => Some(v[key]["detail"].as_str().unwrap_or("failed").to_string()),
            }
        };
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if let Some(why) = failed("user") {
            return Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: format!("the user namespace could not be created: {why}"),
                fix: Some(host_diag::userns_fix(caps.uid, &mountinfo)),
            });
        }
        if let Some(why) = failed("proc") {
            return Err(RuntimeError::Unavailable {
                runtime: RUNTIME,
                reason: format!(
                    "a fresh /proc could not be mounted in the sandbox's pid namespace: {why}"
                ),
                fix: Some(host_diag::proc_fix(&mountinfo)),
            });
        }
        // Best effort, written aside and renamed, as the overlay check's answer is.
        let tmp = caps
            .state_root
            .join(format!("container-probe.{}.tmp", std::process::id()));
        if std::fs::create_dir_all(&caps.state_root).is_ok()
            && restrict_mode(&caps.state_root).is_ok()
            && write_private(&tmp, serde_json::json!({"key": key}).to_string().as_bytes()).is_ok()
        {
            let _ = std::fs::rename(&tmp, &cache);
        }
        Ok(())
    }
}
