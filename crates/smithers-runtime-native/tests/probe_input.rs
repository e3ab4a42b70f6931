//! The init's host probe installs the seccomp program the runtime gives it on stdin (the init
//! has no seccomp compiler of its own), and says so when it is given none.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// Runs the probe with `input` on stdin; its `seccomp` finding.
fn probe_seccomp(input: &[u8]) -> Value {
    let scratch = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_smithers-sandbox-init"))
        .arg("--probe")
        .arg(scratch.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    let findings: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no report ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    findings["seccomp"].clone()
}

fn input(seccomp: Option<Vec<(u16, u8, u8, u32)>>) -> Vec<u8> {
    serde_json::to_vec(&smithers_runtime_native::plan::ProbeInput {
        version: smithers_runtime_native::plan::PLAN_VERSION,
        seccomp,
    })
    .unwrap()
}

/// `BPF_RET | BPF_K` with `SECCOMP_RET_ALLOW`: a valid program that allows everything.
const ALLOW_ALL: (u16, u8, u8, u32) = (0x06, 0, 0, 0x7fff_0000);

#[test]
fn the_probe_installs_the_program_it_is_given() {
    assert_eq!(
        probe_seccomp(&input(Some(vec![ALLOW_ALL])))["ok"],
        json!(true)
    );
    // An opcode the kernel's checker refuses: the probe tried *this* program, not its own.
    let refused = probe_seccomp(&input(Some(vec![(0xffff, 0, 0, 0)])));
    assert_eq!(refused["ok"], json!(false), "{refused}");
    assert_eq!(refused["errno"], json!(libc::EINVAL), "{refused}");
}

#[test]
fn the_probe_without_a_program_says_it_did_not_try() {
    let none = probe_seccomp(&input(None));
    assert_eq!(none["ok"], json!(false), "{none}");
    assert!(
        none["detail"].as_str().unwrap().contains("not tried"),
        "{none}"
    );
    let garbage = probe_seccomp(b"not json");
    assert_eq!(garbage["ok"], json!(false), "{garbage}");
    assert!(
        garbage["detail"].as_str().unwrap().contains("not valid"),
        "{garbage}"
    );
}
