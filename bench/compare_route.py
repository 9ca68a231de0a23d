"""Before and after on this machine for the whole ssr-route program: two builds' ssr-route run in turn on
the same logits files, every policy and thread setting, and the least wall-clock time of each over every
round, with the first build's time over the second's.

    python3 bench/compare_route.py ROUNDS BEFORE/ssr-route AFTER/ssr-route [GEN]

GEN (default build/examples/ssr-example-logits) writes the logits: 24576 x 16, 65536 x 128 and 10^6 x 16.
Each round runs, per shape, policy (softmax, sinkhorn) and --threads (1, 2, 0), the two builds one after
the other, so that a change in the machine's state touches both; one run each first warms the files."""
import os
import subprocess
import sys
import tempfile
import time

SHAPES = [(24576, 16), (65536, 128), (1000000, 16)]


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    rounds, builds = int(sys.argv[1]), sys.argv[2:4]
    gen = sys.argv[4] if len(sys.argv) == 5 else os.path.join("build", "examples", "ssr-example-logits")
    best = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for m, n in SHAPES:
            files[(m, n)] = os.path.join(tmp, f"l{m}x{n}.npy")
            subprocess.run([gen, "--out", files[(m, n)], "--rows", str(m), "--experts", str(n)], check=True,
                           capture_output=True)

        def run(build, shape, policy, threads):
            argv = [build, "--logits", files[shape], "--out", os.path.join(tmp, "out"), "--policy", policy,
                    "--threads", threads]
            start = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            return time.perf_counter() - start

        for shape in SHAPES:
            for build in builds:
                run(build, shape, "softmax", "1")
        for _ in range(rounds):
            for shape in SHAPES:
                for policy in ("softmax", "sinkhorn"):
                    for threads in ("1", "2", "0"):
                        for b, build in enumerate(builds):
                            key = (shape, policy, threads, b)
                            best[key] = min(best.get(key, float("inf")), run(build, shape, policy, threads))
    print("| logits | policy | --threads | before | after | before / after |")
    print("|---|---|---|---|---|---|")
    for m, n in SHAPES:
        for policy in ("softmax", "sinkhorn"):
            for threads in ("1", "2", "0"):
                before, after = (best[((m, n), policy, threads, b)] for b in (0, 1))
                print(f"| {m} × {n} | {policy} | {threads} | {before * 1e3:.1f} ms | {after * 1e3:.1f} ms | "
                      f"{before / after:.2f}× |")


if __name__ == "__main__":
    main()
