#!/usr/bin/env bash
# Fuzzes the parsers of untrusted bytes for a bounded time each (not run by CI):
#   bash bench/fuzz.sh [SECONDS_PER_TARGET]   # default 300
# Targets (fuzz/fuzz_targets/): patch_parser (text, literal and delta binary hunks, the
# review of what parses), bundle_manifest (README.md: manifest and changeNotes),
# archive_unpack (the upload / bundle archive reader), wire_types (the host API's JSON
# documents and SSE stream, both directions), git_index (a project's .git/index), egress_parsers
# (DNS queries, HTTP proxy heads, TLS server names, egress policies). Crashes land in
# fuzz/artifacts/<target>/; a fixed one is kept as a regression test in the crate it hit.
# cargo-fuzz needs a nightly compiler's sanitizer flags: on the stable toolchain
# RUSTC_BOOTSTRAP=1 unlocks them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-300}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
export RUSTC_BOOTSTRAP=1
for target in patch_parser bundle_manifest archive_unpack wire_types git_index egress_parsers; do
  echo "==> $target for ${secs}s"
  mkdir -p "corpus/$target"
  cargo fuzz run -O "$target" "corpus/$target" -- -max_total_time="$secs" -rss_limit_mb=2048 2>&1 \
    | grep -E '^(#[0-9]+ +(DONE|pulse)|==[0-9]+==|SUMMARY|Done|artifact_prefix|Test unit written)' || true
done
