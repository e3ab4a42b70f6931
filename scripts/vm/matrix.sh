#!/usr/bin/env bash
# The kernel and host matrix: boots Debian's stock LTS kernel under QEMU (scripts/vm/run.sh)
# once per row in scripts/vm/rows/ and prints what happened, check by check and row by row.
#
#   scripts/vm/matrix.sh                 # every row
#   scripts/vm/matrix.sh root-rootcg ... # only these rows
#
# The test executables are built on the host first (the guest sees the host's root read-only).
# Each row's full output is kept in $SMITHERS_VM_OUT (default target/vm-matrix/<row>.log).
#
# Exit code: 1 when a row that scripts/vm/expected lists as `pass` did not pass, or a row could
# not be run at all; rows listed as `known-fail` are reported but do not fail the run (a
# known-fail row that passes is pointed out, so the file can be updated). A row missing from
# the file is expected to pass.
#
# Knobs: SMITHERS_VM_EXPECTED (another expectations file), SMITHERS_VM_CARGO_SCOPE=workspace (take the executables from `cargo test --workspace
# --no-run`, which scripts/test has just built, instead of building -p ones), SMITHERS_VM_SUITES (default "conformance containment conformance_copy
# containment_copy engine"), SMITHERS_VM_TEST_FILTER, SMITHERS_VM_TEST_THREADS, and run.sh's
# SMITHERS_VM_TIMEOUT / _MEM / _SMP.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
t_start=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

rows=("$@")
if [ ${#rows[@]} -eq 0 ]; then
  for f in "$here"/rows/*.sh; do rows+=("$(basename "$f" .sh)"); done
fi

out="${SMITHERS_VM_OUT:-$repo/target/vm-matrix}"
mkdir -p "$out"

# The executables cargo reports for a build, as "bin:name=path" (a binary) and
# "test:crate-dir/name=path" (an integration-test harness); no jq needed.
executables() { # cargo args...
  cargo "$@" --message-format=json 2>"$out/build.err" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kinds, test = m["target"]["kind"], m["profile"]["test"]
    if "bin" in kinds and not test:
        print("bin:" + m["target"]["name"] + "=" + m["executable"])
    elif "test" in kinds and test:
        crate = m["manifest_path"].split("/")[-2]
        print("test:" + crate + "/" + m["target"]["name"] + "=" + m["executable"])
' || { cat "$out/build.err" >&2; return 1; }
}

echo "==> vm matrix: building the CLI, smithers-attack and the native runtime's test executables"
t=$(date +%s.%N)
if [ "${SMITHERS_VM_CARGO_SCOPE:-}" = workspace ]; then
  # After `cargo test --workspace` (scripts/test) this builds nothing: the same features.
  built="$(executables test --workspace --no-run)"
  # cargo test builds a package's binaries only for its own integration tests.
  grep -q '^bin:smithers-attack=' <<<"$built" || built="$built
$(executables build -p smithers-attack)"
else
  built="$(executables build -p smithers-cli -p smithers-attack)
$(executables test -p smithers-runtime-native --no-run)"
fi
cli="$(sed -n 's/^bin:smithers-sandbox=//p' <<<"$built" | head -n1)"
attack="$(sed -n 's/^bin:smithers-attack=//p' <<<"$built" | head -n1)"
[ -x "$cli" ] && [ -x "$attack" ] || { echo "matrix: no smithers-sandbox/smithers-attack built" >&2; exit 1; }
suite_list=""
for s in ${SMITHERS_VM_SUITES:-conformance containment conformance_copy containment_copy engine}; do
  # Only the native runtime's suites (the docker and codeplane ones share these names).
  exe="$(sed -n "s|^test:smithers-runtime-native/$s=||p" <<<"$built" | head -n1)"
  [ -x "$exe" ] || { echo "matrix: the native runtime's test executable $s was not built" >&2; exit 1; }
  suite_list="$suite_list $s=$exe"
done
echo "    built in $(since "$t") s"
# The guest sees the host's root but not its /tmp: name the target directory (the checkout
# itself run.sh always shares) so executables built under /tmp are found there too.
target_dir="$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
export SMITHERS_VM_SHOW="$target_dir${SMITHERS_VM_SHOW:+:$SMITHERS_VM_SHOW}"

echo "==> vm matrix: prepare"
t=$(date +%s.%N)
"$here/prepare.sh" >/dev/null
t_prepare="$(since "$t")"
echo "    prepare: $t_prepare s"

expected_file="${SMITHERS_VM_EXPECTED:-$here/expected}"
[ -f "$expected_file" ] || { echo "matrix: no expectations file $expected_file" >&2; exit 1; }
expected_of() { # row
  local e
  e="$(awk -v r="$1" '$1 == r { print $2; exit }' "$expected_file")"
  echo "${e:-pass}"
}

declare -A row_result row_time
gate_failed=0
for row in "${rows[@]}"; do
  script="$here/rows/$row.sh"
  [ -f "$script" ] || { echo "matrix: no row $row ($script)" >&2; exit 2; }
  echo "==> vm matrix: row $row"
  t=$(date +%s.%N)
  rc=0
  # A row may ask for kernel command line extras (`# vm-cmdline: ...`, e.g. systemd as PID 1).
  extras="$(sed -n 's/^# vm-cmdline: //p' "$script" | head -n1)"
  # A row takes 1-3 minutes here. A VM that has not powered off after 10 (software
  # emulation has, rarely, stalled a guest with no output at all) is killed and the row run
  # once more, saying so; a row that fails is never retried.
  attempt=1
  while :; do
    rc=0
    # shellcheck disable=SC2086
    SMITHERS_VM_TIMEOUT="${SMITHERS_VM_TIMEOUT:-600}" \
      SMITHERS_VM_CLI="$cli" SMITHERS_ATTACK_BIN="$attack" SMITHERS_VM_TESTS="$suite_list" \
      SMITHERS_VM_TEST_THREADS="${SMITHERS_VM_TEST_THREADS:-2}" CI="${CI:-}" \
      "$here/run.sh" "$script" $extras >"$out/$row.log" 2>&1 || rc=$?
    if [ "$rc" -eq 124 ] && [ "$attempt" -eq 1 ]; then
      mv "$out/$row.log" "$out/$row.stalled.log"
      echo "    row $row: the VM did not power off within ${SMITHERS_VM_TIMEOUT:-600} s ($(grep -c '^VMCHECK|' "$out/$row.stalled.log" || true) checks had finished); running it once more (log: $out/$row.stalled.log)"
      attempt=2
      continue
    fi
    break
  done
  row_time[$row]="$(since "$t")"
  case "$rc" in
    0) row_result[$row]=pass ;;
    1) row_result[$row]=fail ;;
    124) row_result[$row]="fail (timeout)" ;;
    *) row_result[$row]="fail (exit $rc)" ;;
  esac
  # (`|| true`: a row that ran no check, one that timed out, must not end the script.)
  { grep -E '^VMCHECK\|' "$out/$row.log" || true; } | while IFS='|' read -r _ _ check result secs note; do
    printf '    %-18s %-20s %7s s  %s\n' "$check" "$result" "$secs" "$note"
  done
  if ! grep -q '^VMROW|' "$out/$row.log"; then
    echo "    the row did not start; its output:"
    tail -n 30 "$out/$row.log" | sed 's/^/    | /'
  fi
  echo "    row $row: ${row_result[$row]} in ${row_time[$row]} s (log: $out/$row.log)"
done

echo
echo "==> vm matrix (prepare $t_prepare s, total $(since "$t_start") s)"
printf '%-22s %-15s %-8s %7s  %-26s %-28s %s\n' row kernel cgroup time checks result user
for row in "${rows[@]}"; do
  IFS='|' read -r _ _ kernel mode user < <(grep -m1 '^VMROW|' "$out/$row.log" || echo "VMROW|$row|?|?|?")
  checks="$({ grep -E '^VMCHECK\|' "$out/$row.log" || true; } |
    awk -F'|' '{ n++; if ($4 == "pass") p++; else if ($4 == "refused-as-expected") r++; else f++ }
      END { printf "%d pass, %d refused, %d fail", p, r, f }')"
  expected="$(expected_of "$row")"
  verdict="${row_result[$row]}"
  if [ "$verdict" != pass ]; then
    if [ "$expected" = pass ]; then
      verdict="$verdict (EXPECTED pass)"
      gate_failed=1
    else
      verdict="$verdict (known)"
    fi
  elif [ "$expected" != pass ]; then
    verdict="pass (listed $expected: update scripts/vm/expected)"
  fi
  printf '%-22s %-15s %-8s %7s  %-26s %-28s %s\n' "$row" "$kernel" "$mode" "${row_time[$row]}" \
    "$checks" "$verdict" "$user"
done
exit $gate_failed
