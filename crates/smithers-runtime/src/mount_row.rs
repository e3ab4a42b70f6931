//! The `host-mounts` row every backend's enforcement report carries (apart from `mounts`,
//! whose rules `config` uses when it validates a volume: this row needs the config's types).

use crate::mounts::HOST_MOUNTS;
use crate::{Controls, Protection, ProtectionStatus};

/// The `host-mounts` row of an enforcement report: every host path the caller brought in
/// and how. Enforced when there is none or all are read-only; degraded when the step can
/// write a host path (what it writes there is not reviewed) or a sensitive mount was allowed.
pub fn report_row(c: &Controls) -> Protection {
    let row = |status, detail: String| Protection {
        name: HOST_MOUNTS.to_string(),
        status,
        detail,
        fix: None,
    };
    if c.volumes.is_empty() {
        return row(
            ProtectionStatus::Enforced,
            "no host path mounted beyond the read-only root".into(),
        );
    }
    let list: Vec<String> = c
        .volumes
        .iter()
        .map(|v| {
            format!(
                "{} at {} ({})",
                v.host.display(),
                v.container.display(),
                if v.readonly { "ro" } else { "rw" }
            )
        })
        .collect();
    let writable = c.volumes.iter().any(|v| !v.readonly);
    let mut detail = list.join("; ");
    if writable {
        detail
            .push_str("; a writable mount is written by the step directly, not through the review");
    }
    if c.allow_sensitive_mounts {
        detail.push_str("; sensitive host paths allowed by the caller (allowSensitiveMounts)");
    }
    let status = if writable || c.allow_sensitive_mounts {
        ProtectionStatus::Degraded
    } else {
        ProtectionStatus::Enforced
    };
    row(status, detail)
}
