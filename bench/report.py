#!/usr/bin/env python3
"""This machine's section of docs/performance.md, measured in one run, in Markdown.

The section (printed first; --section-out writes exactly it, to replace this device's section of the page):
  * a heading naming the device, then one line: processor (model, cores, vector instructions), compiler,
    torch and the date;
  * against the peers: bench/peers.py on the default build, one thread, at the paper's shape
    (24576 x 16, top-2) and the three other shapes it runs;
  * one iteration against its read bound: bench/roofline.py over the grid of shapes;
  * one thread and two: bench/threads.py over the converged solves and softmax top-k.
Each table follows the exact command that reproduces it.

After the section come the tables the page does not show, as data for bench/results/ (stdout and --out):
every column of the read-bound table, the native build's peers and read bound, ssr-route per thread count,
the converged solves, the routing throughput of every policy and the distributed iteration.

The steps run one after another; nothing else should run on the machine meanwhile. A step whose program
is missing is left out with a line saying so. Each step's time goes to stderr.

Usage (from the repository root, with the builds and the Python environment of docs/performance.md,
"How to reproduce"):
  python3 bench/report.py [--section-out section.md] [--out report.md] [--quick] [--device NAME]
                          [--build build] [--native build-native] [--mpi build-mpi]
                          [--python .venv/bin/python] [--route-runs 10]
--quick runs each step with fewer shapes and repetitions, to try the script; its figures are not the page's.
"""

import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

PAPER = (24576, 16, 2)
GRID_SHAPES = [(m, n) for m in (4096, 24576, 65536) for n in (8, 16, 128, 256)] + [(1000000, 16)]
THREADS_FILTER = ("BM_SinkhornSolve<float>/(4096|24576|65536)/(8|16|128|256)/500/0/"
                  "|BM_SinkhornSolve<float>/1000000/16/500/0/|BM_Route_SoftmaxTopK/")
ROOFLINE_SECTION_COLUMNS = 9  # m, n, MiB, level, read bound, per iteration, / read bound, outside (time, iterations)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build", help="the default build (cmake --preset default)")
    p.add_argument("--native", default="build-native", help="the -DSSR_NATIVE=ON build")
    p.add_argument("--mpi", default="build-mpi", help="the -DSSR_ENABLE_MPI=ON build")
    p.add_argument("--python", default=".venv/bin/python", help="the interpreter with torch (scripts/python-env.sh)")
    p.add_argument("--section-out", help="write this machine's section of docs/performance.md to this file")
    p.add_argument("--out", help="write everything printed (the section and the other tables) to this file")
    p.add_argument("--device", help="the section's heading (default: from lscpu, e.g. 'AMD EPYC (Zen 3)')")
    p.add_argument("--quick", action="store_true", help="fewer shapes and repetitions, to try the script")
    p.add_argument("--route-runs", type=int, default=10, help="rounds of ssr-route's settings (least time of each)")
    return p.parse_args()


class Report:
    """The printed lines: on stdout as they come, kept for --out, and the section's for --section-out."""

    def __init__(self):
        self.lines = []
        self.section = None

    def emit(self, text=""):
        print(text, flush=True)
        self.lines.append(text)

    def end_section(self):
        self.section = list(self.lines)

    @staticmethod
    def write(path, lines):
        with open(path, "w") as f:
            f.write("\n".join(lines).rstrip("\n") + "\n")


# ---------------------------------------------------------------------------------------------------------
# The machine

def lscpu():
    info = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def amd_core(family, model):
    """AMD's core generation from the CPU family and model (what lscpu gives), or None."""
    if family == 26:
        return "Zen 5"
    if family == 25:
        return "Zen 4" if 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF else "Zen 3"
    if family == 23:
        return "Zen 2" if model >= 0x30 else "Zen"
    return None


def device_name(cpu):
    """'AMD EPYC (Zen 3)', 'Intel Xeon': the processor's name without trademarks, clock and core count."""
    name = re.sub(r"\((R|TM|tm)\)", "", cpu.get("Model name", "unknown processor"))
    name = re.sub(r"\s+(CPU\s+)?@.*$|\s+Processor$|\s+\d+-Core.*$", "", name)
    name = " ".join(name.split())
    try:
        core = amd_core(int(cpu.get("CPU family", "")), int(cpu.get("Model", "")))
    except ValueError:
        core = None
    return f"{name} ({core})" if core and cpu.get("Vendor ID") == "AuthenticAMD" else name


def vector_isa(cpu):
    flags = set(cpu.get("Flags", "").split())
    avx512 = [f[len("avx512"):].upper() for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq") if f in flags]
    isa = [name for flag, name in (("avx2", "AVX2"), ("fma", "FMA")) if flag in flags]
    if avx512:
        isa.append("AVX-512 " + "/".join(avx512))
    return " + ".join(isa) or "SSE2"


def cores(cpu):
    try:
        return int(cpu["Core(s) per socket"]) * int(cpu.get("Socket(s)", "1"))
    except (KeyError, ValueError):
        return os.cpu_count()


def compiler(build):
    """The C++ compiler the build was configured with, as 'GCC 12.2.0' (CMake's record of it)."""
    for path in glob.glob(os.path.join(build, "CMakeFiles", "*", "CMakeCXXCompiler.cmake")):
        text = open(path).read()
        cid = re.search(r'set\(CMAKE_CXX_COMPILER_ID "([^"]*)"\)', text)
        version = re.search(r'set\(CMAKE_CXX_COMPILER_VERSION "([^"]*)"\)', text)
        if cid and version:
            name = {"GNU": "GCC"}.get(cid.group(1), cid.group(1))
            return f"{name} {version.group(1)}"
    return subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.split("\n")[0] or "?"


def torch_version(python):
    if not os.access(python, os.X_OK):
        return None
    out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                         capture_output=True, text=True)
    return out.stdout.strip() or None


def machine(out, args):
    """The section's heading and its one line about the machine."""
    cpu = lscpu()
    vm = f" ({cpu['Hypervisor vendor']})" if cpu.get("Hypervisor vendor") else ""
    torch = torch_version(args.python)
    out.emit(f"## {args.device or device_name(cpu)}")
    out.emit()
    out.emit(f"Machine: {cpu.get('Model name', '?')} (family {cpu.get('CPU family', '?')}, model "
             f"{cpu.get('Model', '?')}), {cores(cpu)} cores{vm}, {vector_isa(cpu)}; compiler: {compiler(args.build)}; "
             f"torch {torch or 'not installed'}; date: {time.strftime('%Y-%m-%d', time.gmtime())}.")
    out.emit()


# ---------------------------------------------------------------------------------------------------------
# Commands

def shown(argv, env):
    """The command as a reader types it: python3 for this interpreter, without the report's own --json file."""
    words = ["python3" if a == sys.executable else a for a in argv]
    if "--json" in words:
        at = words.index("--json")
        del words[at:at + 2]
    prefix = "".join(f"{k}={v} " for k, v in (env or {}).items())
    return prefix + " ".join(shlex.quote(a) for a in words)


def run_shown(out, argv, env=None):
    """Prints the command in a sh block, runs it (with env's additions) and returns its stdout."""
    out.emit("```sh")
    out.emit(shown(argv, env))
    out.emit("```")
    out.emit()
    return subprocess.run(argv, env=dict(os.environ, **(env or {})), check=True, capture_output=True,
                          text=True).stdout


def available(out, *programs):
    """True where every program can run; otherwise a line saying which are missing."""
    missing = [p for p in programs if not os.access(p, os.X_OK)]
    if missing:
        out.emit(f"(left out: {', '.join(missing)} missing)")
        out.emit()
    return not missing


def bench_path(build):
    return os.path.join(build, "bench", "ssr_bench")


def fmt(t):
    if t >= 1:
        return f"{t:.3g} s"
    return f"{t * 1e3:.3g} ms" if t >= 1e-3 else f"{t * 1e6:.3g} µs"


# ---------------------------------------------------------------------------------------------------------
# The section's tables

def run_peers(out, args, build):
    """bench/peers.py's results by shape: {(m, n, k): {implementation: row}}."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        argv = [args.python, os.path.join("bench", "peers.py"), bench_path(build), "--repetitions",
                "3" if args.quick else "5", "--json", f.name]
        if args.quick:
            argv += ["--shapes", "x".join(map(str, PAPER))]
        run_shown(out, argv, {"OMP_WAIT_POLICY": "PASSIVE"})
        rows = json.load(open(f.name))
    table = {}
    for r in rows:
        table.setdefault((r["m"], r["n"], r["k"]), {})[r["implementation"]] = r
    return table


def peers_table(out, table):
    """ssr against each peer that ran: times and peer / ssr; POT and the operator where they ran."""
    def ms(r):
        return f"{r['ms']:.3g} ms" if r and "ms" in r else "-"

    def ratio(r, base):
        return f"{r['ms'] / base['ms']:.1f}×" if r and base and "ms" in r and "ms" in base else "-"

    ran = {name for by_name in table.values() for name, r in by_name.items() if "ms" in r}
    pot = "POT ot.sinkhorn 'sinkhorn'" in ran
    op = "torch.ops.ssr.route softmax" in ran
    out.emit("| m × n, k | ssr Sinkhorn route (iterations) | Megatron-style loop | loop / ssr | ssr softmax top-k "
             "| torch softmax + topk | torch / ssr |" + (" POT `'sinkhorn'` / ssr |" if pot else "")
             + (" operator: softmax, Sinkhorn (/ the C++ call) |" if op else ""))
    out.emit("|---|---|---|---|---|---|---|" + ("---|" if pot else "") + ("---|" if op else ""))
    for (m, n, k), r in table.items():
        base, soft = r.get("ssr Sinkhorn route (C++)"), r.get("ssr SoftmaxTopK (C++)")
        mega, torch_soft = r.get("Megatron-style torch loop"), r.get("torch.softmax + torch.topk")
        iters = base.get("iterations") if base else None
        shape = f"{m} × {n}, {k}" + (" (paper)" if (m, n, k) == PAPER else "")
        cells = [shape, f"{ms(base)} ({'-' if iters is None else f'{iters:.0f}'})", ms(mega),
                 f"**{ratio(mega, base)}**", ms(soft), ms(torch_soft), f"**{ratio(torch_soft, soft)}**"]
        if pot:
            cells.append(ratio(r.get("POT ot.sinkhorn 'sinkhorn'"), base))
        if op:
            op_soft, op_sk = r.get("torch.ops.ssr.route softmax"), r.get("torch.ops.ssr.route sinkhorn")
            route = r.get("ssr Sinkhorn route, load (C++)")
            cells.append(f"{ms(op_soft)} ({ratio(op_soft, soft)}), {ms(op_sk)} ({ratio(op_sk, route)})")
        out.emit("| " + " | ".join(cells) + " |")
    out.emit()


def peers(out, args, build=None):
    build = build or args.build
    if available(out, bench_path(build), args.python):
        peers_table(out, run_peers(out, args, build))


def run_roofline(out, args, build):
    shapes = [(24576, 16), (65536, 256)] if args.quick else GRID_SHAPES
    return run_shown(out, [sys.executable, os.path.join("bench", "roofline.py"), bench_path(build),
                           "--repetitions", "2" if args.quick else "5", "--rounds", "1" if args.quick else "3",
                           "--shapes", ",".join(f"{m}x{n}" for m, n in shapes)], {"OMP_NUM_THREADS": "1"})


def without_host(text):
    """roofline.py's first line begins with the host's name: the rest says the clock and the caches."""
    first, _, rest = text.partition("\n")
    return first.partition(": ")[2] + "\n" + rest if ": " in first else text


def first_columns(markdown, count):
    """A Markdown text with each table row cut to its first count cells."""
    rows = []
    for line in markdown.splitlines():
        if line.startswith("|"):
            line = "|".join(line.split("|")[:count + 1]) + "|"
        rows.append(line)
    return "\n".join(rows)


def roofline(out, args):
    """The section's read-bound table (its first columns); returns roofline.py's whole output for the raw part."""
    if not available(out, bench_path(args.build)):
        return None
    text = without_host(run_roofline(out, args, args.build)).rstrip()
    out.emit(first_columns(text, ROOFLINE_SECTION_COLUMNS))
    out.emit()
    return text


def threads(out, args):
    bench = bench_path(args.build)
    if not available(out, bench):
        return
    flt = "BM_SinkhornSolve<float>/24576/16/500/0/|BM_Route_SoftmaxTopK/24576/16/" if args.quick else THREADS_FILTER
    text = run_shown(out, [sys.executable, os.path.join("bench", "threads.py"), bench, "--threads", "2",
                           "--repetitions", "2" if args.quick else "5", "--rounds", "1" if args.quick else "2",
                           "--filter", flt])
    out.emit(text.rstrip())
    out.emit()


# ---------------------------------------------------------------------------------------------------------
# The other tables (raw data for bench/results/)

def roofline_all_columns(out, text):
    out.emit("### One iteration against its read bound, every column")
    out.emit()
    if text is None:
        out.emit("(left out: no read-bound run)")
    else:
        out.emit("The section's run, with the exp bound and the pass in cache (bench/roofline.py's docstring).")
        out.emit()
        out.emit(text)
    out.emit()


def native_peers(out, args):
    out.emit("### Native build (`-DSSR_NATIVE=ON`): against the peers")
    out.emit()
    peers(out, args, args.native)


def native_roofline(out, args):
    out.emit("### Native build (`-DSSR_NATIVE=ON`): one iteration against its read bound")
    out.emit()
    if available(out, bench_path(args.native)):
        out.emit(without_host(run_roofline(out, args, args.native)).rstrip())
        out.emit()


def least_wall_times(argvs, runs):
    """The least wall-clock time of each command, run in turn runs times (after one run each to warm the files),
    so that a change in the machine's state touches them all."""
    for argv in argvs.values():
        subprocess.run(argv, check=True, capture_output=True)
    best = {key: float("inf") for key in argvs}
    for _ in range(runs):
        for key, argv in argvs.items():
            start = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            best[key] = min(best[key], time.perf_counter() - start)
    return best


def route_threads(out, args):
    """ssr-route, the whole program, on one thread, two and "all" (--threads 0)."""
    out.emit("### `ssr-route`: one thread and two")
    out.emit()
    tool, gen = (os.path.join(args.build, "examples", t) for t in ("ssr-route", "ssr-example-logits"))
    if not available(out, tool, gen):
        return
    shapes = [(24576, 16)] if args.quick else [(24576, 16), (65536, 128), (1000000, 16)]
    runs = 3 if args.quick else args.route_runs
    out.emit(f"The least wall-clock time of {runs} runs of the whole program (reading the `.npy`, routing, writing "
             f"the outputs) per `--threads`, the settings in turn; `{gen} --out L.npy --rows M --experts N` "
             f"makes the logits; T is 1, 2 and 0 (the program's choice: one thread below about 2M logits):")
    out.emit()
    out.emit("```sh")
    out.emit(f"{tool} --logits L.npy --out OUT --policy POLICY --threads T")
    out.emit("```")
    out.emit()
    out.emit("| logits | policy | 1 thread | 2 threads | all (0) | 1 / 2 | 1 / all |")
    out.emit("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for m, n in shapes:
            logits = os.path.join(tmp, f"l{m}x{n}.npy")
            subprocess.run([gen, "--out", logits, "--rows", str(m), "--experts", str(n)], check=True,
                           capture_output=True)
            for policy in ("softmax", "sinkhorn"):
                best = least_wall_times({t: [tool, "--logits", logits, "--out", os.path.join(tmp, "out"),
                                             "--policy", policy, "--threads", t] for t in ("1", "2", "0")}, runs)
                out.emit(f"| {m} × {n} | {policy} | {fmt(best['1'])} | {fmt(best['2'])} | {fmt(best['0'])} | "
                         f"{best['1'] / best['2']:.2f}× | {best['1'] / best['0']:.2f}× |")
    out.emit()


def benchmark_medians(out, bench, flt, repetitions, min_time):
    """ssr_bench's medians on one thread, by benchmark name."""
    text = run_shown(out, [bench, f"--benchmark_filter={flt}", f"--benchmark_min_time={min_time}",
                           f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true",
                           "--benchmark_format=json"], {"OMP_NUM_THREADS": "1"})
    return {b["run_name"].replace("/real_time", ""): b for b in json.loads(text)["benchmarks"]
            if b.get("aggregate_name") == "median"}


def seconds(b):
    return b["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]


def solves(out, args):
    out.emit("### Converged solves")
    out.emit()
    bench = bench_path(args.build)
    if not available(out, bench):
        return
    ms_ = (24576,) if args.quick else (4096, 24576, 65536)
    runs = benchmark_medians(out, bench, f"BM_SinkhornSolve<float>/({'|'.join(map(str, ms_))})/",
                             2 if args.quick else 3, 0.05 if args.quick else 0.2)
    out.emit("Default build, one thread, medians. Each cell: the whole routing call and its Sinkhorn iterations "
             "(100: not converged to 1e-4 within the limit).")
    out.emit()
    for m in ms_:
        out.emit(f"m = {m}")
        out.emit()
        out.emit("| n | cost | xi = 1 | xi = 0.5 | xi = 0.1 | xi = 0.05 |")
        out.emit("|---|---|---|---|---|---|")
        for n in (8, 16, 128, 256):
            for cost, name in ((0, "linear"), (1, "softmax")):
                cells = []
                for xi in (1000, 500, 100, 50):
                    b = runs.get(f"BM_SinkhornSolve<float>/{m}/{n}/{xi}/{cost}")
                    cells.append("-" if b is None else f"{fmt(seconds(b))}, {b['sinkhorn_iterations']:.0f} it")
                out.emit(f"| {n} | {name} | " + " | ".join(cells) + " |")
        out.emit()


def throughput(out, args):
    out.emit("### Routing throughput per policy")
    out.emit()
    bench = bench_path(args.build)
    if not available(out, bench):
        return
    runs = benchmark_medians(out, bench, "BM_Route_" + ("SoftmaxTopK/" if args.quick else ""),
                             2 if args.quick else 5, 0.05 if args.quick else 0.3)
    shapes = ((24576, 16, 2), (24576, 8, 2), (24576, 128, 1), (24576, 256, 8))
    out.emit("Default build, one thread, medians: tokens per second (time per call).")
    out.emit()
    out.emit("| policy | " + " | ".join(f"n = {n}, k = {k}" for _, n, k in shapes) + " |")
    out.emit("|---|---|---|---|---|")
    policies = list(dict.fromkeys(re.match(r"BM_Route_(.*?)/", name).group(1) for name in runs))
    for policy in policies:
        cells = []
        for m, n, k in shapes:
            b = runs.get(f"BM_Route_{policy}/{m}/{n}/{k}")
            cells.append("-" if b is None else f"{b['tokens/s'] / 1e6:.1f} M/s ({fmt(seconds(b))})")
        out.emit(f"| {policy} | " + " | ".join(cells) + " |")
    out.emit()


def distributed(out, args):
    out.emit("### Distributed")
    out.emit()
    if not available(out, os.path.join(args.mpi, "bench", "ssr_bench_distributed")):
        return
    text = run_shown(out, ["bash", os.path.join("bench", "distributed.sh"), args.mpi, "1", "2"])
    lines = [line.split() for line in text.strip().splitlines()]
    out.emit("| ranks | rows/rank | n | alone µs/it | global µs/it | added µs | all-reduce µs |")
    out.emit("|---|---|---|---|---|---|---|")
    for cells in lines[1:]:
        out.emit("| " + " | ".join(cells) + " |")
    out.emit()


# ---------------------------------------------------------------------------------------------------------

def timed(name, step, *step_args):
    start = time.monotonic()
    result = step(*step_args)
    print(f"report.py: {name} took {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return result


def main():
    args = parse_args()
    out = Report()
    start = time.monotonic()
    timed("machine", machine, out, args)
    out.emit("**Against the peers**, one thread (default build; times are medians of CPU time, each ratio the "
             "peer's time over ssr's):")
    out.emit()
    timed("peers", peers, out, args)
    out.emit("**One iteration against its read bound**, one thread (default build; least of each time):")
    out.emit()
    roofline_text = timed("read bound", roofline, out, args)
    out.emit("**One thread and two** (default build; wall-clock medians):")
    out.emit()
    timed("threads", threads, out, args)
    out.end_section()
    roofline_all_columns(out, roofline_text)
    timed("native peers", native_peers, out, args)
    timed("native read bound", native_roofline, out, args)
    timed("ssr-route threads", route_threads, out, args)
    timed("converged solves", solves, out, args)
    timed("throughput", throughput, out, args)
    timed("distributed", distributed, out, args)
    print(f"report.py: took {(time.monotonic() - start) / 60:.1f} min", file=sys.stderr)
    if args.section_out:
        Report.write(args.section_out, out.section)
    if args.out:
        Report.write(args.out, out.lines)


if __name__ == "__main__":
    main()
