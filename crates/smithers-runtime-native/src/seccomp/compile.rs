//! The policy compiled to one classic BPF program: a binary search over runs of equal verdict,
//! each verdict's argument checks after it (see the module docs of [`super`]).

use crate::plan::BpfInstruction;

use super::table::{
    checked, denied_syscalls, plain_allowed, Verdict, CLONE_NS_FLAGS, HARMLESS_PERSONALITY,
    INET_PROTOCOLS, NEWEST_KNOWN, PERSONALITY_QUERY, SOCK_TYPE_MASK,
};

/// Errors while compiling the filter (an unsupported architecture, or a bug).
#[derive(Debug, thiserror::Error)]
pub enum SeccompCompileError {
    #[error("seccomp is not supported on architecture {0}")]
    Arch(String),
    #[error("building the seccomp filter: {0}")]
    Build(String),
}

// Classic BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h).
pub(super) const LD_W_ABS: u16 = 0x20;
pub(super) const AND_K: u16 = 0x54;
pub(super) const JA: u16 = 0x05;
pub(super) const JEQ_K: u16 = 0x15;
pub(super) const JGE_K: u16 = 0x35;
pub(super) const JSET_K: u16 = 0x45;
pub(super) const RET_K: u16 = 0x06;
pub(super) const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
pub(super) const RET_ALLOW: u32 = 0x7fff_0000;

pub(super) const fn errno(e: i32) -> u32 {
    RET_ERRNO | e as u32
}

/// Offsets in `struct seccomp_data`: nr, arch, then the six 64-bit arguments.
pub(super) const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// The low 32 bits of argument `i` (the only part the checked arguments use).
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i + if cfg!(target_endian = "big") { 4 } else { 0 }
}

/// x86_64's x32 ABI numbers its syscalls from this bit up, under the same audit arch: the
/// x86_64 numbers of the list do not describe them, so they are all refused.
#[cfg(target_arch = "x86_64")]
pub(super) const X32_SYSCALL_BIT: u32 = 0x4000_0000;

pub(super) fn audit_arch() -> Result<u32, SeccompCompileError> {
    // AUDIT_ARCH_* of linux/audit.h: the machine, 64-bit, little-endian. Only the
    // architectures whose syscall tables the lists above were checked against.
    match std::env::consts::ARCH {
        "x86_64" => Ok(0xc000_003e),
        "aarch64" => Ok(0xc000_00b7),
        other => Err(SeccompCompileError::Arch(other.to_string())),
    }
}

fn build(e: impl std::fmt::Display) -> SeccompCompileError {
    SeccompCompileError::Build(e.to_string())
}

/// One step of a small piece of code with forward jumps to labels (resolved by [`assemble`]).
#[derive(Debug, Clone, Copy)]
enum Op {
    Load(u32),
    And(u32),
    Ret(u32),
    /// Jump to the label when the comparison holds, else go on.
    JumpIf(u16, u32, Label),
    /// Where the label's jumps land.
    At(Label),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Label {
    Allow,
    Deny,
    Inet,
    Protocol,
    Netlink,
}

fn jump_offset(n: usize) -> Result<u8, SeccompCompileError> {
    u8::try_from(n).map_err(|_| build(format!("a jump of {n} instructions (at most 255)")))
}

/// Lays out `ops`, resolving each jump to its label, which must come after it.
fn assemble(ops: &[Op]) -> Result<Vec<BpfInstruction>, SeccompCompileError> {
    let mut labels: Vec<(Label, usize)> = Vec::new();
    let mut at = 0;
    for op in ops {
        match op {
            Op::At(l) => labels.push((*l, at)),
            _ => at += 1,
        }
    }
    let mut out = Vec::with_capacity(at);
    for op in ops {
        let here = out.len();
        match *op {
            Op::Load(k) => out.push((LD_W_ABS, 0, 0, k)),
            Op::And(k) => out.push((AND_K, 0, 0, k)),
            Op::Ret(k) => out.push((RET_K, 0, 0, k)),
            Op::JumpIf(code, k, label) => {
                let &(_, target) = labels
                    .iter()
                    .find(|(l, _)| *l == label)
                    .ok_or_else(|| build(format!("label {label:?} is missing")))?;
                let skip = target
                    .checked_sub(here + 1)
                    .ok_or_else(|| build(format!("label {label:?} is behind its jump")))?;
                out.push((code, jump_offset(skip)?, 0, k));
            }
            Op::At(_) => {}
        }
    }
    Ok(out)
}

/// The code run once the syscall number is known to have `verdict` (it always returns).
#[allow(clippy::unnecessary_cast)] // the ioctl request constants are u64 on some targets
fn verdict_code(verdict: Verdict) -> Result<Vec<BpfInstruction>, SeccompCompileError> {
    use Label::*;
    use Op::*;
    let ops: Vec<Op> = match verdict {
        Verdict::Allow => vec![Ret(RET_ALLOW)],
        Verdict::Eperm => vec![Ret(errno(libc::EPERM))],
        Verdict::Enosys => vec![Ret(errno(libc::ENOSYS))],
        Verdict::Clone => vec![
            Load(arg_low(0)),
            JumpIf(JSET_K, CLONE_NS_FLAGS, Deny),
            Ret(RET_ALLOW),
            At(Deny),
            Ret(errno(libc::EPERM)),
        ],
        // Pushing characters into a terminal's input queue (TIOCSTI), or reading and pasting
        // a virtual console's selection (TIOCLINUX), reaches past the sandbox on a terminal
        // it shares.
        Verdict::Ioctl => vec![
            Load(arg_low(1)),
            JumpIf(JEQ_K, libc::TIOCSTI as u32, Deny),
            JumpIf(JEQ_K, libc::TIOCLINUX as u32, Deny),
            Ret(RET_ALLOW),
            At(Deny),
            Ret(errno(libc::EPERM)),
        ],
        Verdict::Socketpair => vec![
            Load(arg_low(0)),
            JumpIf(JEQ_K, libc::AF_UNIX as u32, Allow),
            Ret(errno(libc::EAFNOSUPPORT)),
            At(Allow),
            Ret(RET_ALLOW),
        ],
        Verdict::Personality => vec![
            Load(arg_low(0)),
            JumpIf(JEQ_K, PERSONALITY_QUERY, Allow),
            JumpIf(JSET_K, !HARMLESS_PERSONALITY, Deny),
            At(Allow),
            Ret(RET_ALLOW),
            At(Deny),
            Ret(errno(libc::EPERM)),
        ],
        Verdict::Socket => {
            let mut ops = vec![
                Load(arg_low(0)),
                JumpIf(JEQ_K, libc::AF_UNIX as u32, Allow),
                JumpIf(JEQ_K, libc::AF_INET as u32, Inet),
                JumpIf(JEQ_K, libc::AF_INET6 as u32, Inet),
                JumpIf(JEQ_K, libc::AF_NETLINK as u32, Netlink),
                Ret(errno(libc::EAFNOSUPPORT)),
                At(Inet),
                Load(arg_low(1)),
                And(SOCK_TYPE_MASK),
                JumpIf(JEQ_K, libc::SOCK_STREAM as u32, Protocol),
                JumpIf(JEQ_K, libc::SOCK_DGRAM as u32, Protocol),
                Ret(errno(libc::EPERM)),
                At(Protocol),
                Load(arg_low(2)),
            ];
            ops.extend(INET_PROTOCOLS.map(|p| JumpIf(JEQ_K, p as u32, Allow)));
            ops.extend([
                Ret(errno(libc::EPROTONOSUPPORT)),
                At(Netlink),
                Load(arg_low(2)),
                JumpIf(JEQ_K, libc::NETLINK_ROUTE as u32, Allow),
                Ret(errno(libc::EPROTONOSUPPORT)),
                At(Allow),
                Ret(RET_ALLOW),
            ]);
            ops
        }
    };
    assemble(&ops)
}

/// The sorted, checked table of every number the lists name, with its verdict.
pub(super) fn table() -> Result<Vec<(u32, Verdict)>, SeccompCompileError> {
    let mut entries: Vec<(u32, Verdict)> = plain_allowed()
        .into_iter()
        .map(|(_, nr)| (nr as u32, Verdict::Allow))
        .collect();
    entries.extend(checked().into_iter().map(|(_, nr, v)| (nr as u32, v)));
    entries.extend(
        denied_syscalls()
            .into_iter()
            .map(|(_, nr)| (nr as u32, Verdict::Eperm)),
    );
    entries.sort_by_key(|e| e.0);
    if let Some(pair) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(build(format!(
            "syscall {} is listed twice (allowed and denied, or twice in one list)",
            pair[0].0
        )));
    }
    if let Some(&(nr, _)) = entries.iter().find(|e| e.0 > NEWEST_KNOWN) {
        return Err(build(format!(
            "syscall {nr} is newer than NEWEST_KNOWN ({NEWEST_KNOWN})"
        )));
    }
    Ok(entries)
}

/// Every syscall number's verdict as runs: `(first number, verdict)`, sorted, the first run
/// starting at 0 and each lasting until the next. Numbers the table does not name are EPERM
/// up to [`NEWEST_KNOWN`] and ENOSYS above it (x86_64's x32 numbers: EPERM).
pub(super) fn runs(table: &[(u32, Verdict)]) -> Vec<(u32, Verdict)> {
    let mut out: Vec<(u32, Verdict)> = Vec::new();
    let mut push = |start: u32, verdict: Verdict| {
        if out.last().map(|r| r.1) != Some(verdict) {
            out.push((start, verdict));
        }
    };
    let mut next = 0;
    for &(nr, verdict) in table {
        if nr > next {
            push(next, Verdict::Eperm);
        }
        push(nr, verdict);
        next = nr + 1;
    }
    push(NEWEST_KNOWN + 1, Verdict::Enosys);
    #[cfg(target_arch = "x86_64")]
    push(X32_SYSCALL_BIT, Verdict::Eperm);
    out
}

/// The search over `runs` with the number in the accumulator: a `jge` on the middle run's
/// start splits them until one run is left, whose verdict code follows.
pub(super) fn search(runs: &[(u32, Verdict)]) -> Result<Vec<BpfInstruction>, SeccompCompileError> {
    match runs {
        [] => Err(build("an empty range of syscalls")),
        [(_, verdict)] => verdict_code(*verdict),
        _ => {
            let (low, high) = runs.split_at(runs.len() / 2);
            let below = search(low)?;
            let above = search(high)?;
            let mut out = Vec::with_capacity(below.len() + above.len() + 2);
            match u8::try_from(below.len()) {
                Ok(skip) => out.push((JGE_K, skip, 0, high[0].0)),
                // Farther than a conditional jump reaches: it falls through to an
                // unconditional one (a 32-bit offset) instead.
                Err(_) => out.extend([(JGE_K, 0, 1, high[0].0), (JA, 0, 0, below.len() as u32)]),
            }
            out.extend(below);
            out.extend(above);
            Ok(out)
        }
    }
}

/// Compiles the program the init installs: the allow-list with its argument checks, every
/// other known syscall EPERM, newer ones ENOSYS; any other architecture's syscalls kill the
/// process.
pub fn compile() -> Result<Vec<BpfInstruction>, SeccompCompileError> {
    let arch = audit_arch()?;
    let table = table()?;
    let mut program = vec![
        (LD_W_ABS, 0, 0, DATA_ARCH),
        (JEQ_K, 1, 0, arch),
        (RET_K, 0, 0, RET_KILL_PROCESS),
        (LD_W_ABS, 0, 0, DATA_NR),
    ];
    program.extend(search(&runs(&table))?);
    // BPF_MAXINSNS; the kernel also counts every filter a process stacks against 32768.
    if program.len() > 4096 {
        return Err(build(format!(
            "{} instructions (at most 4096)",
            program.len()
        )));
    }
    Ok(program)
}
