//! The engine suite's cases. Each makes its own sandbox and destroys it.

use std::time::Duration;

use smithers_errors::CodedError;
use smithers_runtime::{CancellationToken, ExecRequest, RuntimeError, Termination};

use super::live::{gone, host_pids_with, sh, sh_with_stdin, Live};
use super::EngineEnv;
use crate::conformance::{unique, CaseResult, Skip};

/// What one case waits for at most before it fails (not a timing assertion).
const PATIENCE: Duration = Duration::from_secs(60);

/// The cases by name, for a backend that drives them itself.
pub const CASES: &[&str] = &[
    "execs_share_the_workspace",
    "each_exec_has_its_own_env_and_cwd",
    "output_and_stdin_are_byte_exact",
    "exits_and_signals_are_outcomes",
    "a_timed_out_exec_leaves_the_sandbox_usable",
    "a_cancelled_exec_leaves_the_sandbox_usable",
    "execs_run_at_once",
    "stop_kills_every_process",
    "exec_out_of_order_is_refused",
    "destroy_is_idempotent",
    "a_hundred_execs_in_one_sandbox",
    "a_pause_holds_every_process_still",
    "a_snapshot_restores_and_starts_another",
    "a_command_on_a_terminal_is_its_sessions_leader",
];

/// A file one exec writes, the next reads; the host project is untouched.
pub async fn execs_share_the_workspace(env: &EngineEnv) -> CaseResult {
    let live = Live::started(env).await?;
    live.sh("echo one > /workspace/made.txt && echo two >> /workspace/README.txt")
        .await
        .ok();
    let ran = live
        .sh("cat /workspace/made.txt /workspace/README.txt")
        .await
        .ok();
    assert_eq!(ran.stdout_text(), "one\nfrom the host\ntwo\n");
    assert!(
        !live.project.join("made.txt").exists(),
        "an exec wrote the host project"
    );
    assert_eq!(
        std::fs::read_to_string(live.project.join("README.txt")).unwrap(),
        "from the host\n"
    );
    live.destroy().await;
    Ok(())
}

/// An exec's variables and directory are its own: the next exec sees neither.
pub async fn each_exec_has_its_own_env_and_cwd(env: &EngineEnv) -> CaseResult {
    let live = Live::started(env).await?;
    live.sh("mkdir -p /workspace/sub").await.ok();
    let first = live
        .run(ExecRequest {
            env: vec![("ONLY_FIRST".into(), "yes it is".into())],
            cwd: Some("sub".into()),
            ..sh("printf '%s|%s' \"$ONLY_FIRST\" \"$(pwd)\"")
        })
        .await
        .ok();
    assert_eq!(first.stdout_text(), "yes it is|/workspace/sub");
    let second = live
        .sh("printf '%s|%s' \"${ONLY_FIRST-unset}\" \"$(pwd)\"")
        .await
        .ok();
    assert_eq!(second.stdout_text(), "unset|/workspace");
    let absolute = live
        .run(ExecRequest {
            cwd: Some("/tmp".into()),
            ..sh("pwd")
        })
        .await
        .ok();
    assert_eq!(absolute.stdout_text(), "/tmp\n");
    live.destroy().await;
    Ok(())
}

/// Bytes out are the command's bytes (invalid UTF-8, NULs, no final newline), and stdin's
/// bytes reach the command as given.
pub async fn output_and_stdin_are_byte_exact(env: &EngineEnv) -> CaseResult {
    let live = Live::started(env).await?;
    let ran = live
        .sh("printf 'a\\377b\\000c' ; printf 'err\\376' >&2")
        .await
        .ok();
    assert_eq!(ran.stdout, b"a\xffb\x00c");
    assert_eq!(ran.stderr, b"err\xfe");
    if env.engine().capabilities().exec_stdin {
        let input: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
        let ran = live.run(sh_with_stdin("cat", input.clone())).await.ok();
        assert_eq!(ran.stdout.len(), input.len());
        assert!(ran.stdout == input, "stdin came back changed");
    }
    let empty = live.sh("cat").await.ok();
    assert!(
        empty.stdout.is_empty(),
        "stdin without a stream is /dev/null"
    );
    live.destroy().await;
    Ok(())
}

/// A non-zero exit, a signal and a command not found are outcomes, not errors.
pub async fn exits_and_signals_are_outcomes(env: &EngineEnv) -> CaseResult {
    let live = Live::started(env).await?;
    let ran = live.sh("exit 7").await;
    assert_eq!(
        (ran.exit.termination, ran.exit.exit_code),
        (Termination::Exited, Some(7))
    );
    let ran = live.sh("kill -TERM $$").await;
    assert_eq!(
        ran.exit.termination,
        Termination::Signaled,
        "{:?}",
        ran.exit
    );
    assert_eq!(ran.exit.signal, Some(15));
    let ran = live
        .run(ExecRequest {
            argv: vec!["no-such-command-here".into()],
            ..ExecRequest::default()
        })
        .await;
    assert_eq!(ran.exit.exit_code, Some(127), "{:?}", ran.exit);
    assert!(!ran.stderr.is_empty(), "a command not found says why");
    live.sh("true").await.ok();
    live.destroy().await;
    Ok(())
}

/// A command past its own timeout is killed, with its group; the next exec runs.
pub async fn a_timed_out_exec_leaves_the_sandbox_usable(env: &EngineEnv) -> CaseResult {
    let live = Live::started(env).await?;
    let token = unique("timeout");
    let ran = live
        .run(ExecRequest {
            timeout: Some(Duration::from_millis(300)),
            ..sh(&format!("sleep 1000 & wait; : {token}"))
        })
        .await;
    assert_eq!(ran.exit.termination, Termination::Timeout, "{:?}", ran.exit);
    assert!(gone(&token, PATIENCE).await, "the timed-out group lives on");
    live.sh("echo still here").await.ok();
    live.destroy().await;
    Ok(())
}

/// A cancelled command is killed, with its group; the next exec runs.
pub async fn a_cancelled_exec_leaves_the_sandbox_usable(env: &EngineEnv) -> CaseResult {
    let live = Live::started(env).await?;
    let token = unique("cancel");
    let cancel = CancellationToken::new();
    let canceller = {
        let cancel = cancel.clone();
        let token = token.clone();
        async move {
            let deadline = std::time::Instant::now() + PATIENCE;
            while host_pids_with(&token).is_empty() && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            cancel.cancel();
        }
    };
    let (ran, ()) = tokio::join!(
        live.try_run(sh(&format!("sleep 1000; : {token}")), cancel),
        canceller
    );
    let ran = ran.unwrap_or_else(|e| panic!("exec failed: {e}"));
    assert_eq!(
        ran.exit.termination,
        Termination::Cancelled,
        "{:?}",
        ran.exit
    );
    assert!(
        gone(&token, PATIENCE).await,
        "the cancelled command lives on"
    );
    live.sh("true").await.ok();
    live.destroy().await;
    Ok(())
}

/// Two execs at once: the first waits for a file only the second makes.
pub async fn execs_run_at_once(env: &EngineEnv) -> CaseResult {
    if !env.engine().capabilities().concurrent_execs {
        crate::skip::say(&format!(
            "NOTE {}: the engine runs one exec at a time (its capabilities say so)",
            env.test_name()
        ));
        return Ok(());
    }
    let live = Live::started(env).await?;
    let (waiter, maker) = tokio::join!(
        live.sh("while [ ! -e /tmp/go ]; do sleep 0.01; done; echo saw it"),
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            live.sh("touch /tmp/go").await
        }
    );
    assert_eq!(waiter.ok().stdout_text(), "saw it\n");
    maker.ok();
    live.destroy().await;
    Ok(())
}

/// Stop ends every process of the sandbox, also one that left its command's group, and
/// returns only once they are gone; the sandbox then takes no exec.
pub async fn stop_kills_every_process(env: &EngineEnv) -> CaseResult {
    let live = Live::started(env).await?;
    if live.sh("command -v setsid").await.exit.exit_code != Some(0) {
        live.destroy().await;
        return Err(Skip::new(
            "the sandbox has no setsid to start a process outside its group",
        ));
    }
    let token = unique("escaped");
    // The command waits until the process has left its group (a process still in it when
    // the command ends is killed with it, by design).
    live.sh(&format!(
        "setsid sh -c 'touch /tmp/left; sleep 1000; : {token}' </dev/null >/dev/null 2>&1 & \
         while [ ! -e /tmp/left ]; do sleep 0.01; done"
    ))
    .await
    .ok();
    // It outlived its command (a session of its own).
    assert!(
        !host_pids_with(&token).is_empty(),
        "the escaped process did not start"
    );
    live.stop().await;
    assert!(
        host_pids_with(&token).is_empty(),
        "a process of the sandbox outlived stop"
    );
    match live.try_run(sh("true"), CancellationToken::new()).await {
        Err(RuntimeError::OutOfOrder { .. }) => {}
        other => panic!("exec after stop: {other:?}"),
    }
    // Stop again: nothing to do.
    live.stop().await;
    live.destroy().await;
    Ok(())
}

/// Exec before start and after stop is refused as out of order.
pub async fn exec_out_of_order_is_refused(env: &EngineEnv) -> CaseResult {
    let live = Live::created(env).await?;
    match live.try_run(sh("true"), CancellationToken::new()).await {
        Err(RuntimeError::OutOfOrder { .. }) => {}
        other => panic!("exec before start: {other:?}"),
    }
    live.env.engine().start(&live.handle).await.unwrap();
    match live.env.engine().start(&live.handle).await {
        Err(RuntimeError::OutOfOrder { .. }) => {}
        other => panic!("a second start: {other:?}"),
    }
    live.sh("true").await.ok();
    live.destroy().await;
    Ok(())
}

/// Destroy twice, and destroy of a sandbox never started: each succeeds.
pub async fn destroy_is_idempotent(env: &EngineEnv) -> CaseResult {
    let never_started = Live::created(env).await?;
    let handle = never_started.handle.clone();
    never_started.destroy().await;
    env.engine().destroy(&handle).await.unwrap();
    let live = Live::started(env).await?;
    let token = unique("running");
    let engine = env.engine();
    let handle = live.handle.clone();
    // Destroy while a command runs: the command ends, destroy returns.
    let (ran, destroyed) = tokio::join!(
        live.try_run(
            sh(&format!("sleep 1000; : {token}")),
            CancellationToken::new()
        ),
        async {
            let deadline = std::time::Instant::now() + PATIENCE;
            while host_pids_with(&token).is_empty() && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            engine.destroy(&handle).await
        }
    );
    destroyed.unwrap();
    if let Ok(ran) = ran {
        assert_ne!(ran.exit.exit_code, Some(0), "{:?}", ran.exit);
    }
    assert!(host_pids_with(&token).is_empty(), "destroy left a process");
    live.destroy().await;
    Ok(())
}

/// A hundred commands, one after another, in one sandbox: each one's output is its own.
pub async fn a_hundred_execs_in_one_sandbox(env: &EngineEnv) -> CaseResult {
    let live = Live::started(env).await?;
    for i in 0..100 {
        let ran = live
            .sh(&format!("echo {i} >> /workspace/log; echo {i}"))
            .await
            .ok();
        assert_eq!(ran.stdout_text(), format!("{i}\n"));
    }
    let lines = live.sh("wc -l < /workspace/log").await.ok().stdout_text();
    assert_eq!(lines.trim(), "100");
    live.destroy().await;
    Ok(())
}

/// A pause holds the sandbox: an exec asked for while paused runs only after the resume, a
/// background writer (one that left its command's group) goes on after it, and a pause of
/// an engine that cannot is refused. (That a paused process writes nothing is shown where
/// it matters: a session's diff, which a swapping process cannot race.)
pub async fn a_pause_holds_every_process_still(env: &EngineEnv) -> CaseResult {
    let live = Live::started(env).await?;
    if !env.engine().capabilities().pause {
        let refused = env.engine().pause(&live.handle).await;
        assert!(refused.is_err(), "an engine without pause paused");
        live.destroy().await;
        return Ok(());
    }
    live.sh("(setsid sh -c 'while :; do echo x >> /tmp/ticks; sleep 0.01; done' </dev/null >/dev/null 2>&1 &); sleep 0.2")
        .await
        .ok();
    env.engine()
        .pause(&live.handle)
        .await
        .map_err(|e| Skip::new(format!("pause: {e}")))?;
    let resuming = std::sync::atomic::AtomicBool::new(false);
    let count = async {
        let ran = live.run(sh("wc -l < /tmp/ticks")).await;
        (ran, resuming.load(std::sync::atomic::Ordering::SeqCst))
    };
    let resume = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        resuming.store(true, std::sync::atomic::Ordering::SeqCst);
        env.engine().resume(&live.handle).await
    };
    let ((counted, after_resume), resumed) = tokio::join!(count, resume);
    resumed.map_err(|e| Skip::new(format!("resume: {e}")))?;
    assert!(after_resume, "an exec ran while the sandbox was paused");
    let first: u64 = counted.ok().stdout_text().trim().parse().unwrap_or(0);
    assert!(first > 0, "the writer never wrote");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let later: u64 = live
            .sh("wc -l < /tmp/ticks")
            .await
            .ok()
            .stdout_text()
            .trim()
            .parse()
            .unwrap_or(0);
        if later > first {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writer did not go on after the resume"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    live.destroy().await;
    Ok(())
}

/// A snapshot freezes the workspace as it is: a sandbox started from it sees exactly that
/// (and its own writes stay its own), a restore puts the first sandbox back to it, a second
/// snapshot with nothing written since is the first, a command working in the workspace makes
/// it refused, and the host project is never written. An engine that cannot refuses.
pub async fn a_snapshot_restores_and_starts_another(env: &EngineEnv) -> CaseResult {
    let live = Live::started(env).await?;
    let engine = env.engine();
    if !engine.capabilities().snapshot {
        assert!(
            engine.snapshot(&live.handle).await.is_err(),
            "an engine without snapshots made one"
        );
        live.destroy().await;
        return Ok(());
    }
    // A host whose kernel cannot stack the layers refuses, saying so (never a broken flip).
    if let Err(RuntimeError::ControlUnsupported { reason, .. }) =
        engine.snapshot(&live.handle).await
    {
        assert!(
            reason.contains("kernel"),
            "refused without naming why: {reason}"
        );
        println!("NOTE this host refuses snapshots: {reason}");
        live.destroy().await;
        return Ok(());
    }
    let handle = &live.handle;
    let snap = |what: &'static str| async move {
        engine
            .snapshot(handle)
            .await
            .unwrap_or_else(|e| panic!("{what}: {}", e.report()))
    };
    live.sh("echo one > a; rm README.txt; mkdir -p d/e && echo x > d/e/x")
        .await
        .ok();
    // A process of the session's that lives on (outside the workspace) through the snapshot.
    live.sh("cd /tmp && (setsid sh -c 'while :; do echo x >> /tmp/ticks; sleep 0.01; done' </dev/null >/dev/null 2>&1 &); sleep 0.1")
        .await
        .ok();
    let first = snap("snapshot").await;
    assert!(
        !first.layers.is_empty(),
        "a snapshot of a change holds a layer"
    );
    let ticks = || async {
        let text = live.sh("wc -l < /tmp/ticks").await.ok().stdout_text();
        text.trim().parse::<u64>().unwrap_or(0)
    };
    let before = ticks().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while ticks().await <= before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a process held for the snapshot was never let go"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Still one session: a pause holds it too, whichever spawner started it.
    if engine.capabilities().pause {
        engine
            .pause(&live.handle)
            .await
            .unwrap_or_else(|e| panic!("pause after a snapshot: {}", e.report()));
        engine
            .resume(&live.handle)
            .await
            .unwrap_or_else(|e| panic!("resume: {}", e.report()));
    }
    live.sh("echo two > a; echo new > b; rm -r d").await.ok();
    let second = snap("second snapshot").await;
    assert_eq!(snap("snapshot of nothing new").await.layers, second.layers);
    let state = "cat a; ls; cat d/e/x 2>&1";
    // Another sandbox from the snapshot, where the engine can start one so.
    let fork = match engine.capabilities().fork {
        true => Some(live.forked(first.layers.clone()).await),
        false => None,
    };
    if let Some(fork) = &fork {
        assert_eq!(fork.sh(state).await.ok().stdout_text(), "one\na\nd\nx\n");
        fork.sh("echo forked > a; echo only-here > c").await.ok();
    }
    assert_eq!(live.sh("cat a; ls").await.ok().stdout_text(), "two\na\nb\n");
    engine
        .restore(&live.handle, &first)
        .await
        .unwrap_or_else(|e| panic!("restore: {}", e.report()));
    assert_eq!(live.sh(state).await.ok().stdout_text(), "one\na\nd\nx\n");
    if let Some(fork) = &fork {
        assert_eq!(fork.sh("cat a").await.ok().stdout_text(), "forked\n");
    }
    // A command that works in the workspace while the snapshot is asked for.
    let cancel = CancellationToken::new();
    let working = live.try_run(sh("echo z > z; exec sleep 60"), cancel.clone());
    let asked = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let refused = engine.snapshot(&live.handle).await;
        cancel.cancel();
        refused
    };
    let (_, refused) = tokio::join!(working, asked);
    match refused {
        // (A remote engine relays the host's code.)
        Err(e) if e.report().code == smithers_errors::ErrorCode::Busy => {}
        other => panic!("a snapshot under a working command: {other:?}"),
    }
    assert_eq!(live.sh("cat a z").await.ok().stdout_text(), "one\nz\n");
    assert_eq!(
        std::fs::read_to_string(live.project.join("README.txt")).unwrap(),
        "from the host\n"
    );
    assert!(
        !live.project.join("a").exists(),
        "a sandbox wrote the host project"
    );
    if let Some(fork) = fork {
        fork.destroy().await;
    }
    live.destroy().await;
    Ok(())
}

/// With [`smithers_runtime::EngineCapabilities::terminal`], a command gets a terminal of its
/// own: a tty as 0, 1 and 2 and its controlling one, of the size asked for and then of each
/// size set; what it types back comes through; an engine without refuses it (never runs it
/// without one).
pub async fn a_command_on_a_terminal_is_its_sessions_leader(env: &EngineEnv) -> CaseResult {
    use smithers_runtime::{TerminalRequest, TerminalSize};
    let live = Live::started(env).await?;
    let (size_tx, size) = tokio::sync::watch::channel(TerminalSize {
        rows: 33,
        cols: 111,
    });
    let on_terminal = |script: &str, input: &[u8]| ExecRequest {
        stdin: smithers_runtime::StepStdin::from_reader(std::io::Cursor::new(input.to_vec())),
        terminal: Some(TerminalRequest { size: size.clone() }),
        ..sh(script)
    };
    if !env.engine().capabilities().terminal {
        let refused = live
            .try_run(on_terminal("true", b""), CancellationToken::new())
            .await;
        let Err(e) = refused else {
            panic!("an engine without terminals ran a command that asked for one")
        };
        assert!(e.to_string().contains("terminal"), "{e}");
        live.destroy().await;
        return Ok(());
    }
    // Its own terminal, its controlling one (`/dev/tty` opens), of the size asked for; a line
    // typed is read back (the terminal echoes it too).
    let ran = live
        .run(on_terminal(
            "test -t 0 && test -t 1 && test -t 2 && : </dev/tty && stty size && read l && echo \"got $l\"",
            b"typed\n",
        ))
        .await;
    assert_eq!(ran.exit.exit_code, Some(0), "{}", ran.stdout_text());
    let text = ran.stdout_text();
    assert!(
        text.contains("33 111") && text.contains("got typed"),
        "{text:?}"
    );
    assert!(ran.stderr.is_empty(), "a terminal's output is one stream");
    // A size set while it runs reaches it (SIGWINCH, and the new size).
    let resize = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = size_tx.send(TerminalSize {
            rows: 50,
            cols: 160,
        });
    };
    let (ran, ()) = tokio::join!(
        live.run(on_terminal(
            "trap 'stty size; exit 0' WINCH; i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; exit 3",
            b"",
        )),
        resize
    );
    assert_eq!(ran.exit.exit_code, Some(0), "{}", ran.stdout_text());
    assert!(
        ran.stdout_text().contains("50 160"),
        "{}",
        ran.stdout_text()
    );
    live.destroy().await;
    Ok(())
}
