//! Placement gives up on a Jobs API that keeps failing once its window
//! (`RayOptions::api_retry`) runs out, and the error says what it waited for: the call, how
//! many attempts, each kind of failure counted, every wait. Against the fake head of
//! `support` on loopback.

mod support;

use std::time::{Duration, Instant};

use smithers_errors::CodedError;
use smithers_runtime::{Controls, Runtime, RuntimeError, RuntimeKind, SandboxConfig};
use smithers_runtime_ray::retry::ApiRetry;
use smithers_runtime_ray::{RayOptions, RayRuntime};
use support::{agent_not_ready, Fake, Fault, Project, Reasons, Route};

const WINDOW: Duration = Duration::from_millis(1500);

fn runtime(url: String) -> RayRuntime {
    let mut options = RayOptions::new(url, Some("token".into()));
    options.api_retry = ApiRetry {
        window: WINDOW,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(400),
    };
    RayRuntime::new(options).unwrap()
}

fn config(project: &Project) -> SandboxConfig {
    SandboxConfig {
        run_id: "run-1".into(),
        sandbox_id: "s1".into(),
        runtime: RuntimeKind::Ray,
        root_dir: project.0.clone(),
        image: None,
        controls: Controls::default(),
        workspace_layers: Vec::new(),
    }
}

/// The waits the error names, parsed back: `100 ms, 200 ms, 400 ms ×2, 300 ms`.
fn named_waits(text: &str) -> Vec<Duration> {
    let start = text.find("; waited ").expect("the waits") + "; waited ".len();
    let end = text[start..]
        .find(" between the attempts")
        .expect("their end")
        + start;
    let mut waits = Vec::new();
    for part in text[start..end].split(", ") {
        let (one, times) = match part.split_once(" ×") {
            Some((one, n)) => (one, n.parse::<usize>().unwrap()),
            None => (part, 1),
        };
        let d = if let Some(ms) = one.strip_suffix(" ms") {
            Duration::from_millis(ms.parse().unwrap())
        } else {
            Duration::from_secs_f64(one.strip_suffix(" s").unwrap().parse().unwrap())
        };
        waits.extend(std::iter::repeat_n(d, times));
    }
    waits
}

fn assert_gave_up(e: &RuntimeError, what: &str, failure: &str, attempts: usize, elapsed: Duration) {
    let text = e.to_string();
    println!("{text}");
    assert_eq!(e.code().as_str(), "TASK_RUNTIME_UNAVAILABLE", "{text}");
    assert!(
        elapsed >= WINDOW && elapsed < WINDOW + Duration::from_secs(2),
        "gave up after {elapsed:?}: {text}"
    );
    assert!(
        text.contains(&format!("the Ray Jobs API kept failing to {what} for ")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "({attempts} attempts within the placement window of 1.5 s: {failure} ×{attempts})"
        )),
        "{text}"
    );
    // Every wait between two attempts is named: the backoff (100, 200, 400 ms, then 400 ms
    // each), the last one cut to what was left of the window.
    let waits = named_waits(&text);
    assert_eq!(waits.len(), attempts - 1, "{text}");
    assert_eq!(
        &waits[..3],
        [100, 200, 400].map(Duration::from_millis),
        "{text}"
    );
    assert!(
        waits[3..].iter().all(|w| *w <= Duration::from_millis(400)),
        "{text}"
    );
    let total: Duration = waits.iter().sum();
    assert!(total <= WINDOW && total >= WINDOW / 2, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_cannot_be_read_past_the_window_ends_placement_naming_the_waits() {
    let fake = Fake::start().await;
    let project = Project::new("window-get");
    let rt = runtime(fake.url());
    let handle = rt.create(&config(&project)).await.unwrap();
    fake.always(Route::Get, agent_not_ready());
    let reasons = Reasons::default();
    let started = Instant::now();
    let e = rt.place(handle, &reasons).await.unwrap_err();
    let elapsed = started.elapsed();
    let gets = fake.calls(Route::Get);
    assert!(gets.iter().all(|s| *s == 500), "{gets:?}");
    assert_gave_up(
        &e,
        "read the lease's job",
        "HTTP 500 Internal Server Error",
        gets.len(),
        elapsed,
    );
    let text = e.to_string();
    assert!(
        text.ends_with(
            "the last: the Ray Jobs API answered HTTP 500 Internal Server Error: \
             RuntimeError: Failed to get the agent of node 3f2a: not ready yet"
        ),
        "{text}"
    );
    // Said once while waiting, not once per attempt.
    assert_eq!(
        reasons.all(),
        ["waiting for the Ray Jobs API to read the lease's job: the Ray Jobs API answered HTTP 500 Internal Server Error: \
          RuntimeError: Failed to get the agent of node 3f2a: not ready yet; asking again with backoff for up to 1.5 s"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_that_keeps_failing_ends_create_naming_the_waits() {
    let fake = Fake::start().await;
    let project = Project::new("window-submit");
    fake.always(
        Route::Submit,
        Fault::Status(503, "Service Unavailable".into()),
    );
    let rt = runtime(fake.url());
    let started = Instant::now();
    let e = rt.create(&config(&project)).await.unwrap_err();
    let elapsed = started.elapsed();
    let submits = fake.calls(Route::Submit);
    assert_gave_up(
        &e,
        "submit the lease",
        "HTTP 503 Service Unavailable",
        submits.len(),
        elapsed,
    );
    assert_eq!(fake.job_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_keeps_refusing_connections_ends_create_naming_the_waits() {
    // A port nobody listens on.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let project = Project::new("window-refused");
    let rt = runtime(format!("http://{addr}"));
    let started = Instant::now();
    let e = rt.create(&config(&project)).await.unwrap_err();
    let elapsed = started.elapsed();
    let text = e.to_string();
    let attempts: usize = text
        .split(" attempts within")
        .next()
        .and_then(|t| t.rsplit('(').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(attempts >= 5, "{text}");
    assert_gave_up(
        &e,
        "submit the lease",
        "connection refused",
        attempts,
        elapsed,
    );
}
