#!/usr/bin/env python3
"""The overhead of the PyTorch operator torch.ops.ssr.route over the C++ call it makes, in one run.

For each shape (m x n x k), one thread, float32, process CPU time, medians of --repetitions:
  * C++: ssr_bench's BM_Route_SoftmaxTopK and BM_Route_SinkhornTopK_PlanWeights (Router::route with load;
    Sinkhorn xi 0.5, tol 1e-4), its cpu_time median;
  * the operator as a model calls it (through the dispatcher and its registered autograd), below autograd
    (redispatched to the CPU kernel), and under torch.inference_mode().
The logits follow the benchmark's distribution (normal(0, 1) - 4 j / n; other values).

usage: .venv/bin/python bench/torch_op_overhead.py [build/bench/ssr_bench] [--shapes 24576x16x2,...]
       (PYTHONPATH=build/python for the build tree's ssr_torch)
"""
import argparse
import json
import os
import statistics
import subprocess
import time

os.environ["OMP_NUM_THREADS"] = "1"
import numpy as np  # noqa: E402
import torch  # noqa: E402

import ssr_torch  # noqa: E402,F401

torch.set_num_threads(1)


def cpp_times(bench, shapes, repetitions):
    names = {"softmax": "BM_Route_SoftmaxTopK", "sinkhorn": "BM_Route_SinkhornTopK_PlanWeights"}
    filt = "|".join(f"{b}/{m}/{n}/{k}/" for b in names.values() for m, n, k in shapes)
    out = subprocess.run([bench, f"--benchmark_filter={filt}", "--benchmark_format=json",
                          f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true"],
                         capture_output=True, text=True, check=True).stdout
    times = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6}[b["time_unit"]]
            times[b["run_name"].replace("/real_time", "")] = b["cpu_time"] * scale
    return {(policy, m, n, k): times[f"{name}/{m}/{n}/{k}"] for policy, name in names.items() for m, n, k in shapes}


def median_ms(fn, repetitions):
    fn()
    samples = []
    for _ in range(repetitions):
        t0 = time.process_time()
        fn()
        samples.append(time.process_time() - t0)
    return statistics.median(samples) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bench", nargs="?", default="build/bench/ssr_bench")
    p.add_argument("--shapes", default="24576x16x2,24576x128x1")
    p.add_argument("--repetitions", type=int, default=15)
    a = p.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    cpp = cpp_times(a.bench, shapes, a.repetitions)
    cpu = torch._C.DispatchKeySet("CPU")
    print(f"one thread, CPU time, medians of {a.repetitions}; torch {torch.__version__}")
    print(f"{'m x n, k':<16} {'path':<9} {'C++ ms':>8} {'op ms':>8} {'below autograd':>15} {'inference':>10} {'op / C++':>9}")
    for m, n, k in shapes:
        rng = np.random.default_rng(1)
        s = torch.from_numpy((rng.standard_normal((m, n)) - 4.0 * np.arange(n) / n).astype(np.float32))
        for policy in ("softmax", "sinkhorn"):
            op = median_ms(lambda: torch.ops.ssr.route(s, policy, k), a.repetitions)
            below = median_ms(lambda: torch.ops.ssr.route.default.redispatch(cpu, s, policy, k), a.repetitions)
            with torch.inference_mode():
                inference = median_ms(lambda: torch.ops.ssr.route(s, policy, k), a.repetitions)
            base = cpp[(policy, m, n, k)]
            print(f"{f'{m} x {n}, {k}':<16} {policy:<9} {base:8.3f} {op:8.3f} {below:15.3f} {inference:10.3f} {op / base:9.2f}")


if __name__ == "__main__":
    main()
