#!/usr/bin/env python3
"""One Sinkhorn iteration of the CPU backend against the read bound of the cache level its matrix lives in.

Runs the benchmark binary once (--benchmark_format=json) over the grid m x n and prints a Markdown table:

  * level: where the m x n floats fit, from the cache sizes the binary reports for one core (L2: the core's
    own; L3: the whole shared cache; DRAM beyond);
  * read bound: BM_ReadBound<float>/m/n, one pass summing that matrix into 32 independent lanes, measured in
    the same run, i.e. the bound of that level on this machine;
  * per iteration: the slope (t(21) - t(1)) / 20 of BM_LibraryIterations/m/n/{1,21} (exactly 1 and 21
    iterations, xi = 0.5, linear cost); its ratio to the read bound;
  * outside: t(1) - slope, what the call spends besides its iterations (check, costs, K, Q = exp(K), the
    final top-k and weights), also in iterations' time;
  * exp bound: BM_ExpBound/m/n, the float exp from one m x n buffer into another (one read, one exp and one
    write an element), in the same run: the least a setup that reads the logits once and writes Q = exp(K)
    can cost, in iterations' time, and the outside's ratio to it;
  * pass in cache: BM_PassInCache/m/n, the solver's pass over one block held in L1, swept once for each block
    of the matrix: what an iteration costs the core alone, against the read bound (where it is above 1, the
    core, not the memory, bounds an iteration), and the iteration's ratio to it (what the memory adds).
Times are the least (--statistic min, the default: on a shared machine noise only adds time, and a slope of
two noisy times is noisier still) or the medians (--statistic median) of --repetitions (default 5) in each
of --rounds runs of the binary (default 1), of CPU time with one thread (--clock cpu, the default), or
wall-clock time (--clock wall, the default with more threads).

Usage:
  python3 bench/roofline.py [build/bench/ssr_bench] [--threads 1] [--repetitions 5]
                            [--shapes 4096x8,...] [--min-time 0.2] [--statistic min] [--rounds 1]
"""

import argparse
import json
import os
import re
import subprocess

DEFAULT_SHAPES = ",".join(f"{m}x{n}" for m in (4096, 24576, 65536, 1000000) for n in (8, 16, 128, 256))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bench", nargs="?", default="build/bench/ssr_bench")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--min-time", type=float, default=0.2)
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="m x n, comma separated")
    p.add_argument("--clock", choices=("cpu", "wall"))
    p.add_argument("--statistic", choices=("min", "median"), default="min")
    p.add_argument("--rounds", type=int, default=1)
    return p.parse_args()


def run(args, shapes):
    alt = "|".join(f"{m}/{n}" for m, n in shapes)
    flt = f"(BM_LibraryIterations|BM_ReadBound<float>|BM_ExpBound|BM_PassInCache)/({alt})/"
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run([args.bench, f"--benchmark_filter={flt}", "--benchmark_format=json",
                          f"--benchmark_min_time={args.min_time}", f"--benchmark_repetitions={args.repetitions}"],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def seconds(b, clock):
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
    return b["cpu_time" if clock == "cpu" else "real_time"] * scale


def fmt(t):
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


def main():
    args = parse_args()
    clock = args.clock or ("cpu" if args.threads == 1 else "wall")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rounds = [run(args, shapes) for _ in range(args.rounds)]
    data = rounds[0]
    caches = {c["level"]: c for c in data["context"]["caches"] if c["type"] in ("Data", "Unified")}
    runs = {}
    for b in (b for r in rounds for b in r["benchmarks"]):
        if b.get("run_type") == "iteration":
            runs.setdefault(re.sub(r"/real_time.*", "", b["run_name"]), []).append(seconds(b, clock))
    pick = min if args.statistic == "min" else lambda ts: sorted(ts)[len(ts) // 2]
    time = {name: pick(ts) for name, ts in runs.items()}

    def level(nbytes):
        if nbytes <= caches[2]["size"]:
            return "L2"
        if nbytes <= caches[3]["size"]:
            return "L3"
        return "DRAM"

    what = "least" if args.statistic == "min" else "medians"
    print(f"{data['context'].get('host_name', '')}: {args.threads} thread(s), {clock} time, {what} of "
          f"{args.repetitions * args.rounds}; L2 {caches[2]['size'] >> 10} KiB a core, L3 {caches[3]['size'] >> 20} MiB")
    print()
    print("| m | n | MiB | level | read bound | per iteration | / read bound | outside the iterations | "
          "outside / iteration | exp bound / iteration | outside / exp bound | pass in cache / read bound | "
          "per iteration / pass in cache |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m, n in shapes:
        one, many = time.get(f"BM_LibraryIterations/{m}/{n}/1"), time.get(f"BM_LibraryIterations/{m}/{n}/21")
        bound, exp = time.get(f"BM_ReadBound<float>/{m}/{n}"), time.get(f"BM_ExpBound/{m}/{n}")
        in_cache = time.get(f"BM_PassInCache/{m}/{n}")
        if None in (one, many, bound, exp, in_cache):
            continue
        slope = (many - one) / 20
        outside = one - slope
        nbytes = m * n * 4
        print(f"| {m} | {n} | {nbytes / 2**20:.2f} | {level(nbytes)} | {fmt(bound)} "
              f"({nbytes / bound / 1e9:.0f} GB/s) | {fmt(slope)} | {slope / bound:.1f}× | {fmt(outside)} | "
              f"{outside / slope:.1f} | {exp / slope:.1f} | {outside / exp:.1f}× | {in_cache / bound:.2f} | "
              f"{slope / in_cache:.2f} |")


if __name__ == "__main__":
    main()
