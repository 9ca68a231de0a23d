#!/usr/bin/env bash
# A long fuzzing campaign: builds the fuzz preset (clang, libFuzzer, ASan + UBSan) and runs each target for
# SECONDS on every core (-fork), growing the corpus in build-fuzz/campaign/TARGET from the committed seeds.
# Findings land in build-fuzz/campaign/ as crash-*, leak-* or timeout-* files: replay one with
# build-fuzz/fuzz/fuzz_TARGET FILE, fix it, and add it under fuzz/regressions/TARGET/ (ctest replays those).
#   bash fuzz/campaign.sh [SECONDS per target, default 600] [targets..., default: npy route]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(npy route)
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
out=build-fuzz/campaign
for target in "${targets[@]}"; do
  mkdir -p "$out/$target"
  echo "== fuzz_$target for $seconds s on $(nproc) cores"
  build-fuzz/fuzz/fuzz_"$target" "$out/$target" "fuzz/corpus/$target" -fork="$(nproc)" -max_total_time="$seconds" \
    -artifact_prefix="$out/" -print_final_stats=1 2>&1 | tee "$out/$target.log" | grep -E "^#[0-9]+.*(DONE|INITED)|stat::|ERROR|crash-" || true
done
ls "$out"/crash-* "$out"/leak-* "$out"/timeout-* 2>/dev/null && exit 1 || echo "no findings"
