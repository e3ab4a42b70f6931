#!/bin/bash
# Root in a cgroup that holds other processes too (here the row's own shell: a login session's
# scope, a service that runs the CLI from a script): the kernel refuses controllers for child
# cgroups while it holds processes, so limits are unavailable. The step must still run, doctor
# and the step's report must say why and name the fix (a scope of its own), and a step asking
# for --memory must be refused.
. "$(dirname "$0")/../guest-lib.sh"
VM_EXPECT_MEMORY=unavailable
move_self_into "$CG/system.slice/smithers-shared.service" || { echo "cannot set up the service cgroup"; exit 3; }
row_header "root, $(cut -d: -f3 /proc/self/cgroup) (shared with the row's shell)"
standard_checks root
row_end
