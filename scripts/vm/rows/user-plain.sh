#!/bin/bash
# An ordinary user (uid 1000) in a root-owned cgroup (a logind session scope, no delegation):
# no cgroup the user may create, so the runtime must run without cgroups and say so.
. "$(dirname "$0")/../guest-lib.sh"
VM_EXPECT_MEMORY=unavailable
setup_user_dirs
setup_plain_user_cgroup || { echo "cannot set up the session cgroup"; exit 3; }
row_header "uid $VM_UID, root-owned ${VM_USER_CGROUP#"$CG"}"
standard_checks user
row_end
