#!/usr/bin/env bash
# What global balance adds to a Sinkhorn iteration, on this machine: runs build/bench/ssr_bench_distributed
# under mpirun with R = 1, 2, 4 ranks (more ranks than cores share them) and prints, per shape, one
# iteration's time with the shard alone and balanced over the R ranks (slopes of fixed-iteration solves),
# and the time of the column all-reduce alone. Usage: bash bench/distributed.sh [BUILD] [RANKS...]
set -euo pipefail
build=${1:-build}
shift || true
ranks=("${@:-1 2 4}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1
out=$(mktemp -d)
for r in ${ranks[@]}; do
  mpirun -np "$r" --oversubscribe --bind-to none "$build/bench/ssr_bench_distributed" --benchmark_format=json \
    >"$out/ranks_$r.json"
done
python3 - "$out" ${ranks[@]} <<'PY'
import json, sys
out, ranks = sys.argv[1], sys.argv[2:]
print(f"{'ranks':>5} {'rows/rank':>9} {'n':>4} {'alone us/it':>11} {'global us/it':>12} {'added us':>9} {'all-reduce us':>13}")
for r in ranks:
    rows = {b["name"].rsplit("/iterations", 1)[0]: b["real_time"] for b in json.load(open(f"{out}/ranks_{r}.json"))["benchmarks"]
            if b.get("aggregate_name") == "median"}
    for m in (4096, 24576):
        for n in (16, 256):
            slope = lambda d: (rows[f"BM_Solve/{m}/{n}/21/{d}"] - rows[f"BM_Solve/{m}/{n}/1/{d}"]) / 20
            alone, shared = slope(0), slope(1)
            print(f"{r:>5} {m:>9} {n:>4} {alone:11.1f} {shared:12.1f} {shared - alone:9.1f} {rows[f'BM_ColumnReduction/{n}']:13.2f}")
PY
rm -rf "$out"
