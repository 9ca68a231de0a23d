#!/usr/bin/env python3
"""The CPU backend on one thread and on more, in one run: wall-clock medians and the speed-up.

Runs the benchmark binary with OMP_NUM_THREADS=1 and then =N (--threads, default 2) on the same filter,
alternating --rounds times (default 2) so that a change in the machine's load touches both, and prints a
Markdown table of the median wall-clock time per benchmark and the speed-up t(1) / t(N). The backend picks
one thread below a work size of its own (CpuTuning), so a speed-up below 1 would be a call slowed by threads.

Usage:
  python3 bench/threads.py [build/bench/ssr_bench] [--threads 2] [--filter REGEX] [--repetitions 5]
"""

import argparse
import json
import os
import re
import statistics
import subprocess

DEFAULT_FILTER = ("BM_SinkhornSolve<float>/(4096|24576|65536|1000000)/(8|16|128|256)/500/0/"
                  "|BM_Route_SoftmaxTopK/")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bench", nargs="?", default="build/bench/ssr_bench")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--filter", default=DEFAULT_FILTER)
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--min-time", type=float, default=0.2)
    return p.parse_args()


def run(args, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([args.bench, f"--benchmark_filter={args.filter}", "--benchmark_format=json",
                          f"--benchmark_min_time={args.min_time}", f"--benchmark_repetitions={args.repetitions}"],
                         env=env, check=True, capture_output=True, text=True).stdout
    times = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
        times.setdefault(re.sub(r"/real_time$", "", b["run_name"]), []).append(b["real_time"] * scale)
    return times


def fmt(t):
    if t >= 1:
        return f"{t:.3g} s"
    return f"{t * 1e3:.3g} ms" if t >= 1e-3 else f"{t * 1e6:.3g} µs"


def main():
    args = parse_args()
    samples = {1: {}, args.threads: {}}
    for _ in range(args.rounds):
        for t in samples:
            for name, ts in run(args, t).items():
                samples[t].setdefault(name, []).extend(ts)
    print(f"wall-clock medians of {args.rounds} x {args.repetitions} repetitions")
    print()
    print(f"| benchmark | 1 thread | {args.threads} threads | speed-up |")
    print("|---|---|---|---|")
    for name, ts in samples[1].items():
        one, many = statistics.median(ts), statistics.median(samples[args.threads][name])
        print(f"| `{name}` | {fmt(one)} | {fmt(many)} | {one / many:.2f}× |")


if __name__ == "__main__":
    main()
