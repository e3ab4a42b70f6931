#!/usr/bin/env bash
# Stops the dockerd that docker-up.sh started (by its pid, never by name) and removes what it
# left on the host network (docker0 bridge). Leaves a daemon it did not start alone.
set -euo pipefail
STATE="${SMITHERS_DOCKER_STATE:-/tmp/smithers-dockerd}"
log() { echo "docker-down: $*" >&2; }

pid=""
[ -f "$STATE/dockerd.pid" ] && pid=$(cat "$STATE/dockerd.pid" 2>/dev/null || true)
[ -z "$pid" ] && [ -f "$STATE/dockerd.started" ] && pid=$(cat "$STATE/dockerd.started")
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    log "no dockerd started by docker-up.sh is running"
    rm -f "$STATE/dockerd.started"
    exit 0
fi
# Only a process that really is dockerd: a recycled pid must not be killed.
if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" != dockerd ]; then
    log "pid $pid is not dockerd any more; nothing to stop"
    rm -f "$STATE/dockerd.started"
    exit 0
fi
# Our sandboxes' leftovers first (labelled), so the daemon does not restart them later.
docker ps -aq --filter label=smithers.managed=true | xargs -r docker rm -f >/dev/null 2>&1 || true
docker volume ls -q --filter label=smithers.managed=true | xargs -r docker volume rm -f >/dev/null 2>&1 || true
kill -TERM "$pid"
for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
    log "dockerd $pid ignored SIGTERM for 15 s; killing"
    kill -KILL "$pid" || true
fi
rm -f "$STATE/dockerd.started"
# The shared parent cgroup of the docker runtime's sandboxes (empty once they are gone).
for d in /sys/fs/cgroup/*/smithers-docker /sys/fs/cgroup/smithers-docker; do
    [ -d "$d" ] && rmdir "$d" 2>/dev/null || true
done
# dockerd leaves the docker0 bridge behind; remove it so the machine is as it was.
if ip link show docker0 >/dev/null 2>&1; then ip link delete docker0 2>/dev/null || true; fi
log "stopped dockerd $pid"
