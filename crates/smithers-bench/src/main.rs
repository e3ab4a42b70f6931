//! `smithers-bench`: the benchmark suite of `../shared/design/performance.md`.
//!
//! ```text
//! cargo run --release -p smithers-bench -- cold-start          # scenario 1
//! cargo run --release -p smithers-bench -- workspace-scaling   # scenario 2 (through the CLI)
//! cargo run --release -p smithers-bench -- throughput          # scenario 3
//! cargo run --release -p smithers-bench -- whole-cli           # scenario 6
//! cargo run --release -p smithers-bench -- warm-start          # scenario 7
//! cargo run --release -p smithers-bench -- change-cost         # scenario 8
//! cargo run --release -p smithers-bench -- egress              # scenario 9
//! cargo run --release -p smithers-bench -- fleet               # scenario 10 (a Ray cluster)
//! cargo run --release -p smithers-bench -- sessions            # scenario 11 (exec)
//! cargo run --release -p smithers-bench -- forks               # scenario 11 (checkpoint, fork)
//! cargo run --release -p smithers-bench -- hosted              # scenario 11 on a serve host
//! cargo run --release -p smithers-bench -- big-delta           # scenario 12
//! cargo run --release -p smithers-bench -- all
//! ```
//!
//! Each scenario writes its section of `bench/RESULTS.md` and an SVG chart next to it. Every
//! contender runs in the same process of measurement, interleaved round by round; the ratios
//! are medians of per-round ratios. Nothing here asserts a time: the report is the product.

mod big_delta;
mod egress;
mod egress_link;
mod egress_secrets;
mod fleet;
mod forks;
mod hosted;
mod measure;
mod report;
mod roundtrip;
mod sessions;
mod throughput;
mod warm;
mod whole_cli;
mod workspace;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use measure::{fmt_ms, have, interleaved, median_ratio, run_quiet, Contender, Series};
use report::{bar_chart_svg, machine_line, write_section, Table};

#[derive(Parser, Debug)]
#[command(about = "Benchmarks of smithers-sandbox against its peers, side by side in one run")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
    /// Where RESULTS.md and the charts go.
    #[arg(long, default_value = "bench", global = true)]
    out: PathBuf,
    /// Where generated workspaces and sandbox state live (needs a few GB for 100k files).
    #[arg(long, default_value = "/var/tmp/smithers-bench", global = true)]
    scratch: PathBuf,
    /// Recorded rounds per contender (warm-up rounds come on top).
    #[arg(long, global = true)]
    rounds: Option<usize>,
    /// Also measure the docker runtime with this local image (engine must be running).
    #[arg(long, global = true)]
    docker_image: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Scenario {
    /// 1: create → ship → execute `true` → collect → cleanup, against bare bwrap and spawn.
    ColdStart,
    /// 2: the same step over 1k, 10k and 100k-file workspaces with 10 changed files.
    WorkspaceScaling,
    /// 3: N = 1, 10, 100 steps in parallel through the orchestrator with the SQLite store.
    Throughput,
    /// 6: `smithers-sandbox run -- true` as a user runs it against bare bwrap, whole processes.
    WholeCli,
    /// 7: asking for a sandbox to its first command running, with a warm pool and without,
    /// against bare bwrap.
    WarmStart,
    /// 8: the cost after the step of 1k/10k/100k changed files and huge or sparse files,
    /// time and peak memory, against `git add -A && git diff --cached --binary`.
    ChangeCost,
    /// 9: a connection through the egress engine (HTTP CONNECT, SOCKS5) against a direct
    /// one: time to first byte, connections per second, throughput.
    Egress,
    /// 10: leases on a Ray cluster (scripts/ray/cluster.sh up) against the same steps on
    /// this host: lease to first exec, steps per second, node death to NODE_LOST.
    Fleet,
    /// 11: `true` exec'd in a live session (its socket, the CLI) against host spawn, a
    /// bare bwrap sandbox per command and ours per command.
    Sessions,
    /// 11 (its checkpoint and fork half): a session whose layer holds 10k files and 1 GiB, checkpointed, restored and forked (socket, CLI, engine API).
    Forks,
    /// 11 on a sandbox host: a session of `serve` driven over HTTP (its MCP endpoint and the
    /// fork route): exec, checkpoint (and how long it held the session), fork.
    Hosted,
    /// 12: one byte flipped in a 32 MB, a 120 MB and a 1 GiB file: patch size, time and
    /// peak RSS to make it and to apply it, against `git diff --binary` and `git apply`.
    BigDelta,
    /// Every scenario above (but the fleet, which needs a cluster).
    All,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.out)?;
    std::fs::create_dir_all(&cli.scratch)?;
    match cli.scenario {
        Scenario::ColdStart => cold_start(&cli),
        Scenario::WholeCli => {
            anyhow::ensure!(
                have("bwrap"),
                "bare bwrap is the reference point of this scenario: apt-get install bubblewrap"
            );
            // 300 rounds: as scenario 1, whose ratio moved by ±5% with fewer.
            let body = whole_cli::whole_cli(&cli.scratch, cli.rounds.unwrap_or(300), BWRAP_ARGS)?;
            finish(&cli, "Scenario 6: the whole CLI", "whole-cli", &body, &[])
        }
        Scenario::WarmStart => {
            anyhow::ensure!(
                have("bwrap"),
                "bare bwrap is the reference point of this scenario: apt-get install bubblewrap"
            );
            let (body, series) = warm::run(&cli.scratch, cli.rounds.unwrap_or(300), BWRAP_ARGS)?;
            finish(&cli, "Scenario 7: warm start", "warm-start", &body, &series)
        }
        Scenario::ChangeCost => {
            let body = whole_cli::change_cost(&cli.scratch, cli.rounds.unwrap_or(3))?;
            finish(
                &cli,
                "Scenario 8: cost of what a step changed",
                "change-cost",
                &body,
                &[],
            )
        }
        Scenario::WorkspaceScaling => workspace_scaling(&cli),
        Scenario::Egress => {
            let rounds = cli.rounds.unwrap_or(300);
            let body = format!(
                "{}\n{}{}",
                egress::run(rounds)?,
                egress_link::run()?,
                egress_secrets::run(rounds)?
            );
            finish(&cli, "Scenario 9: egress", "egress", &body, &[])
        }
        Scenario::Fleet => {
            let body = fleet::run(&cli.scratch, cli.rounds.unwrap_or(20))?;
            finish(&cli, "Scenario 10: the fleet", "fleet", &body, &[])
        }
        Scenario::BigDelta => {
            let body = big_delta::run(&cli.scratch, cli.rounds.unwrap_or(3))?;
            finish(
                &cli,
                "Scenario 12: big binaries keep their delta",
                "big-delta",
                &body,
                &[],
            )
        }
        Scenario::Forks => {
            let body = forks::run(&cli.scratch, cli.rounds.unwrap_or(100))?;
            finish(
                &cli,
                "Scenario 11: sessions (checkpoint and fork)",
                "forks",
                &body,
                &[],
            )
        }
        Scenario::Hosted => {
            let body = hosted::run(&cli.scratch, cli.rounds.unwrap_or(50))?;
            finish(
                &cli,
                "Scenario 11: sessions on a sandbox host (MCP over HTTP, fork)",
                "hosted",
                &body,
                &[],
            )
        }
        Scenario::Sessions => {
            anyhow::ensure!(
                have("bwrap"),
                "bare bwrap is the reference point of this scenario: apt-get install bubblewrap"
            );
            let body = sessions::run(&cli.scratch, cli.rounds.unwrap_or(300), BWRAP_ARGS)?;
            finish(&cli, "Scenario 11: sessions (exec)", "sessions", &body, &[])
        }
        Scenario::Throughput => {
            let (body, series) = throughput::run(&cli.scratch, cli.rounds)?;
            finish(
                &cli,
                "Scenario 3: throughput and concurrency",
                "throughput",
                &body,
                &series,
            )
        }
        Scenario::All => {
            cold_start(&cli)?;
            workspace_scaling(&cli)?;
            let (body, series) = throughput::run(&cli.scratch, cli.rounds)?;
            finish(
                &cli,
                "Scenario 3: throughput and concurrency",
                "throughput",
                &body,
                &series,
            )
        }
    }
}

const BWRAP_ARGS: &[&str] = &[
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
    "true",
];

fn cold_start(cli: &Cli) -> anyhow::Result<()> {
    // 300: a run's ratio moved by ±5% with 40–100 rounds on this project's shared machines
    // (a burst of noise covered much of a run); 300 rounds take ~10 s.
    let rounds = cli.rounds.unwrap_or(300);
    anyhow::ensure!(
        have("bwrap"),
        "bare bwrap is the reference point of this scenario: apt-get install bubblewrap"
    );
    let project = cli.scratch.join("cold-start-project");
    std::fs::create_dir_all(&project)?;
    std::fs::write(project.join("README"), "a tiny project\n")?;

    let native = roundtrip::RoundTrip::native(&project, &cli.scratch)?;
    let native_exec = roundtrip::RoundTrip::native_without_zygote(&project)?;
    let docker = match &cli.docker_image {
        Some(image) => Some(roundtrip::RoundTrip::docker(&project, image)?),
        None => None,
    };

    let mut contenders = vec![
        Contender::new("smithers-sandbox bubblewrap (round trip)", || {
            native.run(&["true"])
        })
        .with_after(|| native.discard_bundles()),
        Contender::new("bare bwrap --unshare-all ... true", || {
            run_quiet("bwrap", BWRAP_ARGS)
        }),
        Contender::new("spawn /bin/true", || run_quiet("/bin/true", &[])),
        Contender::new(
            "smithers-sandbox bubblewrap, init executed per sandbox (no zygote)",
            || native_exec.run(&["true"]),
        )
        .with_after(|| native_exec.discard_bundles()),
    ];
    if let (Some(rt), Some(image)) = (&docker, &cli.docker_image) {
        contenders.push(
            Contender::new("smithers-sandbox docker (round trip)", move || {
                rt.run(&["true"])
            })
            .with_after(move || rt.discard_bundles()),
        );
        contenders.push(Contender::new(
            format!("docker run --rm --network none {image} true"),
            move || {
                run_quiet(
                    "docker",
                    &["run", "--rm", "--network", "none", image, "true"],
                )
            },
        ));
    }
    let series = interleaved(&mut contenders, 5, rounds)?;
    drop(contenders);
    let phases = phase_table(&native.phases(), 5);

    let bwrap = &series[1];
    let mut table = Table::new(&[
        "contender",
        "p50",
        "p95",
        "ratio to bare bwrap (median of pairs)",
    ]);
    for s in &series {
        table.row(vec![
            s.name.clone(),
            fmt_ms(s.median()),
            fmt_ms(s.p95()),
            format!("{:.2}×", median_ratio(s, bwrap)),
        ]);
    }
    let mut body = format!(
        "Machine: {}. {rounds} interleaved rounds after 5 warm-up rounds. Default isolation \
         (all namespaces, no network, memory/pids limits on, seccomp, Landlock).\n\n{}",
        machine_line(),
        table.to_markdown()
    );
    body.push_str(&format!(
        "\nThe zygote (each sandbox's init forked from a pre-started one): without it / with \
         it = **{:.2}×** (median of pairs).\n",
        median_ratio(&series[3], &series[0])
    ));
    if series.len() == 6 {
        body.push_str(&format!(
            "\nDocker: our round trip / bare `docker run` = **{:.2}×** (median of pairs).\n",
            median_ratio(&series[4], &series[5])
        ));
    }
    body.push_str(&format!(
        "\nWhere the native round trip's time goes (median per verb over the recorded \
         rounds):\n\n{}",
        phases.to_markdown()
    ));
    body.push_str(&format!(
        "\nOurs / bare bwrap = **{:.2}×**. Chart: `cold-start.svg`. Command: \
         `cargo run --release -p smithers-bench -- cold-start{}`\n",
        median_ratio(&series[0], bwrap),
        cli.docker_image
            .as_ref()
            .map(|i| format!(" --docker-image {i}"))
            .unwrap_or_default()
    ));
    finish(
        cli,
        "Scenario 1: cold start to first exec",
        "cold-start",
        &body,
        &series,
    )
}

/// Median time of each verb over the round trips after the first `warm_up`.
fn phase_table(rounds: &[[std::time::Duration; 5]], warm_up: usize) -> Table {
    let mut table = Table::new(&["verb", "p50", "p95"]);
    for (i, verb) in roundtrip::PHASES.iter().enumerate() {
        let samples = verb_samples(rounds, warm_up, i);
        table.row(vec![
            verb.to_string(),
            fmt_ms(measure::percentile(&samples, 50.0)),
            fmt_ms(measure::percentile(&samples, 95.0)),
        ]);
    }
    table
}

/// The durations of verb `i` ([`roundtrip::PHASES`]) over the round trips after `warm_up`.
fn verb_samples(
    rounds: &[[std::time::Duration; 5]],
    warm_up: usize,
    i: usize,
) -> Vec<std::time::Duration> {
    rounds.iter().skip(warm_up).map(|r| r[i]).collect()
}

fn workspace_scaling(cli: &Cli) -> anyhow::Result<()> {
    let rounds = cli.rounds.unwrap_or(15);
    let bin = whole_cli::cli_binary()?;
    let sizes = [1_000usize, 10_000, 100_000];
    let mut roots = Vec::new();
    for n in sizes {
        eprintln!("generating a {n}-file workspace (cached)...");
        roots.push(workspace::generated(&cli.scratch, n)?);
    }
    let script = workspace::change_ten_files_script();
    let runs: Vec<workspace::CliRuns> = roots
        .iter()
        .map(|r| workspace::CliRuns::new(&bin, r, &script))
        .collect();
    let big = roots[2].clone();
    let copy_target = cli.scratch.join("copy-target");

    // The previous round's copy is renamed aside (O(1)) rather than deleted inside the timed
    // closure, so the contender measures the copy alone; the copies go after the run.
    let trash = cli.scratch.join("copy-trash");
    std::fs::create_dir_all(&trash)?;
    let mut copies = 0;
    let mut contenders: Vec<Contender<'_>> = Vec::new();
    for (n, run) in sizes.iter().zip(&runs) {
        contenders.push(
            Contender::new(
                format!("smithers-sandbox run, {}k files, 10 changed", n / 1000),
                move || run.run(10),
            )
            .with_after(move || run.discard_bundles()),
        );
    }
    contenders.push(Contender::new("git status, 100k files", || {
        run_quiet(
            "git",
            &["-C", big.to_str().unwrap(), "status", "--porcelain"],
        )
    }));
    contenders.push(Contender::new("cp -a of the 100k-file tree", || {
        if copy_target.exists() {
            copies += 1;
            std::fs::rename(&copy_target, trash.join(copies.to_string()))?;
        }
        run_quiet(
            "cp",
            &["-a", big.to_str().unwrap(), copy_target.to_str().unwrap()],
        )?;
        Ok(())
    }));
    let series = interleaved(&mut contenders, 2, rounds)?;
    drop(contenders);
    let mut clock = Table::new(&[
        "run's own clock (p50)",
        "1k files",
        "10k files",
        "100k files",
    ]);
    for (i, phase) in workspace::CLOCK_PHASES.iter().enumerate() {
        let mut row = vec![phase.to_string()];
        for run in &runs {
            row.push(fmt_ms(run.phase_median(i, 2)));
        }
        clock.row(row);
    }
    let _ = std::fs::remove_dir_all(&copy_target);
    let _ = std::fs::remove_dir_all(&trash);

    let mut table = Table::new(&["contender", "p50", "p95"]);
    for s in &series {
        table.row(vec![s.name.clone(), fmt_ms(s.median()), fmt_ms(s.p95())]);
    }
    let body = format!(
        "Machine: {}. {rounds} interleaved rounds after 2 warm-up rounds. Each of ours is one \
         whole `smithers-sandbox run --root <tree> -- sh -c <append to 10 files>` process, on \
         its own (no resident service): the project's store opened, create → ship → the step → \
         collect (patches, bundle written durably) → cleanup, the review left pending (its \
         bundle removed after the round, untimed). The trees are the generated git projects of \
         1k, 10k and 100k files in directories of 100.\n\n{}\n\
         - 100k-file run / 1k-file run = **{:.2}×** (median of pairs)\n\
         - cp -a of the 100k tree / our 100k run = **{:.1}×**\n\
         - git status on the 100k tree / our 100k run = **{:.2}×**\n\n\
         Where a run's time goes, per tree size: `run`'s own progress clock (hundredths of a \
         second, from the process's start), the median of each line's time:\n\n{}\n\
         Chart: `workspace-scaling.svg`. Command: `cargo build --release -p smithers-cli -p \
         smithers-bench && target/x86_64-unknown-linux-gnu/release/smithers-bench \
         workspace-scaling`\n",
        machine_line(),
        table.to_markdown(),
        median_ratio(&series[2], &series[0]),
        median_ratio(&series[4], &series[2]),
        median_ratio(&series[3], &series[2]),
        clock.to_markdown(),
    );
    finish(
        cli,
        "Scenario 2: workspace scaling",
        "workspace-scaling",
        &body,
        &series,
    )
}

/// Writes the chart and the results section; our own contenders are the highlighted bars.
fn finish(cli: &Cli, title: &str, slug: &str, body: &str, series: &[Series]) -> anyhow::Result<()> {
    let bars: Vec<(String, f64, bool)> = series
        .iter()
        .map(|s| {
            let ours = s.name.starts_with("ours") || s.name.starts_with("smithers-sandbox");
            (s.name.clone(), s.median().as_secs_f64() * 1000.0, ours)
        })
        .collect();
    if !bars.is_empty() {
        std::fs::write(
            cli.out.join(format!("{slug}.svg")),
            bar_chart_svg(&format!("{title} (p50)"), "ms", &bars),
        )?;
    }
    write_section(&cli.out.join("RESULTS.md"), title, body)?;
    println!("## {title}\n\n{body}");
    Ok(())
}
