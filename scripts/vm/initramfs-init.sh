#!/bin/busybox sh
# /init of the VM's initramfs (built by prepare.sh; PID 1 until switch_root). Loads the
# modules in /modules/order, mounts the host's root (9p, read-only) with tmpfs on /tmp and
# /run, cgroup2, proc, sys and dev under it, mounts the results share, and switch_roots into
# the host root's bash running the stage-2 script named on the kernel command line
# (smithers.stage2=PATH). A switch_root, not a chroot: creating a user namespace fails with
# EPERM inside a chroot.
/bin/busybox --install -s /bin
export PATH=/bin

fail() {
  echo "SMITHERS-VM-INIT-FAILED: $*"
  echo o >/proc/sysrq-trigger
  sleep 5
  poweroff -f
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^$1=//p" | head -n1; }

for m in $(cat /modules/order); do
  insmod "/modules/$m.ko" || fail "insmod $m"
done

if grep -q 'smithers.probe=1' /proc/cmdline; then
  echo SMITHERS-VM-PROBE-OK
  echo o >/proc/sysrq-trigger
  sleep 5
fi

mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /newroot ||
  fail "mount the host root over 9p"
r=/newroot
mount -t tmpfs -o mode=1777,size=75% tmpfs $r/tmp || fail "tmpfs /tmp"
mount -t tmpfs -o mode=0755 tmpfs $r/run || fail "tmpfs /run"
mount -t proc proc $r/proc || fail "proc"
mount -t sysfs sysfs $r/sys || fail "sysfs"
mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 $r/sys/fs/cgroup || fail "cgroup2"
mount -t devtmpfs devtmpfs $r/dev || fail "devtmpfs"
mkdir -p $r/dev/pts $r/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts $r/dev/pts || fail "devpts"
mount -t tmpfs -o mode=1777 tmpfs $r/dev/shm || fail "/dev/shm"
mkdir -p $r/run/vm-results
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none results $r/run/vm-results ||
  fail "mount the results share"

# Host directories under /tmp or /run the guest must still see (run.sh: SMITHERS_VM_SHOW).
n=0
while :; do
  p="$(arg smithers.show$n)"
  [ -n "$p" ] || break
  mkdir -p "$r$p" || fail "mkdir $p"
  mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose "show$n" "$r$p" ||
    fail "mount the host's $p"
  n=$((n + 1))
done

stage2="$(arg smithers.stage2)"
[ -n "$stage2" ] || fail "no smithers.stage2= on the kernel command line"
[ -f "$r$stage2" ] || fail "stage 2 $stage2 not found in the host root"
exec switch_root $r /bin/bash "$stage2"
