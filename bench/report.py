#!/usr/bin/env python3
"""Every CPU measurement of docs/performance.md, on this machine, in one run: its tables in Markdown.

Runs, one after another (nothing else should run on the machine meanwhile), and writes each section with
the command that produced it:
  * the machine: processor, caches, compiler, revision, torch and POT;
  * peers: bench/peers.py against the default build and the native build (one thread);
  * read bound: bench/roofline.py over the grid, both builds (least of 3 rounds x 5 repetitions);
  * threads: bench/threads.py, one thread against two, and ssr-route's --threads 1, 2 and "all" (0);
  * converged solves: BM_SinkhornSolve<float> over m, n, xi and the cost, with each call's iterations;
  * routing throughput: BM_Route_*, tokens per second and time per call, every policy;
  * distributed: bench/distributed.sh (when the MPI benchmark was built).
A step whose binary is missing is left out with a line saying so.

Usage (from the repository root, after `cmake --preset default && cmake --build build`, the native and MPI
builds below, and scripts/python-env.sh with `.venv/bin/pip install pot`):
  python3 bench/report.py [--build build] [--native build-native] [--mpi build-mpi]
                          [--python .venv/bin/python] [--out report.md] [--quick] [--route-runs 10]
  native: cmake -S . -B build-native -G Ninja -DCMAKE_BUILD_TYPE=Release -DSSR_NATIVE=ON \
            -DSSR_BUILD_TESTS=OFF -DSSR_BUILD_EXAMPLES=OFF -DSSR_ENABLE_XTENSOR=OFF
          cmake --build build-native --target ssr_bench
  MPI:    cmake -S . -B build-mpi -G Ninja -DCMAKE_BUILD_TYPE=Release -DSSR_ENABLE_MPI=ON \
            -DSSR_BUILD_TESTS=OFF -DSSR_BUILD_EXAMPLES=OFF -DSSR_ENABLE_XTENSOR=OFF
          cmake --build build-mpi --target ssr_bench_distributed
--quick runs each step with fewer repetitions and shapes, to try the script (its figures are not the doc's).
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GRID_SHAPES = [(m, n) for m in (4096, 24576, 65536) for n in (8, 16, 128, 256)] + [(1000000, 16)]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--native", default="build-native")
    p.add_argument("--mpi", default="build-mpi")
    p.add_argument("--python", default=".venv/bin/python")
    p.add_argument("--out", help="also write the report to this file")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--route-runs", type=int, default=10, help="rounds of ssr-route's settings (least time of each)")
    return p.parse_args()


ARGS = parse_args()
LINES = []


def emit(text=""):
    print(text, flush=True)
    LINES.append(text)


def command(argv, env=None):
    """Runs argv (with env's additions), prints it as the section's command and returns its stdout."""
    words = ["python3" if a == sys.executable else a for a in argv]
    if "--json" in words:  # the report's own temporary file
        at = words.index("--json")
        del words[at:at + 2]
    shown = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    shown = (shown + " " if shown else "") + " ".join(shlex.quote(a) for a in words)
    emit("```sh")
    emit(shown)
    emit("```")
    emit()
    out = subprocess.run(argv, env=dict(os.environ, **(env or {})), check=True, capture_output=True, text=True)
    return out.stdout


def fmt(t):
    if t >= 1:
        return f"{t:.3g} s"
    return f"{t * 1e3:.3g} ms" if t >= 1e-3 else f"{t * 1e6:.3g} µs"


def bench_path(build):
    return os.path.join(build, "bench", "ssr_bench")


def section(title, *needed):
    """Writes the section's title; False, with a line saying so, where a program it needs is missing."""
    emit(title)
    emit()
    missing = [p for p in needed if not os.access(p, os.X_OK)]
    if missing:
        emit(f"(left out: {', '.join(missing)} missing)")
        emit()
    return not missing


def machine():
    emit("## The machine")
    emit()
    info = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    flags = set(info.get("Flags", "").split())
    isa = ", ".join(f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_fp16") if f in flags)
    compiler = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    versions = "-"
    if os.access(ARGS.python, os.X_OK):
        versions = subprocess.run([ARGS.python, "-c", "import importlib.metadata as m\nfor p in ('torch', 'pot'):\n"
                                   "    try: print(p, m.version(p))\n    except Exception: print(p, '-')"],
                                  capture_output=True, text=True).stdout.replace("\n", ", ").strip(", ")
    emit(f"- processor: {info.get('Model name', '?')} (family {info.get('CPU family', '?')}, model "
         f"{info.get('Model', '?')}), {info.get('CPU(s)', '?')} CPUs; {isa}")
    emit(f"- caches: L1d {info.get('L1d cache', '?')}, L2 {info.get('L2 cache', '?')}, L3 {info.get('L3 cache', '?')}")
    emit(f"- compiler: {compiler}; revision {rev}{' (with uncommitted changes)' if dirty else ''}; {versions}")
    emit(f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    emit()


def peers(build, title):
    bench = bench_path(build)
    if not section(f"### {title}", bench, ARGS.python):
        return
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        argv = [ARGS.python, os.path.join("bench", "peers.py"), bench, "--threads", "1",
                "--repetitions", "3" if ARGS.quick else "5", "--json", f.name]
        if ARGS.quick:
            argv += ["--shapes", "24576x16x2"]
        command(argv, {"OMP_NUM_THREADS": "1"})
        rows = json.load(open(f.name))
    table = {}
    for r in rows:
        table.setdefault((r["m"], r["n"], r["k"]), {})[r["implementation"]] = r

    def ms(r):
        return f"{r['ms']:.3g} ms" if r and "ms" in r else "-"

    def ratio(r, base):
        return f"{r['ms'] / base['ms']:.1f}×" if r and base and "ms" in r and "ms" in base else "-"

    emit("| m × n, k | ssr Sinkhorn route (iterations) | Megatron loop | ratio | POT `'sinkhorn'` | POT `'sinkhorn_log'` "
         "| ssr softmax top-k | torch softmax + topk | ratio | operator: softmax, Sinkhorn (/ the C++ call) |")
    emit("|---|---|---|---|---|---|---|---|---|---|")
    for (m, n, k), r in table.items():
        base, soft = r.get("ssr Sinkhorn route (C++)"), r.get("ssr SoftmaxTopK (C++)")
        mega, torch_soft = r.get("Megatron-style torch loop"), r.get("torch.softmax + torch.topk")
        op_soft, op_sk = r.get("torch.ops.ssr.route softmax"), r.get("torch.ops.ssr.route sinkhorn")
        route = r.get("ssr Sinkhorn route, load (C++)")
        pot, pot_log = r.get("POT ot.sinkhorn 'sinkhorn'"), r.get("POT ot.sinkhorn 'sinkhorn_log'")
        ops = "-" if op_soft is None else (f"{ms(op_soft)} ({ratio(op_soft, soft)}), "
                                           f"{ms(op_sk)} ({ratio(op_sk, route)})")
        shape = f"{m} × {n}, {k}" + (" (paper)" if (m, n, k) == (24576, 16, 2) else "")
        iters = base.get("iterations") if base else None
        iters = "-" if iters is None else f"{iters:.0f}"
        emit(f"| {shape} | {ms(base)} ({iters}) | {ms(mega)} | **{ratio(mega, base)}** | "
             f"{ratio(pot, base)} | {ratio(pot_log, base)} | {ms(soft)} | {ms(torch_soft)} | "
             f"**{ratio(torch_soft, soft)}** | {ops} |")
    emit()


def roofline(build, title):
    bench = bench_path(build)
    if not section(f"### {title}", bench):
        return
    shapes = [(24576, 16), (24576, 128)] if ARGS.quick else GRID_SHAPES
    out = command([sys.executable, os.path.join("bench", "roofline.py"), bench, "--repetitions",
                   "2" if ARGS.quick else "5", "--rounds", "1" if ARGS.quick else "3",
                   "--shapes", ",".join(f"{m}x{n}" for m, n in shapes)], {"OMP_NUM_THREADS": "1"})
    emit(out.rstrip())
    emit()


def threads():
    bench = bench_path(ARGS.build)
    if not section("### The library", bench):
        return
    flt = ("BM_SinkhornSolve<float>/24576/16/500/0/|BM_Route_SoftmaxTopK/24576/16/" if ARGS.quick else
           "BM_SinkhornSolve<float>/(4096|24576|65536)/(8|16|128|256)/500/0/|BM_SinkhornSolve<float>/1000000/16/500/0/"
           "|BM_Route_SoftmaxTopK/")
    out = command([sys.executable, os.path.join("bench", "threads.py"), bench, "--threads", "2", "--repetitions",
                   "2" if ARGS.quick else "5", "--rounds", "1" if ARGS.quick else "2", "--filter", flt])
    emit(out.rstrip())
    emit()


def route_threads():
    """ssr-route on one thread, two and "all" (--threads 0, the backend's choice by work size): least wall time."""
    tool, gen = (os.path.join(ARGS.build, "examples", t) for t in ("ssr-route", "ssr-example-logits"))
    if not section("### `ssr-route`", tool, gen):
        return
    shapes = [(24576, 16)] if ARGS.quick else [(24576, 16), (65536, 128), (1000000, 16)]
    runs = 3 if ARGS.quick else ARGS.route_runs
    emit(f"The least wall-clock time of {runs} runs of the whole program (reading the `.npy`, routing, writing "
         f"the outputs), per `--threads`, the settings in turn, after one run each to warm the files; "
         f"`ssr-example-logits --out L.npy --rows M --experts N` makes the logits, then for each policy and T in "
         f"1, 2, 0 (0: the program's choice, one thread below about 2M logits):")
    emit()
    emit("```sh")
    emit("build/examples/ssr-route --logits L.npy --out OUT --policy POLICY --threads T")
    emit("```")
    emit()
    emit("| logits | policy | 1 thread | 2 threads | all (0) | 1 / 2 | 1 / all |")
    emit("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for m, n in shapes:
            logits = os.path.join(tmp, f"l{m}x{n}.npy")
            subprocess.run([gen, "--out", logits, "--rows", str(m), "--experts", str(n)], check=True,
                           capture_output=True)
            for policy in ("softmax", "sinkhorn"):
                argv = {t: [tool, "--logits", logits, "--out", os.path.join(tmp, "out"), "--policy", policy,
                            "--threads", t] for t in ("1", "2", "0")}
                for t in argv:
                    subprocess.run(argv[t], check=True, capture_output=True)
                # The settings in turn, so that a change in the machine's state (the kernel's time to clear
                # the program's fresh pages moves by 2x from one minute to the next) touches them all.
                best = {t: float("inf") for t in argv}
                for _ in range(runs):
                    for t in argv:
                        start = time.perf_counter()
                        subprocess.run(argv[t], check=True, capture_output=True)
                        best[t] = min(best[t], time.perf_counter() - start)
                emit(f"| {m} × {n} | {policy} | {fmt(best['1'])} | {fmt(best['2'])} | {fmt(best['0'])} | "
                     f"{best['1'] / best['2']:.2f}× | {best['1'] / best['0']:.2f}× |")
    emit()


def benchmark_json(bench, flt, repetitions, min_time):
    out = command([bench, f"--benchmark_filter={flt}", f"--benchmark_min_time={min_time}",
                   f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true",
                   "--benchmark_format=json"], {"OMP_NUM_THREADS": "1"})
    return {b["run_name"].replace("/real_time", ""): b for b in json.loads(out)["benchmarks"]
            if b.get("aggregate_name") == "median"}


def seconds(b):
    return b["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]


def solves():
    bench = bench_path(ARGS.build)
    if not section("## Converged solves", bench):
        return
    ms_ = (24576,) if ARGS.quick else (4096, 24576, 65536)
    runs = benchmark_json(bench, f"BM_SinkhornSolve<float>/({'|'.join(map(str, ms_))})/",
                          2 if ARGS.quick else 3, 0.05 if ARGS.quick else 0.2)
    emit("Default build, one thread, medians. Each cell: the whole routing call and its Sinkhorn iterations "
         "(100: not converged to 1e-4 within the limit).")
    emit()
    for m in ms_:
        emit(f"m = {m}")
        emit()
        emit("| n | cost | xi = 1 | xi = 0.5 | xi = 0.1 | xi = 0.05 |")
        emit("|---|---|---|---|---|---|")
        for n in (8, 16, 128, 256):
            for cost, name in ((0, "linear"), (1, "softmax")):
                cells = []
                for xi in (1000, 500, 100, 50):
                    b = runs.get(f"BM_SinkhornSolve<float>/{m}/{n}/{xi}/{cost}")
                    cells.append("-" if b is None else f"{fmt(seconds(b))}, {b['sinkhorn_iterations']:.0f} it")
                emit(f"| {n} | {name} | " + " | ".join(cells) + " |")
        emit()


def throughput():
    bench = bench_path(ARGS.build)
    if not section("## Routing throughput per policy", bench):
        return
    runs = benchmark_json(bench, "BM_Route_" + ("SoftmaxTopK/" if ARGS.quick else ""),
                          2 if ARGS.quick else 5, 0.05 if ARGS.quick else 0.3)
    shapes = ((24576, 16, 2), (24576, 8, 2), (24576, 128, 1), (24576, 256, 8))
    emit("Default build, one thread, medians: tokens per second (time per call).")
    emit()
    emit("| policy | " + " | ".join(f"n = {n}, k = {k}" for _, n, k in shapes) + " |")
    emit("|---|---|---|---|---|")
    policies = []
    for name in runs:
        policy = re.match(r"BM_Route_(.*?)/", name).group(1)
        if policy not in policies:
            policies.append(policy)
    for policy in policies:
        cells = []
        for m, n, k in shapes:
            b = runs.get(f"BM_Route_{policy}/{m}/{n}/{k}")
            cells.append("-" if b is None else f"{b['tokens/s'] / 1e6:.1f} M/s ({fmt(seconds(b))})")
        emit(f"| {policy} | " + " | ".join(cells) + " |")
    emit()


def distributed():
    tool = os.path.join(ARGS.mpi, "bench", "ssr_bench_distributed")
    if not section("## Distributed", tool):
        return
    out = command(["bash", os.path.join("bench", "distributed.sh"), ARGS.mpi, "1", "2"])
    lines = [line.split() for line in out.strip().splitlines()]
    emit("| ranks | rows/rank | n | alone µs/it | global µs/it | added µs | all-reduce µs |")
    emit("|---|---|---|---|---|---|---|")
    for cells in lines[1:]:
        emit("| " + " | ".join(cells) + " |")
    emit()


def main():
    start = time.monotonic()
    machine()
    emit("## Against the peers, one thread")
    emit()
    peers(ARGS.build, "Default build")
    peers(ARGS.native, "Native build")
    emit("## One iteration against the read bound of its cache level")
    emit()
    roofline(ARGS.build, "Default build")
    roofline(ARGS.native, "Native build")
    emit("## One thread and two")
    emit()
    threads()
    route_threads()
    solves()
    throughput()
    distributed()
    emit(f"(report took {(time.monotonic() - start) / 60:.0f} min)")
    if ARGS.out:
        with open(ARGS.out, "w") as f:
            f.write("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()
