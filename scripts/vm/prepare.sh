#!/usr/bin/env bash
# Prepares what scripts/vm/run.sh boots: Debian's stock LTS kernel (the package that
# `linux-image-amd64` depends on, 6.1 on bookworm) unpacked from its .deb (nothing is installed
# into /boot), and a tiny initramfs (busybox-static as the shell of /init, plus the 9p/virtio/
# overlay modules that kernel builds as modules, loaded in dependency order).
#
# Idempotent and cached under ${XDG_CACHE_HOME:-$HOME/.cache}/smithers-sandbox/vm/: a second
# run only checks. Prints the cache directory of the kernel on its last line of stdout.
#
#   scripts/vm/prepare.sh                 # resolve linux-image-amd64's dependency
#   SMITHERS_VM_KERNEL_PKG=linux-image-6.1.0-57-amd64 scripts/vm/prepare.sh
#
# Needs root only to apt-get install qemu-system-x86 / busybox-static when they are missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/smithers-sandbox/vm"
mkdir -p "$cache_root"

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'prepare.sh: %s\n' "$*" >&2; exit 1; }

install_missing_packages() {
  local need=()
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  busybox_is_static || need+=(busybox-static)
  [ "${#need[@]}" -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing packages: ${need[*]} (run as root, or install them)"
  say "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  }
}

# The initramfs has no libc: the busybox in it must be the static one.
busybox_is_static() {
  local bb
  bb="$(command -v busybox 2>/dev/null)" || return 1
  # ldd fails on a static executable ("not a dynamic executable").
  ! ldd "$bb" >/dev/null 2>&1
}

# The kernel package linux-image-amd64 depends on (e.g. linux-image-6.1.0-57-amd64).
resolve_kernel_package() {
  if [ -n "${SMITHERS_VM_KERNEL_PKG:-}" ]; then
    echo "$SMITHERS_VM_KERNEL_PKG"
    return
  fi
  local pkg
  pkg="$(apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n1)"
  if [ -z "$pkg" ] && [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq >/dev/null 2>&1 || true
    pkg="$(apt-cache depends linux-image-amd64 2>/dev/null |
      sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n1)"
  fi
  [ -n "$pkg" ] || die "cannot resolve linux-image-amd64's kernel package (apt-cache depends)"
  echo "$pkg"
}

# Downloads and unpacks the kernel package into $1/pkg (once).
fetch_kernel() {
  local dir="$1" pkg="$2"
  [ -f "$dir/pkg/.unpacked" ] && return 0
  say "apt-get download $pkg"
  rm -rf "$dir/pkg" "$dir/deb"
  mkdir -p "$dir/deb"
  # apt's sandbox user cannot write into a root-owned 0700 cache; download as we are.
  (cd "$dir/deb" && apt-get download -o APT::Sandbox::User=root "$pkg" >/dev/null 2>&1) ||
    (cd "$dir/deb" && apt-get download "$pkg" >/dev/null) ||
    die "apt-get download $pkg failed"
  say "dpkg-deb -x $pkg"
  dpkg-deb -x "$dir"/deb/*.deb "$dir/pkg"
  rm -rf "$dir/deb"
  touch "$dir/pkg/.unpacked"
}

# The `depends=` field of a module's .modinfo section (no kmod/modinfo needed).
module_depends() {
  tr '\0' '\n' <"$1" | sed -n 's/^depends=//p' | head -n1 | tr ',' ' '
}

# Appends $1 and, first, its dependencies to the load order (depth first, each once). A
# module the kernel has built in has no .ko and is skipped (recorded in modules.builtin).
add_module() {
  local name="$1" moddir="$2" ko dep
  case " $load_order " in *" $name "*) return 0 ;; esac
  ko="$(find "$moddir/kernel" -name "$name.ko" -o -name "${name//_/-}.ko" | head -n1)"
  if [ -z "$ko" ]; then
    grep -Eq "/(${name}|${name//_/-})\.ko$" "$moddir/modules.builtin" ||
      die "module $name: neither a .ko in the package nor built in"
    return 0
  fi
  for dep in $(module_depends "$ko"); do
    add_module "$dep" "$moddir"
  done
  load_order="$load_order $name"
  cp "$ko" "$initrd_tree/modules/$name.ko"
}

build_initramfs() {
  local dir="$1" kver="$2" pkg="$3" out="$1/initramfs.cpio.gz"
  local stamp
  stamp="$(cat "$here/initramfs-init.sh" | sha256sum | cut -c1-16)"
  [ -f "$out" ] && [ "$(cat "$dir/initramfs.stamp" 2>/dev/null)" = "$stamp" ] && return 0
  # The modules were pruned after the last build (see below): unpack the package again.
  [ -d "$dir/pkg/lib/modules/$kver" ] || { rm -f "$dir/pkg/.unpacked"; fetch_kernel "$dir" "$pkg"; }
  say "initramfs for $kver"
  initrd_tree="$dir/initrd"
  rm -rf "$initrd_tree"
  mkdir -p "$initrd_tree"/{bin,dev,proc,sys,newroot,modules}
  cp "$(command -v busybox)" "$initrd_tree/bin/busybox"
  cp "$here/initramfs-init.sh" "$initrd_tree/init"
  chmod 0755 "$initrd_tree/init"
  load_order=""
  local m
  # virtio PCI transport, 9p over it (the host's root and the results share), and overlayfs
  # (the native runtime's workspace).
  for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci \
    9pnet 9pnet_virtio netfs fscache 9p overlay; do
    add_module "$m" "$dir/pkg/lib/modules/$kver"
  done
  echo "$load_order" | tr ' ' '\n' | sed '/^$/d' >"$initrd_tree/modules/order"
  (cd "$initrd_tree" && find . -mindepth 1 | busybox cpio -o -H newc 2>/dev/null) |
    gzip -1 >"$out.tmp"
  mv "$out.tmp" "$out"
  echo "$stamp" >"$dir/initramfs.stamp"
  say "modules, in load order: $(tr '\n' ' ' <"$initrd_tree/modules/order")"
  # The package's ~400 MB of modules are not needed any more: keep the kernel image only.
  rm -rf "$dir/pkg/lib" "$initrd_tree"
}

# KVM hangs on hosts without nested virtualization: use it only if a probe boot ends.
probe_accel() {
  local dir="$1" kver="$2"
  [ -f "$dir/accel" ] && return 0
  local accel=tcg
  if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
    say "probing KVM (a boot that must power off within 15 s)"
    local log="$dir/kvm-probe.log"
    if timeout --kill-after=5 15 qemu-system-x86_64 -machine accel=kvm -cpu host -m 256 \
      -nographic -no-reboot -kernel "$dir/pkg/boot/vmlinuz-$kver" \
      -initrd "$dir/initramfs.cpio.gz" \
      -append "console=ttyS0 quiet panic=-1 smithers.probe=1" >"$log" 2>&1 </dev/null &&
      grep -q SMITHERS-VM-PROBE-OK "$log"; then
      accel=kvm
    fi
  fi
  say "accelerator: $accel"
  echo "$accel" >"$dir/accel"
}

main() {
  install_missing_packages
  local pkg kver dir
  pkg="$(resolve_kernel_package)"
  kver="${pkg#linux-image-}"
  dir="$cache_root/$kver"
  mkdir -p "$dir"
  fetch_kernel "$dir" "$pkg"
  [ -f "$dir/pkg/boot/vmlinuz-$kver" ] || die "no /boot/vmlinuz-$kver in $pkg"
  build_initramfs "$dir" "$kver" "$pkg"
  probe_accel "$dir" "$kver"
  echo "$dir"
}

main "$@"
