//! What a run of transient failures of the Jobs API was, once the placement window ran out
//! ([`Waited`]), and how its durations are said. The report a [`JobsError::GaveUp`] carries:
//! below both the Jobs API client, whose error holds it, and the retry that makes it
//! (`crate::retry`, which re-exports it), so neither of those uses the other back for it.
//!
//! [`JobsError::GaveUp`]: crate::jobs::JobsError::GaveUp

use std::time::Duration;

/// What a run of transient failures was, once the window ran out.
#[derive(Debug, Clone)]
pub struct Waited {
    /// What was asked.
    pub what: String,
    pub attempts: u32,
    /// From the first attempt to the end of the last.
    pub elapsed: Duration,
    pub window: Duration,
    /// Each kind of failure and how often it came, in the order they first came.
    pub failures: Vec<(String, u32)>,
    /// Each wait between two attempts.
    pub waits: Vec<Duration>,
    /// The last failure, in full.
    pub last: String,
}

impl std::fmt::Display for Waited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let failures = self
            .failures
            .iter()
            .map(|(kind, n)| format!("{kind} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        write!(
            f,
            "the Ray Jobs API kept failing to {} for {} ({} attempts within the placement window of {}: {failures}); \
             waited {} between the attempts; the last: {}",
            self.what,
            secs(self.elapsed),
            self.attempts,
            secs(self.window),
            runs(&self.waits),
            self.last
        )
    }
}

/// `100 ms`, `1.6 s`, `2 s`, `61 s`.
pub fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{} ms", d.as_millis())
    } else if s >= 10.0 || (s - s.round()).abs() < 0.05 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

/// The waits, equal neighbours counted: `100 ms, 200 ms, 400 ms, 2 s ×5, 700 ms`.
pub fn runs(waits: &[Duration]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < waits.len() {
        let text = secs(waits[i]);
        let mut n = 1;
        while i + n < waits.len() && secs(waits[i + n]) == text {
            n += 1;
        }
        out.push(if n == 1 {
            text
        } else {
            format!("{text} ×{n}")
        });
        i += n;
    }
    if out.is_empty() {
        "nothing".into()
    } else {
        out.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_said_in_runs() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|m| Duration::from_millis(*m))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            runs(&ms(&[100, 200, 400, 800, 1600, 2000, 2000, 2000, 700])),
            "100 ms, 200 ms, 400 ms, 800 ms, 1.6 s, 2 s ×3, 700 ms"
        );
        assert_eq!(runs(&[]), "nothing");
        assert_eq!(secs(Duration::from_millis(61_234)), "61 s");
    }
}
