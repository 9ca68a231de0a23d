"""Before and after on this machine: two or more builds' ssr_bench run alternately, one thread, and the
least real time of each benchmark over every round, with the first build's time over the last's.

    python3 bench/compare_builds.py FILTER ROUNDS BEFORE/ssr_bench [...] AFTER/ssr_bench

Each round runs each binary once with --benchmark_repetitions=5 --benchmark_min_time=0.1. The least time
of many interleaved runs is the one least disturbed by the rest of the machine; rerun it to see how far
the ratios move between runs."""
import json
import os
import subprocess
import sys

UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    pattern, rounds, binaries = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    least = {b: {} for b in binaries}
    for _ in range(rounds):
        for b in binaries:
            out = subprocess.run([b, f"--benchmark_filter={pattern}", "--benchmark_min_time=0.1",
                                  "--benchmark_repetitions=5", "--benchmark_format=json"],
                                 capture_output=True, text=True, env=env, check=True).stdout
            for r in json.loads(out)["benchmarks"]:
                if r.get("run_type") == "iteration":
                    t = r["real_time"] * UNIT_US[r["time_unit"]]
                    least[b][r["run_name"]] = min(least[b].get(r["run_name"], float("inf")), t)
    print("| benchmark | " + " | ".join(binaries) + " | first / last |")
    print("|---" * (len(binaries) + 2) + "|")
    for name in least[binaries[0]]:
        times = [least[b].get(name, float("nan")) for b in binaries]
        print(f"| `{name}` | " + " | ".join(f"{t:.1f} us" for t in times) + f" | {times[0] / times[-1]:.2f}x |")


if __name__ == "__main__":
    main()
