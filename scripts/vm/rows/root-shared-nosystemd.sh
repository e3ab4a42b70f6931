#!/bin/bash
# Root, no systemd, shared cgroup: root in a cgroup that holds other processes too (here the
# row's own shell: a root shell's session, a script that runs the CLI) on a pure v2 host that
# systemd does not run. The kernel refuses controllers for the children of a cgroup that holds
# processes, so the runtime makes its sandboxes' cgroups at the top of the hierarchy instead
# (/sys/fs/cgroup/smithers-sandbox, as runc's and podman's cgroupfs drivers do): --memory must
# be enforced, and the sandbox cgroups must be there, not under the shared cgroup.
. "$(dirname "$0")/../guest-lib.sh"
VM_EXPECT_MEMORY=enforced
[ ! -d /run/systemd/system ] || { echo "this row needs a host without systemd"; exit 3; }
move_self_into "$CG/system.slice/smithers-shared.service" || { echo "cannot set up the service cgroup"; exit 3; }
row_header "root, no systemd, $(cut -d: -f3 /proc/self/cgroup) (shared with the row's shell)"
standard_checks root
check_sandbox_cgroups_at "$CG/smithers-sandbox" root
row_end
