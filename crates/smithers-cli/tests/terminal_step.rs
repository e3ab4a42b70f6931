//! `run -it` on a real terminal: tmux is the person's terminal, the real CLI runs in one of
//! its panes, and what the pane shows, its title and tmux's paste buffers are read on tmux's
//! side. A REPL and a full-screen program (vim) are driven key by key; a window resize, Ctrl-C
//! and the exit code reach through; a hostile step's clipboard write, title change and
//! answer-back requests never reach the terminal, while the cursor position report it is
//! allowed still does (so the check can fail), and the same sequences sent by a pane outside
//! the sandbox do change tmux (so the terminal would have obeyed them).
//!
//! Needs native sandboxes, tmux and vim; prints `SKIP <reason>` without them (fails under
//! `CI=true`).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

use smithers_test_support::skip_or_fail;
use support::native::{bin_path, sandboxes_usable};

/// A tmux server of the test's own (its own socket, no configuration read), with one pane.
struct Tmux {
    dir: tempfile::TempDir,
    root: PathBuf,
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

impl Tmux {
    /// A project, and the pane running `run -it` with `args` in it (then its exit code is
    /// written where [`Tmux::exit_code`] reads it).
    fn start(args: &[&str]) -> Tmux {
        let mut all: Vec<String> = ["run", "-it", "--sandbox-id", "sbx-term"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        all.extend(args.iter().map(|s| s.to_string()));
        Tmux::start_cli(|_| all)
    }

    /// A project, and the pane running the CLI with the arguments `prepare` gives once it
    /// exists.
    fn start_cli(prepare: impl FnOnce(&Tmux) -> Vec<String>) -> Tmux {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("a.txt"), "a\n").unwrap();
        let t = Tmux { dir, root };
        let args = prepare(&t);
        let quoted: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
        let script = format!(
            "cd {root} && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME={home} TERM=xterm-256color \
             SMITHERS_RESIDENT=off NO_COLOR=1 {bin} {args}; \
             echo $? > {exit}; sleep 600",
            root = shell_quote(&t.root.display().to_string()),
            home = shell_quote(&t.dir.path().display().to_string()),
            bin = shell_quote(bin_path()),
            args = quoted.join(" "),
            exit = shell_quote(&t.dir.path().join("exit").display().to_string()),
        );
        t.cmd(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "100",
            "-y",
            "30",
            &script,
        ]);
        // OSC 52 would make a paste buffer (as it sets a person's clipboard): on, so that a
        // write that got through would be seen.
        t.cmd(&["set", "-s", "set-clipboard", "on"]);
        t
    }

    fn cmd(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(self.dir.path().join("tmux.sock"))
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "t"];
        args.extend_from_slice(keys);
        self.cmd(&args);
    }

    /// Types `line` literally, then Enter.
    fn line(&self, line: &str) {
        self.cmd(&["send-keys", "-t", "t", "-l", line]);
        self.keys(&["Enter"]);
    }

    fn screen(&self) -> String {
        self.cmd(&["capture-pane", "-p", "-J", "-t", "t"])
    }

    fn format(&self, format: &str) -> String {
        self.cmd(&["display", "-p", "-t", "t", format])
            .trim()
            .to_string()
    }

    /// Waits until `check` holds of the screen (up to 30 s), and returns it.
    fn wait(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let screen = self.screen();
            if check(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} on the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_for(&self, needle: &str) -> String {
        self.wait(needle, |s| s.contains(needle))
    }

    /// Waits until `format` says `value`.
    fn wait_format(&self, format: &str, value: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.format(format) != value {
            assert!(
                Instant::now() < deadline,
                "{format} never {value}:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `run`'s exit code, once it has ended.
    fn exit_code(&self) -> i32 {
        let file = self.dir.path().join("exit");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(text) = std::fs::read_to_string(&file) {
                if text.ends_with('\n') {
                    return text.trim().parse().unwrap();
                }
            }
            assert!(
                Instant::now() < deadline,
                "run never ended:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Tmux {
    /// Asks the shell for its terminal's size until it says `size` (a resize reaches it
    /// asynchronously).
    fn wait_until_size(&self, size: &str) {
        for _ in 0..50 {
            self.line("stty size");
            std::thread::sleep(Duration::from_millis(100));
            if self.screen().contains(size) {
                return;
            }
        }
        panic!("the size never became {size}:\n{}", self.screen());
    }
}

/// The CLI run in the pane's project and home, outside the pane.
fn cli(t: &Tmux, args: &[&str]) -> std::process::Output {
    Command::new(bin_path())
        .args(args)
        .current_dir(&t.root)
        .env("HOME", t.dir.path())
        .env("SMITHERS_RESIDENT", "off")
        .output()
        .unwrap()
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Native sandboxes, tmux and vim (its real path: `/usr/bin/vi` is a link through
/// `/etc/alternatives`, which the sandbox need not see).
fn usable() -> Option<PathBuf> {
    if !sandboxes_usable() {
        return None;
    }
    if Command::new("tmux").arg("-V").output().is_err() {
        skip_or_fail("tmux is not installed (scripts/setup installs it)");
        return None;
    }
    let vim = ["vim", "vi"].iter().find_map(|v| {
        let out = Command::new("sh")
            .args(["-c", &format!("readlink -f \"$(command -v {v})\"")])
            .output()
            .ok()?;
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        (path.is_absolute() && path.starts_with("/usr")).then_some(path)
    });
    if vim.is_none() {
        skip_or_fail("vim is not installed in /usr (scripts/setup installs it)");
    }
    vim
}

#[test]
fn a_repl_and_a_full_screen_program_run_on_the_steps_own_terminal() {
    let Some(vim) = usable() else { return };
    let t = Tmux::start(&["--", "bash", "--norc", "--noprofile", "-i"]);
    t.wait_for("bash-");
    // A terminal of the sandbox's own: its devpts, our size.
    t.line("tty; stty size");
    t.wait_for("30 100");
    assert!(t.screen().contains("/dev/pts/0"), "{}", t.screen());
    // A REPL, key by key.
    t.line("python3 -q");
    t.wait_for(">>> ");
    t.line("import sys; print(sys.stdin.isatty(), 6 * 7)");
    t.wait_for("True 42");
    t.keys(&["C-d"]);
    t.line("echo back-in-bash");
    t.wait("the echo", |s| s.matches("back-in-bash").count() >= 2);
    // A full-screen program: the alternate screen on while it runs, its edit saved.
    t.line(&format!("{} -u NONE -N notes.txt", vim.display()));
    t.wait_format("#{alternate_on}", "1");
    t.cmd(&["send-keys", "-t", "t", "-l", "ihello from vim"]);
    t.keys(&["Escape"]);
    t.line(":wq");
    t.wait_format("#{alternate_on}", "0");
    // The window's new size reaches the step's terminal.
    t.cmd(&["resize-window", "-t", "t", "-x", "120", "-y", "40"]);
    // Until the new size has reached the step's terminal (a signal, then an ioctl).
    t.wait_until_size("40 120");
    // Ctrl-C is the step's: it ends the step's command, not the run.
    t.line("sleep 100");
    std::thread::sleep(Duration::from_millis(300));
    t.keys(&["C-c"]);
    t.line("echo rc=$?");
    t.wait_for("rc=130");
    t.line("exit 0");
    assert_eq!(t.exit_code(), 0, "{}", t.screen());
    // The edit came back for review and is accepted as made.
    let accept = Command::new(bin_path())
        .args(["accept", "sbx-term", "--root"])
        .arg(&t.root)
        .env("SMITHERS_RESIDENT", "off")
        .output()
        .unwrap();
    assert!(accept.status.success(), "{accept:?}");
    assert_eq!(
        std::fs::read_to_string(t.root.join("notes.txt")).unwrap(),
        "hello from vim\n"
    );
}

/// A step that leaves the terminal in modes a shell cannot live with (mouse and focus
/// reports, a hidden cursor, the application keypad, the alternate screen) and ends: they
/// hold while it runs (so the check can fail) and are set back when it ends, on tmux's side.
#[test]
fn what_a_step_left_set_on_the_terminal_is_set_back_when_it_ends() {
    if usable().is_none() {
        return;
    }
    let script = r"printf '\033[?1003h\033[?1004h\033[?25l\033=\033[?1049hMODES-SET'; sleep 3";
    let t = Tmux::start(&["--", "sh", "-c", script]);
    t.wait_for("MODES-SET");
    let flags = "#{alternate_on} #{mouse_any_flag} #{cursor_flag} #{keypad_flag}";
    assert_eq!(t.format(flags), "1 1 0 1", "{}", t.screen());
    assert_eq!(t.exit_code(), 0, "{}", t.screen());
    assert_eq!(t.format(flags), "0 0 1 0", "{}", t.screen());
}

/// The hostile step: each sequence sent on its terminal (raw), and whatever comes back on its
/// input within half a second counted; it prints the counts and exits 7.
const HOSTILE: &str = r#"
import os, select, sys, time, tty
fd = sys.stdin.fileno()
tty.setraw(fd)
def ask(seq):
    os.write(1, seq)
    got, end = b"", time.time() + 0.5
    while time.time() < end:
        if select.select([fd], [], [], 0.05)[0]:
            got += os.read(fd, 1024)
    return got
answers = [
    ("title", ask(b"\x1b]2;PWNED-TITLE\x07")),
    ("clipboard", ask(b"\x1b]52;c;ZWNobyBwd25lZA==\x07")),
    ("titlereport", ask(b"\x1b[21t")),
    ("decrqss", ask(b"\x1bP$qm\x1b\\")),
    ("enq", ask(b"\x05")),
    ("decid", ask(b"\x1bZ")),
    ("da", ask(b"\x1b[c")),
    ("cpr", ask(b"\x1b[6n")),
]
os.write(1, ("\r\nANSWERS " + " ".join(f"{k}={len(v)}" for k, v in answers) + "\r\n").encode())
sys.exit(7)
"#;

#[test]
fn a_hostile_steps_clipboard_title_and_answer_back_never_reach_the_terminal() {
    if usable().is_none() {
        return;
    }
    let t = Tmux::start(&["--", "python3", "-c", HOSTILE]);
    assert_eq!(t.exit_code(), 7, "{}", t.screen());
    let screen = t.wait_for("ANSWERS");
    let line = screen.lines().find(|l| l.starts_with("ANSWERS")).unwrap();
    let count = |k: &str| -> usize {
        let field = line
            .split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in {line}"));
        field.parse().unwrap()
    };
    // Answers the terminal gives on its own (the cursor position, its attributes) come back.
    assert!(count("cpr") > 0 && count("da") > 0, "{line}");
    for k in [
        "title",
        "clipboard",
        "titlereport",
        "decrqss",
        "enq",
        "decid",
    ] {
        assert_eq!(count(k), 0, "{k}: {line}");
    }
    // tmux's side: its title is not the step's, no paste buffer was made.
    assert_ne!(t.format("#{pane_title}"), "PWNED-TITLE");
    assert_eq!(
        t.cmd(&["list-buffers"]),
        "",
        "a clipboard write reached tmux"
    );
    // What was kept out is said.
    t.wait_for("kept from your terminal");
    let screen = t.screen();
    for kind in ["clipboard access", "title change", "device control string"] {
        assert!(screen.contains(kind), "{kind}: {screen}");
    }
    // The same sequences from a pane outside the sandbox: tmux obeys them.
    t.cmd(&[
        "respawn-pane",
        "-k",
        "-t",
        "t",
        "printf '\\033]2;CONTROL-TITLE\\007\\033]52;c;ZWNobyBwd25lZA==\\007'; sleep 600",
    ]);
    t.wait_format("#{pane_title}", "CONTROL-TITLE");
    assert!(t.cmd(&["list-buffers"]).contains("echo pwned"));
}

/// `session exec -t`: a session's command on a terminal of its own, shown on the client's
/// terminal through the same filter: its size and a resize, a title change kept out, its exit
/// code as the client's, its change in the session's diff.
#[test]
fn a_sessions_command_runs_on_a_terminal_of_its_own() {
    if usable().is_none() {
        return;
    }
    let mut id = String::new();
    let t = Tmux::start_cli(|t| {
        let out = cli(t, &["session", "start"]);
        assert!(out.status.success(), "{out:?}");
        id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        ["session", "exec", "-t", &id, "--", "bash", "--norc", "-i"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    });
    t.wait_for("bash-");
    t.line("stty size; echo from-the-session > s.txt");
    t.wait_for("30 100");
    t.cmd(&["resize-window", "-t", "t", "-x", "120", "-y", "40"]);
    t.wait_until_size("40 120");
    t.line("printf '\\033]2;PWNED\\007'; exit 3");
    assert_eq!(t.exit_code(), 3, "{}", t.screen());
    let screen = t.screen();
    assert!(screen.contains("kept from your terminal"), "{screen}");
    assert_ne!(t.format("#{pane_title}"), "PWNED");
    let diff = cli(&t, &["session", "diff", &id]);
    assert!(
        String::from_utf8_lossy(&diff.stdout).contains("+from-the-session"),
        "{diff:?}"
    );
    let stop = cli(&t, &["session", "stop", &id]);
    assert!(stop.status.success(), "{stop:?}");
}

/// A step that turns off its terminal's signals and ignores SIGINT: Ctrl-C reaches it as a
/// byte it ignores, and only `~.` at the start of a line ends it (as ssh's escape): the step
/// is cancelled, the terminal set back. A `~` elsewhere reaches the step as typed.
#[test]
fn tilde_dot_ends_a_step_that_took_away_its_own_signals() {
    if usable().is_none() {
        return;
    }
    let script =
        "stty -isig; trap '' INT; echo IGNORING; while read -r l; do echo \"GOT[$l]\"; done";
    let t = Tmux::start(&["--", "sh", "-c", script]);
    t.wait_for("IGNORING");
    t.keys(&["C-c"]);
    t.line("a~.b");
    t.wait_for("GOT[a~.b]");
    t.cmd(&["send-keys", "-t", "t", "-l", "~~x"]);
    t.keys(&["Enter"]);
    t.wait_for("GOT[~x]");
    t.cmd(&["send-keys", "-t", "t", "-l", "~."]);
    let code = t.exit_code();
    assert_ne!(code, 0, "{}", t.screen());
    let screen = t.screen();
    assert!(screen.contains("cancel"), "{screen}");
    // Our terminal is out of raw mode again: its line discipline echoes and edits lines.
    let tty = t.format("#{pane_tty}");
    let modes = Command::new("stty")
        .args(["-F", &tty, "-a"])
        .output()
        .unwrap();
    let modes = String::from_utf8_lossy(&modes.stdout);
    let set: Vec<&str> = modes.split_whitespace().collect();
    for mode in ["icanon", "echo", "isig"] {
        assert!(set.contains(&mode), "{mode} not set back: {modes}");
    }
}

/// The same escape for a session's command on its terminal: the command is killed, the
/// session goes on.
#[test]
fn tilde_dot_ends_a_sessions_command_and_not_the_session() {
    if usable().is_none() {
        return;
    }
    let mut id = String::new();
    let script = "stty -isig; trap '' INT; echo IGNORING; sleep 600";
    let t = Tmux::start_cli(|t| {
        let out = cli(t, &["session", "start"]);
        assert!(out.status.success(), "{out:?}");
        id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        ["session", "exec", "-t", &id, "--", "sh", "-c", script]
            .iter()
            .map(|s| s.to_string())
            .collect()
    });
    t.wait_for("IGNORING");
    // Ctrl-C, then a new line (the escape is read only at the start of one).
    t.keys(&["C-c", "Enter"]);
    t.cmd(&["send-keys", "-t", "t", "-l", "~."]);
    assert_eq!(t.exit_code(), 130, "{}", t.screen());
    t.wait_for("ended with ~.");
    let after = cli(
        &t,
        &["session", "exec", &id, "--", "sh", "-c", "echo still-here"],
    );
    assert!(
        String::from_utf8_lossy(&after.stdout).contains("still-here"),
        "{after:?}"
    );
    let stop = cli(&t, &["session", "stop", &id]);
    assert!(stop.status.success(), "{stop:?}");
}
