# shellcheck shell=bash
# Sourced by the row scripts (scripts/vm/rows/*.sh), which run as root inside the VM
# (scripts/vm/run.sh). It sets up the cgroup a row emulates, runs the checks as root or as the
# ordinary user, and prints one machine-readable line per check for matrix.sh:
#
#   VMROW|<row>|<kernel>|<cgroup mode>|<user>
#   VMCHECK|<row>|<check>|<pass|fail|refused-as-expected>|<seconds>|<note>
#
# Everything else on stdout is the checks' real output, kept for the report.
#
# From the host (run.sh passes CI and SMITHERS_*): SMITHERS_VM_CLI (the smithers-sandbox
# binary), SMITHERS_VM_TESTS ("name=path ..." test executables), SMITHERS_VM_TEST_FILTER (an
# optional libtest filter for every suite), SMITHERS_VM_TEST_THREADS (default 2).
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export TMPDIR=/tmp
CG=/sys/fs/cgroup
VM_UID=1000
VM_USER_CGROUP=""   # the cgroup as_user puts the user's processes in (set by the row)
VM_USER_MODE=plain  # plain: root moves the process there; delegated: see enter_delegated
row_failed=0
ROW="$(basename "${SMITHERS_VM_ROW:-row}" .sh)"
cli="${SMITHERS_VM_CLI:?SMITHERS_VM_CLI unset}"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

cgroup_mode() {
  if grep -q ' cgroup ' /proc/mounts; then echo hybrid; else echo "pure-v2"; fi
}

row_header() { # user-description
  echo "VMROW|$ROW|$(uname -r)|$(cgroup_mode)|$1"
  echo "== row $ROW: kernel $(uname -r), $(cgroup_mode), user: $1"
  echo "   controllers at the root: $(cat $CG/cgroup.controllers)"
  echo "   userns clone sysctl: $(cat /proc/sys/kernel/unprivileged_userns_clone 2>/dev/null || echo n/a)"
}

# record CHECK RESULT START NOTE
record() {
  local note="${4//|/\/}"
  note="$(printf '%s' "$note" | tr '\n' ' ' | cut -c1-300)"
  echo "VMCHECK|$ROW|$1|$2|$(elapsed "$3")|$note"
  [ "$2" = fail ] && row_failed=1
  return 0
}

# Enables controllers in every ancestor's cgroup.subtree_control from the root down to (not
# including) $1, as systemd does for a unit that needs them.
enable_controllers_down_to() {
  local target="${1#"$CG"/}" path="$CG" part
  local IFS=/
  for part in $target; do
    echo "+memory +pids +cpu" >"$path/cgroup.subtree_control" || return 1
    path="$path/$part"
    mkdir -p "$path"
  done
}

# Moves the calling shell (root) into cgroup $1 (created, controllers enabled above it).
move_self_into() {
  mkdir -p "$1"
  enable_controllers_down_to "$1" || return 1
  echo $$ >"$1/cgroup.procs"
}

# systemd's Delegate=yes for user@1000.service: root creates the unit's cgroup, enables the
# controllers in its ancestors and hands the directory and the files the delegatee may write
# (cgroup.procs, cgroup.subtree_control, cgroup.threads) to the user. The user's manager then
# (as the user) moves itself into init.scope, enables the controllers for its own subtree and
# makes app.slice; `systemd-run --user --scope` makes app.slice/<name>.scope and moves the
# command into it. Sets VM_USER_CGROUP to that scope.
setup_delegated_user_cgroup() {
  local svc="$CG/user.slice/user-$VM_UID.slice/user@$VM_UID.service"
  mkdir -p "$svc"
  enable_controllers_down_to "$svc" || return 1
  chown "$VM_UID:$VM_UID" "$svc" "$svc/cgroup.procs" "$svc/cgroup.subtree_control" \
    "$svc/cgroup.threads" || return 1
  # The user manager's own start-up, as the user, from inside the unit's cgroup.
  bash -c 'echo $$ >"$1/cgroup.procs" && exec "${@:2}"' _ "$svc" \
    setpriv --reuid=$VM_UID --regid=$VM_UID --clear-groups \
    sh -euc '
      svc="$1"
      mkdir "$svc/init.scope"
      echo $$ >"$svc/init.scope/cgroup.procs"
      echo "+memory +pids +cpu" >"$svc/cgroup.subtree_control"
      mkdir "$svc/app.slice"
      echo "+memory +pids +cpu" >"$svc/app.slice/cgroup.subtree_control"
      mkdir "$svc/app.slice/smithers.scope"
    ' _ "$svc" || return 1
  VM_USER_CGROUP="$svc/app.slice/smithers.scope"
  VM_USER_MODE=delegated
  VM_USER_INIT="$svc/init.scope"
}

# A session scope as logind makes it: root-owned, not delegated. Sets VM_USER_CGROUP.
setup_plain_user_cgroup() {
  VM_USER_CGROUP="$CG/user.slice/user-$VM_UID.slice/session-1.scope"
  mkdir -p "$VM_USER_CGROUP"
  enable_controllers_down_to "$VM_USER_CGROUP"
  VM_USER_MODE=plain
}

# What systemd-logind and pam_systemd give a logged-in user: $XDG_RUNTIME_DIR, a home.
setup_user_dirs() {
  mkdir -p "/run/user/$VM_UID" "/tmp/home-$VM_UID" "/tmp/tmp-$VM_UID"
  chown "$VM_UID:$VM_UID" "/run/user/$VM_UID" "/tmp/home-$VM_UID" "/tmp/tmp-$VM_UID"
  chmod 0700 "/run/user/$VM_UID" "/tmp/home-$VM_UID" "/tmp/tmp-$VM_UID"
}

# as_user CMD...: runs CMD as uid 1000 with a clean login-like environment, in
# $VM_USER_CGROUP (plain: root moves it there; delegated: root places it in the manager's
# init.scope and the user moves it into the scope, as `systemd-run --user --scope` does).
as_user() {
  local entry="$VM_USER_CGROUP"
  [ "$VM_USER_MODE" = delegated ] && entry="$VM_USER_INIT"
  # (systemd: the process stays where root's service is; the runtime asks systemd for a scope.)
  bash -c '[ -z "$1" ] || echo $$ >"$1/cgroup.procs" || exit 96; exec "${@:2}"' _ "$entry" \
    setpriv --reuid=$VM_UID --regid=$VM_UID --clear-groups \
    env -i PATH="$PATH" HOME="/tmp/home-$VM_UID" TMPDIR="/tmp/tmp-$VM_UID" \
    XDG_RUNTIME_DIR="/run/user/$VM_UID" USER=cloudsdk LOGNAME=cloudsdk LANG=C.UTF-8 \
    CI="${CI:-}" SMITHERS_ATTACK_BIN="${SMITHERS_ATTACK_BIN:-}" \
    VM_MOVE_TO="$([ "$VM_USER_MODE" = delegated ] && next_unit "$VM_USER_CGROUP")" \
    bash -c '[ -z "$VM_MOVE_TO" ] || { mkdir "$VM_MOVE_TO" && echo $$ >"$VM_MOVE_TO/cgroup.procs"; } || exit 97
             unset VM_MOVE_TO; exec "$@"' _ "$@"
}

# A fresh unit's cgroup path beside $1 (foo.service -> foo-N.service): each command gets one,
# as each start of a service or each `systemd-run --scope` does. (A runtime that enabled
# controllers in its cgroup's subtree_control has made it a cgroup no process may join.)
next_unit() {
  # (Called in a command substitution, so no counter: the time in ns is unique enough here.)
  local ext="${1##*.}"
  echo "${1%.*}-$(date +%s%N).$ext"
}

# as_root CMD...: from the row's own shell, or, when the row set VM_ROOT_CGROUP, as the only
# process of a fresh cgroup beside it (what a systemd service's main process is).
as_root() {
  if [ -n "${VM_ROOT_CGROUP:-}" ]; then
    local unit
    unit="$(next_unit "$VM_ROOT_CGROUP")"
    mkdir "$unit"
    bash -c 'echo $$ >"$1/cgroup.procs" && exec "${@:2}"' _ "$unit" "$@"
  else
    "$@"
  fi
}

# run_as WHO CMD... (WHO: root or user)
run_as() {
  local who="$1"
  shift
  if [ "$who" = user ]; then as_user "$@"; else as_root "$@"; fi
}

# A small file in a fresh project the user owns; prints its path.
new_project() { # who
  local dir
  local base=/tmp
  [ "$1" = user ] && base="/tmp/tmp-$VM_UID"
  dir="$(run_as "$1" mktemp -d "$base/proj.XXXXXX")"
  run_as "$1" sh -c "echo original > '$dir/a.txt'"
  echo "$dir"
}

json_field() { # FILE python-expression-on-j
  /usr/bin/python3 -c 'import json,sys
j=json.load(open(sys.argv[1]))
print(eval(sys.argv[2]))' "$1" "$2" 2>/dev/null
}

check_doctor() { # who
  local t out rc
  t="$(now)"
  out="/tmp/doctor-$1.json"
  rc=0
  run_as "$1" "$cli" doctor --json >"$out" 2>"$out.err" || rc=$?
  echo "--- doctor --json as $1 (exit $rc)"
  cat "$out" "$out.err"
  chmod 0644 "$out"
  local mem
  mem="$(json_field "$out" '[p["status"]+": "+p.get("detail","") for p in j["protections"] if p["name"]=="memory"][0]')"
  if [ "$rc" -eq 0 ]; then
    record doctor pass "$t" "exit 0; memory: $mem"
  else
    record doctor fail "$t" "exit $rc: $(head -c 200 "$out.err")"
  fi
  # A fix must fit the host: no systemd advice where systemd does not run.
  if [ ! -d /run/systemd/system ]; then
    t="$(now)"
    if grep -q 'systemd-run' "$out" "$out.err"; then
      record doctor-fixes fail "$t" "no systemd here, yet doctor says: $(grep -o '[^"]*systemd-run[^"]*' "$out" "$out.err" | head -n1 | cut -c1-200)"
    else
      record doctor-fixes pass "$t" "no systemd here, and no fix names systemd-run"
    fi
  fi
}

# The native runtime's suites, each its own test executable built on the host.
check_suites() { # who
  local who="$1" entry name exe t rc log summary failed
  for entry in ${SMITHERS_VM_TESTS:?}; do
    name="${entry%%=*}"
    exe="${entry#*=}"
    t="$(now)"
    log="/tmp/suite-$who-$name.log"
    rc=0
    # shellcheck disable=SC2086
    run_as "$who" "$exe" --test-threads="${SMITHERS_VM_TEST_THREADS:-2}" \
      ${SMITHERS_VM_TEST_FILTER:-} >"$log" 2>&1 || rc=$?
    summary="$(grep -E '^test result:' "$log" | tail -n1)"
    failed="$(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$log" | tr '\n' ' ')"
    echo "--- $name as $who (exit $rc): $summary"
    if [ "$rc" -ne 0 ]; then
      # The failures' own messages: what the kernel or the runtime said.
      sed -n '/^failures:$/,/^test result:/p' "$log" | grep -vE '^\s*$' | head -n 80
      [ -n "$summary" ] || tail -n 30 "$log"
      record "$name" fail "$t" "${summary#test result: } failed: $failed"
    else
      record "$name" pass "$t" "${summary#test result: }"
    fi
  done
}

# run, review, accept of a small step in a fresh project.
check_cli_run() { # who
  local who="$1" t proj rc id=vmstep1
  t="$(now)"
  proj="$(new_project "$who")"
  rc=0
  echo "--- smithers-sandbox run as $who in $proj"
  run_as "$who" "$cli" run --root "$proj" --sandbox-id $id -- \
    sh -c 'echo hello > hello.txt; echo changed >> a.txt' 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    record cli-run fail "$t" "run exit $rc"
    return
  fi
  run_as "$who" "$cli" review $id --root "$proj" 2>&1 || rc=$?
  run_as "$who" "$cli" accept $id --root "$proj" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ] && [ "$(cat "$proj/hello.txt" 2>/dev/null)" = hello ] &&
    [ "$(tail -n1 "$proj/a.txt")" = changed ]; then
    record cli-run pass "$t" "run, review, accept: hello.txt and a.txt applied"
  else
    record cli-run fail "$t" "review/accept exit $rc or the change was not applied"
  fi
}

# doctor's memory line against what `run --memory 64m` does: enforced -> a small step runs
# under the limit and one that touches 128 MiB ends with termination "memory"; anything else
# -> the run is refused, and its message says what to do.
check_memory_matches_doctor() { # who
  local who="$1" t proj status out rc
  t="$(now)"
  status="$(json_field "/tmp/doctor-$who.json" '[p["status"] for p in j["protections"] if p["name"]=="memory"][0]')"
  proj="$(new_project "$who")"
  out="/tmp/mem-$who.json"
  echo "--- run --memory 64m as $who (doctor says memory: ${status:-?}; the row expects ${VM_EXPECT_MEMORY:-either})"
  if [ -n "${VM_EXPECT_MEMORY:-}" ] && [ "$status" != "$VM_EXPECT_MEMORY" ]; then
    record memory-64m fail "$t" "doctor says memory ${status:-?}, this row must give ${VM_EXPECT_MEMORY}"
    return
  fi
  rc=0
  run_as "$who" "$cli" --json run --root "$proj" --memory 64m -- true >"$out" 2>&1 || rc=$?
  cat "$out"
  if [ "$status" = enforced ]; then
    if [ "$rc" -ne 0 ]; then
      record memory-64m fail "$t" "doctor: enforced, but run --memory 64m -- true exit $rc: $(head -c 240 "$out")"
      return
    fi
    rc=0
    run_as "$who" "$cli" --json run --root "$proj" --memory 64m -- \
      dd if=/dev/zero of=/dev/null bs=128M count=1 >"$out" 2>&1 || rc=$?
    cat "$out"
    if grep -q '"termination":"memory"' "$out"; then
      record memory-64m pass "$t" "doctor: enforced; true ran under 64m, dd of 128M ended with termination memory"
    else
      record memory-64m fail "$t" "doctor: enforced, but dd of 128M under 64m: exit $rc $(head -c 200 "$out")"
    fi
  else
    if [ "$rc" -ne 0 ] && [ ! -d /run/systemd/system ] && grep -q 'systemd-run' "$out"; then
      record memory-64m fail "$t" "doctor: ${status:-?}; run refused, but its fix names systemd-run on a host without systemd: $(grep -o 'fix: [^"]*' "$out" | head -c 200)"
    elif [ "$rc" -ne 0 ] && grep -q 'cannot enforce memoryLimit' "$out" && grep -q 'fix: ' "$out"; then
      record memory-64m refused-as-expected "$t" "doctor: ${status:-?}; run refused with the fix: $(grep -o 'fix: [^"]*' "$out" | head -c 200)"
    elif [ "$rc" -ne 0 ]; then
      record memory-64m fail "$t" "doctor: ${status:-?}; run refused without naming memoryLimit and a fix: $(head -c 240 "$out")"
    else
      record memory-64m fail "$t" "doctor: ${status:-?}, yet run --memory 64m was accepted"
    fi
  fi
}

# While a step of WHO runs, its sandbox's cgroup must be populated below DIR (and none made
# below the cgroup the row's shell is in).
check_sandbox_cgroups_at() { # dir who
  local dir="$1" who="$2" t proj pid found="" own mem="" beside=""
  t="$(now)"
  proj="$(new_project "$who")"
  own="$CG$(cut -d: -f3 /proc/self/cgroup)"
  echo "--- a running step's cgroup, expected below $dir"
  run_as "$who" "$cli" run --root "$proj" -- sleep 15 >/tmp/cgroup-step.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    for d in "$dir"/smithers-*/; do
      # (cgroup files have no size: read it.)
      grep -q . "${d}cgroup.procs" 2>/dev/null && { found="${d%/}"; break; }
    done
    [ -n "$found" ] && break
    sleep 0.25
  done
  if [ -n "$found" ]; then
    mem="$(cat "$found/memory.max" 2>/dev/null)"
    beside="$(ls "$own" | grep '^smithers-[0-9a-f]\{16\}$' || true)"
  fi
  wait "$pid" || true
  cat /tmp/cgroup-step.log
  if [ -z "$found" ]; then
    record sandbox-cgroup fail "$t" "no populated sandbox cgroup appeared below $dir: $(ls "$dir" 2>&1 | tr '\n' ' ')"
  elif [ -n "$beside" ]; then
    record sandbox-cgroup fail "$t" "a sandbox cgroup was made below the shared $own too: $beside"
  else
    record sandbox-cgroup pass "$t" "the step ran in $found (memory.max $mem; the top's subtree_control: $(cat "$CG/cgroup.subtree_control"))"
  fi
}

# Under systemd nothing may be made at the top of the hierarchy.
check_no_top_level_cgroups() { # who
  local t
  t="$(now)"
  if [ -e "$CG/smithers-sandbox" ]; then
    record top-level-cgroup fail "$t" "$CG/smithers-sandbox exists under systemd"
  else
    record top-level-cgroup pass "$t" "nothing made at $CG/smithers-sandbox: the runtime went through systemd"
  fi
}

# The row's checks for one user.
standard_checks() { # who
  check_doctor "$1"
  check_cli_run "$1"
  check_memory_matches_doctor "$1"
  check_suites "$1"
}

row_end() {
  echo "== row $ROW: $([ $row_failed -eq 0 ] && echo pass || echo fail)"
  exit $row_failed
}
