//! The seven sandbox metrics of spec section 8, rendered in the Prometheus text format.
//!
//! A small registry of our own: seven fixed series do not justify a metrics framework, and
//! the rendering is a few lines. Thread-safe; cheap enough to update on every event.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// `100 × 2^k` for k in 0..n (or `10 × 2^k`): the JavaScript package's bucket boundaries.
fn exponential(start: f64, count: usize) -> Vec<f64> {
    (0..count).map(|k| start * f64::from(1u32 << k)).collect()
}

#[derive(Debug, Clone)]
struct Histogram {
    bounds: Vec<f64>,
    /// Non-cumulative count per bound, plus one for +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: Vec<f64>) -> Self {
        let n = bounds.len();
        Histogram {
            bounds,
            counts: vec![0; n + 1],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, value: f64) {
        let idx = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[idx] += 1;
        self.sum += value;
        self.count += 1;
    }
}

#[derive(Debug)]
struct Inner {
    created: BTreeMap<String, u64>,
    completed: BTreeMap<(String, String), u64>,
    active: BTreeMap<String, i64>,
    duration: Histogram,
    bundle_size: Histogram,
    transport: Histogram,
    patch_count: Histogram,
}

/// The sandbox metrics.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// A snapshot of one histogram (for tests and dashboards).
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    pub count: u64,
    pub sum: f64,
}

impl Metrics {
    /// Empty metrics with the documented buckets.
    pub fn new() -> Self {
        Metrics {
            inner: Mutex::new(Inner {
                created: BTreeMap::new(),
                completed: BTreeMap::new(),
                active: BTreeMap::new(),
                duration: Histogram::new(exponential(100.0, 12)),
                bundle_size: Histogram::new(exponential(100.0, 16)),
                transport: Histogram::new(exponential(100.0, 12)),
                patch_count: Histogram::new(exponential(10.0, 18)),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Metric updates cannot leave the maps inconsistent, so a poisoned lock is reusable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `smithers_sandbox_created_total{runtime}` += 1.
    pub fn sandbox_created(&self, runtime: &str) {
        *self.lock().created.entry(runtime.to_string()).or_default() += 1;
    }

    /// `smithers_sandbox_completed_total{runtime,status}` += 1.
    pub fn sandbox_completed(&self, runtime: &str, status: &str) {
        *self
            .lock()
            .completed
            .entry((runtime.to_string(), status.to_string()))
            .or_default() += 1;
    }

    /// `smithers_sandbox_active{runtime}` += delta.
    pub fn active_add(&self, runtime: &str, delta: i64) {
        *self.lock().active.entry(runtime.to_string()).or_default() += delta;
    }

    /// Current value of the active gauge for a runtime.
    pub fn active(&self, runtime: &str) -> i64 {
        self.lock().active.get(runtime).copied().unwrap_or(0)
    }

    /// Current value of the created counter for a runtime.
    pub fn created(&self, runtime: &str) -> u64 {
        self.lock().created.get(runtime).copied().unwrap_or(0)
    }

    /// Current value of the completed counter.
    pub fn completed(&self, runtime: &str, status: &str) -> u64 {
        self.lock()
            .completed
            .get(&(runtime.to_string(), status.to_string()))
            .copied()
            .unwrap_or(0)
    }

    pub fn observe_duration_ms(&self, ms: f64) {
        self.lock().duration.observe(ms);
    }

    pub fn observe_bundle_size(&self, bytes: u64) {
        self.lock().bundle_size.observe(bytes as f64);
    }

    pub fn observe_transport_ms(&self, ms: f64) {
        self.lock().transport.observe(ms);
    }

    /// Observed once per sandbox, when its bundle is received (0.16 observed it up to 3 times).
    pub fn observe_patch_count(&self, count: u64) {
        self.lock().patch_count.observe(count as f64);
    }

    /// Count and sum of `smithers_sandbox_patch_count`.
    pub fn patch_count_snapshot(&self) -> HistogramSnapshot {
        let g = self.lock();
        HistogramSnapshot {
            count: g.patch_count.count,
            sum: g.patch_count.sum,
        }
    }

    /// Count and sum of `smithers_sandbox_duration_ms`.
    pub fn duration_snapshot(&self) -> HistogramSnapshot {
        let g = self.lock();
        HistogramSnapshot {
            count: g.duration.count,
            sum: g.duration.sum,
        }
    }

    /// Count and sum of `smithers_sandbox_transport_duration_ms`.
    pub fn transport_snapshot(&self) -> HistogramSnapshot {
        let g = self.lock();
        HistogramSnapshot {
            count: g.transport.count,
            sum: g.transport.sum,
        }
    }

    /// The Prometheus text exposition (version 0.0.4).
    pub fn render_prometheus(&self) -> String {
        let g = self.lock();
        let mut out = String::new();
        out.push_str("# HELP smithers_sandbox_created_total Sandboxes created.\n");
        out.push_str("# TYPE smithers_sandbox_created_total counter\n");
        for (runtime, v) in &g.created {
            let _ = writeln!(
                out,
                "smithers_sandbox_created_total{{runtime=\"{}\"}} {v}",
                escape(runtime)
            );
        }
        out.push_str(
            "# HELP smithers_sandbox_completed_total Sandboxes completed, by final status.\n",
        );
        out.push_str("# TYPE smithers_sandbox_completed_total counter\n");
        for ((runtime, status), v) in &g.completed {
            let _ = writeln!(
                out,
                "smithers_sandbox_completed_total{{runtime=\"{}\",status=\"{}\"}} {v}",
                escape(runtime),
                escape(status)
            );
        }
        out.push_str("# HELP smithers_sandbox_active Sandboxes currently running.\n");
        out.push_str("# TYPE smithers_sandbox_active gauge\n");
        for (runtime, v) in &g.active {
            let _ = writeln!(
                out,
                "smithers_sandbox_active{{runtime=\"{}\"}} {v}",
                escape(runtime)
            );
        }
        render_histogram(
            &mut out,
            "smithers_sandbox_duration_ms",
            "Sandbox execution duration in milliseconds.",
            &g.duration,
        );
        render_histogram(
            &mut out,
            "smithers_sandbox_bundle_size_bytes",
            "Size of received result bundles in bytes.",
            &g.bundle_size,
        );
        render_histogram(
            &mut out,
            "smithers_sandbox_transport_duration_ms",
            "Duration of runtime verb calls in milliseconds.",
            &g.transport,
        );
        render_histogram(
            &mut out,
            "smithers_sandbox_patch_count",
            "Patches per sandbox.",
            &g.patch_count,
        );
        out
    }
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn render_histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative = 0;
    for (bound, count) in h.bounds.iter().zip(&h.counts) {
        cumulative += count;
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum {}", h.sum);
    let _ = writeln!(out, "{name}_count {}", h.count);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_the_spec() {
        let m = Metrics::new();
        let g = m.lock();
        assert_eq!(g.duration.bounds.len(), 12);
        assert_eq!(g.duration.bounds[11], 204_800.0);
        assert_eq!(g.bundle_size.bounds.len(), 16);
        assert_eq!(g.transport.bounds.len(), 12);
        assert_eq!(g.patch_count.bounds.len(), 18);
        assert_eq!(g.patch_count.bounds[0], 10.0);
        assert_eq!(g.patch_count.bounds[17], 10.0 * f64::from(1u32 << 17));
    }

    #[test]
    fn renders_cumulative_buckets_and_labels() {
        let m = Metrics::new();
        m.sandbox_created("docker");
        m.active_add("docker", 1);
        m.active_add("docker", -1);
        m.sandbox_completed("docker", "failed");
        m.observe_patch_count(3);
        m.observe_patch_count(25);
        let text = m.render_prometheus();
        assert!(text.contains("smithers_sandbox_created_total{runtime=\"docker\"} 1\n"));
        assert!(text.contains("smithers_sandbox_active{runtime=\"docker\"} 0\n"));
        assert!(text.contains(
            "smithers_sandbox_completed_total{runtime=\"docker\",status=\"failed\"} 1\n"
        ));
        assert!(text.contains("smithers_sandbox_patch_count_bucket{le=\"10\"} 1\n"));
        assert!(text.contains("smithers_sandbox_patch_count_bucket{le=\"20\"} 1\n"));
        assert!(text.contains("smithers_sandbox_patch_count_bucket{le=\"40\"} 2\n"));
        assert!(text.contains("smithers_sandbox_patch_count_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("smithers_sandbox_patch_count_sum 28\n"));
        assert!(text.contains("# TYPE smithers_sandbox_duration_ms histogram\n"));
    }
}
