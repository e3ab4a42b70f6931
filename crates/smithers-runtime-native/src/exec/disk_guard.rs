//! The host-disk guard of a step whose workspace layer is on the host's disk.

use std::time::Duration;

use crate::backend::Backend;
use smithers_sandbox_init::sys;

/// The host-disk guard of a step whose workspace layer is on the host's disk (no `--disk`):
/// resolves once the layer's file system has less free space than the floor, which is the
/// runtime's reserve or half of what was free at the start, whichever is smaller (so a disk
/// already low at the start still leaves the step some room). Checked every
/// [`DISK_CHECK_INTERVAL`]: one `statvfs`, whatever the step writes.
pub(super) struct DiskGuard {
    layer: Option<std::path::PathBuf>,
    floor: u64,
}

const DISK_CHECK_INTERVAL: Duration = Duration::from_millis(200);

impl DiskGuard {
    pub(super) fn new(backend: &Backend, reserve: u64) -> DiskGuard {
        let layer = (!backend.layer_tmpfs && reserve > 0).then(|| backend.layer());
        let free = |p: &std::path::Path| {
            sys::statvfs(p)
                .ok()
                .map(|st| st.f_bavail.saturating_mul(st.f_frsize))
        };
        match layer.as_deref().and_then(free) {
            Some(at_start) => DiskGuard {
                layer,
                floor: reserve.min(at_start / 2),
            },
            None => DiskGuard {
                layer: None,
                floor: 0,
            },
        }
    }

    pub(super) async fn exhausted(&self) {
        let Some(layer) = &self.layer else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(DISK_CHECK_INTERVAL).await;
            if let Ok(st) = sys::statvfs(layer) {
                if st.f_bavail.saturating_mul(st.f_frsize) < self.floor {
                    return;
                }
            }
        }
    }
}
