//! Side-by-side measurement: every contender of a scenario runs once per round, in a rotating
//! order, so drift on a noisy shared machine hits all of them alike. Ratios are taken per
//! round (ours / peer in the same round), and their median reported: a ratio measured this way
//! is stable from run to run even when absolute times are not.

use anyhow::Context;
use std::time::{Duration, Instant};

/// One thing being timed: a name and a closure that performs one repetition.
pub struct Contender<'a> {
    pub name: String,
    pub run: Box<dyn FnMut() -> anyhow::Result<()> + 'a>,
    /// Untimed housekeeping after each repetition (removing what it left that is not part of
    /// the measured operation, e.g. a result bundle, which in real use is kept for review).
    pub after: Option<Box<dyn FnMut() + 'a>>,
}

impl<'a> Contender<'a> {
    pub fn new(name: impl Into<String>, run: impl FnMut() -> anyhow::Result<()> + 'a) -> Self {
        Contender {
            name: name.into(),
            run: Box::new(run),
            after: None,
        }
    }

    /// Adds untimed housekeeping run after each repetition.
    pub fn with_after(mut self, after: impl FnMut() + 'a) -> Self {
        self.after = Some(Box::new(after));
        self
    }
}

/// The samples of one contender, in round order.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub samples: Vec<Duration>,
}

impl Series {
    /// An empty series, filled by hand.
    pub fn new(name: impl Into<String>) -> Series {
        Series {
            name: name.into(),
            samples: Vec::new(),
        }
    }
    pub fn median(&self) -> Duration {
        percentile(&self.samples, 50.0)
    }
    pub fn p95(&self) -> Duration {
        percentile(&self.samples, 95.0)
    }
}

/// Runs `warmup` unrecorded rounds, then `rounds` recorded ones. Contender order rotates by
/// one each round.
pub fn interleaved(
    contenders: &mut [Contender<'_>],
    warmup: usize,
    rounds: usize,
) -> anyhow::Result<Vec<Series>> {
    let n = contenders.len();
    let mut series: Vec<Series> = contenders
        .iter()
        .map(|c| Series {
            name: c.name.clone(),
            samples: Vec::with_capacity(rounds),
        })
        .collect();
    for round in 0..warmup + rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let start = Instant::now();
            (contenders[i].run)()
                .map_err(|e| e.context(format!("{} (round {round})", contenders[i].name)))?;
            let took = start.elapsed();
            if let Some(after) = contenders[i].after.as_mut() {
                after();
            }
            if round >= warmup {
                series[i].samples.push(took);
            }
        }
    }
    Ok(series)
}

/// Median over rounds of `a[r] / b[r]`.
pub fn median_ratio(a: &Series, b: &Series) -> f64 {
    let mut ratios: Vec<f64> = a
        .samples
        .iter()
        .zip(&b.samples)
        .map(|(x, y)| x.as_secs_f64() / y.as_secs_f64().max(1e-9))
        .collect();
    ratios.sort_by(|x, y| x.total_cmp(y));
    median_f64(&ratios)
}

fn median_f64(sorted: &[f64]) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let m = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[m]
    } else {
        (sorted[m - 1] + sorted[m]) / 2.0
    }
}

/// Nearest-rank percentile.
pub fn percentile(samples: &[Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    if p == 50.0 {
        let m = sorted.len() / 2;
        return if sorted.len() % 2 == 1 {
            sorted[m]
        } else {
            (sorted[m - 1] + sorted[m]) / 2
        };
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Milliseconds with a precision that suits the magnitude.
pub fn fmt_ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

/// Runs `program` with its output thrown away; an error unless it exits 0.
pub fn run_quiet(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let status = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .with_context(|| format!("spawn {program}"))?;
    anyhow::ensure!(status.success(), "{program} {args:?} exited with {status}");
    Ok(())
}

/// Whether `program` runs here (`--version` starts).
pub fn have(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_ratios() {
        let s = |v: &[u64]| Series {
            name: "x".into(),
            samples: v.iter().map(|&ms| Duration::from_millis(ms)).collect(),
        };
        let a = s(&[10, 20, 30, 40]);
        let b = s(&[5, 10, 15, 40]);
        assert_eq!(a.median(), Duration::from_millis(25));
        assert_eq!(a.p95(), Duration::from_millis(40));
        // ratios 2, 2, 2, 1 → median 2
        assert!((median_ratio(&a, &b) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn rounds_rotate_and_record_every_contender() {
        let order = std::cell::RefCell::new(Vec::new());
        let mut cs = vec![
            Contender::new("a", || {
                order.borrow_mut().push('a');
                Ok(())
            }),
            Contender::new("b", || {
                order.borrow_mut().push('b');
                Ok(())
            }),
        ];
        let series = interleaved(&mut cs, 1, 3).unwrap();
        drop(cs);
        assert_eq!(series[0].samples.len(), 3);
        assert_eq!(series[1].samples.len(), 3);
        assert_eq!(order.into_inner().iter().collect::<String>(), "abbaabba");
    }
}
