#!/bin/bash
# PID 1 of the VM after switch_root (the host's root, read-only over 9p). Reads the row and
# its environment from the results share that run.sh prepared (/run/vm-results/env), runs the
# row script with its stdout and stderr into that share and its exit code into rc, then powers
# the VM off. Nothing here may exit: PID 1 exiting is a kernel panic (the host's timeout would
# still end it, but without a result).
set -u
res=/run/vm-results
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp/home-root TMPDIR=/tmp LANG=C.UTF-8
mkdir -p "$HOME"
hostname smithers-vm 2>/dev/null || true
ip link set lo up 2>/dev/null || true
# shellcheck disable=SC1091
. "$res/env"
# A row that needs systemd as PID 1 (`# vm-cmdline: smithers.pid1=systemd` in the row, passed
# by matrix.sh): a minimal boot target that starts the system bus, logind and a service that
# runs this script again (smithers.pid1=done) to run the row, as a service's process.
if grep -qw 'smithers.pid1=systemd' /proc/cmdline && [ "${SMITHERS_VM_UNDER_SYSTEMD:-}" != 1 ]; then
  mkdir -p /run/systemd/system
  cat >/run/systemd/system/smithers-row.target <<EOF_TARGET
[Unit]
Description=smithers VM row
Wants=dbus.socket dbus.service systemd-logind.service smithers-row.service
EOF_TARGET
  cat >/run/systemd/system/smithers-row.service <<EOF_SERVICE
[Unit]
Description=smithers VM row, as a systemd service
After=dbus.service systemd-logind.service
[Service]
Type=oneshot
Environment=SMITHERS_VM_UNDER_SYSTEMD=1
ExecStart=/bin/bash $0
StandardOutput=journal+console
EOF_SERVICE
  exec /lib/systemd/systemd --unit=smithers-row.target
fi
start=$(date +%s.%N)
if [ -f "${SMITHERS_VM_ROW:-}" ]; then
  timeout --kill-after=10 "${SMITHERS_VM_ROW_TIMEOUT:-1200}" \
    /bin/bash "$SMITHERS_VM_ROW" >"$res/stdout" 2>"$res/stderr" </dev/null
  echo $? >"$res/rc.tmp"
else
  echo "row script not found: ${SMITHERS_VM_ROW:-unset}" >"$res/stderr"
  echo 127 >"$res/rc.tmp"
fi
end=$(date +%s.%N)
echo "$start $end" >"$res/guest-time"
mv "$res/rc.tmp" "$res/rc"
sync
echo o >/proc/sysrq-trigger
sleep 30
