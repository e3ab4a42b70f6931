#!/usr/bin/env bash
# Benchmark scenario 4 (shared/design/performance.md): bundle validation, ours vs. the
# JavaScript reference, on the same bundle in the same run.
#
#   bash bench/validate.sh [pairs]        (default 10 pairs; writes "Scenario 4" of bench/RESULTS.md)
#
# The bundle: README.md listing 1000 patches, 1000 patch files (~2 KiB each) under nested
# directories, 90 MiB of artifacts (90 x 1 MiB of random bytes plus 200 small files), and a
# 1000-line logs/stream.ndjson. Page cache warm (one untimed run of each first).
#
# Measured, alternating A B A B ... (pairs): the whole command, as a user or the orchestrator
# runs it:
#   A = smithers-sandbox bundle validate <dir> --json       (release build)
#   B = node shared/tools/smithers-js/smithers-bundle.mjs validate <dir>
# B includes Node's start and the package's module loading (~1 s), which a long-lived JS
# orchestrator pays once, so a second series, also alternating, times the validators in
# process (A' = validate_bundle() in Rust, B' = validateSandboxBundle() in Node, each after a
# warm-up call).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
pairs="${1:-10}"
tool="${SMITHERS_JS_TOOL:-$here/../shared/tools/smithers-js/smithers-bundle.mjs}"
release="$("$here/scripts/bin-dir" release)"

command -v node >/dev/null || { echo "node is required" >&2; exit 1; }
[ -f "$tool" ] || { echo "JS tool not found: $tool" >&2; exit 1; }

echo "==> building smithers-sandbox (release)" >&2
(cd "$here" && cargo build --release -q -p smithers-cli && cargo build --release -q -p smithers-bundle --example validate_timing)
bin="$release/smithers-sandbox"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
b="$work/bundle"
mkdir -p "$b/patches" "$b/artifacts" "$b/logs"

echo "==> generating the bundle in $b" >&2
body="$(head -c 1500 /dev/zero | tr '\0' 'x')"
entries=()
for i in $(seq -f '%04g' 0 999); do
  d="$b/patches/d$((10#$i % 10))"
  mkdir -p "$d"
  printf -- '--- a/src/file%s.txt\n+++ b/src/file%s.txt\n@@ -1,3 +1,3 @@\n context\n-old %s\n+new %s %s\n context\n' \
    "$i" "$i" "$i" "$i" "$body" > "$d/$i.patch"
  entries+=("\"patches/d$((10#$i % 10))/$i.patch\"")
done
for i in $(seq 1 90); do
  mkdir -p "$b/artifacts/blobs/$((i % 9))"
  head -c 1048576 /dev/urandom > "$b/artifacts/blobs/$((i % 9))/blob$i.bin"
done
for i in $(seq 1 200); do
  printf 'artifact %s\n' "$i" > "$b/artifacts/small$i.txt"
done
for i in $(seq 1 1000); do printf '{"type":"log","n":%s}\n' "$i"; done > "$b/logs/stream.ndjson"
list="$(IFS=,; echo "${entries[*]}")"
printf '{\n  "outputs": {"summary": "benchmark bundle", "files": 1000},\n  "status": "finished",\n  "runId": "bench-run",\n  "patches": [%s]\n}' "$list" > "$b/README.md"

size="$(du -sb "$b" | cut -f1)"
echo "==> checking that both accept it with the same result" >&2
ours="$("$bin" bundle validate "$b" --json)"
theirs="$(node "$tool" validate "$b")"
node -e '
  const [a, b] = [JSON.parse(process.argv[1]), JSON.parse(process.argv[2])];
  a.patchFiles.sort(); b.patchFiles.sort();
  if (JSON.stringify(a) !== JSON.stringify(b)) { console.error("results differ"); process.exit(1); }
  if (a.patchFiles.length !== 1000) { console.error("expected 1000 patch files"); process.exit(1); }
' "$ours" "$theirs"

now_ns() { date +%s%N; }
ours_ms=(); js_ms=(); ratios=()
for i in $(seq 1 "$pairs"); do
  t0=$(now_ns); "$bin" bundle validate "$b" --json > /dev/null; t1=$(now_ns)
  node "$tool" validate "$b" > /dev/null; t2=$(now_ns)
  a=$(( (t1 - t0) )); j=$(( (t2 - t1) ))
  ours_ms+=("$(awk -v n="$a" 'BEGIN{printf "%.3f", n/1e6}')")
  js_ms+=("$(awk -v n="$j" 'BEGIN{printf "%.3f", n/1e6}')")
  ratios+=("$(awk -v a="$a" -v j="$j" 'BEGIN{printf "%.3f", j/a}')")
  echo "pair $i: ours ${ours_ms[-1]} ms, js ${js_ms[-1]} ms" >&2
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END{ if (NR%2) print v[(NR+1)/2]; else printf "%.3f\n", (v[NR/2]+v[NR/2+1])/2 }'; }
m_ours="$(median "${ours_ms[@]}")"; m_js="$(median "${js_ms[@]}")"; m_ratio="$(median "${ratios[@]}")"

# In process, also alternating: each side in its own process, one untimed warm-up call, then
# one timed call of the validator (Rust: validate_bundle via the validate_timing example; JS:
# validateSandboxBundle with the module already loaded). Process start and imports excluded.
js_inproc() {
  node --input-type=module -e '
    import { homedir } from "node:os"; import { join } from "node:path"; import { pathToFileURL } from "node:url";
    const home = process.env.SMITHERS_JS_HOME ?? join(homedir(), ".cache", "smithers-js");
    const m = await import(pathToFileURL(join(home, "node_modules/@smithers-orchestrator/sandbox/src/bundle.js")).href);
    await m.validateSandboxBundle(process.argv[1]);
    const s = performance.now(); await m.validateSandboxBundle(process.argv[1]);
    console.log((performance.now() - s).toFixed(3));
  ' "$1"
}
ex="$release/examples/validate_timing"
in_ours=(); in_js=(); in_ratios=()
for i in $(seq 1 "$pairs"); do
  a="$("$ex" "$b" 1)"; j="$(js_inproc "$b")"
  in_ours+=("$a"); in_js+=("$j")
  in_ratios+=("$(awk -v a="$a" -v j="$j" 'BEGIN{printf "%.3f", j/a}')")
  echo "in-process pair $i: ours $a ms, js $j ms" >&2
done
mi_ours="$(median "${in_ours[@]}")"; mi_js="$(median "${in_js[@]}")"; mi_ratio="$(median "${in_ratios[@]}")"

machine="$(nproc) cores, kernel $(uname -r), $(node --version) / $(rustc --version | cut -d' ' -f1-2), load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
section="$(cat <<MD
## Scenario 4: bundle validation

Bundle: 1000 patch files (nested, ~1.6 KiB each), README.md listing them, 90 MiB of artifacts
(90 x 1 MiB + 200 small files), 1000-line stream log; $size bytes in all. Page cache warm.
Machine: $machine. Measured $(date -u +%Y-%m-%dT%H:%MZ).

Command: \`bash bench/validate.sh $pairs\`

| what | median (ms) |
|---|---|
| A: \`smithers-sandbox bundle validate --json\` (release, whole process) | $m_ours |
| B: \`node smithers-bundle.mjs validate\` (JS 0.32, whole process) | $m_js |
| **median of pairwise ratios B/A, whole process** ($pairs pairs, A B A B ...) | **${m_ratio}x** |
| A': \`validate_bundle()\` in process (after a warm-up call) | $mi_ours |
| B': JS \`validateSandboxBundle()\` in process (module loaded, after a warm-up call) | $mi_js |
| **median of pairwise ratios B'/A', in process** ($pairs pairs) | **${mi_ratio}x** |

Both return the same result on this bundle (checked by the script before timing: same
manifest, same size, same 1000 patch files once sorted). B is dominated by Node's start and
the package's imports (which a long-lived JS orchestrator pays once); A'/B' compare the
validators alone. The machine is shared and was loaded (see the load average): absolute
times vary from run to run, the pairwise ratios less so.
MD
)"
echo "$section"

results="$here/bench/RESULTS.md"
[ -f "$results" ] || printf '# Benchmark results\n\nEach section is written by its own script; see the command in it.\n' > "$results"
# Replace our section (up to the next "## " heading) or append it; other sections stay.
awk -v section="$section" '
  /^## Scenario 4/ { print section; skip = 1; done = 1; next }
  /^## / && skip { skip = 0 }
  !skip { print }
  END { if (!done) { print ""; print section } }
' "$results" > "$results.tmp" && mv "$results.tmp" "$results"
echo "==> wrote $results" >&2
