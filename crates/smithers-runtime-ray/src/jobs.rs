//! The part of Ray's Jobs REST API (the dashboard port, `/api/jobs/`) a lease needs: submit,
//! read, logs, stop, delete. Replies are read with a cap: the engine is trusted to place and
//! watch, not to size our allocations.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use smithers_errors::error_chain;

/// Largest JSON reply we read from the Jobs API (a job record, a job list).
const MAX_REPLY_BYTES: usize = 4 << 20;
/// Largest job log we read: a lease's log is the few lines `serve` prints.
const MAX_LOG_BYTES: usize = 1 << 20;

/// A job's state, as Ray names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    Pending,
    Running,
    Stopped,
    Succeeded,
    Failed,
}

impl JobStatus {
    /// The job has ended and will not run again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Stopped | JobStatus::Succeeded | JobStatus::Failed
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "PENDING",
            JobStatus::Running => "RUNNING",
            JobStatus::Stopped => "STOPPED",
            JobStatus::Succeeded => "SUCCEEDED",
            JobStatus::Failed => "FAILED",
        }
    }
}

/// What `POST /api/jobs/` takes (the fields a lease uses).
#[derive(Debug, Clone, Serialize)]
pub struct JobSubmit {
    pub entrypoint: String,
    pub submission_id: String,
    pub runtime_env: Value,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint_num_cpus: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint_memory: Option<u64>,
    pub entrypoint_resources: BTreeMap<String, f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub entrypoint_label_selector: BTreeMap<String, String>,
}

/// A job record (`GET /api/jobs/<id>`), the fields a lease reads.
#[derive(Debug, Clone, Deserialize)]
pub struct JobRecord {
    pub submission_id: Option<String>,
    pub status: JobStatus,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub error_type: Option<String>,
    /// `http://<node ip>:<agent port>` of the node the job's entrypoint runs on.
    #[serde(default)]
    pub driver_agent_http_address: Option<String>,
    #[serde(default)]
    pub driver_node_id: Option<String>,
    #[serde(default)]
    pub runtime_env: Option<Value>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub start_time: Option<u64>,
}

impl JobRecord {
    /// The IP address of the node running the entrypoint, from the agent's address.
    pub fn node_ip(&self) -> Option<std::net::IpAddr> {
        let address = self.driver_agent_http_address.as_deref()?;
        let url = reqwest::Url::parse(address).ok()?;
        match url.host()? {
            url::Host::Ipv4(ip) => Some(ip.into()),
            url::Host::Ipv6(ip) => Some(ip.into()),
            url::Host::Domain(d) => d.parse().ok(),
        }
    }

    /// An environment variable the job was submitted with.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.runtime_env
            .as_ref()?
            .get("env_vars")?
            .get(name)?
            .as_str()
    }

    /// Status and Ray's own words, for a message.
    pub fn describe(&self) -> String {
        let mut text = format!("job {}", self.status.as_str());
        if let Some(t) = &self.error_type {
            text.push_str(&format!(" ({})", t.chars().take(80).collect::<String>()));
        }
        if let Some(m) = &self.message {
            text.push_str(": ");
            text.push_str(&m.chars().take(600).collect::<String>());
        }
        text
    }
}

/// How a Jobs API call failed.
#[derive(Debug, Clone)]
pub enum JobsError {
    /// The API could not be reached, or the connection failed or timed out mid-call
    /// (refused, reset, closed before the reply, timed out): the kind of failure that passes
    /// (a head restarting, a busy dashboard). `kind` names it in a few words.
    Unreachable { kind: &'static str, message: String },
    /// The call could not be made or its reply not used (a name that does not resolve, TLS,
    /// a reply that is not what the API sends, or over its cap): asking again will not help.
    Unusable(String),
    /// A job with this submission id exists already (Ray answers HTTP 500 with this message).
    Duplicate(String),
    /// The API refused the token (401/403).
    Unauthorized(String),
    /// Any other refusal, with the status and the (capped) body.
    Refused(StatusCode, String),
    /// Transient failures retried until the placement window ran out
    /// ([`crate::retry::ApiRetry`]): what was asked, how often, what failed, each wait.
    GaveUp(Box<crate::waited::Waited>),
}

impl JobsError {
    /// A failure worth asking again (within a bound): the API out of reach for a moment, or
    /// answering 5xx (a dashboard whose agent is starting, a proxy in front of it), 408 or
    /// 429. An answer that refuses the request itself (4xx: the token, a bad request) is
    /// final, as is everything that asking again cannot change.
    pub fn is_transient(&self) -> bool {
        match self {
            JobsError::Unreachable { .. } => true,
            JobsError::Refused(s, _) => {
                (s.is_server_error()
                    && !matches!(
                        *s,
                        StatusCode::NOT_IMPLEMENTED | StatusCode::HTTP_VERSION_NOT_SUPPORTED
                    ))
                    || matches!(
                        *s,
                        StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS
                    )
            }
            JobsError::Unusable(_)
            | JobsError::Duplicate(_)
            | JobsError::Unauthorized(_)
            | JobsError::GaveUp(_) => false,
        }
    }

    /// The failure in a few words, for a count of failures of one kind ("HTTP 500 Internal
    /// Server Error", "connection refused").
    pub fn kind(&self) -> String {
        match self {
            JobsError::Unreachable { kind, .. } => (*kind).to_string(),
            JobsError::Unusable(_) => "unusable reply".into(),
            JobsError::Duplicate(_) => "duplicate submission id".into(),
            JobsError::Unauthorized(_) => "token refused".into(),
            JobsError::Refused(s, _) => format!("HTTP {s}"),
            JobsError::GaveUp(_) => "gave up".into(),
        }
    }
}

impl std::fmt::Display for JobsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobsError::Unreachable { message, .. } => {
                write!(f, "the Ray Jobs API is unreachable: {message}")
            }
            JobsError::Unusable(m) => write!(f, "the Ray Jobs API cannot be used: {m}"),
            JobsError::Duplicate(m) => write!(f, "a job with this submission id exists: {m}"),
            JobsError::Unauthorized(m) => write!(f, "the Ray Jobs API refused the token: {m}"),
            JobsError::Refused(s, m) => write!(f, "the Ray Jobs API answered HTTP {s}: {m}"),
            JobsError::GaveUp(w) => write!(f, "{w}"),
        }
    }
}

/// A failed request or reply body: transient (refused, reset, closed early, timed out) or not
/// (no such name, TLS, a request that cannot be built).
fn transport(e: &reqwest::Error) -> JobsError {
    let message = error_chain(e);
    match transient_kind(e) {
        Some(kind) => JobsError::Unreachable { kind, message },
        None => JobsError::Unusable(message),
    }
}

/// The kind of a transport failure that passes, from the error and its sources.
fn transient_kind(e: &reqwest::Error) -> Option<&'static str> {
    if e.is_timeout() {
        return Some("timed out");
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            let kind = match io.kind() {
                K::ConnectionRefused => Some("connection refused"),
                K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => {
                    Some("connection reset")
                }
                K::TimedOut => Some("timed out"),
                K::UnexpectedEof | K::NotConnected => Some("connection closed before the reply"),
                K::HostUnreachable | K::NetworkUnreachable => Some("no route to the head"),
                _ => None,
            };
            if kind.is_some() {
                return kind;
            }
        }
        // hyper's own words for a connection that closed before (or while) the reply came.
        let text = s.to_string();
        if text.contains("connection closed before message completed")
            || text.contains("end of file before message length reached")
        {
            return Some("connection closed before the reply");
        }
        if text.contains("connection reset") {
            return Some("connection reset");
        }
        source = s.source();
    }
    None
}

/// A client of one cluster's Jobs API.
#[derive(Debug, Clone)]
pub struct JobsClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
    timeout: Duration,
}

impl JobsClient {
    pub fn new(base: &str, token: Option<String>, timeout: Duration) -> Result<Self, String> {
        let url = reqwest::Url::parse(base).map_err(|e| format!("invalid URL {base:?}: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("unsupported URL scheme {:?}", url.scheme()));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(JobsClient {
            base: base.trim_end_matches('/').to_string(),
            token,
            http,
            timeout,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(self.timeout);
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    async fn call(
        &self,
        req: reqwest::RequestBuilder,
        cap: usize,
    ) -> Result<(StatusCode, Vec<u8>), JobsError> {
        let resp = req.send().await.map_err(|e| transport(&e))?;
        let status = resp.status();
        let body = read_capped(resp, cap).await?;
        Ok((status, body))
    }

    /// Submits a job. A submission id in use is [`JobsError::Duplicate`].
    pub async fn submit(&self, job: &JobSubmit) -> Result<(), JobsError> {
        let (status, body) = self
            .call(
                self.request(Method::POST, "/api/jobs/").json(job),
                MAX_REPLY_BYTES,
            )
            .await?;
        if status.is_success() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&body);
        // Ray 2.x answers a reused submission id with HTTP 500 and a traceback naming it.
        if text.contains("already exists") {
            return Err(JobsError::Duplicate(last_line(&text)));
        }
        Err(refusal(status, &text))
    }

    /// Reads a job; `None` when Ray knows no such job.
    pub async fn get(&self, id: &str) -> Result<Option<JobRecord>, JobsError> {
        let (status, body) = self
            .call(
                self.request(Method::GET, &format!("/api/jobs/{id}")),
                MAX_REPLY_BYTES,
            )
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(refusal(status, &String::from_utf8_lossy(&body)));
        }
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| JobsError::Unusable(format!("unreadable job record: {e}")))
    }

    /// Every job the cluster keeps a record of (at most 16 MiB of records).
    pub async fn list(&self) -> Result<Vec<JobRecord>, JobsError> {
        let (status, body) = self
            .call(self.request(Method::GET, "/api/jobs/"), MAX_REPLY_BYTES * 4)
            .await?;
        if !status.is_success() {
            return Err(refusal(status, &String::from_utf8_lossy(&body)));
        }
        let rows: Vec<Value> = serde_json::from_slice(&body)
            .map_err(|e| JobsError::Unusable(format!("unreadable job list: {e}")))?;
        Ok(rows
            .into_iter()
            .filter_map(|r| serde_json::from_value(r).ok())
            .collect())
    }

    /// The job's log (its entrypoint's stdout and stderr), at most 1 MiB of it.
    pub async fn logs(&self, id: &str) -> Result<String, JobsError> {
        let (status, body) = self
            .call(
                self.request(Method::GET, &format!("/api/jobs/{id}/logs")),
                MAX_LOG_BYTES + 4096,
            )
            .await?;
        if !status.is_success() {
            return Err(refusal(status, &String::from_utf8_lossy(&body)));
        }
        #[derive(Deserialize)]
        struct Logs {
            logs: String,
        }
        serde_json::from_slice::<Logs>(&body)
            .map(|l| l.logs)
            .map_err(|e| JobsError::Unusable(format!("unreadable job log: {e}")))
    }

    /// Asks Ray to stop the job (SIGTERM to its entrypoint, SIGKILL after Ray's grace time).
    /// A job Ray does not know is stopped already.
    pub async fn stop(&self, id: &str) -> Result<(), JobsError> {
        let (status, body) = self
            .call(
                self.request(Method::POST, &format!("/api/jobs/{id}/stop")),
                MAX_REPLY_BYTES,
            )
            .await?;
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        Err(refusal(status, &String::from_utf8_lossy(&body)))
    }

    /// Deletes an ended job's record. A job Ray does not know is deleted already.
    pub async fn delete(&self, id: &str) -> Result<(), JobsError> {
        let (status, body) = self
            .call(
                self.request(Method::DELETE, &format!("/api/jobs/{id}")),
                MAX_REPLY_BYTES,
            )
            .await?;
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        Err(refusal(status, &String::from_utf8_lossy(&body)))
    }

    /// The cluster's nodes that are alive, with their `sandbox_slot` count and labels.
    pub async fn nodes(&self) -> Result<Vec<NodeInfo>, JobsError> {
        let (status, body) = self
            .call(
                self.request(Method::GET, "/api/v0/nodes?detail=1&limit=10000"),
                MAX_REPLY_BYTES * 4,
            )
            .await?;
        if !status.is_success() {
            return Err(refusal(status, &String::from_utf8_lossy(&body)));
        }
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| JobsError::Unusable(format!("unreadable node list: {e}")))?;
        let rows = v["data"]["result"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(rows
            .into_iter()
            .filter_map(|n| serde_json::from_value::<NodeInfo>(n).ok())
            .collect())
    }
}

/// One node of the cluster, as the state API lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct NodeInfo {
    pub node_id: String,
    pub node_ip: String,
    pub state: String,
    #[serde(default)]
    pub resources_total: BTreeMap<String, f64>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

fn refusal(status: StatusCode, text: &str) -> JobsError {
    let short = last_line(text);
    if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
        JobsError::Unauthorized(short)
    } else {
        JobsError::Refused(status, short)
    }
}

/// The last non-empty line of a (traceback) reply, capped: Ray's errors end with the message.
fn last_line(text: &str) -> String {
    let line = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && *l != ".")
        .unwrap_or("");
    line.chars().take(500).collect()
}

async fn read_capped(resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, JobsError> {
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| transport(&e))?;
        if body.len() + chunk.len() > cap {
            return Err(JobsError::Unusable(format!(
                "the reply is larger than {cap} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceback_reply_is_said_by_its_last_line() {
        let text = "Traceback (most recent call last):\n  File x\nValueError: Job with submission_id t1 already exists. Please use a different submission_id.\n.\n";
        assert_eq!(
            last_line(text),
            "ValueError: Job with submission_id t1 already exists. Please use a different submission_id."
        );
    }

    #[test]
    fn a_job_record_names_its_node_and_env() {
        let record: JobRecord = serde_json::from_value(serde_json::json!({
            "type": "SUBMISSION", "submission_id": "s", "status": "RUNNING",
            "driver_agent_http_address": "http://10.88.0.12:52365",
            "driver_node_id": "abc", "runtime_env": {"env_vars": {"K": "v"}},
            "message": "Job is currently running."
        }))
        .unwrap();
        assert_eq!(record.node_ip().unwrap().to_string(), "10.88.0.12");
        assert_eq!(record.env_var("K"), Some("v"));
        assert_eq!(record.env_var("missing"), None);
        assert!(!record.status.is_terminal());
        assert_eq!(record.describe(), "job RUNNING: Job is currently running.");
    }
}
