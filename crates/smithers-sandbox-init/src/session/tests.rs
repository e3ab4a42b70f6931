//! The session loop against a recording fake: the protocol without namespaces.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;

use serde_json::{json, Value};

use super::{serve, CommandIo, ExecHost, Wake};
use crate::plan::{ExecSpec, SessionReport, TerminalSize, MAX_SESSION_EXECS};
use crate::sys::{SysError, SysResult};

enum Step {
    Request(Value, usize),
    Raw(Vec<u8>, usize, bool),
    Ended(Vec<(libc::pid_t, libc::c_int)>),
    Closed,
    Broken,
}

/// Plays `script` to the loop and writes down every call it makes.
struct Fake {
    script: VecDeque<Step>,
    to_reap: VecDeque<(libc::pid_t, libc::c_int)>,
    next_pid: libc::pid_t,
    /// argv[0] of commands that cannot start, and the code they end with.
    missing: Vec<(String, i32)>,
    calls: Vec<String>,
    reports: Vec<SessionReport>,
    /// Descriptors handed to `spawn`, still open then (checked: 3, all valid).
    spawned_with: Vec<usize>,
    /// How many looks at `all_stopped` answer no before one answers yes (`None`: never).
    stops_after: Option<u32>,
}

fn fds(n: usize) -> Vec<OwnedFd> {
    (0..n)
        .map(|_| std::fs::File::open("/dev/null").unwrap().into())
        .collect()
}

impl Fake {
    fn new(script: Vec<Step>) -> Fake {
        Fake {
            script: script.into(),
            to_reap: VecDeque::new(),
            next_pid: 100,
            missing: vec![],
            calls: vec![],
            reports: vec![],
            spawned_with: vec![],
            stops_after: Some(0),
        }
    }
    fn run(mut self) -> (i32, Fake) {
        let code = serve(&mut self);
        (code, self)
    }
    fn reports_json(&self) -> Vec<Value> {
        self.reports
            .iter()
            .map(|r| serde_json::to_value(r).unwrap())
            .collect()
    }
}

impl ExecHost for Fake {
    fn next(&mut self) -> SysResult<Wake> {
        match self.script.pop_front() {
            Some(Step::Request(value, n)) => Ok(Wake::Request {
                bytes: serde_json::to_vec(&value).unwrap(),
                fds: fds(n),
                truncated: false,
            }),
            Some(Step::Raw(bytes, n, truncated)) => Ok(Wake::Request {
                bytes,
                fds: fds(n),
                truncated,
            }),
            Some(Step::Ended(list)) => {
                self.to_reap.extend(list);
                Ok(Wake::Children)
            }
            Some(Step::Closed) | None => Ok(Wake::Closed),
            Some(Step::Broken) => Err(SysError {
                op: "poll".into(),
                errno: libc::EBADF,
            }),
        }
    }
    fn report(&mut self, report: &SessionReport) {
        self.reports.push(report.clone());
    }
    fn report_with(&mut self, report: &SessionReport, _fd: &OwnedFd) {
        self.calls.push("report with a descriptor".into());
        self.reports.push(report.clone());
    }
    fn open_terminal(
        &mut self,
        size: TerminalSize,
    ) -> Result<(OwnedFd, std::ffi::CString), String> {
        self.calls
            .push(format!("terminal {}x{}", size.cols, size.rows));
        Ok((fds(1).remove(0), c"/dev/pts/0".to_owned()))
    }
    fn spawn(&mut self, exec: &ExecSpec, io: CommandIo<'_>) -> Result<libc::pid_t, i32> {
        self.spawned_with.push(match io {
            CommandIo::Fds(stdio) => stdio.len(),
            CommandIo::Terminal(_) => 0,
        });
        let argv0 = exec.argv.first().cloned().unwrap_or_default();
        self.calls.push(format!("spawn {argv0}"));
        if let Some((_, code)) = self.missing.iter().find(|(m, _)| *m == argv0) {
            return Err(*code);
        }
        self.next_pid += 1;
        Ok(self.next_pid)
    }
    fn reap(&mut self) -> Option<(libc::pid_t, libc::c_int)> {
        self.to_reap.pop_front()
    }
    fn signal_group(&mut self, pgid: libc::pid_t, signal: libc::c_int) {
        self.calls.push(format!("signal {pgid} {signal}"));
    }
    fn kill_all_and_reap(&mut self) {
        self.calls.push("kill all".into());
    }
    fn signal_all(&mut self, signal: libc::c_int) {
        self.calls.push(format!("signal all {signal}"));
    }
    fn all_stopped(&mut self) -> bool {
        match &mut self.stops_after {
            Some(0) => true,
            Some(n) => {
                *n -= 1;
                false
            }
            None => false,
        }
    }
    fn wait_a_little(&mut self, _us: u64) {}
    fn now_ns(&mut self) -> u64 {
        7
    }
}

fn exec(id: u64, argv0: &str) -> Value {
    json!({"op": "exec", "id": id, "exec": {"argv": [argv0], "env": [], "cwd": "/workspace", "searchPath": "/bin"}})
}

/// A wait status: exited with `code`.
fn exited(code: i32) -> libc::c_int {
    (code & 0xff) << 8
}

#[test]
fn two_commands_run_at_once_and_each_exit_is_reported_under_its_own_id() {
    let (code, fake) = Fake::new(vec![
        Step::Request(exec(1, "sleep"), 3),
        Step::Request(exec(2, "true"), 3),
        // The second ends first, then the first is killed by a signal.
        Step::Ended(vec![(102, exited(0))]),
        Step::Ended(vec![(101, libc::SIGTERM)]),
        Step::Request(json!({"op": "stop"}), 0),
    ])
    .run();
    assert_eq!(code, 0);
    assert_eq!(
        fake.reports_json(),
        vec![
            json!({"event": "started", "id": 1, "pid": 101, "monotonicNs": 7}),
            json!({"event": "started", "id": 2, "pid": 102, "monotonicNs": 7}),
            json!({"event": "exit", "id": 2, "code": 0}),
            json!({"event": "exit", "id": 1, "signal": libc::SIGTERM}),
            json!({"event": "stopped"}),
        ]
    );
    // Each command's leftovers are killed as it ends, the sandbox's at the stop.
    assert_eq!(
        fake.calls,
        [
            "spawn sleep",
            "spawn true",
            "signal 102 9",
            "signal 101 9",
            "kill all"
        ]
    );
    assert_eq!(fake.spawned_with, [3, 3]);
}

#[test]
fn orphans_are_reaped_without_a_report() {
    let (_, fake) = Fake::new(vec![
        Step::Request(exec(5, "sh"), 3),
        Step::Ended(vec![(4242, exited(0)), (101, exited(3))]),
    ])
    .run();
    assert_eq!(
        fake.reports_json()[1..],
        [json!({"event": "exit", "id": 5, "code": 3})]
    );
}

#[test]
fn a_command_that_cannot_start_ends_with_a_shells_code() {
    let mut fake = Fake::new(vec![Step::Request(exec(9, "nope"), 3)]);
    fake.missing.push(("nope".into(), 127));
    let (_, fake) = fake.run();
    assert_eq!(
        fake.reports_json(),
        [json!({"event": "exit", "id": 9, "code": 127})]
    );
}

#[test]
fn requests_that_cannot_be_carried_out_are_refused_and_the_loop_goes_on() {
    let mut stdin_path = exec(4, "cat");
    stdin_path["exec"]["stdin"] = json!("/tmp/fifo");
    let (code, fake) = Fake::new(vec![
        Step::Request(exec(1, "a"), 2), // 2 descriptors
        Step::Request(exec(1, "a"), 4), // 4 descriptors
        Step::Request(exec(1, "a"), 3), // fine
        Step::Request(exec(1, "b"), 3), // id in use
        Step::Request(stdin_path, 3),   // a stdin path
        Step::Request(json!({"op": "signal", "id": 8, "signal": 15}), 0), // not running
        Step::Request(json!({"op": "signal", "id": 1, "signal": 0}), 0), // not a signal
        Step::Request(json!({"op": "signal", "id": 1, "signal": 99}), 0), // not a signal
        Step::Request(json!({"op": "exec", "id": 2, "exec": {}, "x": 1}), 3), // unknown field
        Step::Raw(b"{not json".to_vec(), 0, false),
        Step::Raw(b"{}".to_vec(), 3, true), // truncated
        Step::Request(json!({"op": "signal", "id": 1, "signal": 2}), 0),
        Step::Closed,
    ])
    .run();
    assert_eq!(code, 0);
    let reports = fake.reports_json();
    let refused: Vec<&Value> = reports.iter().filter(|r| r["event"] == "refused").collect();
    assert_eq!(refused.len(), 10, "{reports:#?}");
    for (r, needle) in refused.iter().zip([
        "2 descriptors",
        "4 descriptors",
        "already running",
        "stdin path",
        "not running",
        "not 1 to 64",
        "not 1 to 64",
        "not valid",
        "not valid",
        "over 131072 bytes",
    ]) {
        assert!(
            r["message"].as_str().unwrap().contains(needle),
            "{r} ~ {needle}"
        );
    }
    // Only the valid exec ran; the valid signal reached its group; the channel's end
    // stopped the sandbox and reported the command it killed.
    assert_eq!(fake.calls, ["spawn a", "signal 101 2", "kill all"]);
    assert_eq!(
        reports.last().unwrap(),
        &json!({"event": "exit", "id": 1, "signal": 9})
    );
}

#[test]
fn a_stop_kills_everything_and_reports_each_running_command_then_stopped() {
    let (code, fake) = Fake::new(vec![
        Step::Request(exec(3, "x"), 3),
        Step::Request(exec(1, "y"), 3),
        Step::Request(json!({"op": "stop"}), 0),
        Step::Request(exec(7, "never"), 3),
    ])
    .run();
    assert_eq!(code, 0);
    let reports = fake.reports_json();
    assert_eq!(
        reports[2..],
        [
            json!({"event": "exit", "id": 1, "signal": 9}),
            json!({"event": "exit", "id": 3, "signal": 9}),
            json!({"event": "stopped"}),
        ]
    );
    assert!(!fake.calls.iter().any(|c| c == "spawn never"));
}

#[test]
fn a_broken_channel_stops_the_sandbox() {
    let (code, fake) = Fake::new(vec![Step::Request(exec(1, "x"), 3), Step::Broken]).run();
    assert_eq!(code, 1);
    assert_eq!(fake.calls.last().unwrap(), "kill all");
}

#[test]
fn no_more_than_the_bound_run_at_once() {
    let mut script: Vec<Step> = (0..=MAX_SESSION_EXECS as u64)
        .map(|id| Step::Request(exec(id, "x"), 3))
        .collect();
    script.push(Step::Closed);
    let (_, fake) = Fake::new(script).run();
    let reports = fake.reports_json();
    assert_eq!(
        reports.iter().filter(|r| r["event"] == "started").count(),
        MAX_SESSION_EXECS
    );
    assert!(reports[MAX_SESSION_EXECS]["message"]
        .as_str()
        .unwrap()
        .contains("running already"));
}

#[test]
fn a_pause_stops_every_process_and_holds_new_commands_until_the_resume() {
    let mut fake = Fake::new(vec![
        Step::Request(exec(1, "sleep"), 3),
        Step::Request(json!({"op": "pause", "id": 50}), 0),
        // Asked for while paused: held back, not started.
        Step::Request(exec(2, "true"), 3),
        Step::Request(json!({"op": "pause", "id": 51}), 0),
        Step::Request(json!({"op": "resume", "id": 52}), 0),
        Step::Request(json!({"op": "stop"}), 0),
    ]);
    fake.stops_after = Some(3);
    let (code, fake) = fake.run();
    assert_eq!(code, 0);
    assert_eq!(
        fake.reports_json(),
        vec![
            json!({"event": "started", "id": 1, "pid": 101, "monotonicNs": 7}),
            json!({"event": "paused", "id": 50}),
            json!({"event": "paused", "id": 51}),
            json!({"event": "resumed", "id": 52}),
            json!({"event": "started", "id": 2, "pid": 102, "monotonicNs": 7}),
            json!({"event": "exit", "id": 1, "signal": 9}),
            json!({"event": "exit", "id": 2, "signal": 9}),
            json!({"event": "stopped"}),
        ]
    );
    let stop = libc::SIGSTOP.to_string();
    let cont = libc::SIGCONT.to_string();
    assert_eq!(
        fake.calls,
        [
            "spawn sleep".to_string(),
            format!("signal all {stop}"),
            format!("signal all {cont}"),
            "spawn true".to_string(),
            "kill all".to_string()
        ]
    );
}

#[test]
fn a_pause_that_does_not_hold_in_time_is_refused_and_everything_continues() {
    let mut fake = Fake::new(vec![
        Step::Request(json!({"op": "pause", "id": 7}), 0),
        Step::Request(exec(1, "true"), 3),
        Step::Request(json!({"op": "stop"}), 0),
    ]);
    fake.stops_after = None;
    let (_, fake) = fake.run();
    let reports = fake.reports_json();
    assert_eq!(reports[0]["event"], "refused", "{reports:?}");
    assert_eq!(reports[0]["id"], 7);
    // Not paused: the next command starts at once.
    assert_eq!(reports[1]["event"], "started", "{reports:?}");
    let cont = format!("signal all {}", libc::SIGCONT);
    assert!(fake.calls.contains(&cont), "{:?}", fake.calls);
}

#[test]
fn a_stop_while_paused_ends_the_held_back_commands_too() {
    let (_, fake) = Fake::new(vec![
        Step::Request(json!({"op": "pause", "id": 1}), 0),
        Step::Request(exec(9, "true"), 3),
        Step::Request(json!({"op": "stop"}), 0),
    ])
    .run();
    assert_eq!(
        fake.reports_json(),
        vec![
            json!({"event": "paused", "id": 1}),
            json!({"event": "exit", "id": 9, "signal": 9}),
            json!({"event": "stopped"}),
        ]
    );
    assert!(!fake.calls.iter().any(|c| c == "spawn true"));
}

#[test]
fn a_stat_line_is_read_after_its_last_parenthesis() {
    use super::stopped_state;
    assert!(stopped_state(b"12 (sleep) T 1 12"));
    assert!(stopped_state(b"12 (a) R (b) t 1"));
    assert!(stopped_state(b"12 (x) Z 1"));
    assert!(!stopped_state(b"12 (x) T) R 1"));
    assert!(!stopped_state(b"12 (sleep) S 1"));
    assert!(!stopped_state(b"garbage"));
}

#[test]
fn a_command_held_back_by_a_pause_can_be_killed_before_it_starts() {
    let (_, fake) = Fake::new(vec![
        Step::Request(json!({"op": "pause", "id": 1}), 0),
        Step::Request(exec(4, "true"), 3),
        Step::Request(json!({"op": "signal", "id": 4, "signal": 9}), 0),
        Step::Request(json!({"op": "resume", "id": 2}), 0),
        Step::Request(json!({"op": "stop"}), 0),
    ])
    .run();
    assert_eq!(
        fake.reports_json(),
        vec![
            json!({"event": "paused", "id": 1}),
            json!({"event": "exit", "id": 4, "signal": 9}),
            json!({"event": "resumed", "id": 2}),
            json!({"event": "stopped"}),
        ]
    );
    assert!(!fake.calls.iter().any(|c| c == "spawn true"));
}

#[test]
fn only_process_making_calls_count_as_held_in_uninterruptible_sleep() {
    use super::process_making_call;
    assert!(process_making_call(libc::SYS_clone));
    assert!(process_making_call(libc::SYS_clone3));
    #[cfg(target_arch = "x86_64")]
    assert!(process_making_call(libc::SYS_vfork));
    assert!(!process_making_call(libc::SYS_renameat2));
    assert!(!process_making_call(libc::SYS_write));
}

#[test]
fn a_command_on_a_terminal_gets_one_whose_master_is_reported_before_its_start() {
    let mut on_terminal = exec(1, "sh");
    on_terminal["exec"]["terminal"] = json!({"rows": 24, "cols": 80});
    let (_, fake) = Fake::new(vec![
        Step::Request(on_terminal.clone(), 0),
        // A terminal command that also brings descriptors is refused whole.
        Step::Request(
            {
                let mut both = on_terminal.clone();
                both["id"] = json!(2);
                both
            },
            3,
        ),
        Step::Ended(vec![(101, exited(0))]),
    ])
    .run();
    assert_eq!(
        fake.reports_json(),
        vec![
            json!({"event": "terminal", "id": 1}),
            json!({"event": "started", "id": 1, "pid": 101, "monotonicNs": 7}),
            json!({"event": "refused", "id": 2, "message": "exec 2 came with 3 descriptors, not 0"}),
            json!({"event": "exit", "id": 1, "code": 0}),
        ]
    );
    assert_eq!(
        fake.calls[..3],
        ["terminal 80x24", "report with a descriptor", "spawn sh"]
    );
    assert_eq!(fake.spawned_with, [0]);
}
