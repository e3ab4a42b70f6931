//! Riding out a Jobs API that fails for a moment while a lease is placed.
//!
//! Ray's dashboard answers HTTP 500 while the agent of a node that just started is not up
//! yet, refuses connections while the head restarts, and times out when busy. None of that
//! says anything about the lease, so placement (the lease's submit, the reads of its job and
//! its log while it waits to run) asks again, backing off, for up to the placement window
//! ([`ApiRetry::window`]). What it waited for is told as it happens (the caller's log and
//! progress) and, when the window runs out, in the error ([`Waited`]). A refusal of the
//! request itself (4xx: the token, a bad request), an unusable reply or a duplicate
//! submission id is never retried: it fails at once.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::jobs::JobsError;
pub use crate::waited::{runs, secs, Waited};

/// How placement retries a Jobs API call that failed transiently
/// ([`JobsError::is_transient`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRetry {
    /// The placement window: how long one call is asked again, from its first attempt. The
    /// attempt that ends after it is the last.
    pub window: Duration,
    /// The first wait; each next one doubles, up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for ApiRetry {
    fn default() -> Self {
        ApiRetry {
            window: Duration::from_secs(60),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// A transient failure about to be waited out: told to the caller's log and progress.
#[derive(Debug)]
pub struct Retrying<'a> {
    /// What was asked ("read the lease's job").
    pub what: &'a str,
    /// Which attempt failed (1 = the first).
    pub attempt: u32,
    pub error: &'a JobsError,
    /// The wait before the next attempt.
    pub wait: Duration,
    /// How much of the window is left after that wait.
    pub left: Duration,
    pub window: Duration,
}

/// Calls `call` (with the attempt's number, from 1) until it succeeds, fails for good, or
/// fails transiently past `policy.window`: then [`JobsError::GaveUp`] says what it waited
/// for. `retrying` is told of each wait before it starts.
pub async fn with_retry<T, F, Fut>(
    policy: &ApiRetry,
    what: &str,
    mut retrying: impl FnMut(&Retrying<'_>),
    mut call: F,
) -> Result<T, JobsError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, JobsError>>,
{
    let started = Instant::now();
    let mut backoff = policy.initial_backoff;
    let mut failures: Vec<(String, u32)> = Vec::new();
    let mut waits = Vec::new();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let error = match call(attempt).await {
            Ok(v) => return Ok(v),
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) => e,
        };
        let kind = error.kind();
        match failures.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => failures.push((kind, 1)),
        }
        let left = policy.window.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(JobsError::GaveUp(Box::new(Waited {
                what: what.to_string(),
                attempts: attempt,
                elapsed: started.elapsed(),
                window: policy.window,
                failures,
                waits,
                last: error.to_string(),
            })));
        }
        let wait = backoff.min(left);
        retrying(&Retrying {
            what,
            attempt,
            error: &error,
            wait,
            left: left - wait,
            window: policy.window,
        });
        waits.push(wait);
        tokio::time::sleep(wait).await;
        backoff = backoff.saturating_mul(2).min(policy.max_backoff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;

    fn quick(window_ms: u64) -> ApiRetry {
        ApiRetry {
            window: Duration::from_millis(window_ms),
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(40),
        }
    }

    fn server_error() -> JobsError {
        JobsError::Refused(StatusCode::INTERNAL_SERVER_ERROR, "agent not ready".into())
    }

    #[tokio::test]
    async fn transient_failures_are_retried_with_backoff_until_one_succeeds() {
        let mut told = Vec::new();
        let got = with_retry(
            &quick(5_000),
            "read the lease's job",
            |r| told.push((r.attempt, r.wait, r.error.kind())),
            |attempt| async move {
                match attempt {
                    1 | 2 => Err(server_error()),
                    3 => Err(JobsError::Unreachable {
                        kind: "connection refused",
                        message: "tcp connect error".into(),
                    }),
                    _ => Ok(attempt),
                }
            },
        )
        .await
        .unwrap();
        assert_eq!(got, 4);
        let waits: Vec<_> = told.iter().map(|t| t.1.as_millis()).collect();
        assert_eq!(waits, [10, 20, 40]);
        assert_eq!(told[0].2, "HTTP 500 Internal Server Error");
        assert_eq!(told[2].2, "connection refused");
    }

    #[tokio::test]
    async fn a_refusal_of_the_request_fails_at_once() {
        for error in [
            JobsError::Unauthorized("bad token".into()),
            JobsError::Refused(StatusCode::BAD_REQUEST, "no entrypoint".into()),
            JobsError::Refused(StatusCode::NOT_IMPLEMENTED, "no".into()),
            JobsError::Unusable("unreadable job record".into()),
            JobsError::Duplicate("exists".into()),
        ] {
            let mut calls = 0;
            let e = with_retry(
                &quick(5_000),
                "submit the lease",
                |_| panic!("no wait for {error}"),
                |_| {
                    calls += 1;
                    let error = error.clone();
                    async move { Err::<(), _>(error) }
                },
            )
            .await
            .unwrap_err();
            assert_eq!(calls, 1, "{e}");
            assert!(!matches!(e, JobsError::GaveUp(_)), "{e}");
        }
    }

    #[tokio::test]
    async fn a_window_that_runs_out_names_every_wait() {
        let e = with_retry(
            &quick(200),
            "submit the lease",
            |_| {},
            |_| async { Err::<(), _>(server_error()) },
        )
        .await
        .unwrap_err();
        let JobsError::GaveUp(w) = &e else {
            panic!("{e}")
        };
        assert!(w.attempts >= 5, "{e}");
        assert!(w.elapsed >= Duration::from_millis(200), "{e}");
        assert_eq!(w.waits.len() as u32, w.attempts - 1);
        let text = e.to_string();
        assert!(
            text.starts_with("the Ray Jobs API kept failing to submit the lease for "),
            "{text}"
        );
        assert!(
            text.contains(
                " attempts within the placement window of 200 ms: HTTP 500 Internal Server Error ×"
            ),
            "{text}"
        );
        assert!(text.contains("waited 10 ms, 20 ms, 40 ms ×"), "{text}");
        assert!(text.ends_with("the last: the Ray Jobs API answered HTTP 500 Internal Server Error: agent not ready"), "{text}");
    }
}
