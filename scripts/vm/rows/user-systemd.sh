#!/bin/bash
# vm-cmdline: smithers.pid1=systemd
# An ordinary user on a systemd host, the way rootless podman gets cgroups: systemd is PID 1
# (with the system bus and logind), root starts user@1000.service (Delegate=pids memory cpu),
# and the user's commands start outside any cgroup of theirs (in this row's root-owned
# service). The runtime must ask the user's systemd instance for a transient scope with
# Delegate=yes (which asks the system instance to move the process) and get its limits there.
. "$(dirname "$0")/../guest-lib.sh"
VM_EXPECT_MEMORY=enforced
setup_user_dirs
systemctl start "user@$VM_UID.service" || { echo "cannot start user@$VM_UID.service"; systemctl status "user@$VM_UID.service" --no-pager; exit 3; }
for _ in $(seq 1 100); do [ -S "/run/user/$VM_UID/bus" ] && break; sleep 0.2; done
[ -S "/run/user/$VM_UID/bus" ] || { echo "no user bus at /run/user/$VM_UID/bus"; ls -la "/run/user/$VM_UID"; exit 3; }
VM_USER_CGROUP=""
VM_USER_MODE=systemd
row_header "uid $VM_UID under systemd, starting in $(cut -d: -f3 /proc/self/cgroup)"
as_user sh -c 'echo "   the user process starts in $(cut -d: -f3 /proc/self/cgroup), id: $(id)"'
standard_checks user
row_end
