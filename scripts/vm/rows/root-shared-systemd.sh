#!/bin/bash
# vm-cmdline: smithers.pid1=systemd
# Root in a shared cgroup on a host systemd runs: the row runs as a systemd service (its shell
# and the CLI share the service's cgroup). The tree is systemd's, so the runtime must not make
# cgroups at its top: it asks systemd (the system bus) for a transient scope with Delegate=yes
# holding itself, and gets its limits there; --memory must be enforced, and nothing made at
# /sys/fs/cgroup/smithers-sandbox.
. "$(dirname "$0")/../guest-lib.sh"
VM_EXPECT_MEMORY=enforced
[ -d /run/systemd/system ] || { echo "this row needs systemd as PID 1"; exit 3; }
row_header "root under systemd, $(cut -d: -f3 /proc/self/cgroup) (shared with the row's shell)"
standard_checks root
check_no_top_level_cgroups root
row_end
