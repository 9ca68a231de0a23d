"""Before and after on this machine: two or more builds' ssr_bench run alternately, one thread, and the
least real time of each benchmark over every round, with the first build's time over the last's.

    python3 bench/compare_builds.py [--together] FILTER ROUNDS BEFORE/ssr_bench [...] AFTER/ssr_bench

Each round runs each binary once with --benchmark_repetitions=5 --benchmark_min_time=0.1. The least time
of many interleaved runs is the one least disturbed by the rest of the machine; rerun it to see how far
the ratios move between runs. --together (two builds, a machine of two cores or more) runs both at once,
each pinned to its own core, then again with the cores swapped: on a shared machine whose speed drifts
between runs, both builds then see the same moments. They share the last-level cache, so keep it to
matrices that fit the cores' own caches."""
import json
import os
import subprocess
import sys

UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def run(binary, pattern, env, core=None):
    argv = [binary, f"--benchmark_filter={pattern}", "--benchmark_min_time=0.1", "--benchmark_repetitions=5",
            "--benchmark_format=json"]
    if core is not None:
        argv = ["taskset", "-c", str(core)] + argv
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)


def main():
    args = sys.argv[1:]
    together = bool(args) and args[0] == "--together"
    if together:
        args = args[1:]
    if len(args) < 4 or (together and len(args) != 4):
        sys.exit(__doc__)
    pattern, rounds, binaries = args[0], int(args[1]), args[2:]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    least = {b: {} for b in binaries}

    def record(b, out):
        for r in json.loads(out)["benchmarks"]:
            if r.get("run_type") == "iteration":
                t = r["real_time"] * UNIT_US[r["time_unit"]]
                least[b][r["run_name"]] = min(least[b].get(r["run_name"], float("inf")), t)

    for _ in range(rounds):
        if together:
            for cores in ((0, 1), (1, 0)):
                procs = [run(b, pattern, env, c) for b, c in zip(binaries, cores)]
                outs = [p.communicate()[0] for p in procs]
                if any(p.returncode for p in procs):
                    sys.exit("a benchmark binary failed")
                for b, out in zip(binaries, outs):
                    record(b, out)
        else:
            for b in binaries:
                p = run(b, pattern, env)
                out = p.communicate()[0]
                if p.returncode:
                    sys.exit(f"{b} failed")
                record(b, out)
    print("| benchmark | " + " | ".join(binaries) + " | first / last |")
    print("|---" * (len(binaries) + 2) + "|")
    for name in least[binaries[0]]:
        times = [least[b].get(name, float("nan")) for b in binaries]
        print(f"| `{name}` | " + " | ".join(f"{t:.1f} us" for t in times) + f" | {times[0] / times[-1]:.2f}x |")


if __name__ == "__main__":
    main()
