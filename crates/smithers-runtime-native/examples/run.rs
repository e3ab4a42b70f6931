//! Runs one command in a native sandbox over the current directory and prints the outcome:
//! `cargo run -p smithers-runtime-native --example run -- sh -c 'id; ls /'`.

use smithers_runtime::{
    CancellationToken, Controls, OutputEvent, OutputSink, OutputStream, RequestBundle, Runtime,
    RuntimeKind, SandboxConfig, StepCommand,
};
use smithers_runtime_native::NativeRuntime;

struct Print;

impl OutputSink for Print {
    fn event(&self, event: OutputEvent) {
        use std::io::Write as _;
        // The step's bytes as it wrote them (the line events are what its log keeps).
        if let OutputEvent::Output { stream, bytes, .. } = event {
            let _ = match stream {
                OutputStream::Stdout => std::io::stdout().write_all(&bytes),
                OutputStream::Stderr => std::io::stderr().write_all(&bytes),
            };
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let t0 = std::time::Instant::now();
    // STATE_ROOT=dir puts the sandbox state (upper layer, logs) elsewhere, e.g. on a tmpfs.
    let rt = NativeRuntime::new(smithers_runtime_native::NativeOptions {
        state_root: std::env::var_os("STATE_ROOT").map(Into::into),
        ..Default::default()
    });
    let config = SandboxConfig {
        run_id: format!("example-{}", std::process::id()),
        sandbox_id: "sb".into(),
        runtime: RuntimeKind::Bubblewrap,
        root_dir: std::env::current_dir().expect("cwd"),
        image: None,
        controls: Controls::default(),
        workspace_layers: Vec::new(),
    };
    let handle = rt.create(&config).await.expect("create");
    let t_create = t0.elapsed();
    rt.ship(
        &handle,
        &RequestBundle {
            request: serde_json::json!({"status": "pending"}),
        },
    )
    .await
    .expect("ship");
    let t_ship = t0.elapsed();
    let outcome = rt
        .execute(
            &handle,
            &StepCommand {
                argv,
                cwd: None,
                stdin: Default::default(),
            },
            CancellationToken::new(),
            &Print,
        )
        .await;
    let t_exec = t0.elapsed();
    let collected = rt.collect(&handle).await;
    let t_collect = t0.elapsed();
    rt.cleanup(&handle).await.expect("cleanup");
    let t_cleanup = t0.elapsed();
    if std::env::var_os("TIMINGS").is_some() {
        eprintln!(
            "create {:?} ship {:?} execute {:?} collect {:?} cleanup {:?} total {:?}",
            t_create,
            t_ship - t_create,
            t_exec - t_ship,
            t_collect - t_exec,
            t_cleanup - t_collect,
            t_cleanup
        );
        return;
    }
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&outcome.expect("execute")).unwrap()
    );
    eprintln!("{collected:?}");
}
