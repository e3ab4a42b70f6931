//! Prometheus metrics of the host (spec section 8 names), rendered in the text exposition
//! format at `GET /metrics`. Small enough to keep by hand rather than pull in a registry.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// A histogram with fixed upper bounds.
#[derive(Debug)]
struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// `start × 2^k` for k in 0..n.
    fn exponential(start: f64, n: usize) -> Self {
        let bounds: Vec<f64> = (0..n).map(|k| start * 2f64.powi(k as i32)).collect();
        Histogram {
            counts: vec![0; bounds.len()],
            bounds,
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (bound, count) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if v <= *bound {
                *count += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Debug)]
struct Inner {
    created: BTreeMap<String, u64>,
    completed: BTreeMap<(String, String), u64>,
    active: BTreeMap<String, i64>,
    rejected_uploads: BTreeMap<String, u64>,
    http_responses: BTreeMap<u16, u64>,
    connections_accepted: u64,
    connections_open: i64,
    duration_ms: Histogram,
    bundle_size_bytes: Histogram,
    transport_duration_ms: Histogram,
    patch_count: Histogram,
}

/// The host's metrics.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            inner: Mutex::new(Inner {
                created: BTreeMap::new(),
                completed: BTreeMap::new(),
                active: BTreeMap::new(),
                rejected_uploads: BTreeMap::new(),
                http_responses: BTreeMap::new(),
                connections_accepted: 0,
                connections_open: 0,
                duration_ms: Histogram::exponential(100.0, 12),
                bundle_size_bytes: Histogram::exponential(100.0, 16),
                transport_duration_ms: Histogram::exponential(100.0, 12),
                patch_count: Histogram::exponential(10.0, 18),
            }),
        }
    }
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    pub fn sandbox_created(&self, runtime: &str) {
        self.with(|m| {
            *m.created.entry(runtime.to_string()).or_default() += 1;
            *m.active.entry(runtime.to_string()).or_default() += 1;
        });
    }

    /// A sandbox reached a terminal status (finished, failed, cancelled): the active gauge goes
    /// down whatever the status, so failures do not leak it.
    pub fn sandbox_completed(&self, runtime: &str, status: &str) {
        self.with(|m| {
            *m.completed
                .entry((runtime.to_string(), status.to_string()))
                .or_default() += 1;
            *m.active.entry(runtime.to_string()).or_default() -= 1;
        });
    }

    pub fn duration_ms(&self, v: f64) {
        self.with(|m| m.duration_ms.observe(v));
    }

    pub fn bundle_size_bytes(&self, v: f64) {
        self.with(|m| m.bundle_size_bytes.observe(v));
    }

    pub fn transport_duration_ms(&self, v: f64) {
        self.with(|m| m.transport_duration_ms.observe(v));
    }

    /// Observed once per sandbox, at collect.
    pub fn patch_count(&self, v: f64) {
        self.with(|m| m.patch_count.observe(v));
    }

    pub fn upload_rejected(&self, code: &str) {
        self.with(|m| *m.rejected_uploads.entry(code.to_string()).or_default() += 1);
    }

    pub fn http_response(&self, status: u16) {
        self.with(|m| *m.http_responses.entry(status).or_default() += 1);
    }

    pub fn connection_opened(&self) {
        self.with(|m| {
            m.connections_accepted += 1;
            m.connections_open += 1;
        });
    }

    pub fn connection_closed(&self) {
        self.with(|m| m.connections_open -= 1);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        self.with(|m| {
            let mut out = String::new();
            let _ = writeln!(
                out,
                "# HELP smithers_sandbox_created_total Sandboxes created.\n# TYPE smithers_sandbox_created_total counter"
            );
            for (runtime, n) in &m.created {
                let _ = writeln!(out, "smithers_sandbox_created_total{{runtime=\"{runtime}\"}} {n}");
            }
            let _ = writeln!(
                out,
                "# HELP smithers_sandbox_completed_total Sandboxes that reached a terminal status.\n# TYPE smithers_sandbox_completed_total counter"
            );
            for ((runtime, status), n) in &m.completed {
                let _ = writeln!(
                    out,
                    "smithers_sandbox_completed_total{{runtime=\"{runtime}\",status=\"{status}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "# HELP smithers_sandbox_active Sandboxes not yet in a terminal status.\n# TYPE smithers_sandbox_active gauge"
            );
            for (runtime, n) in &m.active {
                let _ = writeln!(out, "smithers_sandbox_active{{runtime=\"{runtime}\"}} {n}");
            }
            m.duration_ms.render(
                "smithers_sandbox_duration_ms",
                "Duration of execute, in milliseconds.",
                &mut out,
            );
            m.bundle_size_bytes.render(
                "smithers_sandbox_bundle_size_bytes",
                "Size of collected result bundles.",
                &mut out,
            );
            m.transport_duration_ms.render(
                "smithers_sandbox_transport_duration_ms",
                "Duration of workspace uploads, in milliseconds.",
                &mut out,
            );
            m.patch_count.render(
                "smithers_sandbox_patch_count",
                "Patches per collected bundle.",
                &mut out,
            );
            let _ = writeln!(
                out,
                "# HELP smithers_server_rejected_uploads_total Workspace uploads refused, by error code.\n# TYPE smithers_server_rejected_uploads_total counter"
            );
            for (code, n) in &m.rejected_uploads {
                let _ = writeln!(out, "smithers_server_rejected_uploads_total{{code=\"{code}\"}} {n}");
            }
            let _ = writeln!(
                out,
                "# HELP smithers_server_http_responses_total HTTP responses, by status.\n# TYPE smithers_server_http_responses_total counter"
            );
            for (status, n) in &m.http_responses {
                let _ = writeln!(out, "smithers_server_http_responses_total{{status=\"{status}\"}} {n}");
            }
            let _ = writeln!(
                out,
                "# HELP smithers_server_connections_accepted_total TCP connections accepted.\n# TYPE smithers_server_connections_accepted_total counter\nsmithers_server_connections_accepted_total {}",
                m.connections_accepted
            );
            let _ = writeln!(
                out,
                "# HELP smithers_server_connections_open TCP connections being served (at most the connection cap).\n# TYPE smithers_server_connections_open gauge\nsmithers_server_connections_open {}",
                m.connections_open
            );
            out
        })
    }
}
