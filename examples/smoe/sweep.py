#!/usr/bin/env python3
"""Sweeps one option of ssr-smoe-demo (p, xi or noise) over values: at each value it trains softmax top-k
and the given routers with the same seeds, and prints each router's paired difference to softmax top-k
(mean over seeds and 95% interval, * where it excludes zero) and its count of non-finite training losses.
Exits with 1 if any training loss was not finite. Needs only Python's standard library.

    python3 examples/smoe/sweep.py --demo build/examples/ssr-smoe-demo --option xi --values 0.05,0.1,0.5,1 \\
        --routers ssr-l,ssr-s --seeds 8 --out sweep-xi
"""
import argparse
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

METRICS = (("bpb", "Δ val bits/byte", 4), ("bpb_attacked", "Δ attacked", 4), ("val_mm", "Δ load max/mean", 3),
           ("drop_val", "Δ dropped %", 2))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", required=True, help="the ssr-smoe-demo executable")
    parser.add_argument("--option", required=True, choices=("p", "xi", "noise"), help="the demo option swept")
    parser.add_argument("--values", required=True, help="comma-separated values of the option")
    parser.add_argument("--routers", required=True, help="comma-separated routers compared with softmax top-k")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--out", default="smoe-sweep", help="directory of each value's demo output, JSON and log")
    parser.add_argument("demo_options", nargs="*", help="further demo options, after --")
    args = parser.parse_args(argv)
    args.values = args.values.split(",")
    args.routers = args.routers.split(",")
    if args.seeds < 2:
        parser.error("--seeds must be at least 2 for paired intervals")
    if "softmax" in args.routers or len(set(args.routers)) < len(args.routers):
        parser.error("--routers names each router once, softmax (the reference, always run) not among them")
    return args


def non_finite_losses(steps_csv):
    """Per router of the demo's per-step CSV: (training losses not finite, training losses)."""
    counts = {}
    with open(steps_csv, newline="") as f:
        for row in csv.DictReader(f):
            bad, total = counts.get(row["router"], (0, 0))
            counts[row["router"]] = (bad + (not math.isfinite(float(row["train_bits_per_byte"]))), total + 1)
    return counts


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out)
    header = ["--" + args.option, "router", "Sinkhorn calls", "non-finite losses"] + [m[1] for m in METRICS]
    rows, bad, losses = [], 0, 0
    for value in args.values:
        run_dir = out / f"{args.option}-{value}"
        command = [args.demo, "--routers", ",".join(["softmax"] + args.routers), "--seeds", str(args.seeds),
                   "--steps", str(args.steps), f"--{args.option}", value, "--out", str(run_dir), "--json",
                   str(run_dir / "results.json"), *args.demo_options]
        print(" ".join(command), file=sys.stderr, flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / "log.txt", "w") as log:  # the demo's table and progress
            status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
        if status:
            sys.exit(f"ssr-smoe-demo exited with {status}: see {run_dir / 'log.txt'}")
        results = json.loads((run_dir / "results.json").read_text())
        nonfinite = non_finite_losses(run_dir / "steps.csv")
        bad += sum(count for count, _ in nonfinite.values())
        losses += sum(total for _, total in nonfinite.values())
        for router in args.routers:
            sinkhorn = results["routers"][router]["sinkhorn"]
            cells = [value, router, f"{sum(sinkhorn) / len(sinkhorn):.1f}", str(nonfinite[router][0])]
            for key, _, decimals in METRICS:
                d = results["paired"]["softmax"][router][key]
                if d["mean"] is None:  # not measured (--attack 0)
                    cells.append("-")
                    continue
                cells.append(f"{d['mean']:+.{decimals}f} [{d['low']:+.{decimals}f}, {d['high']:+.{decimals}f}]"
                             + ("*" if d["excludes_zero"] else ""))
            rows.append(cells)
    print(f"Paired against softmax top-k over {args.seeds} seeds of {args.steps} steps "
          f"({' '.join(args.demo_options) or 'the demo defaults'}): mean difference [95% interval], * where the "
          "interval excludes zero; Sinkhorn calls: per run, mean over seeds.\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    print(f"\n{losses} training losses (softmax top-k's included), {bad} not finite")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
