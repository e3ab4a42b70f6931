#!/bin/bash
# Root in the root cgroup (a root shell on a host whose init is not systemd, or a container's
# init): the runtime may make its cgroups right under the root, which holds processes but is
# exempt from the no-internal-processes rule.
. "$(dirname "$0")/../guest-lib.sh"
VM_EXPECT_MEMORY=enforced
row_header "root, root cgroup ($(cut -d: -f3 /proc/self/cgroup))"
standard_checks root
row_end
