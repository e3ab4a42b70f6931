#!/bin/bash
# Debian's kernel.unprivileged_userns_clone=0 (also what Ubuntu's AppArmor restriction amounts
# to for an unconfined binary): an ordinary user cannot create a user namespace. doctor and a
# run must refuse, and their output must name the fix (the sysctl).
. "$(dirname "$0")/../guest-lib.sh"
setup_user_dirs
setup_plain_user_cgroup || { echo "cannot set up the session cgroup"; exit 3; }
sysctl -w kernel.unprivileged_userns_clone=0
row_header "uid $VM_UID, root-owned ${VM_USER_CGROUP#"$CG"}, unprivileged_userns_clone=0"

refused_with_fix() { # check-name exit-code output-file what
  if [ "$2" -ne 0 ] && grep -q 'sysctl -w kernel.unprivileged_userns_clone=1' "$3"; then
    record "$1" refused-as-expected "$t" "$4 exit $2, names the sysctl: $(grep -m1 unprivileged_userns_clone "$3" | sed "s/^ *//")"
  elif [ "$2" -ne 0 ]; then
    record "$1" fail "$t" "$4 refused (exit $2) but does not name the fix sysctl -w kernel.unprivileged_userns_clone=1"
  else
    record "$1" fail "$t" "$4 exit 0: not refused"
  fi
}

t="$(now)"; rc=0
as_user "$cli" doctor >/tmp/doctor.out 2>&1 || rc=$?
echo "--- doctor as user (exit $rc)"; cat /tmp/doctor.out
refused_with_fix doctor "$rc" /tmp/doctor.out doctor

t="$(now)"; rc=0
as_user "$cli" doctor --json >/tmp/doctor.json 2>&1 || rc=$?
echo "--- doctor --json as user (exit $rc)"; cat /tmp/doctor.json
refused_with_fix doctor-json "$rc" /tmp/doctor.json "doctor --json"

t="$(now)"; rc=0
proj="$(new_project user)"
as_user "$cli" run --root "$proj" -- sh -c 'echo hi > hello.txt' >/tmp/run.out 2>&1 || rc=$?
echo "--- run as user (exit $rc)"; cat /tmp/run.out
refused_with_fix run "$rc" /tmp/run.out run
row_end
