//! Placement rides out a Jobs API that fails for a moment (issue: a lease failed at once on
//! the HTTP 500 Ray answers while a fresh node's agent starts), against a fake head on
//! loopback (`support`): 5xx answers, connections closed before the answer or refused, and a
//! submit whose reply was lost after Ray took the job, are asked again with backoff and the
//! lease is placed; each wait is told as a `SandboxQueued` reason. A refusal of the request
//! itself (401, 403, 400) fails at once, asked once.
//!
//! The window running out is `placement_window.rs`.

mod support;

use std::time::{Duration, Instant};

use smithers_runtime::{Controls, Runtime, RuntimeKind, SandboxConfig};
use smithers_runtime_ray::{RayOptions, RayRuntime};
use support::{agent_not_ready, Fake, Fault, Project, Reasons, Route};

fn runtime(fake: &Fake) -> RayRuntime {
    RayRuntime::new(RayOptions::new(fake.url(), Some("token".into()))).unwrap()
}

fn config(project: &Project, sandbox_id: &str) -> SandboxConfig {
    SandboxConfig {
        run_id: "run-1".into(),
        sandbox_id: sandbox_id.into(),
        runtime: RuntimeKind::Ray,
        root_dir: project.0.clone(),
        image: None,
        controls: Controls::default(),
        workspace_layers: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_placed_through_a_jobs_api_that_fails_for_a_moment() {
    let fake = Fake::start().await;
    let project = Project::new("moment");
    // Ray's answers while a fresh node's agent starts, a proxy's, and a connection closed
    // before any answer: each route fails twice or three times, then answers.
    fake.script(
        Route::Submit,
        [
            agent_not_ready(),
            Fault::Status(503, "Service Unavailable".into()),
            Fault::Close,
        ],
    );
    fake.script(
        Route::Get,
        [agent_not_ready(), Fault::Status(502, "Bad Gateway".into())],
    );
    fake.script(Route::Logs, [agent_not_ready(), agent_not_ready()]);
    let rt = runtime(&fake);

    let handle = rt
        .create(&config(&project, "s1"))
        .await
        .expect("create rides out the submit's failures");
    assert_eq!(fake.calls(Route::Submit), [500, 503, 0, 200]);
    assert_eq!(fake.job_count(), 1, "one lease");

    let reasons = Reasons::default();
    let (_, placement) = rt
        .place(handle, &reasons)
        .await
        .expect("place rides out the job's and the log's failures");
    let placement = placement.expect("a placement");
    assert_eq!(placement.node, "127.0.0.1");
    assert_eq!(placement.lease, "smithers-r5-run-1-s1");
    assert_eq!(&fake.calls(Route::Get)[..3], [500, 502, 200]);
    assert_eq!(fake.calls(Route::Logs), [500, 500, 200]);
    assert_eq!(fake.calls(Route::CreateSandbox), [201]);

    // What placement waited for, as it waited: each kind of failure once.
    let reasons = reasons.all();
    let waiting: Vec<&String> = reasons
        .iter()
        .filter(|r| r.starts_with("waiting for the Ray Jobs API"))
        .collect();
    assert_eq!(
        waiting,
        [
            "waiting for the Ray Jobs API to read the lease's job: the Ray Jobs API answered HTTP 500 Internal Server Error: \
             RuntimeError: Failed to get the agent of node 3f2a: not ready yet; asking again with backoff for up to 60 s",
            "waiting for the Ray Jobs API to read the lease's job: the Ray Jobs API answered HTTP 502 Bad Gateway: \
             Bad Gateway; asking again with backoff for up to 60 s",
            "waiting for the Ray Jobs API to read the lease's log: the Ray Jobs API answered HTTP 500 Internal Server Error: \
             RuntimeError: Failed to get the agent of node 3f2a: not ready yet; asking again with backoff for up to 60 s",
        ],
        "{reasons:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_whose_reply_was_lost_after_ray_took_it_is_one_lease() {
    let fake = Fake::start().await;
    let project = Project::new("lost-reply");
    fake.script(Route::Submit, [Fault::TakeThen500]);
    let rt = runtime(&fake);
    let handle = rt
        .create(&config(&project, "s1"))
        .await
        .expect("the retry finds its own job under the id, not another sandbox's");
    // The second attempt met the job the first one made ("already exists"), with this
    // submit's nonce.
    assert_eq!(fake.calls(Route::Submit), [500, 500]);
    assert_eq!(fake.job_count(), 1);
    rt.place(handle, &Reasons::default()).await.expect("placed");

    // A job of another submit under the same id stays a duplicate: refused, not adopted.
    let again = rt.create(&config(&project, "s1")).await.unwrap_err();
    assert!(again.to_string().contains("already has a lease"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_refuses_connections_for_a_moment_is_waited_for() {
    let mut fake = Fake::start().await;
    let project = Project::new("refused");
    let rt = runtime(&fake);
    let handle = rt.create(&config(&project, "s1")).await.unwrap();
    fake.stop();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let reasons = Reasons::default();
    let (placed, _) = tokio::join!(rt.place(handle, &reasons), async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        fake.resume().await;
    });
    placed.expect("placed once the head answers again");
    let reasons = reasons.all();
    assert!(
        reasons.iter().any(|r| r.starts_with(
            "waiting for the Ray Jobs API to read the lease's job: the Ray Jobs API is unreachable: "
        ) && r.ends_with("; asking again with backoff for up to 60 s")),
        "{reasons:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_the_request_fails_at_once() {
    for (status, body, said) in [
        (401, "Unauthorized", "refused the token"),
        (403, "Forbidden", "refused the token"),
        (
            400,
            "entrypoint_memory must be an integer",
            "answered HTTP 400 Bad Request",
        ),
    ] {
        // At submit: asked once.
        let fake = Fake::start().await;
        let project = Project::new(&format!("refusal-{status}"));
        fake.always(Route::Submit, Fault::Status(status, body.into()));
        let rt = runtime(&fake);
        let started = Instant::now();
        let e = rt.create(&config(&project, "s1")).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2), "{e}");
        assert_eq!(fake.calls(Route::Submit), [status], "{e}");
        assert!(e.to_string().contains(said), "{e}");

        // While placing: the job's read is asked once.
        let fake = Fake::start().await;
        let rt = runtime(&fake);
        let handle = rt.create(&config(&project, "s2")).await.unwrap();
        fake.always(Route::Get, Fault::Status(status, body.into()));
        let started = Instant::now();
        let e = rt.place(handle, &Reasons::default()).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2), "{e}");
        assert_eq!(fake.calls(Route::Get), [status], "{e}");
        assert!(e.to_string().contains(said), "{e}");
    }
}
