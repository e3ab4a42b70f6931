#!/usr/bin/env bash
# A real Ray cluster on this machine, for the ray runtime's tests and benchmarks
# (docs/scaling.md, ../shared/design/fleet.md): a head and two workers, each a "machine" of its
# own: its own network namespace on a bridge (in a switch namespace of its own, so the host's
# firewall and Docker's bridge rules never see the traffic), its own mount namespace with a
# private /tmp and /dev/shm, and its own PID namespace (so killing a node kills every process it
# ran, sandboxes included, as a machine's death does). The host is the client: it reaches the
# nodes through a veth into the switch.
#
# A node's private /tmp hides the host's: a build in a checkout under /tmp is not on the
# nodes. As real nodes have `smithers-sandbox` installed at one path, the cluster has an
# install directory, $state/bin, that every node sees at the same path, read-only;
# `install-bin` copies a build there (one copy per build) and prints the path to give the
# runtime (SMITHERS_RAY_SERVE_BIN). The tests install the binary they built.
#
#   scripts/ray/cluster.sh install       # install Ray (PyPI, cached venv) if needed
#   scripts/ray/cluster.sh up            # install if needed, start, wait for the 4 slots
#   scripts/ray/cluster.sh down          # stop every node by PID, remove the namespaces
#   scripts/ray/cluster.sh status        # the Jobs API's view (nodes and their resources)
#   scripts/ray/cluster.sh alive         # exit 0 if a cluster runs and its head answers
#   scripts/ray/cluster.sh kill NODE     # SIGKILL a node's whole PID namespace (w1 or w2)
#   scripts/ray/cluster.sh start NODE    # start a killed node again
#   scripts/ray/cluster.sh cut NODE      # partition: the node's link to the switch goes down
#   scripts/ray/cluster.sh heal NODE     # and comes back
#   scripts/ray/cluster.sh api-refuse    # the head refuses the host's connections to the Jobs
#                                        # API (as while it restarts); the nodes still reach it
#   scripts/ray/cluster.sh api-accept    # and accepts them again
#   scripts/ray/cluster.sh env           # prints RAY_ADDRESS=... RAY_AUTH_TOKEN=... lines
#   scripts/ray/cluster.sh install-bin FILE   # install a smithers-sandbox build for the
#                                             # nodes; prints its path there
#
# State (PIDs, the token, logs) lives in $SMITHERS_RAY_STATE (default /tmp/smithers-ray-cluster);
# the venv in $SMITHERS_RAY_VENV (default ~/.cache/smithers-ray/venv). Needs root.
set -euo pipefail

state="${SMITHERS_RAY_STATE:-/tmp/smithers-ray-cluster}"
venv="${SMITHERS_RAY_VENV:-$HOME/.cache/smithers-ray/venv}"
ray_version="${SMITHERS_RAY_VERSION:-2.60.0}"
prefix=smr
subnet=10.88.0
slots="${SMITHERS_RAY_SLOTS:-2}"
# Node name -> last octet. The head holds no slot: steps run on workers only.
declare -A octet=([head]=10 [w1]=11 [w2]=12)
nodes=(head w1 w2)

say() { printf '==> ray cluster: %s\n' "$*" >&2; }
die() { printf 'ray cluster: %s\n' "$*" >&2; exit 1; }

install_ray() {
  if [ -x "$venv/bin/ray" ] && "$venv/bin/python" -c "import ray, sys; sys.exit(ray.__version__ != '$ray_version')" 2>/dev/null; then
    return
  fi
  say "installing ray[default]==$ray_version from PyPI into $venv"
  local py
  py="$(command -v python3)"
  if ! "$py" -m venv --help >/dev/null 2>&1 || ! "$py" -c 'import ensurepip' 2>/dev/null; then
    [ "$(id -u)" -eq 0 ] || die "python3 has no venv module; install python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "ray[default]==$ray_version"
}

ns() { echo "$prefix-$1"; }

# The install directory every node sees at this same path (read-only), and the mark `up` leaves
# for a cluster whose nodes see it (one started by an older version of this script does not).
bin_dir="$state/bin"
layout_mark="$state/layout-bin"

make_network() {
  ip netns add "$(ns sw)"
  ip -n "$(ns sw)" link add br0 type bridge
  ip -n "$(ns sw)" link set br0 up
  ip -n "$(ns sw)" link set lo up
  # The host's leg.
  ip link add "$prefix-host" type veth peer name host-sw netns "$(ns sw)"
  ip -n "$(ns sw)" link set host-sw master br0 up
  ip addr add "$subnet.1/24" dev "$prefix-host"
  ip link set "$prefix-host" up
  for n in "${nodes[@]}"; do
    ip netns add "$(ns "$n")"
    ip link add "$prefix-$n" netns "$(ns "$n")" type veth peer name "$n-sw" netns "$(ns sw)"
    ip -n "$(ns sw)" link set "$n-sw" master br0 up
    ip -n "$(ns "$n")" link set lo up
    ip -n "$(ns "$n")" addr add "$subnet.${octet[$n]}/24" dev "$prefix-$n"
    ip -n "$(ns "$n")" link set "$prefix-$n" up
  done
}

remove_network() {
  for n in "${nodes[@]}" sw; do
    ip netns del "$(ns "$n")" 2>/dev/null || true
  done
  ip link del "$prefix-host" 2>/dev/null || true
}

# Starts one node: `ray start --block` as PID 1 of a new PID namespace, in the node's network
# namespace (nsenter, not `ip netns exec`, which remounts /sys and hides the cgroup mounts) and a
# private mount namespace with its own /tmp and /dev/shm, where the install directory stays at
# its path, read-only (parked on /dev/shm while the new /tmp is mounted over the old, then moved
# into it: it is under the host's /tmp unless $SMITHERS_RAY_STATE says otherwise).
start_node() {
  local n="$1" ip="$subnet.${octet[$1]}" role
  local log="$state/$n.log"
  if [ "$n" = head ]; then
    role=(--head --port 6379 --dashboard-host 0.0.0.0 --dashboard-port 8265 --num-cpus 1
      --resources '{"sandbox_slot": 0}')
  else
    role=(--address "$subnet.${octet[head]}:6379" --num-cpus 2
      --resources "{\"sandbox_slot\": $slots}" --labels "{\"smithers-pool\": \"default\", \"smithers-node\": \"$n\"}")
  fi
  # From `/`: the node mounts its own /tmp, and a working directory it hides (a checkout under
  # /tmp) left the head without its dashboard, so without the Jobs API (its module processes
  # start in the working directory and never came up).
  local back="$PWD"
  cd /
  # shellcheck disable=SC2016
  setsid nsenter --net="/run/netns/$(ns "$n")" -- \
    unshare --mount --propagation private --pid --fork --mount-proc -- \
    env RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$(cat "$state/token")" \
      RAY_USAGE_STATS_ENABLED=0 \
      RAY_health_check_initial_delay_ms=1000 RAY_health_check_period_ms=1000 \
      RAY_health_check_timeout_ms=1000 RAY_health_check_failure_threshold=3 \
      PATH="$venv/bin:$PATH" \
      SMITHERS_RAY_BIN_DIR="$bin_dir" \
      sh -c 'set -e; b="$SMITHERS_RAY_BIN_DIR"; unset SMITHERS_RAY_BIN_DIR
        mount --bind "$b" /dev/shm
        mount -t tmpfs -o mode=1777 tmpfs /tmp
        mkdir -p "$b"
        mount --move /dev/shm "$b"
        mount -o remount,bind,ro "$b"
        mount -t tmpfs -o mode=1777 tmpfs /dev/shm
        exec "$@"' sh \
      "$venv/bin/ray" start --block --disable-usage-stats --node-ip-address "$ip" \
        --object-store-memory 100000000 --min-worker-port 20000 --max-worker-port 20999 \
        "${role[@]}" \
    > "$log" 2>&1 < /dev/null &
  echo $! > "$state/$n.pid"
  start_time $! > "$state/$n.start"
  cd "$back"
}

# A process's start time (clock ticks since boot, /proc/PID/stat field 22): with its PID it
# names the process, where a PID alone may have been reused since it was written down.
start_time() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  # Fields after the command name, which may hold spaces and parentheses: 3 is the first.
  stat="${stat##*) }"
  # shellcheck disable=SC2086
  set -- $stat
  echo "${20}"
}

# The node's `ray start` leader, if the process its pid file names still runs (same PID and
# start time); nothing for a node that is down or whose pid file outlived it.
leader_of() {
  local pid start
  pid="$(cat "$state/$1.pid" 2>/dev/null)" || return 0
  start="$(cat "$state/$1.start" 2>/dev/null)" || return 0
  [ -n "$pid" ] && [ "$(start_time "$pid" 2>/dev/null)" = "$start" ] && echo "$pid"
  return 0
}

# Every process of a node: the PID namespace its `ray start` leads.
node_pids() {
  local leader
  leader="$(leader_of "$1")"
  [ -n "$leader" ] || return 0
  # The setsid'd nsenter forks unshare, which forks the namespace's PID 1.
  local pidns
  for p in $(pgrep -s "$leader" 2>/dev/null); do
    pidns="$(readlink "/proc/$p/ns/pid" 2>/dev/null)" || continue
    echo "$p $pidns"
  done
}

kill_node() {
  local n="$1" leader
  leader="$(leader_of "$n")"
  rm -f "$state/$n.pid" "$state/$n.start"
  # A pid file whose process is gone (or whose PID now names another process) kills nothing.
  [ -n "$leader" ] || return 0
  # The leader is `unshare` (nsenter execs it); its child is PID 1 of the node's PID
  # namespace, whose death takes every process of the namespace (and of the sandboxes' nested
  # namespaces) with it. Killing the leader alone would leave the namespace running.
  local init
  init="$(pgrep -P "$leader" 2>/dev/null | head -1 || true)"
  if [ -n "$init" ]; then kill -KILL "$init" 2>/dev/null || true; fi
  kill -KILL "$leader" 2>/dev/null || true
  for _ in $(seq 50); do
    if [ ! -d "/proc/$leader" ] && { [ -z "$init" ] || [ ! -d "/proc/$init" ]; }; then break; fi
    sleep 0.1
  done
  # A dead machine's kernel state dies with it; here the nodes share this kernel's cgroup
  # hierarchies, so the cgroups its sandboxes made stay behind, empty. Remove the empty ones
  # (rmdir refuses a cgroup with processes or children, so a live sandbox's is kept). Only the
  # fleet tests kill nodes, one test at a time, with no other sandbox starting meanwhile.
  for d in $(find /sys/fs/cgroup -mindepth 1 -maxdepth 6 -depth -type d -name 'smithers-*' 2>/dev/null); do
    rmdir "$d" 2>/dev/null || true
  done
}

# Copies the smithers-sandbox build FILE into the install directory, once per build (named by
# its path, inode, size and modification time: a rebuild is another build), and prints the
# path the nodes run it from. A copy, not a link: the build may be rewritten while leases run
# it. Builds no install used for an hour go, but for the three last used.
install_bin() {
  local src="$1" id key dest tmp
  [ -f "$src" ] && [ -x "$src" ] || die "install-bin: $src is not an executable file"
  [ -f "$layout_mark" ] ||
    die "install-bin: no cluster whose nodes see $bin_dir (none is up, or it was started by an older cluster.sh): scripts/ray/cluster.sh down; scripts/ray/cluster.sh up"
  src="$(realpath "$src")"
  id="$(stat -c '%d %i %s %.9Y' "$src")"
  key="$(printf '%s\n%s\n' "$src" "$id" | sha256sum | cut -c1-20)"
  dest="$bin_dir/$key"
  if [ ! -x "$dest/smithers-sandbox" ]; then
    tmp="$(mktemp -d "$bin_dir/.install-XXXXXX")"
    cp "$src" "$tmp/smithers-sandbox"
    chmod 755 "$tmp" "$tmp/smithers-sandbox"
    # The build changed while it was copied: the copy is not that build.
    if [ "$(stat -c '%d %i %s %.9Y' "$src")" != "$id" ]; then
      rm -rf "$tmp"
      die "install-bin: $src changed while it was copied (a build running?); try again"
    fi
    # Another install of the same build may have won the race: then its copy is kept.
    mv -T "$tmp" "$dest" 2>/dev/null || rm -rf "$tmp"
  fi
  touch "$dest"
  # Copies an interrupted install left behind.
  find "$bin_dir" -mindepth 1 -maxdepth 1 -name '.install-*' -mmin +60 -exec rm -rf {} + 2>/dev/null || true
  # shellcheck disable=SC2012
  ls -1t "$bin_dir" | tail -n +4 | while read -r old; do
    if [ -n "$(find "$bin_dir/$old" -maxdepth 0 -mmin +60 2>/dev/null)" ]; then
      rm -rf "${bin_dir:?}/$old"
    fi
  done
  echo "$dest/smithers-sandbox"
}

api() {
  curl -sS --max-time 5 -H "Authorization: Bearer $(cat "$state/token")" "http://$subnet.${octet[head]}:8265$1"
}

wait_ready() {
  local want=$((slots * 2)) deadline=$((SECONDS + ${SMITHERS_RAY_START_TIMEOUT:-180}))
  while [ $SECONDS -lt $deadline ]; do
    local got
    got="$("$venv/bin/python" - "$state" <<'PY' 2>/dev/null || true
import json, sys, urllib.request
state = sys.argv[1]
token = open(f"{state}/token").read().strip()
req = urllib.request.Request("http://10.88.0.10:8265/api/v0/nodes?detail=1",
                             headers={"Authorization": f"Bearer {token}"})
data = json.load(urllib.request.urlopen(req, timeout=5))
total = 0
for node in data["data"]["result"]["result"]:
    if node["state"] == "ALIVE":
        total += int(node["resources_total"].get("sandbox_slot", 0))
print(total)
PY
)"
    if [ "$got" = "$want" ]; then return 0; fi
    sleep 1
  done
  for n in "${nodes[@]}"; do tail -20 "$state/$n.log" >&2 || true; done
  die "the cluster did not report $want sandbox slots within its start timeout"
}

cmd="${1:-}"
case "$cmd" in
  up)
    [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
    install_ray
    if [ -n "$(leader_of head)" ] && [ -f "$layout_mark" ]; then
      say "already up"; wait_ready; exit 0
    fi
    if [ -n "$(leader_of head)" ]; then
      say "restarting a cluster started by an older cluster.sh (its nodes do not see $bin_dir)"
    fi
    "$0" down >/dev/null 2>&1 || true
    mkdir -p "$state" "$bin_dir"
    chmod 755 "$bin_dir"
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$state/token"
    chmod 600 "$state/token"
    make_network
    start_node head
    for _ in $(seq 120); do
      api /api/version >/dev/null 2>&1 && break
      sleep 0.5
    done
    start_node w1
    start_node w2
    wait_ready
    touch "$layout_mark"
    say "up: RAY_ADDRESS=http://$subnet.${octet[head]}:8265 ($((slots * 2)) sandbox slots on w1 and w2)"
    ;;
  install) install_ray ;;
  down)
    for n in w2 w1 head; do kill_node "$n"; done
    remove_network
    rm -rf "$state"
    ;;
  kill) kill_node "${2:?node}" ;;
  start)
    # One `ray start` per node: a second would outlive the first's pid file.
    if [ -n "$(leader_of "${2:?node}")" ]; then
      die "node $2 is running (kill it first)"
    fi
    start_node "$2" ;;
  api-refuse | api-accept)
    # A rule in the head's own network namespace: a reset for the host's connections to the
    # dashboard port, nothing else (the nodes' traffic to the head is untouched).
    command -v iptables >/dev/null || die "$cmd needs iptables"
    rule=(INPUT -p tcp --dport 8265 -s "$subnet.1" -j REJECT --reject-with tcp-reset)
    in_head=(nsenter --net="/run/netns/$(ns head)" --)
    if [ "$cmd" = api-refuse ]; then
      "${in_head[@]}" iptables -w -C "${rule[@]}" 2>/dev/null || "${in_head[@]}" iptables -w -I "${rule[@]}"
    else
      while "${in_head[@]}" iptables -w -C "${rule[@]}" 2>/dev/null; do
        "${in_head[@]}" iptables -w -D "${rule[@]}"
      done
    fi ;;
  cut) ip -n "$(ns sw)" link set "${2:?node}-sw" down ;;
  heal) ip -n "$(ns sw)" link set "${2:?node}-sw" up ;;
  status) api '/api/v0/nodes?detail=1'; echo ;;
  alive)
    # A state directory can outlive its cluster (a reboot, a killed CI run, a disk image
    # copied with its /tmp): its token alone says nothing. Alive = the head's `ray start`
    # runs and its API answers, and its nodes see the install directory (`up` restarts one
    # started by an older version of this script).
    [ -n "$(leader_of head)" ] && [ -f "$state/token" ] && [ -f "$layout_mark" ] &&
      api /api/version >/dev/null 2>&1 ;;
  env)
    echo "RAY_ADDRESS=http://$subnet.${octet[head]}:8265"
    echo "RAY_AUTH_TOKEN=$(cat "$state/token")"
    ;;
  pids) node_pids "${2:?node}" ;;
  install-bin) install_bin "${2:?the smithers-sandbox build to install}" ;;
  *) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
