//! A step's output through `run`, the real binary and real native sandboxes: to a pipe or a
//! file it is the step's stdout and stderr byte for byte and whole (bytes that are not UTF-8,
//! no newline added, binary data, more than the capture caps), through the resident service
//! and a `serve` host (`--runtime codeplane`) as well; the caps bound what the bundle's log
//! keeps, which says what it did not keep, never the step (`--max-output-lines` raises the
//! line cap, `--fail-on-output-cap` makes a cap fail the step); the log keeps bytes that are
//! not UTF-8 exactly; and a change of thousands of files is summarised by directory in
//! `run`'s summary, with the ignore rule that would leave them out, while `review` lists all.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::native::{bin, sandboxes_usable};
use support::serve::{ServeChild, ServeOptions};

/// `run ARGS -- sh -c SCRIPT` in `dir`, its stdout and stderr pipes, stdin /dev/null.
fn run_cmd(dir: &Path, flags: &[&str], script: &str) -> Command {
    let mut c = bin();
    c.env("SMITHERS_RESIDENT", "off")
        .current_dir(dir)
        .arg("run")
        .args(flags)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null());
    c
}

fn run(dir: &Path, flags: &[&str], script: &str) -> Output {
    run_cmd(dir, flags, script).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A project directory (its `.smithers` marks the top).
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(".smithers")).unwrap();
    dir
}

/// The bundle directory `run`'s summary names.
fn bundle_of(out: &Output) -> PathBuf {
    let stderr = text(&out.stderr);
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("bundle   "))
        .unwrap_or_else(|| panic!("no bundle line in: {stderr}"));
    PathBuf::from(line.trim())
}

/// The records of a bundle's log.
fn log_records(bundle: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(bundle.join("logs/stream.ndjson")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What the log kept of a stream, decoded as the log's format says: `line` (UTF-8) or `b64`
/// bytes, each followed by a newline unless `partial`.
fn kept(records: &[Value], stream: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records.iter().filter(|r| r["type"] == stream) {
        match (r["line"].as_str(), r["b64"].as_str()) {
            (Some(t), None) => out.extend_from_slice(t.as_bytes()),
            (None, Some(b)) => out.extend(base64(b)),
            _ => panic!("an output record with neither or both of line and b64: {r}"),
        }
        if r["partial"] != true {
            out.push(b'\n');
        }
    }
    out
}

/// Standard base64 (with padding), decoded here rather than by the code under test.
fn base64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

fn truncations<'a>(records: &'a [Value], stream: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["type"] == "outputTruncated" && r["stream"] == stream)
        .collect()
}

/// Random-looking bytes (every byte value, no structure), `len` of them.
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The step's stdout to a file is its bytes: not UTF-8, no newline added, exit 0.
#[test]
fn stdout_to_a_file_is_the_steps_bytes() {
    if !sandboxes_usable() {
        return;
    }
    let dir = project();
    let file = dir.path().join("out.bin");
    let out = run_cmd(dir.path(), &[], r#"printf '\377\376x'; printf 'e\377' >&2"#)
        .stdout(std::fs::File::create(&file).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(&file).unwrap(), b"\xff\xfex");
    // The step's stderr is in ours as written, before the summary.
    assert!(
        out.stderr.windows(2).any(|w| w == b"e\xff"),
        "{:?}",
        text(&out.stderr)
    );
    // The log keeps them exactly.
    let records = log_records(&bundle_of(&out));
    assert_eq!(kept(&records, "stdout"), b"\xff\xfex");
    assert_eq!(kept(&records, "stderr"), b"e\xff");
}

/// 5 MiB of binary data (over the 1 MiB capture cap) from a file of the project: the pipe
/// gets every byte; the log keeps 1 MiB of it and says how much it did not keep; the step
/// finished.
#[test]
fn binary_output_past_the_cap_is_relayed_whole() {
    if !sandboxes_usable() {
        return;
    }
    let dir = project();
    let blob = noise(5 << 20);
    std::fs::write(dir.path().join("blob.bin"), &blob).unwrap();
    let out = run(dir.path(), &[], "cat blob.bin");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        out.stdout == blob,
        "{} bytes relayed of 5 MiB",
        out.stdout.len()
    );
    assert!(stderr.contains("status   finished (exit 0)"), "{stderr}");
    assert!(
        stderr.contains(
            "stdout cut off at maxOutputBytes (1048576 bytes): raise it with --max-output"
        ),
        "{stderr}"
    );
    let records = log_records(&bundle_of(&out));
    assert_eq!(kept(&records, "stdout"), blob[..1 << 20]);
    let cut = truncations(&records, "stdout");
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert_eq!(cut[0]["notKeptBytes"], (4u64 << 20), "{}", cut[0]);
    assert_eq!(cut[0]["totalBytes"], (5u64 << 20), "{}", cut[0]);
}

/// 200,000 lines: the step finishes (exit 0), the pipe gets all of them, the log keeps the
/// first 100,000 and says that 100,000 were not kept.
#[test]
fn a_loud_step_finishes_and_its_pipe_gets_every_line() {
    if !sandboxes_usable() {
        return;
    }
    let dir = project();
    let out = run(dir.path(), &[], "seq 1 200000");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("status   finished (exit 0)"), "{stderr}");
    let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(lines.len(), 200_000);
    assert_eq!(lines[199_999], "200000");
    assert!(
        stderr.contains("stdout cut off at maxOutputLines (100000 lines): raise it with --max-output-lines; 700000 bytes (100000 lines) not kept"),
        "{stderr}"
    );
    let records = log_records(&bundle_of(&out));
    let stdout_records = records.iter().filter(|r| r["type"] == "stdout").count();
    assert_eq!(stdout_records, 100_000);
    let cut = truncations(&records, "stdout");
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert_eq!(cut[0]["cap"], "lines");
    assert_eq!(cut[0]["notKeptLines"], 100_000);
    let exit = records.iter().find(|r| r["type"] == "exit").unwrap();
    assert_eq!(exit["termination"], "exited", "{exit}");
    assert_eq!(exit["exitCode"], 0, "{exit}");
}

/// `--max-output-lines` raises the line cap: the log keeps all 200,000 lines.
#[test]
fn max_output_lines_raises_the_line_cap() {
    if !sandboxes_usable() {
        return;
    }
    let dir = project();
    let out = run(
        dir.path(),
        &["--max-output-lines", "300000", "--max-output", "8m"],
        "seq 1 200000",
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("cut off"), "{stderr}");
    let records = log_records(&bundle_of(&out));
    assert!(truncations(&records, "stdout").is_empty());
    assert_eq!(kept(&records, "stdout"), out.stdout);
    assert_eq!(out.stdout.iter().filter(|b| **b == b'\n').count(), 200_000);
    // And lowers it.
    let out = run(dir.path(), &["--max-output-lines", "10"], "seq 1 20");
    assert!(out.status.success());
    let records = log_records(&bundle_of(&out));
    assert_eq!(kept(&records, "stdout"), b"1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n");
    assert_eq!(truncations(&records, "stdout")[0]["notKeptLines"], 10);
    let bad = run(dir.path(), &["--max-output-lines", "0"], "true");
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
}

/// `--fail-on-output-cap`: a stream past a cap fails the step (termination output).
#[test]
fn fail_on_output_cap_fails_the_step() {
    if !sandboxes_usable() {
        return;
    }
    let dir = project();
    let out = run(
        dir.path(),
        &["--json", "--fail-on-output-cap"],
        "seq 1 200000",
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["termination"], "output", "{doc}");
    assert_eq!(doc["status"], "failed", "{doc}");
    let out = run(dir.path(), &["--fail-on-output-cap"], "seq 1 10");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, b"1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n");
}

/// The log round-trips bytes that are not UTF-8, lines and a last line without a newline,
/// and `logs ID` to a pipe gives them back exactly.
#[test]
fn the_log_keeps_bytes_that_are_not_utf8_exactly() {
    if !sandboxes_usable() {
        return;
    }
    let dir = project();
    let script = r#"printf 'plain\n\200\201 latin-1 \351\n\000nul\ttab\n'; printf 'last \342\234' ; printf '\223'"#;
    let expected: &[u8] = b"plain\n\x80\x81 latin-1 \xe9\n\x00nul\ttab\nlast \xe2\x9c\x93";
    let out = run(dir.path(), &[], script);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, expected);
    let records = log_records(&bundle_of(&out));
    assert_eq!(kept(&records, "stdout"), expected);
    let b64 = records.iter().filter(|r| r.get("b64").is_some()).count();
    assert_eq!(
        b64, 1,
        "only the line that is not UTF-8 is base64: {records:?}"
    );
    let json = run(dir.path(), &["--json"], "true");
    let id = serde_json::from_slice::<Value>(&json.stdout).unwrap()["sandboxId"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!id.is_empty());
    let first = bundle_of(&out);
    let first_id = first
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let logs = bin()
        .current_dir(dir.path())
        .args(["logs", first_id])
        .output()
        .unwrap();
    assert!(logs.status.success(), "{}", text(&logs.stderr));
    assert_eq!(logs.stdout, expected);
}

/// A change of 2,000 files: `run`'s summary counts them by directory with the ignore rule
/// that would leave `node_modules/` out, not file by file; `review` and `run --json` list
/// every one.
#[test]
fn a_change_of_thousands_of_files_is_summarised_by_directory() {
    if !sandboxes_usable() {
        return;
    }
    let dir = project();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/main.js"), "one\n").unwrap();
    let script = "for i in $(seq 1 1990); do mkdir -p node_modules/p$i; echo x > node_modules/p$i/index.js; done; \
                  for i in $(seq 1 9); do echo y > src/f$i.js; done; echo two >> src/main.js";
    let out = run(dir.path(), &[], script);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("patches  2000 files, by directory"),
        "{stderr}"
    );
    let modules = stderr
        .lines()
        .find(|l| l.trim_start().starts_with("node_modules/ "))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        modules.contains("1990 files (1990 new), +1990 -0"),
        "{modules}"
    );
    let src = stderr
        .lines()
        .find(|l| l.trim_start().starts_with("src/ "))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(src.contains("10 files (9 new), +10 -0"), "{src}");
    assert!(
        stderr.contains("2000 files changed, 2000 insertions(+), 0 deletions(-)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("add node_modules/ to .gitignore"),
        "{stderr}"
    );
    assert!(!stderr.contains("node_modules/p17/index.js"), "{stderr}");
    let id = bundle_of(&out)
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let review = bin()
        .current_dir(dir.path())
        .args(["review", &id])
        .output()
        .unwrap();
    let shown = text(&review.stdout);
    for i in [1, 17, 1990] {
        assert!(
            shown.contains(&format!("node_modules/p{i}/index.js")),
            "review leaves out p{i}"
        );
    }
    let listed = bin()
        .current_dir(dir.path())
        .args(["review", "--json", &id])
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(doc["patches"].as_array().map(Vec::len), Some(2000));
}

/// Output kept under raised caps past what a bundle may spend on its log: the bundle's log
/// is cut to its room (its start and its end kept, a `logCut` record between, said in the
/// summary), the pipe still gets everything, and the step's change comes back.
#[test]
fn a_log_past_the_bundles_room_is_cut_and_the_change_comes_back() {
    if !sandboxes_usable() {
        return;
    }
    let dir = project();
    let out = run(
        dir.path(),
        &["--max-output", "128m", "--max-output-lines", "10000000"],
        "head -c 60000000 /dev/zero | tr '\\0' x | fold -w 99; echo made > new.txt",
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(out.stdout.len(), 60_606_060, "every byte relayed");
    assert!(stderr.contains("log      the log ("), "{stderr}");
    assert!(stderr.contains("new.txt"), "{stderr}");
    let bundle = bundle_of(&out);
    let len = std::fs::metadata(bundle.join("logs/stream.ndjson"))
        .unwrap()
        .len();
    assert!(len <= 48 << 20, "{len}");
    let records = log_records(&bundle);
    let first = records.iter().find(|r| r["type"] == "stdout").unwrap();
    assert_eq!(first["line"].as_str(), Some("x".repeat(99).as_str()));
    assert_eq!(records.iter().filter(|r| r["type"] == "logCut").count(), 1);
    assert!(records.iter().any(|r| r["type"] == "exit"));
}

/// A service of the binary under test in a private directory; stopped when dropped.
struct Service {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl Service {
    fn start() -> Service {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let child = bin()
            .env("SMITHERS_RESIDENT_DIR", dir.path())
            .args(["daemon", "serve", "--idle", "5m"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let s = Service { dir, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = s
                .client()
                .args(["--json", "daemon", "status"])
                .output()
                .unwrap();
            let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            if doc["running"] == true {
                return s;
            }
            assert!(Instant::now() < deadline, "the service did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn client(&self) -> Command {
        let mut c = bin();
        c.env("SMITHERS_RESIDENT_DIR", self.dir.path());
        c
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.client().args(["daemon", "stop"]).output();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Through the resident service, a served `run` relays the same bytes: to a file, past the
/// cap, not UTF-8, no newline added.
#[test]
fn a_served_run_relays_the_steps_bytes() {
    if !sandboxes_usable() {
        return;
    }
    let service = Service::start();
    let dir = project();
    let blob = noise(3 << 20);
    std::fs::write(dir.path().join("blob.bin"), &blob).unwrap();
    let file = dir.path().join("out.bin");
    let out = service
        .client()
        .env("SMITHERS_RESIDENT", "require")
        .current_dir(dir.path())
        .args([
            "run",
            "--",
            "sh",
            "-c",
            r#"cat blob.bin; printf '\377\376x'"#,
        ])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&file).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut expected = blob;
    expected.extend_from_slice(b"\xff\xfex");
    let got = std::fs::read(&file).unwrap();
    assert!(got == expected, "{} bytes of {}", got.len(), expected.len());
}

const TOKEN: &str = "output-relay-token-0123456789";

/// Through a `serve` host (`--runtime codeplane`): the same bytes, all of them, and the
/// step's stderr as written.
#[test]
fn a_remote_run_relays_the_steps_bytes() {
    if !sandboxes_usable() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let server = ServeChild::start(&ServeOptions {
        token: TOKEN.into(),
        data_dir: data.path().join("data"),
        args: Vec::new(),
        env: Vec::new(),
        wrapper: Vec::new(),
    })
    .unwrap();
    let dir = project();
    let blob = noise(5 << 20);
    std::fs::write(dir.path().join("blob.bin"), &blob).unwrap();
    let out = bin()
        .env("SMITHERS_RESIDENT", "off")
        .current_dir(dir.path())
        .args(["run", "--runtime", "codeplane", "--"])
        .args([
            "sh",
            "-c",
            r#"cat blob.bin; printf '\377\376x'; printf 'e\377' >&2"#,
        ])
        .env("CODEPLANE_API_URL", server.url())
        .env("CODEPLANE_API_KEY", TOKEN)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(
        out.status.success(),
        "{stderr}\nserver: {}",
        server.stderr()
    );
    let mut expected = blob;
    expected.extend_from_slice(b"\xff\xfex");
    assert!(
        out.stdout == expected,
        "{} bytes of {}",
        out.stdout.len(),
        expected.len()
    );
    assert!(out.stderr.windows(2).any(|w| w == b"e\xff"), "{stderr}");
    assert!(!stderr.contains("did not reach us"), "{stderr}");
}
