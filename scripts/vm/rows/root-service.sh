#!/bin/bash
# Root in a systemd service without delegation (system.slice/smithers-test.service): the
# service's cgroup holds the process, and its ancestors have memory, pids and cpu enabled. A
# cgroup v2 child with controllers needs the runtime to move itself into a leaf first (the
# no-internal-processes rule), as container engines do.
. "$(dirname "$0")/../guest-lib.sh"
move_self_into "$CG/system.slice/smithers-test.service" || { echo "cannot set up the service cgroup"; exit 3; }
row_header "root, $(cut -d: -f3 /proc/self/cgroup)"
standard_checks root
row_end
