#!/usr/bin/env bash
# Boots the kernel prepared by prepare.sh with the host's root as the guest's root (read-only
# over 9p) and runs ONE guest script in it as root, then prints its stdout and stderr and exits
# with its exit code.
#
#   scripts/vm/run.sh ROW_SCRIPT [kernel command-line extras...]
#
# ROW_SCRIPT is a path on the host (the guest sees the same path). The guest's kernel runs with
# cgroup_no_v1=all (pure cgroup v2) unless an extra names cgroup_no_v1 itself. Environment
# variables named CI or SMITHERS_* are passed to the guest script. Knobs:
#   SMITHERS_VM_TIMEOUT  seconds for the whole boot before qemu is killed (default 1500)
#   SMITHERS_VM_MEM      guest memory (default 3G)        SMITHERS_VM_SMP  vCPUs (default 2)
#   SMITHERS_VM_KEEP=1   keep the results directory (its path is printed)
#   SMITHERS_VM_SHOW     more host directories the guest must see, ':'-separated (the
#                        checkout is always one): those under /tmp or /run, which the guest
#                        mounts tmpfs over, are shared read-only at the same path
# Exit code: the guest script's; 124 when the boot timed out; 125 when the guest gave no result.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 ROW_SCRIPT [kernel cmdline extras]" >&2; exit 2; }
row="$(realpath "$1")"
shift
[ -f "$row" ] || { echo "run.sh: no such script: $row" >&2; exit 2; }

dir="$("$here/prepare.sh" | tail -n1)"
kver="$(basename "$dir")"
accel="$(cat "$dir/accel")"

res="$(mktemp -d "${TMPDIR:-/tmp}/smithers-vm-results.XXXXXX")"
cleanup() {
  if [ -n "${SMITHERS_VM_KEEP:-}" ]; then
    echo "run.sh: results kept in $res" >&2
  else
    rm -rf "$res"
  fi
}
trap cleanup EXIT

# The guest's environment: the row and every CI / SMITHERS_* variable, shell-quoted.
{
  printf 'export SMITHERS_VM_ROW=%q\n' "$row"
  printf 'export SMITHERS_VM_KERNEL=%q\n' "$kver"
  while IFS='=' read -r -d '' name value; do
    case "$name" in
      CI | SMITHERS_*) [ "$name" = SMITHERS_VM_ROW ] || printf 'export %s=%q\n' "$name" "$value" ;;
    esac
  done < <(env -0)
} >"$res/env"

cmdline="console=ttyS0 panic=-1 quiet loglevel=3 smithers.stage2=$here/guest-stage2.sh"

# The guest mounts fresh tmpfs on /tmp and /run, which hides a checkout or a target directory
# there (a clone in /tmp is common): each such directory is a read-only share of its own,
# mounted at its host path by the initramfs (smithers.showN=PATH names share showN).
shares=()
n=0
IFS=':' read -r -a show <<<"$(cd "$here/../.." && pwd):${SMITHERS_VM_SHOW:-}"
for p in "${show[@]}"; do
  [ -n "$p" ] || continue
  p="$(realpath -e "$p")" || { echo "run.sh: SMITHERS_VM_SHOW names a missing path" >&2; exit 2; }
  case "$p" in /tmp/* | /run/*) ;; *) continue ;; esac
  # The path rides on the kernel command line: no spaces or quotes there.
  [[ "$p" =~ ^[A-Za-z0-9._/+-]+$ ]] || { echo "run.sh: cannot share $p with the guest (only [A-Za-z0-9._/+-] in such a path)" >&2; exit 2; }
  shares+=(-virtfs "local,path=$p,mount_tag=show$n,security_model=passthrough,readonly=on,multidevs=remap")
  cmdline="$cmdline smithers.show$n=$p"
  n=$((n + 1))
done
case " $* " in *" cgroup_no_v1="*) ;; *) cmdline="$cmdline cgroup_no_v1=all" ;; esac
[ $# -gt 0 ] && cmdline="$cmdline $*"

if [ "$accel" = kvm ]; then
  machine=(-accel kvm -cpu host)
else
  machine=(-accel tcg,thread=multi -cpu max)
fi

# qboot starts a -kernel boot seconds sooner than SeaBIOS under TCG; SeaBIOS where it is missing.
bios=()
qboot="${SMITHERS_VM_BIOS:-/usr/share/qemu/qboot.rom}"
[ -f "$qboot" ] && bios=(-bios "$qboot")

rc=0
timeout --kill-after=10 "${SMITHERS_VM_TIMEOUT:-1500}" qemu-system-x86_64 "${machine[@]}" \
  -m "${SMITHERS_VM_MEM:-3G}" -smp "${SMITHERS_VM_SMP:-2}" \
  "${bios[@]}" -nodefaults -nic none -display none -monitor none -serial "file:$res/console.log" -no-reboot \
  -kernel "$dir/pkg/boot/vmlinuz-$kver" -initrd "$dir/initramfs.cpio.gz" \
  -append "$cmdline" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap \
  -virtfs "local,path=$res,mount_tag=results,security_model=none" "${shares[@]}" \
  </dev/null >"$res/qemu.log" 2>&1 || rc=$?

[ -f "$res/stdout" ] && cat "$res/stdout"
[ -f "$res/stderr" ] && cat "$res/stderr" >&2
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "run.sh: the VM did not power off within ${SMITHERS_VM_TIMEOUT:-1500} s; console tail:" >&2
  tail -n 30 "$res/console.log" >&2 || true
  exit 124
fi
if [ ! -f "$res/rc" ]; then
  echo "run.sh: the guest wrote no result (qemu exit $rc); qemu and console tail:" >&2
  tail -n 10 "$res/qemu.log" >&2 || true
  tail -n 30 "$res/console.log" >&2 || true
  exit 125
fi
exit "$(cat "$res/rc")"
