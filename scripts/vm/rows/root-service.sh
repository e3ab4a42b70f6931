#!/bin/bash
# Root as a systemd service's main process, without delegation (system.slice/
# smithers-test.service, memory, pids and cpu enabled in its ancestors): the service's cgroup
# holds the runtime itself, so before enabling controllers for its sandboxes the runtime must
# move itself into a leaf (the no-internal-processes rule), as container engines do. Each
# command is the cgroup's only process, as a service's main process is.
. "$(dirname "$0")/../guest-lib.sh"
VM_EXPECT_MEMORY=enforced
VM_ROOT_CGROUP="$CG/system.slice/smithers-test.service"
mkdir -p "$VM_ROOT_CGROUP"
enable_controllers_down_to "$VM_ROOT_CGROUP" || { echo "cannot set up the service cgroup"; exit 3; }
row_header "root, ${VM_ROOT_CGROUP#"$CG"} (the runtime its only process)"
standard_checks root
row_end
