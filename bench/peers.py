#!/usr/bin/env python3
"""ssr's Sinkhorn solve and softmax top-k against their usual Python peers, in one run, on the same shapes.

Peers:
  * the Megatron-LM-style PyTorch Sinkhorn loop (d0/d1 alternating normalisation of exp(cost), as in
    megatron/core/transformer/moe/moe_utils.py), with ssr's stopping rule;
  * POT's ot.sinkhorn, method 'sinkhorn' and 'sinkhorn_log';
  * torch.softmax followed by torch.topk, against ssr's SoftmaxTopK.

What is compared, for each shape (m tokens, n experts) at xi (default 0.5), float32, linear cost:
  * ssr: BM_SinkhornSolve<float>/m/n/1000*xi/0 of the benchmark binary (--benchmark_format=json): a full
    routing call, that is the costs, the iterations to err < tol, top-k and plan weights;
  * Megatron-style loop: K = exp((S - rowmax S) / xi) (the row shift changes no plan), then per iteration
    d0 = (1/m) / (K d1), s1 = K^T d0, err = sum_j |m d1_j s1_j - m/n| / m, stop when err < tol, else
    d1 = (1/n) / s1; at most 100 iterations. That is ssr's error (the normalised L1 column error after an
    exact row update) and ssr's iteration count; the time covers the kernel and the iterations only;
  * POT: ot.sinkhorn(a = ones(m), b = m/n ones(n), M = -S, reg = xi, numItermax = 100), time of the call
    only. POT tests the L2 norm of the column error every 10 iterations; stopThr = m * tol makes it stop no
    later than ssr's L1 rule would (||e||_2 <= ||e||_1), which favours POT. Its final L1 error is reported;
  * softmax top-k: ssr's BM_Route_SoftmaxTopK (top-k, weights renormalised over the chosen experts, load)
    against probs = torch.softmax(S, 1); vals, idx = torch.topk(probs, k); vals / vals.sum(1);
  * the PyTorch operator (when ssr_torch is importable): torch.ops.ssr.route on the same tensor, against the
    C++ call it makes (BM_Route_SinkhornTopK_PlanWeights and BM_Route_SoftmaxTopK: xi 0.5, tol 1e-4, plan
    weights, load): the ratio is the operator's overhead (dispatch, output and workspace tensors, the info).
Every peer runs on the same logits as the benchmark binary's generator (normal(0, 1) - 4 j / n; the exact
values differ, the distribution is the same) with the same number of threads: OMP_NUM_THREADS, the BLAS
thread variables and torch.set_num_threads are set to --threads (default 1) before anything starts.
Times are medians of --repetitions runs (default 5), the ratios peer time / ssr time. With one thread the
clock is the process's CPU time (ssr: Google Benchmark's cpu_time; peers: time.process_time), which a busy
shared machine disturbs least; --clock wall compares wall-clock times (the default with more threads).

Requirements: torch from PyPI (the .venv of scripts/python-env.sh, which also installs ssr_torch) and POT
(pip install pot into the same environment). A missing peer is skipped with a message.

Usage:
  .venv/bin/python bench/peers.py [build/bench/ssr_bench] [--threads 1] [--xi 0.5] [--tol 1e-4]
                                  [--shapes 24576x16x2,24576x8x2,24576x128x1,24576x256x8] [--repetitions 5]
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bench", nargs="?", default="build/bench/ssr_bench", help="ssr's benchmark binary")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--xi", type=float, default=0.5)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--max-iters", type=int, default=100)
    p.add_argument("--shapes", default="24576x16x2,24576x8x2,24576x128x1,24576x256x8", help="m x n x k, comma separated")
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--clock", choices=("cpu", "wall"), help="time to compare: process CPU time (default with one "
                   "thread: robust on a shared machine) or wall-clock time (default with more threads)")
    p.add_argument("--json", help="also write the results here")
    return p.parse_args()


ARGS = parse_args()
if ARGS.clock is None:
    ARGS.clock = "cpu" if ARGS.threads == 1 else "wall"
# Before numpy or torch start their thread pools.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402

try:
    import torch

    torch.set_num_threads(ARGS.threads)
except ImportError as e:
    torch = None
    print(f"skipping the PyTorch peers: cannot import torch ({e}); run with .venv/bin/python (scripts/python-env.sh)",
          file=sys.stderr)

try:
    import ssr_torch
except ImportError as e:
    ssr_torch = None
    print(f"skipping the PyTorch operator: cannot import ssr_torch ({e}); pip install --no-build-isolation .",
          file=sys.stderr)

try:
    import ot
except ImportError as e:
    ot = None
    print(f"skipping POT: cannot import ot ({e}); Debian: apt-get install python3-pot, or pip install pot", file=sys.stderr)


def shapes():
    out = []
    for item in ARGS.shapes.split(","):
        m, n, k = (int(x) for x in item.lower().split("x"))
        out.append((m, n, k))
    return out


def logits(m, n, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, n)) - 4.0 * np.arange(n) / n).astype(np.float32)


def median_time(fn, repetitions):
    fn()  # warm up: allocations, first-touch, lazy initialisation
    clock = time.process_time if ARGS.clock == "cpu" else time.perf_counter
    times, result = [], None
    for _ in range(repetitions):
        t0 = clock()
        result = fn()
        times.append(clock() - t0)
    return statistics.median(times), result


def column_error(plan_rows_one, m, n):
    """Normalised L1 column error of a plan whose rows sum to 1."""
    return float(np.abs(plan_rows_one.sum(0, dtype=np.float64) - m / n).sum() / m)


# ---- ssr --------------------------------------------------------------------------------------------------

def run_ssr(shape_list):
    """Median real times (ms) and counters of ssr's benchmarks, from one run of the binary."""
    xi = int(round(ARGS.xi * 1000))
    solve = "|".join(f"BM_SinkhornSolve<float>/{m}/{n}/{xi}/0/" for m, n, _ in shape_list)
    soft = "|".join(f"BM_Route_SoftmaxTopK/{m}/{n}/{k}/" for m, n, k in shape_list)
    plan = "|".join(f"BM_Route_SinkhornTopK_PlanWeights/{m}/{n}/{k}/" for m, n, k in shape_list)
    cmd = [ARGS.bench, f"--benchmark_filter={solve}|{soft}|{plan}", "--benchmark_format=json",
           f"--benchmark_repetitions={ARGS.repetitions}", "--benchmark_report_aggregates_only=true"]
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(ARGS.threads)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"cannot run {ARGS.bench}: {e}; build it with cmake --build build --target ssr_bench")
    results = {}
    for b in json.loads(proc.stdout)["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6}[b["time_unit"]]
        t = b["cpu_time"] if ARGS.clock == "cpu" else b["real_time"]
        results[b["run_name"].replace("/real_time", "")] = dict(ms=t * scale, iterations=b.get("sinkhorn_iterations"),
                                                                 err=b.get("marginal_error"))
    return results


# ---- peers ------------------------------------------------------------------------------------------------

def megatron_sinkhorn(s, xi, tol, max_iters):
    """Megatron-LM's d0/d1 loop on K = exp(S / xi), stopping on ssr's error. Returns (plan, iterations, err)."""
    m, n = s.shape
    k = torch.exp((s - s.max(dim=1, keepdim=True).values) / xi)
    d1 = torch.ones(n, dtype=s.dtype)
    eps = 1e-8
    it, err = 0, math.inf
    while it < max_iters:
        d0 = (1.0 / m) / (torch.mv(k, d1) + eps)
        s1 = torch.mv(k.t(), d0)
        it += 1
        err = float((m * d1 * s1 - m / n).abs().sum()) / m
        if err < tol:
            break
        d1 = (1.0 / n) / (s1 + eps)
    return k, d0, d1, it, err


def run_megatron(s_np, xi):
    s = torch.from_numpy(s_np)
    t, (k, d0, d1, it, err) = median_time(lambda: megatron_sinkhorn(s, xi, ARGS.tol, ARGS.max_iters), ARGS.repetitions)
    m = s_np.shape[0]
    plan = (m * d0[:, None] * k * d1[None, :]).numpy()
    return dict(ms=t * 1e3, iterations=it, err=err, check=column_error(plan, *s_np.shape))


def run_pot(s_np, xi, method):
    m, n = s_np.shape
    a = np.ones(m, dtype=np.float32)
    b = np.full(n, m / n, dtype=np.float32)
    cost = -s_np
    thr = m * ARGS.tol

    def call():
        return ot.sinkhorn(a, b, cost, xi, method=method, numItermax=ARGS.max_iters, stopThr=thr, log=True)

    try:
        t, (plan, log) = median_time(call, ARGS.repetitions)
    except Exception as e:  # noqa: BLE001 -- report any failure of the peer and go on
        return dict(skipped=f"{type(e).__name__}: {e}")
    plan = np.asarray(plan, dtype=np.float64)
    if not np.all(np.isfinite(plan)):
        return dict(ms=t * 1e3, iterations=log.get("niter"), err=float("nan"), note="non-finite plan")
    rows = plan.sum(1, keepdims=True)
    iters = log.get("niter")
    if iters is None and "err" in log:
        iters = f"<= {10 * len(log['err'])}"
    return dict(ms=t * 1e3, iterations=iters, err=column_error(plan / rows, m, n))


def run_torch_softmax_topk(s_np, k):
    s = torch.from_numpy(s_np)

    def call():
        probs = torch.softmax(s, dim=1)
        vals, idx = torch.topk(probs, k, dim=1)
        return idx, vals / vals.sum(dim=1, keepdim=True)

    t, _ = median_time(call, ARGS.repetitions)
    return dict(ms=t * 1e3)


def run_ssr_torch(s_np, k, policy):
    s = torch.from_numpy(s_np)
    t, (_, _, _, info) = median_time(lambda: ssr_torch.route(s, policy, k), ARGS.repetitions)
    return dict(ms=t * 1e3, iterations=int(info[2]) if policy == "sinkhorn" else None,
                err=float(info[3]) if policy == "sinkhorn" else None)


# ---- report -----------------------------------------------------------------------------------------------

def fmt_iters(x):
    return "-" if x is None else (f"{x:g}" if isinstance(x, (int, float)) else str(x))


def main():
    shape_list = shapes()
    ssr = run_ssr(shape_list)
    xi = ARGS.xi
    rows = []
    for m, n, k in shape_list:
        s_np = logits(m, n)
        key = f"BM_SinkhornSolve<float>/{m}/{n}/{int(round(xi * 1000))}/0"
        base = ssr.get(key)
        if base is None:
            print(f"ssr's benchmark {key} is missing from {ARGS.bench}", file=sys.stderr)
            continue
        rows.append(((m, n, k), "ssr Sinkhorn route (C++)", base, base))
        if torch is not None:
            rows.append(((m, n, k), "Megatron-style torch loop", run_megatron(s_np, xi), base))
        if ot is not None:
            for method in ("sinkhorn", "sinkhorn_log"):
                rows.append(((m, n, k), f"POT ot.sinkhorn '{method}'", run_pot(s_np, xi, method), base))
        soft = ssr.get(f"BM_Route_SoftmaxTopK/{m}/{n}/{k}")
        if soft is not None:
            rows.append(((m, n, k), "ssr SoftmaxTopK (C++)", soft, soft))
            if torch is not None:
                rows.append(((m, n, k), "torch.softmax + torch.topk", run_torch_softmax_topk(s_np, k), soft))
            if ssr_torch is not None:
                rows.append(((m, n, k), "torch.ops.ssr.route softmax", run_ssr_torch(s_np, k, "softmax"), soft))
        route = ssr.get(f"BM_Route_SinkhornTopK_PlanWeights/{m}/{n}/{k}")
        if route is not None and ssr_torch is not None and xi == 0.5 and ARGS.tol == 1e-4 and ARGS.max_iters == 100:
            rows.append(((m, n, k), "ssr Sinkhorn route, load (C++)", route, route))
            rows.append(((m, n, k), "torch.ops.ssr.route sinkhorn", run_ssr_torch(s_np, k, "sinkhorn"), route))

    print(f"threads {ARGS.threads}, {ARGS.clock} time, xi {xi}, tol {ARGS.tol}, max {ARGS.max_iters} iterations, float32, "
          f"medians of {ARGS.repetitions}; torch {torch.__version__ if torch else '-'}, POT {ot.__version__ if ot else '-'}")
    print(f"{'m x n, k':<16} {'implementation':<30} {'time ms':>10} {'iterations':>11} {'final err':>10} {'peer / ssr':>10}")
    for (m, n, k), name, r, base in rows:
        shape = f"{m} x {n}, {k}"
        if "skipped" in r:
            print(f"{shape:<16} {name:<30} skipped: {r['skipped']}")
            continue
        ratio = r["ms"] / base["ms"]
        err = r.get("err")
        err_s = "-" if err is None else f"{err:.2e}"
        print(f"{shape:<16} {name:<30} {r['ms']:>10.3f} {fmt_iters(r.get('iterations')):>11} {err_s:>10} {ratio:>10.1f}"
              + (f"  ({r['note']})" if "note" in r else ""))
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump([dict(m=m, n=n, k=k, implementation=name, **{a: b for a, b in r.items()}) for (m, n, k), name, r, _ in rows],
                      f, indent=1, default=str)


if __name__ == "__main__":
    main()
