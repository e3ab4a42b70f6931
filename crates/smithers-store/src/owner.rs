//! Who owns a running sandbox, and whether that owner is still alive.
//!
//! A pid alone cannot say that: pids are reused. A process is identified by (host, boot id,
//! pid, start time in clock ticks since boot, from `/proc/<pid>/stat`). A different boot id on
//! the same host means a reboot happened, so the owner is dead; a different start time under
//! the same pid means the pid was reused, so the owner is dead.

use std::fs;

use serde::{Deserialize, Serialize};

/// The identity of a process that owns sandboxes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerIdentity {
    /// `/proc/sys/kernel/hostname` (a shared database file may be used from several hosts).
    pub host: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// Process id.
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`: start time in clock ticks after boot.
    pub start_time: u64,
}

/// What can be said about an owner from this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The very same process is running.
    Alive,
    /// It is gone: no such pid, a reused pid, a zombie, or the host rebooted since.
    Dead,
    /// It runs on another host; we cannot see it, so it must be left alone.
    Unknown,
}

impl OwnerIdentity {
    /// The identity of the calling process, or `None` where `/proc` cannot tell it (then
    /// ownership cannot be proven and callers must not pretend it can).
    pub fn current() -> Option<OwnerIdentity> {
        Self::of_pid(std::process::id())
    }

    /// The identity of a running process on this host.
    pub fn of_pid(pid: u32) -> Option<OwnerIdentity> {
        let (_, start_time) = read_stat(pid)?;
        Some(OwnerIdentity {
            host: host_name()?,
            boot_id: boot_id()?,
            pid,
            start_time,
        })
    }

    /// Decides whether this owner is still the process that registered it.
    pub fn liveness(&self) -> Liveness {
        let (Some(host), Some(boot)) = (host_name(), boot_id()) else {
            return Liveness::Unknown;
        };
        if host != self.host {
            return Liveness::Unknown;
        }
        if boot != self.boot_id {
            return Liveness::Dead;
        }
        match read_stat(self.pid) {
            None => Liveness::Dead,
            Some((state, start)) if start != self.start_time || state == 'Z' || state == 'X' => {
                Liveness::Dead
            }
            Some(_) => Liveness::Alive,
        }
    }
}

/// This process's effective uid, from `/proc/self/status` (`Uid:` real, effective, saved,
/// fs), or `None` where `/proc` cannot tell it.
pub fn effective_uid() -> Option<u32> {
    parse_effective_uid(&fs::read_to_string("/proc/self/status").ok()?)
}

fn parse_effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn read_trimmed(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn host_name() -> Option<String> {
    read_trimmed("/proc/sys/kernel/hostname")
}

fn boot_id() -> Option<String> {
    read_trimmed("/proc/sys/kernel/random/boot_id")
}

/// (state, start time) from `/proc/<pid>/stat`.
fn read_stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

/// The command name (field 2) may contain spaces and parentheses, so fields are counted from
/// the LAST `)`: after it come field 3 (state) onwards, so start time (field 22) is index 19.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_hostile_command_name() {
        let stat =
            "1234 (a) b (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        assert_eq!(parse_stat(stat), Some(('S', 987654)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn effective_uid_is_the_second_uid_field() {
        assert_eq!(
            parse_effective_uid("Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t1\t1\t1\t1\n"),
            Some(0)
        );
        assert_eq!(parse_effective_uid("Name: x\n"), None);
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("f");
        fs::write(&made, "").unwrap();
        assert_eq!(effective_uid(), Some(fs::metadata(&made).unwrap().uid()));
    }

    #[test]
    fn current_process_is_alive_and_a_changed_start_time_is_dead() {
        let me = OwnerIdentity::current().expect("/proc is readable");
        assert_eq!(me.liveness(), Liveness::Alive);
        let reused = OwnerIdentity {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert_eq!(reused.liveness(), Liveness::Dead);
        let rebooted = OwnerIdentity {
            boot_id: "00000000-0000-0000-0000-000000000000".into(),
            ..me.clone()
        };
        assert_eq!(rebooted.liveness(), Liveness::Dead);
        let elsewhere = OwnerIdentity {
            host: format!("{}-other", me.host),
            ..me
        };
        assert_eq!(elsewhere.liveness(), Liveness::Unknown);
    }

    #[test]
    fn killed_child_goes_from_alive_to_dead() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let id = OwnerIdentity::of_pid(child.id()).expect("running child has a stat");
        assert_eq!(id.liveness(), Liveness::Alive);
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert_eq!(id.liveness(), Liveness::Dead);
    }
}
