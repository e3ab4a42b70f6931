#!/bin/bash
# An ordinary user (uid 1000) in a cgroup delegated as systemd's Delegate=yes does for
# user@1000.service, in app.slice/smithers.scope (what `systemd-run --user --scope` gives).
. "$(dirname "$0")/../guest-lib.sh"
VM_EXPECT_MEMORY=enforced
setup_user_dirs
setup_delegated_user_cgroup || { echo "cannot set up the delegated cgroup"; exit 3; }
row_header "uid $VM_UID, delegated ${VM_USER_CGROUP#"$CG"}"
as_user sh -c 'echo "   the user process is in $(cut -d: -f3 /proc/self/cgroup), id: $(id)"'
standard_checks user
row_end
