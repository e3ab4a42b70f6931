//! A real server on 127.0.0.1:0 with the host-process test double as its runtime.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use smithers_server::testing::HostProcessRuntime;
use smithers_server::{Limits, SandboxServer, ServerConfig};
use smithers_wire::wire::WireEvent;
use smithers_wire::SseParser;

pub const TOKEN: &str = "test-token-0123456789abcdef";

pub struct Host {
    pub base: String,
    pub runtime: Arc<HostProcessRuntime>,
    pub data: tempfile::TempDir,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub served: tokio::task::JoinHandle<Result<(), smithers_server::ServerError>>,
    pub http: reqwest::Client,
}

pub fn small_limits() -> Limits {
    Limits {
        max_json_bytes: 64 * 1024,
        max_upload_bytes: 4 * 1024 * 1024,
        max_workspace_bytes: 1024 * 1024,
        max_workspace_entries: 50,
        max_path_bytes: 1024,
        ..Limits::default()
    }
}

pub async fn start_with(limits: Limits, grace: Duration) -> Host {
    start_config(|data| ServerConfig {
        token: Some(TOKEN.to_string()),
        tokens: Vec::new(),
        data_dir: data.to_path_buf(),
        limits,
        shutdown_grace: grace,
    })
    .await
}

/// A server with the configuration `config` makes for its data directory.
pub async fn start_config(config: impl FnOnce(&std::path::Path) -> ServerConfig) -> Host {
    let data = tempfile::tempdir().unwrap();
    let runtime = Arc::new(HostProcessRuntime::new());
    let config = config(data.path());
    let server = SandboxServer::new(config, runtime.clone()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server.serve(listener, async move {
        let _ = rx.await;
    }));
    Host {
        base,
        runtime,
        data,
        stop: Some(tx),
        served,
        http: reqwest::Client::new(),
    }
}

pub async fn start() -> Host {
    start_with(small_limits(), Duration::from_secs(30)).await
}

impl Host {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path)).bearer_auth(TOKEN)
    }

    pub async fn health_ok(&self) {
        let r = self.http.get(self.url("/health")).send().await.unwrap();
        assert_eq!(r.status(), 200, "health after a bad request");
    }

    pub async fn create(&self, sandbox_id: &str) -> String {
        let r = self
            .req(reqwest::Method::POST, "/v1/sandboxes")
            .json(&serde_json::json!({"runId": "run-1", "sandboxId": sandbox_id}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let v: serde_json::Value = r.json().await.unwrap();
        v["id"].as_str().unwrap().to_string()
    }

    pub async fn upload(&self, id: &str, body: Vec<u8>) -> reqwest::Response {
        self.req(
            reqwest::Method::PUT,
            &format!("/v1/sandboxes/{id}/workspace"),
        )
        .body(body)
        .send()
        .await
        .unwrap()
    }

    pub async fn ship(&self, id: &str) {
        let r = self
            .req(reqwest::Method::PUT, &format!("/v1/sandboxes/{id}/request"))
            .json(&serde_json::json!({"status": "pending", "sandboxId": "s", "input": {"n": 1}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }

    pub async fn execute(&self, id: &str, key: Option<&str>, argv: &[&str]) -> reqwest::Response {
        let mut b = self
            .req(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{id}/execute"),
            )
            .json(&serde_json::json!({ "argv": argv }));
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        b.send().await.unwrap()
    }

    /// Reads the SSE stream to its end: (seq, event) pairs.
    pub async fn events(
        &self,
        id: &str,
        query: &str,
        last_event_id: Option<u64>,
    ) -> Vec<(u64, WireEvent)> {
        let mut b = self.req(
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{id}/events{query}"),
        );
        if let Some(l) = last_event_id {
            b = b.header("last-event-id", l.to_string());
        }
        let r = b.send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let mut stream = r.bytes_stream();
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            for f in parser.push(&chunk.unwrap()) {
                let seq = f.id.unwrap().parse().unwrap();
                let ev: WireEvent = serde_json::from_str(&f.data).unwrap();
                assert_eq!(f.event.as_deref(), Some(ev.name()));
                out.push((seq, ev));
            }
        }
        out
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.served.await.unwrap().unwrap();
    }
}

/// A tar (zstd-compressed) of the given entries, built entry by entry so hostile archives can
/// be written (raw names, links, devices).
pub struct TarBuilder {
    b: tar::Builder<Vec<u8>>,
}

impl TarBuilder {
    pub fn new() -> Self {
        TarBuilder {
            b: tar::Builder::new(Vec::new()),
        }
    }

    fn raw(
        &mut self,
        name: &str,
        kind: tar::EntryType,
        data: &[u8],
        link: Option<&str>,
    ) -> &mut Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        let field = &mut h.as_old_mut().name;
        field[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(l) = link {
            let lf = &mut h.as_old_mut().linkname;
            lf[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_cksum();
        self.b.append(&h, data).unwrap();
        self
    }

    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.raw(name, tar::EntryType::Regular, data, None)
    }

    pub fn dir(&mut self, name: &str) -> &mut Self {
        self.raw(name, tar::EntryType::Directory, b"", None)
    }

    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(name, tar::EntryType::Symlink, b"", Some(target))
    }

    pub fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(name, tar::EntryType::Link, b"", Some(target))
    }

    pub fn special(&mut self, name: &str, kind: tar::EntryType) -> &mut Self {
        self.raw(name, kind, b"", None)
    }

    pub fn zstd(&mut self) -> Vec<u8> {
        let b = std::mem::replace(&mut self.b, tar::Builder::new(Vec::new()));
        let raw = b.into_inner().unwrap();
        zstd::encode_all(&raw[..], 3).unwrap()
    }

    pub fn gzip(&mut self) -> Vec<u8> {
        use std::io::Write;
        let b = std::mem::replace(&mut self.b, tar::Builder::new(Vec::new()));
        let raw = b.into_inner().unwrap();
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&raw).unwrap();
        enc.finish().unwrap()
    }
}
