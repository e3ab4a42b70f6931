#!/usr/bin/env bash
# Brings up a Docker engine and the local test images for the docker runtime's tests.
# Idempotent: installs docker.io + busybox-static when missing (Debian), starts dockerd in the
# background when the socket does not answer, builds the images without a registry (none is
# reachable here) when they are missing.
#
# Env: SMITHERS_DOCKER_STATE (default /tmp/smithers-dockerd) holds dockerd's pid file and log.
#      SMITHERS_DOCKER_REBUILD=1 rebuilds the images even when present.
set -euo pipefail

STATE="${SMITHERS_DOCKER_STATE:-/tmp/smithers-dockerd}"
SOCK=/var/run/docker.sock
IMAGE_BUSYBOX=smithers-test:busybox
# busybox + the host's glibc runtime: runs any Rust binary built here (the attack probe).
IMAGE_GLIBC=smithers-test:glibc
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$STATE"

log() { echo "docker-up: $*" >&2; }

engine_answers() {
    curl -sf --max-time 2 --unix-socket "$SOCK" http://localhost/_ping >/dev/null 2>&1
}

# 1. Packages. dockerd from docker.io; busybox-static for the image's only binary.
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
if ! dpkg -s busybox-static >/dev/null 2>&1; then need+=(busybox-static); fi
command -v curl >/dev/null 2>&1 || need+=(curl)
if [ "${#need[@]}" -gt 0 ]; then
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

# 2. The engine. Started by us only when nothing answers; the pid file lets docker-down.sh stop
# exactly the process we started.
if ! engine_answers; then
    if [ -S "$SOCK" ] && ! pgrep -x dockerd >/dev/null 2>&1; then
        rm -f "$SOCK"   # a stale socket from a dead daemon would make dockerd refuse to start
    fi
    log "starting dockerd (log: $STATE/dockerd.log)"
    # setsid: the daemon must not die with this script's process group.
    setsid dockerd --host "unix://$SOCK" --pidfile "$STATE/dockerd.pid" \
        >"$STATE/dockerd.log" 2>&1 < /dev/null &
    echo $! > "$STATE/dockerd.started"
    for _ in $(seq 1 300); do
        engine_answers && break
        sleep 0.1
    done
    if ! engine_answers; then
        log "dockerd did not answer on $SOCK within 30 s; last log lines:"
        tail -20 "$STATE/dockerd.log" >&2 || true
        exit 1
    fi
fi
log "engine up: $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})' 2>/dev/null || echo '?')"

# 3. The images: one static busybox, its applets as symlinks, /tmp, a nobody user; the glibc
# image adds the host's dynamic loader and the libraries a Rust binary links against.
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }
make_rootfs() {  # $1 = rootfs dir
    local rootfs="$1" BB
    BB=$(command -v busybox || true)
    [ -x /bin/busybox ] && BB=/bin/busybox
    if ! (ldd "$BB" 2>&1 || true) | grep -q 'not a dynamic'; then
        log "$BB is not statically linked (install busybox-static)"; exit 1
    fi
    mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,tmp,etc,workspace,result,proc,sys,dev,home/nobody}
    chmod 1777 "$rootfs/tmp"
    cp "$BB" "$rootfs/bin/busybox"
    chroot "$rootfs" /bin/busybox --install -s
    cat > "$rootfs/etc/passwd" <<'PW'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/home/nobody:/bin/sh
PW
    cat > "$rootfs/etc/group" <<'GR'
root:x:0:
nogroup:x:65534:
GR
    chown 65534:65534 "$rootfs/home/nobody"
}
import_rootfs() {  # $1 = rootfs dir, $2 = image name
    tar -C "$1" -c . | docker import \
        --change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/sh"]' - "$2" >/dev/null
    log "built $2"
}
rebuild="${SMITHERS_DOCKER_REBUILD:-0}"
if [ "$rebuild" = 1 ] || ! image_exists "$IMAGE_BUSYBOX" || ! image_exists "$IMAGE_GLIBC"; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    make_rootfs "$work/busybox"
    import_rootfs "$work/busybox" "$IMAGE_BUSYBOX"
    make_rootfs "$work/glibc"
    libdir=/lib/x86_64-linux-gnu
    mkdir -p "$work/glibc/lib64" "$work/glibc$libdir"
    cp -L /lib64/ld-linux-x86-64.so.2 "$work/glibc/lib64/"
    for lib in libc.so.6 libm.so.6 libgcc_s.so.1 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1; do
        [ -e "$libdir/$lib" ] && cp -L "$libdir/$lib" "$work/glibc$libdir/"
    done
    import_rootfs "$work/glibc" "$IMAGE_GLIBC"
fi
echo "docker-up: ready ($IMAGE_BUSYBOX, $IMAGE_GLIBC)"
