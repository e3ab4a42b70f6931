//! Removal of the labelled leftovers of sandboxes whose owner process is gone.

use std::collections::HashMap;
use std::path::PathBuf;

use bollard::query_parameters::{ListContainersOptions, ListVolumesOptions};
use smithers_runtime::RuntimeError;

use crate::engine::{remove_container, remove_volume, spawn_err};
use crate::runtime::DockerRuntime;
use crate::{cgroup, hostfs, plan};

/// Which leftovers [`DockerRuntime::cleanup_orphans`] removes.
#[derive(Debug, Clone, Default)]
pub struct OrphanFilter {
    /// Only this run's objects.
    pub run_id: Option<String>,
    /// Only this sandbox's objects.
    pub sandbox_id: Option<String>,
    /// Also remove objects whose owner process is still alive (e.g. the caller knows they
    /// are abandoned). Default false: only dead owners' objects.
    pub include_live_owners: bool,
}

/// What [`DockerRuntime::cleanup_orphans`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrphanReport {
    pub containers: Vec<String>,
    pub volumes: Vec<String>,
    pub state_dirs: Vec<PathBuf>,
}

impl DockerRuntime {
    /// Removes labelled containers, volumes and state directories of sandboxes whose owner
    /// process is gone (pid absent, or reused by a process with another start time). The
    /// orchestrator's recovery calls it at start-up. Idempotent.
    pub async fn cleanup_orphans(
        &self,
        filter: &OrphanFilter,
    ) -> Result<OrphanReport, RuntimeError> {
        let docker = self.engine().await?;
        let mut labels = vec![format!("{}=true", plan::LABEL_MANAGED)];
        if let Some(r) = &filter.run_id {
            labels.push(format!("{}={r}", plan::LABEL_RUN_ID));
        }
        if let Some(s) = &filter.sandbox_id {
            labels.push(format!("{}={s}", plan::LABEL_SANDBOX_ID));
        }
        let filters = HashMap::from([("label".to_string(), labels)]);
        let abandoned = |l: &HashMap<String, String>| filter.include_live_owners || !owner_alive(l);
        let mut report = OrphanReport::default();

        let containers = docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters.clone()),
                ..Default::default()
            }))
            .await
            .map_err(|e| spawn_err("list labelled containers", &e))?;
        for c in containers {
            let l = c.labels.unwrap_or_default();
            if !abandoned(&l) {
                continue;
            }
            let Some(id) = c.id else { continue };
            remove_container(docker, &id).await?;
            report
                .containers
                .push(c.names.and_then(|n| n.into_iter().next()).unwrap_or(id));
        }

        let volumes = docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| spawn_err("list labelled volumes", &e))?;
        for v in volumes.volumes.unwrap_or_default() {
            if !abandoned(&v.labels) {
                continue;
            }
            remove_volume(docker, &v.name).await?;
            report.volumes.push(v.name.clone());
            if v.name.starts_with("smithers-") {
                cgroup::remove(&format!("smithers-docker/{}", v.name))
                    .map_err(|e| RuntimeError::spawn("remove cgroup", e))?;
            }
            if let Some(dir) = v.labels.get(plan::LABEL_STATE_DIR) {
                let dir = PathBuf::from(dir);
                // Only directories under our state root: a label is data from the engine,
                // never a licence to delete an arbitrary host path.
                if dir.starts_with(&self.opts.state_root) && dir != self.opts.state_root {
                    hostfs::unmount(&dir.join("layer"))?;
                    hostfs::remove_tree(&dir)?;
                    report.state_dirs.push(dir);
                }
            }
        }
        Ok(report)
    }
}

pub(crate) fn owner_alive(labels: &HashMap<String, String>) -> bool {
    let pid: Option<u32> = labels
        .get(plan::LABEL_OWNER_PID)
        .and_then(|p| p.parse().ok());
    let start: Option<u64> = labels
        .get(plan::LABEL_OWNER_START)
        .and_then(|p| p.parse().ok());
    match (pid, start) {
        (Some(pid), Some(start)) => hostfs::process_start(pid) == Some(start),
        _ => false,
    }
}
