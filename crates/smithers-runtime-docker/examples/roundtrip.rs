//! Informal measurement: the docker runtime's full round trip (create → ship → execute `true`
//! → collect → cleanup) against `docker run --rm --network none IMAGE true`, medians over N
//! runs, interleaved so both see the same machine load.
//!
//! `cargo run --release -p smithers-runtime-docker --example roundtrip -- [N] [IMAGE]`

use std::time::{Duration, Instant};

use smithers_runtime::{
    CancellationToken, Controls, NullSink, RequestBundle, Runtime, RuntimeKind, SandboxConfig,
    StepCommand,
};
use smithers_runtime_docker::{DockerOptions, DockerRuntime};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    let image = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| "smithers-test:busybox".to_string());
    let project = tempfile::tempdir().expect("tempdir");
    std::fs::write(project.path().join("a.txt"), "a\n").expect("write");
    let rt = DockerRuntime::new(DockerOptions::default());
    // Warm-up: the connection and version negotiation happen once per runtime instance.
    let _ = rt.probe().await;
    let mut ours = Vec::new();
    let mut bare = Vec::new();
    for i in 0..n + 1 {
        let config = SandboxConfig {
            run_id: format!("bench-{}", std::process::id()),
            sandbox_id: format!("sb{i}"),
            runtime: RuntimeKind::Docker,
            root_dir: project.path().to_path_buf(),
            image: Some(image.clone()),
            controls: Controls::default(),
            workspace_layers: Vec::new(),
        };
        let t = Instant::now();
        let h = rt.create(&config).await.expect("create");
        rt.ship(
            &h,
            &RequestBundle {
                request: serde_json::json!({}),
            },
        )
        .await
        .expect("ship");
        let o = rt
            .execute(
                &h,
                &StepCommand {
                    argv: vec!["true".into()],
                    cwd: None,
                    stdin: Default::default(),
                },
                CancellationToken::new(),
                &NullSink,
            )
            .await
            .expect("execute");
        assert!(o.succeeded());
        rt.collect(&h).await.expect("collect");
        rt.cleanup(&h).await.expect("cleanup");
        let ours_t = t.elapsed();
        std::fs::remove_dir_all(&h.sandbox_root).ok();

        let t = Instant::now();
        let st = std::process::Command::new("docker")
            .args(["run", "--rm", "--network", "none", &image, "true"])
            .status()
            .expect("docker run");
        assert!(st.success());
        let bare_t = t.elapsed();
        if i > 0 {
            ours.push(ours_t);
            bare.push(bare_t);
        }
    }
    let (o, b) = (median(ours.clone()), median(bare.clone()));
    println!(
        "n={n} image={image}\nours (create+ship+execute true+collect+cleanup): median {:.1} ms  all {:?}\ndocker run --rm --network none true:             median {:.1} ms  all {:?}\nratio ours/bare: {:.2}",
        o.as_secs_f64() * 1e3,
        ours.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
        b.as_secs_f64() * 1e3,
        bare.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
        o.as_secs_f64() / b.as_secs_f64()
    );
}
