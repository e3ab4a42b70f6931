//! [`RayRuntime`]: the five verbs on a lease.
//!
//! * `create` submits the lease (a Ray job reserving one `sandbox_slot` and the step's CPU and
//!   memory) and returns at once, so the orchestrator stores the handle before any wait.
//! * `place` waits for Ray to start the job (each distinct "pending" reason a
//!   `SandboxQueued` event), reads the node from the job record, the port from the job's log
//!   and the token from the job's environment, and creates the sandbox on the node's `serve`.
//! * `ship`, `execute`, `collect` are the codeplane client's, each raced against a watch of the
//!   lease: a lease that ends (FAILED, STOPPED) while the step holds it is `NODE_LOST`, and a
//!   bundle collected from a lease that did not survive the download is removed, not kept.
//! * `cleanup` deletes the sandbox on the node (so its layers go with it), then stops the job
//!   and deletes its record.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use smithers_runtime::{
    CancellationToken, CollectReport, EnforcementReport, ExecOutcome, NoPlacementEvents,
    OutputSink, Placement, PlacementSink, Protection, ProtectionStatus, RequestBundle, Runtime,
    RuntimeError, RuntimeKind, SandboxConfig, SandboxHandle, ShipReport, StepCommand,
};
use smithers_runtime_remote::{RemoteOptions, RemoteRuntime};

use crate::jobs::{JobRecord, JobStatus, JobSubmit, JobsClient, JobsError};
use crate::lease;
use crate::options::{RayOptions, ENV_ADDRESS, ENV_TOKEN};

const RUNTIME: &str = "ray";

/// What the handle's `backend` holds: plain data. The node's address and token are never
/// taken from it: they are read again from the cluster, so a handle from a crafted database
/// cannot point our requests (or our tokens) anywhere else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Backend {
    /// The Jobs API the lease was submitted to.
    ray_address: String,
    submission_id: String,
    /// A warm lease claimed for this sandbox: the job that runs its server (the
    /// `submission_id` record is then the claim, naming it in its metadata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    warm_lease: Option<String>,
    /// Set once placed: the sandbox on the node (its codeplane handle's backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<NodeBackend>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeBackend {
    /// Informative: where it ran when placed.
    node_ip: String,
    node_id: String,
    /// The codeplane handle's `backend` on that node.
    remote: Value,
}

/// A placed lease, attached: the node's client and the codeplane handle there.
#[derive(Debug, Clone)]
pub(crate) struct Attached {
    pub(crate) remote: RemoteRuntime,
    pub(crate) inner: SandboxHandle,
    pub(crate) node: String,
}

/// The `ray` runtime. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RayRuntime {
    pub(crate) options: Arc<RayOptions>,
    pub(crate) jobs: JobsClient,
    /// Configs between `create` and `place` (the node's sandbox is made with them).
    configs: Arc<Mutex<HashMap<String, SandboxConfig>>>,
    /// Leases attached in this process.
    attached: Arc<Mutex<HashMap<String, Attached>>>,
    /// Warm leases claimed at create, until `place` takes them.
    pub(crate) claimed: Arc<Mutex<HashMap<String, crate::pool::WarmLease>>>,
    /// The warm leases kept ready (`RayOptions::warm`).
    pub(crate) pool: Arc<Mutex<crate::pool::Pool>>,
}

fn key(run_id: &str, sandbox_id: &str) -> String {
    format!("{run_id}/{sandbox_id}")
}

fn unavailable(reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Unavailable {
        runtime: RUNTIME,
        reason: reason.into(),
        fix: Some(format!(
            "set {ENV_ADDRESS} to the Ray Jobs API (the dashboard, e.g. http://head:8265) and {ENV_TOKEN} to the cluster's token"
        )),
    }
}

fn jobs_error(what: &str, e: JobsError) -> RuntimeError {
    match e {
        JobsError::GaveUp(_) => RuntimeError::Unavailable {
            runtime: RUNTIME,
            reason: format!("{what}: {e}"),
            fix: Some(
                "the cluster's Jobs API (the head's dashboard) did not recover within the placement window: \
                 check the head (`ray status` there, its dashboard log), then run the step again"
                    .into(),
            ),
        },
        JobsError::Unreachable { .. } | JobsError::Unusable(_) | JobsError::Unauthorized(_) => {
            unavailable(format!("{what}: {e}"))
        }
        other => RuntimeError::spawn(what.to_string(), other),
    }
}

/// Tells a reason to `sink` only when it is not the one told last: Ray's unchanged "pending"
/// message, or the same Jobs API failure again, is one event.
struct Said<'a> {
    sink: &'a dyn PlacementSink,
    last: Mutex<Option<String>>,
}

impl<'a> Said<'a> {
    fn new(sink: &'a dyn PlacementSink) -> Self {
        Said {
            sink,
            last: Mutex::new(None),
        }
    }
}

impl PlacementSink for Said<'_> {
    fn queued(&self, reason: &str) {
        let mut last = self.last.lock().expect("said");
        if last.as_deref() != Some(reason) {
            self.sink.queued(reason);
            *last = Some(reason.to_string());
        }
    }
}

impl Backend {
    /// The job that runs the sandbox's server.
    fn lease_job(&self) -> &str {
        self.warm_lease.as_deref().unwrap_or(&self.submission_id)
    }
}

impl RayRuntime {
    pub fn new(options: RayOptions) -> Result<Self, RuntimeError> {
        // The entrypoint runs it through `env`, which would take `NAME=…` for an assignment
        // and `-…` for an option of its own.
        let bin = &options.serve_binary;
        if bin.is_empty() || bin.starts_with('-') || bin.contains('=') {
            return Err(RuntimeError::InvalidControl {
                control: "SMITHERS_RAY_SERVE_BIN",
                reason: format!(
                    "{bin:?} is not a path to smithers-sandbox (no leading '-', no '=')"
                ),
            });
        }
        let jobs = JobsClient::new(&options.address, options.token.clone(), options.api_timeout)
            .map_err(unavailable)?;
        Ok(RayRuntime {
            options: Arc::new(options),
            jobs,
            configs: Arc::default(),
            attached: Arc::default(),
            claimed: Arc::default(),
            pool: Arc::default(),
        })
    }

    /// [`RayOptions::from_env`] then [`RayRuntime::new`].
    pub fn from_env() -> Result<Self, RuntimeError> {
        RayRuntime::new(RayOptions::from_env()?)
    }

    pub fn options(&self) -> &RayOptions {
        &self.options
    }

    /// The handle's lease, only when it names this runtime's cluster and a lease id of the
    /// shape this runtime derives for the handle's ids.
    fn backend(&self, handle: &SandboxHandle) -> Result<Backend, RuntimeError> {
        let b: Backend = serde_json::from_value(handle.backend.clone()).map_err(|e| {
            RuntimeError::OutOfOrder {
                verb: "handle",
                reason: format!("not a ray handle: {e}"),
            }
        })?;
        if b.ray_address != self.jobs.base() {
            return Err(RuntimeError::InvalidControl {
                control: "handle",
                reason: format!(
                    "the handle names cluster {:?}, not this runtime's {:?}: not contacted",
                    b.ray_address,
                    self.jobs.base()
                ),
            });
        }
        smithers_runtime::config::validate_id("runId", &handle.run_id)?;
        smithers_runtime::config::validate_id("sandboxId", &handle.sandbox_id)?;
        if let Some(w) = &b.warm_lease {
            if !lease::is_warm_id(w) {
                return Err(RuntimeError::InvalidControl {
                    control: "handle",
                    reason: format!("{w:?} is not a warm lease's id"),
                });
            }
        }
        if b.submission_id != lease::submission_id(&handle.run_id, &handle.sandbox_id) {
            return Err(RuntimeError::InvalidControl {
                control: "handle",
                reason: format!(
                    "the handle's lease {:?} is not the one derived for {}/{}",
                    b.submission_id, handle.run_id, handle.sandbox_id
                ),
            });
        }
        Ok(b)
    }

    /// The job record, or NODE_LOST / an error when it cannot be had.
    async fn job(&self, id: &str) -> Result<JobRecord, RuntimeError> {
        match self.jobs.get(id).await {
            Ok(Some(record)) => Ok(record),
            Ok(None) => Err(RuntimeError::NodeLost {
                runtime: RUNTIME,
                lease: id.to_string(),
                node: None,
                reason: "the cluster no longer knows the lease's job".into(),
            }),
            Err(e) => Err(jobs_error("read the lease", e)),
        }
    }

    fn node_lost(id: &str, record: &JobRecord) -> RuntimeError {
        RuntimeError::NodeLost {
            runtime: RUNTIME,
            lease: id.to_string(),
            node: record.node_ip().map(|ip| ip.to_string()),
            reason: record.describe(),
        }
    }

    /// A Jobs API call made while a lease is placed: a transient failure (5xx, a refused or
    /// reset connection, a timeout) is asked again with backoff within the placement window
    /// (`RayOptions::api_retry`), each wait logged and each kind of failure told to `sink`
    /// (a `SandboxQueued` event: what placement waits for); a refusal fails at once. When
    /// the window runs out, the error ([`JobsError::GaveUp`]) names every wait.
    pub(crate) async fn patiently<T, F, Fut>(
        &self,
        what: &str,
        sink: &dyn PlacementSink,
        call: F,
    ) -> Result<T, JobsError>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, JobsError>>,
    {
        let mut told: Vec<String> = Vec::new();
        crate::retry::with_retry(
            &self.options.api_retry,
            what,
            |r| {
                tracing::warn!(
                    what = r.what,
                    attempt = r.attempt,
                    wait_ms = r.wait.as_millis() as u64,
                    window_left_ms = r.left.as_millis() as u64,
                    error = %r.error,
                    "the Ray Jobs API failed while a lease is placed; asking again"
                );
                let kind = r.error.kind();
                if !told.contains(&kind) {
                    sink.queued(&format!(
                        "waiting for the Ray Jobs API to {what}: {}; asking again with backoff for up to {}",
                        r.error,
                        crate::waited::secs(r.window)
                    ));
                    told.push(kind);
                }
            },
            call,
        )
        .await
    }

    /// Submits `job` (`what` names it), riding out transient failures ([`Self::patiently`]).
    /// A retry refused as a duplicate is this very submit when the record Ray holds under
    /// its id is this job's (its nonce, or for a claim the same warm lease): an earlier
    /// attempt reached Ray and only its reply was lost.
    pub(crate) async fn submit(
        &self,
        what: &str,
        job: &JobSubmit,
        sink: &dyn PlacementSink,
    ) -> Result<(), JobsError> {
        self.patiently(what, sink, move |attempt| async move {
            match self.jobs.submit(job).await {
                Err(JobsError::Duplicate(message)) if attempt > 1 => {
                    match self.jobs.get(&job.submission_id).await? {
                        Some(record) if lease::same_submission(&record, job) => Ok(()),
                        _ => Err(JobsError::Duplicate(message)),
                    }
                }
                other => other,
            }
        })
        .await
    }

    /// The node's `serve` for a running lease: address from the job record, port from the
    /// job's log, token from the job's environment. With a `sink` (placement), the log's
    /// read rides out transient Jobs API failures ([`Self::patiently`]).
    pub(crate) async fn node_client(
        &self,
        id: &str,
        record: &JobRecord,
        sink: Option<&dyn PlacementSink>,
    ) -> Result<Option<(RemoteRuntime, String)>, RuntimeError> {
        let Some(ip) = record.node_ip() else {
            return Ok(None);
        };
        let log = match sink {
            Some(sink) => {
                self.patiently("read the lease's log", sink, move |_| self.jobs.logs(id))
                    .await
            }
            None => self.jobs.logs(id).await,
        }
        .map_err(|e| jobs_error("read the lease's log", e))?;
        let Some(nonce) = record.env_var(lease::LEASE_NONCE_ENV) else {
            return Err(RuntimeError::spawn(
                "attach to the lease",
                "its job carries no lease nonce (not a lease this runtime submitted)",
            ));
        };
        let Some(port) = lease::serving_port(&log, nonce) else {
            return Ok(None);
        };
        let token = record.env_var(lease::LEASE_TOKEN_ENV).ok_or_else(|| {
            RuntimeError::spawn(
                "attach to the lease",
                "its job carries no lease token (not a lease this runtime submitted)",
            )
        })?;
        let url = match ip {
            std::net::IpAddr::V4(v4) => format!("http://{v4}:{port}"),
            std::net::IpAddr::V6(v6) => format!("http://[{v6}]:{port}"),
        };
        let mut options = RemoteOptions::new(url, token);
        options.retry = self.options.node_retry.clone();
        options.connect_timeout = Duration::from_secs(3);
        options.event_idle_timeout = self.options.node_event_idle_timeout;
        options.include_git = true;
        let remote = RemoteRuntime::new(options)?;
        Ok(Some((remote, ip.to_string())))
    }

    /// The attached lease of `handle`: from this process's table, or attached again from the
    /// cluster (a new client process reattaching from the row).
    pub(crate) async fn attach(&self, handle: &SandboxHandle) -> Result<Attached, RuntimeError> {
        let k = key(&handle.run_id, &handle.sandbox_id);
        if let Some(a) = self.attached.lock().expect("attached table").get(&k) {
            return Ok(a.clone());
        }
        let b = self.backend(handle)?;
        let Some(node) = &b.node else {
            return Err(RuntimeError::OutOfOrder {
                verb: "attach",
                reason: "the lease was never placed (place was not called)".into(),
            });
        };
        self.check_claim(&b).await?;
        let id = b.lease_job();
        let record = self.job(id).await?;
        if record.status != JobStatus::Running {
            return Err(Self::node_lost(id, &record));
        }
        let Some((remote, node_ip)) = self.node_client(id, &record, None).await? else {
            return Err(RuntimeError::OutOfOrder {
                verb: "attach",
                reason: "the lease's server has not said where it listens".into(),
            });
        };
        let attached = Attached {
            inner: inner_handle(handle, node.remote.clone()),
            remote,
            node: node_ip,
        };
        self.attached
            .lock()
            .expect("attached table")
            .insert(k, attached.clone());
        Ok(attached)
    }

    /// For a warm handle: the claim record under the sandbox's own id must name the warm
    /// lease the handle names, so that a crafted handle can neither borrow nor end another
    /// sandbox's warm lease.
    async fn check_claim(&self, b: &Backend) -> Result<(), RuntimeError> {
        let Some(w) = &b.warm_lease else {
            return Ok(());
        };
        let claim = self.job(&b.submission_id).await?;
        let named = claim
            .metadata
            .as_ref()
            .and_then(|m| m.get(lease::META_CLAIM_OF))
            .map(String::as_str);
        if named == Some(w.as_str()) {
            Ok(())
        } else {
            Err(RuntimeError::InvalidControl {
                control: "handle",
                reason: format!(
                    "the claim {:?} does not name the warm lease {w:?}: not touched",
                    b.submission_id
                ),
            })
        }
    }

    /// Resolves when the lease has ended (or vanished): the NODE_LOST to report. A Jobs API
    /// that cannot be reached is not a lost node: the watch keeps asking.
    async fn watch(&self, id: &str) -> RuntimeError {
        loop {
            tokio::time::sleep(self.options.watch_interval).await;
            match self.jobs.get(id).await {
                Ok(Some(record)) if record.status.is_terminal() => {
                    return Self::node_lost(id, &record)
                }
                Ok(Some(_)) => {}
                Ok(None) => {
                    return RuntimeError::NodeLost {
                        runtime: RUNTIME,
                        lease: id.to_string(),
                        node: None,
                        reason: "the cluster no longer knows the lease's job".into(),
                    }
                }
                Err(e) => tracing::debug!(lease = id, error = %e, "lease watch: Jobs API"),
            }
        }
    }

    /// Runs `fut` while watching the lease: the lease ending first is NODE_LOST; an error of
    /// `fut` from a lease that has ended is NODE_LOST too (the node's connection died with it).
    pub(crate) async fn guarded<T>(
        &self,
        handle: &SandboxHandle,
        fut: impl std::future::Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        let b = self.backend(handle)?;
        let id = b.lease_job();
        let result = tokio::select! {
            r = fut => r,
            lost = self.watch(id) => return Err(lost),
        };
        let e = match result {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if let Ok(Some(record)) = self.jobs.get(id).await {
            if record.status.is_terminal() {
                return Err(Self::node_lost(id, &record));
            }
        }
        // The node does not answer but Ray still holds the lease running: a dead machine
        // refuses connections before Ray's health checks declare it dead. Wait (bounded) for
        // Ray's verdict rather than call a lost node a network error.
        if let RuntimeError::Unavailable { reason, .. } = &e {
            let grace = self.options.loss_grace;
            return match tokio::time::timeout(grace, self.watch(id)).await {
                Ok(lost) => Err(lost),
                Err(_) => Err(RuntimeError::Unavailable {
                    runtime: RUNTIME,
                    reason: format!(
                        "the lease's node does not answer, yet Ray still holds the lease running after {grace:?}: {reason}"
                    ),
                    fix: Some("check the network between this machine and the cluster's nodes".into()),
                }),
            };
        }
        Err(e)
    }

    /// Waits while Ray keeps the lease's job pending (each of Ray's reasons told to `sink`
    /// once), then until its server says where it listens: the node's client, its address,
    /// the job record and how long the lease queued. A lease that fails to start, or waits
    /// past the queue timeout, is ended and reported.
    pub(crate) async fn wait_running(
        &self,
        id: &str,
        sink: &dyn PlacementSink,
    ) -> Result<(RemoteRuntime, String, JobRecord, Duration), RuntimeError> {
        let id = id.to_string();
        let started = Instant::now();
        let sink = Said::new(sink);
        let mut running_since: Option<Instant> = None;
        let (remote, node_ip, record) = loop {
            let record = match self
                .patiently("read the lease's job", &sink, |_| self.jobs.get(&id))
                .await
            {
                Ok(Some(record)) => record,
                Ok(None) => {
                    return Err(RuntimeError::NodeLost {
                        runtime: RUNTIME,
                        lease: id.clone(),
                        node: None,
                        reason: "the cluster no longer knows the lease's job".into(),
                    })
                }
                Err(e) => return Err(jobs_error("read the lease", e)),
            };
            match record.status {
                JobStatus::Pending => {
                    let reason: String = record
                        .message
                        .as_deref()
                        .unwrap_or("waiting for a free sandbox slot")
                        .chars()
                        .take(600)
                        .collect();
                    sink.queued(&reason);
                    if started.elapsed() > self.options.queue_timeout {
                        let _ = self.end_lease(&id).await;
                        return Err(RuntimeError::Unavailable {
                            runtime: RUNTIME,
                            reason: format!(
                                "the lease waited {:?} in Ray's queue without a free slot: {}",
                                self.options.queue_timeout,
                                record.describe()
                            ),
                            fix: Some(
                                "add nodes with sandbox slots, or wait for running steps".into(),
                            ),
                        });
                    }
                }
                JobStatus::Running => {
                    let since = *running_since.get_or_insert_with(Instant::now);
                    if let Some((remote, ip)) = self.node_client(&id, &record, Some(&sink)).await? {
                        break (remote, ip, record);
                    }
                    if since.elapsed() > self.options.start_timeout {
                        let log = self.jobs.logs(&id).await.unwrap_or_default();
                        let _ = self.end_lease(&id).await;
                        return Err(RuntimeError::spawn(
                            "start the lease's server",
                            format!(
                                "it did not say where it listens within {:?}; its log ends: {}",
                                self.options.start_timeout,
                                tail(&log)
                            ),
                        ));
                    }
                }
                _ => {
                    let log = self.jobs.logs(&id).await.unwrap_or_default();
                    return Err(RuntimeError::spawn(
                        "start the lease",
                        format!("{}; its log ends: {}", record.describe(), tail(&log)),
                    ));
                }
            }
            tokio::time::sleep(self.options.poll_interval).await;
        };
        let queued = running_since
            .map(|r| r.duration_since(started))
            .unwrap_or_default();
        Ok((remote, node_ip, record, queued))
    }

    /// Whether the record under `id` has ended and holds no lease: a lease that ended, or a
    /// claim record whose warm lease ended too.
    async fn ended_record(&self, id: &str) -> bool {
        let read = self.patiently(
            "read the earlier lease's job",
            &NoPlacementEvents,
            move |_| self.jobs.get(id),
        );
        let Ok(Some(r)) = read.await else {
            return false;
        };
        if !r.status.is_terminal() {
            return false;
        }
        match r
            .metadata
            .as_ref()
            .and_then(|m| m.get(lease::META_CLAIM_OF))
        {
            None => true,
            Some(lease) => match self.jobs.get(lease).await {
                Ok(Some(l)) => l.status.is_terminal(),
                Ok(None) => true,
                Err(_) => false,
            },
        }
    }

    /// Stops the lease's job and deletes its record, waiting (bounded) for it to end.
    pub(crate) async fn end_lease(&self, id: &str) -> Result<(), RuntimeError> {
        self.jobs
            .stop(id)
            .await
            .map_err(|e| jobs_error("stop the lease", e))?;
        let deadline = Instant::now() + self.options.stop_timeout;
        loop {
            match self.jobs.get(id).await {
                Ok(None) => return Ok(()),
                Ok(Some(r)) if r.status.is_terminal() => break,
                Ok(Some(_)) | Err(_) if Instant::now() < deadline => {
                    // A stopped lease's server ends in a few hundred milliseconds (SIGTERM,
                    // its drain); asked often, as every step's cleanup waits for it.
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Ok(Some(r)) => {
                    return Err(RuntimeError::spawn(
                        "stop the lease",
                        format!(
                            "it has not ended after {:?}: {}",
                            self.options.stop_timeout,
                            r.describe()
                        ),
                    ))
                }
                Err(e) => return Err(jobs_error("stop the lease", e)),
            }
        }
        self.jobs
            .delete(id)
            .await
            .map_err(|e| jobs_error("delete the lease's job", e))?;
        self.sweep_ghosts().await;
        Ok(())
    }

    /// Deletes the records Ray wrote back for leases already deleted. Ray's job monitor
    /// looks at a job about once a second; when it finds the supervisor of a job whose record
    /// we just deleted gone, it takes the missing record for a job that died and writes a
    /// FAILED one (`JOB_SUPERVISOR_ACTOR_DIED`, no start time, no runtime env). Waiting it
    /// out would add a second to every step; instead each cleanup removes the ghosts of the
    /// earlier ones. Only records of that exact shape under our submission-id prefix are
    /// touched. Best effort: a failure here loses nothing.
    ///
    /// Ended claim records whose warm lease is no longer running go too (a warm step's
    /// cleanup does not wait for its claim to end).
    async fn sweep_ghosts(&self) {
        let Ok(records) = self.jobs.list().await else {
            return;
        };
        let live: std::collections::BTreeSet<&str> = records
            .iter()
            .filter(|r| !r.status.is_terminal())
            .filter_map(|r| r.submission_id.as_deref())
            .collect();
        for r in &records {
            let Some(id) = r.submission_id.as_deref() else {
                continue;
            };
            let ghost = id.starts_with(lease::SUBMISSION_PREFIX)
                && r.status.is_terminal()
                && r.start_time.is_none()
                && r.runtime_env.is_none()
                && r.error_type.as_deref() == Some("JOB_SUPERVISOR_ACTOR_DIED");
            let spent_claim = id.starts_with(lease::SUBMISSION_PREFIX)
                && r.status.is_terminal()
                && r.metadata
                    .as_ref()
                    .and_then(|m| m.get(lease::META_CLAIM_OF))
                    .is_some_and(|lease| !live.contains(lease.as_str()));
            if ghost || spent_claim {
                let _ = self.jobs.delete(id).await;
            }
        }
    }
}

/// The codeplane handle on the node for our handle: same ids and local directories.
fn inner_handle(handle: &SandboxHandle, remote: Value) -> SandboxHandle {
    SandboxHandle {
        runtime: RuntimeKind::Codeplane,
        backend: remote,
        ..handle.clone()
    }
}

#[async_trait]
impl Runtime for RayRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Ray
    }

    async fn probe(&self) -> EnforcementReport {
        let mut protections = Vec::new();
        match self.jobs.nodes().await {
            Ok(nodes) => {
                let slot = &self.options.slot_resource;
                let usable: Vec<_> = nodes
                    .iter()
                    .filter(|n| n.state == "ALIVE")
                    .filter(|n| n.resources_total.get(slot).copied().unwrap_or(0.0) >= 1.0)
                    .filter(|n| match &self.options.pool {
                        Some(pool) => {
                            n.labels.get(&self.options.pool_label).map(String::as_str)
                                == Some(pool.as_str())
                        }
                        None => true,
                    })
                    .collect();
                let slots: f64 = usable
                    .iter()
                    .map(|n| n.resources_total.get(slot).copied().unwrap_or(0.0))
                    .sum();
                protections.push(Protection {
                    name: "fleet".into(),
                    status: if usable.is_empty() {
                        ProtectionStatus::Unavailable
                    } else {
                        ProtectionStatus::Enforced
                    },
                    detail: format!(
                        "{} of the cluster's {} live nodes offer {slots} `{slot}`{}: a step waits in Ray's queue for one and holds it for its whole life",
                        usable.len(),
                        nodes.iter().filter(|n| n.state == "ALIVE").count(),
                        match &self.options.pool {
                            Some(p) => format!(" in pool {p:?} (label {})", self.options.pool_label),
                            None => String::new(),
                        }
                    ),
                    fix: usable.is_empty().then(|| {
                        format!("start worker nodes with `ray start --resources '{{\"{slot}\": N}}'`")
                    }),
                });
                protections.push(Protection {
                    name: "node-isolation".into(),
                    status: ProtectionStatus::Degraded,
                    detail: "each step is contained by `smithers-sandbox serve` (native runtime) on its node; \
                             what that node enforces is in the step's own enforcement report, read from the node when it runs"
                        .into(),
                    fix: None,
                });
            }
            Err(e) => protections.push(Protection {
                name: "fleet".into(),
                status: ProtectionStatus::Unavailable,
                detail: e.to_string(),
                fix: Some(format!("check {ENV_ADDRESS} and {ENV_TOKEN}")),
            }),
        }
        EnforcementReport {
            runtime: Some(RuntimeKind::Ray),
            protections,
        }
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        config.refuse_layers("ray")?;
        config.refuse_home("ray")?;
        config.refuse_secrets("ray")?;
        config.validate()?;
        if config.runtime != RuntimeKind::Ray {
            return Err(RuntimeError::InvalidControl {
                control: "runtime",
                reason: format!("the ray runtime was given a {} config", config.runtime),
            });
        }
        let c = &config.controls;
        if !c.volumes.is_empty() {
            return Err(RuntimeError::ControlUnsupported {
                runtime: RUNTIME,
                control: "volumes",
                reason: "host paths of this machine do not exist on the fleet's nodes".into(),
            });
        }
        if !c.ports.is_empty() {
            return Err(RuntimeError::ControlUnsupported {
                runtime: RUNTIME,
                control: "ports",
                reason: "a port published on a fleet node is not reachable as this machine's"
                    .into(),
            });
        }
        if c.egress_policy.is_some() {
            return Err(RuntimeError::ControlUnsupported {
                runtime: RUNTIME,
                control: "egressPolicy",
                reason:
                    "a node's egress ceiling is its operator's file; a lease does not carry one yet"
                        .into(),
            });
        }
        let meta = tokio::fs::metadata(&config.root_dir)
            .await
            .map_err(|e| RuntimeError::io("read rootDir", &config.root_dir, e))?;
        if !meta.is_dir() {
            return Err(RuntimeError::InvalidControl {
                control: "rootDir",
                reason: format!("{} is not a directory", config.root_dir.display()),
            });
        }
        let id = lease::submission_id(&config.run_id, &config.sandbox_id);
        let claimed = self.claim_warm(config).await?;
        let warm_lease = claimed.as_ref().map(|w| w.id.clone());
        let token = lease::new_token();
        let job = match &claimed {
            Some(w) => lease::claim_job(config, &id, &w.id),
            None => lease::job_for(&self.options, config, &id, &token),
        };
        let what = match &claimed {
            Some(_) => "submit the claim of a warm lease",
            None => "submit the lease",
        };
        let mut submitted = self.submit(what, &job, &NoPlacementEvents).await;
        if matches!(submitted, Err(JobsError::Duplicate(_))) && self.ended_record(&id).await {
            // The earlier sandbox of these ids has ended and only its record is left (a
            // cleanup that could not delete it, a claim record not swept yet): it holds no
            // lease, so it goes and this one is submitted. A live one is refused below.
            let _ = self.jobs.delete(&id).await;
            submitted = self.submit(what, &job, &NoPlacementEvents).await;
        }
        if let Some(w) = claimed.clone() {
            match &submitted {
                // Claimed: its replacement starts now.
                Ok(()) => self.fill_warm(),
                // Not ours after all: back to the pool.
                Err(JobsError::Duplicate(_)) => self.return_warm(w),
                // Ray may have taken the claim before the reply was lost: the warm lease may
                // be named by it, so it is not handed to anyone else.
                Err(_) => {
                    let _ = self.end_lease(&w.id).await;
                    self.fill_warm();
                }
            }
        }
        match submitted {
            Ok(()) => {}
            Err(JobsError::Duplicate(message)) => {
                return Err(RuntimeError::InvalidControl {
                    control: "sandboxId",
                    reason: format!(
                        "sandbox {}/{} already has a lease ({id}): one sandbox, one lease; not created again ({message})",
                        config.run_id, config.sandbox_id
                    ),
                })
            }
            Err(e) => {
                // A reply lost after Ray took the job would leave a lease nobody holds a
                // handle for: ended, in case (a job Ray does not know is ended already).
                let _ = self.end_lease(&id).await;
                return Err(jobs_error("submit the lease", e));
            }
        }
        let sandbox_root = SandboxHandle::derived_sandbox_root(
            &config.root_dir,
            &config.run_id,
            &config.sandbox_id,
        );
        let request_path = sandbox_root.join("request");
        let result_path = sandbox_root.join("result");
        if let Err(e) = tokio::fs::create_dir_all(&request_path).await {
            let _ = self.end_lease(&id).await;
            if let Some(w) = claimed {
                let _ = self.end_lease(&w.id).await;
            }
            return Err(RuntimeError::io("create", &request_path, e));
        }
        if let Some(w) = claimed {
            self.claimed
                .lock()
                .expect("claimed table")
                .insert(key(&config.run_id, &config.sandbox_id), w);
        }
        self.configs
            .lock()
            .expect("config table")
            .insert(key(&config.run_id, &config.sandbox_id), config.clone());
        Ok(SandboxHandle {
            runtime: RuntimeKind::Ray,
            run_id: config.run_id.clone(),
            sandbox_id: config.sandbox_id.clone(),
            sandbox_root,
            request_path,
            result_path,
            container_id: None,
            workspace_id: Some(id.clone()),
            backend: serde_json::to_value(Backend {
                ray_address: self.jobs.base().to_string(),
                submission_id: id,
                warm_lease,
                node: None,
            })
            .unwrap_or(Value::Null),
        })
    }

    async fn place(
        &self,
        handle: SandboxHandle,
        sink: &dyn PlacementSink,
    ) -> Result<(SandboxHandle, Option<Placement>), RuntimeError> {
        let mut b = self.backend(&handle)?;
        let k = key(&handle.run_id, &handle.sandbox_id);
        let config = self
            .configs
            .lock()
            .expect("config table")
            .get(&k)
            .cloned()
            .ok_or_else(|| RuntimeError::OutOfOrder {
                verb: "place",
                reason: "the sandbox was not created by this process".into(),
            })?;
        // A warm lease claimed at create: its server is up already.
        let warm = self.claimed.lock().expect("claimed table").remove(&k);
        let (id, remote, node_ip, record, queued_ms) = match warm {
            Some(w) => (w.id, w.remote, w.node_ip, w.record, 0),
            None if b.warm_lease.is_some() => {
                return Err(RuntimeError::OutOfOrder {
                    verb: "place",
                    reason: "the warm lease was claimed by another process".into(),
                })
            }
            None => {
                let id = b.submission_id.clone();
                let (remote, node_ip, record, queued) = self.wait_running(&id, sink).await?;
                (id, remote, node_ip, record, queued.as_millis() as u64)
            }
        };
        let is_warm = b.warm_lease.is_some();
        let node_id = record.driver_node_id.clone().unwrap_or_default();
        // The sandbox on the node, with the same ids and the same local directories.
        let remote_config = SandboxConfig {
            runtime: RuntimeKind::Codeplane,
            ..config
        };
        let inner = match remote.create(&remote_config).await {
            Ok(inner) => inner,
            Err(e) => {
                return Err(match self.jobs.get(&id).await {
                    Ok(Some(r)) if r.status.is_terminal() => Self::node_lost(&id, &r),
                    Ok(Some(r)) => {
                        // Say what the lease itself says: its state and the end of its log.
                        let log = self.jobs.logs(&id).await.unwrap_or_default();
                        RuntimeError::spawn(
                            "make the sandbox on the lease's server",
                            format!(
                                "{}: {e}; the lease is {} on node {node_ip}, its log ends: {}",
                                remote.options().base_url,
                                r.describe(),
                                tail(&log)
                            ),
                        )
                    }
                    _ => e,
                });
            }
        };
        b.node = Some(NodeBackend {
            node_ip: node_ip.clone(),
            node_id: node_id.clone(),
            remote: inner.backend.clone(),
        });
        let placed = SandboxHandle {
            backend: serde_json::to_value(&b).unwrap_or(Value::Null),
            ..handle
        };
        self.configs.lock().expect("config table").remove(&k);
        self.attached.lock().expect("attached table").insert(
            k,
            Attached {
                remote,
                inner,
                node: node_ip.clone(),
            },
        );
        Ok((
            placed,
            Some(Placement {
                node: node_ip,
                node_id,
                lease: id,
                queued_ms,
                warm: is_warm,
            }),
        ))
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        let a = self.attach(handle).await?;
        self.guarded(handle, a.remote.ship(&a.inner, request)).await
    }

    async fn execute(
        &self,
        handle: &SandboxHandle,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecOutcome, RuntimeError> {
        let a = self.attach(handle).await?;
        tracing::debug!(node = %a.node, "execute on the lease's node");
        self.guarded(handle, a.remote.execute(&a.inner, command, cancel, output))
            .await
    }

    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        let a = self.attach(handle).await?;
        let b = self.backend(handle)?;
        let report = match self.guarded(handle, a.remote.collect(&a.inner)).await {
            Ok(report) => report,
            Err(e) => {
                // Whatever came down before the failure (a lost lease, a cut stream) is not a
                // bundle anyone may review: gone, not left looking complete.
                let _ = tokio::fs::remove_dir_all(&handle.result_path).await;
                return Err(e);
            }
        };
        // Downloaded: kept only if the lease is still the live one that ran the step. A node
        // lost during the download may have sent a bundle it never finished.
        let id = b.lease_job();
        let alive = match self.jobs.get(id).await {
            Ok(Some(r)) if r.status == JobStatus::Running => Ok(()),
            Ok(Some(r)) => Err(Self::node_lost(id, &r)),
            Ok(None) => Err(RuntimeError::NodeLost {
                runtime: RUNTIME,
                lease: id.to_string(),
                node: Some(a.node.clone()),
                reason: "the cluster no longer knows the lease's job".into(),
            }),
            Err(e) => Err(jobs_error("confirm the lease after the download", e)),
        };
        if let Err(e) = alive {
            let _ = tokio::fs::remove_dir_all(&report.bundle_path).await;
            return Err(e);
        }
        Ok(report)
    }

    async fn cleanup(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        // The handle may come from a crafted database: directories checked before anything is
        // removed, the cluster and the lease id checked before anything is asked of them.
        let root = handle.project_root()?;
        handle.check_project_dirs_real(&root)?;
        let b = self.backend(handle)?;
        // A warm handle's lease is touched only if its claim names it.
        let b = match self.check_claim(&b).await {
            Ok(()) => b,
            // The claim is gone (a crash before it was written, a sweep): the warm lease is
            // not provably this sandbox's; its server ends by itself when idle.
            Err(RuntimeError::NodeLost { .. }) => Backend {
                warm_lease: None,
                ..b
            },
            Err(e) => return Err(e),
        };
        let k = key(&handle.run_id, &handle.sandbox_id);
        self.configs.lock().expect("config table").remove(&k);
        let mut first_error = None;
        // The sandbox on the node first: its layers and processes go with it. A lease that has
        // ended took its server with it: nothing to ask the node (it may be unreachable).
        let live = matches!(
            self.jobs.get(b.lease_job()).await,
            Ok(Some(ref r)) if r.status == JobStatus::Running
        );
        let attached = match b.node {
            Some(_) if live => self.attach(handle).await.ok(),
            _ => None,
        };
        match attached {
            Some(a) => {
                if let Err(e) = a.remote.cleanup(&a.inner).await {
                    first_error = Some(e);
                }
            }
            // What the codeplane client would remove here, the node being out of reach
            // (a download cut off by the lost lease leaves its staging directory).
            None => {
                first_error = smithers_runtime_remote::remove_local_leftovers(handle)
                    .await
                    .err()
            }
        }
        self.attached.lock().expect("attached table").remove(&k);
        let unplaced = self.claimed.lock().expect("claimed table").remove(&k);
        if let Some(w) = unplaced {
            // Claimed at create, never placed: the warm lease goes too (it was promised).
            if let Err(e) = self.end_lease(&w.id).await {
                first_error.get_or_insert(e);
            }
        }
        if let Err(e) = self.end_lease(b.lease_job()).await {
            first_error.get_or_insert(e);
        }
        if b.warm_lease.is_some() {
            // The claim record runs `true` on no resources; it may still be starting (a Ray
            // job takes most of a second). It is stopped, and deleted now if it has ended,
            // else by the next cleanup's sweep: waiting for it would cost every warm step
            // that second back.
            let _ = self.jobs.stop(&b.submission_id).await;
            if let Ok(Some(r)) = self.jobs.get(&b.submission_id).await {
                if r.status.is_terminal() {
                    let _ = self.jobs.delete(&b.submission_id).await;
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The last lines of a log, for an error message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().rev().take(8).collect();
    let text = lines.into_iter().rev().collect::<Vec<_>>().join(" | ");
    let count = text.chars().count();
    if count > 1500 {
        text.chars().skip(count - 1500).collect()
    } else {
        text
    }
}
