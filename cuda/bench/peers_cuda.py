#!/usr/bin/env python3
"""GPU routing: ssr's CUDA backend against the PyTorch code engines write themselves, in one run.

Runs ssr_cuda_bench (Google Benchmark, JSON) and, on the same GPU, shapes and logit distribution
(N(0, 1) - 4 j / n), the PyTorch peers:
  * softmax top-k: torch.softmax + torch.topk (+ renormalisation of the k weights), float32 and bfloat16;
  * the Megatron-LM-style Sinkhorn loop (alternating row and column normalisation of exp(S / xi), one
    host synchronisation per iteration for its stopping test), stopping on ssr's rule: the normalised L1
    column error of the row-normalised plan below tol = 1e-4, at most 100 iterations; then top-k of the
    plan. Iteration counts of both sides are printed.
and prints each ssr time, each peer time and their ratio, and ssr's fraction of memory bandwidth; then,
when ssr_torch is importable, the PyTorch operator torch.ops.ssr.route at the paper's shape against the same
peers (float32 and bfloat16 logits; the operator's time includes its dispatch and output tensors).

usage: python3 cuda/bench/peers_cuda.py --bench build/cuda/bench/ssr_cuda_bench [--json OUT.json]
"""
import argparse
import json
import statistics
import subprocess
import sys

try:
    import torch
except ImportError:  # the peers need PyTorch with CUDA
    sys.exit("peers_cuda.py: PyTorch is not installed")


def logits(m, n, dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(1)
    s = torch.randn(m, n, device="cuda", generator=g) - 4.0 * torch.arange(n, device="cuda") / n
    return s.to(dtype)


def cuda_time(fn, reps=50, warmup=5):
    """Median seconds of fn() on the GPU, from CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return statistics.median(times)


def torch_softmax_topk(s, k):
    p = torch.softmax(s.float(), dim=-1)
    w, e = torch.topk(p, k, dim=-1)
    return e, w / w.sum(dim=-1, keepdim=True)


def megatron_sinkhorn_topk(s, k, xi=0.5, tol=1e-4, max_iters=100):
    """Megatron-LM's sinkhorn() loop on exp(S / xi), stopping on ssr's column-error rule."""
    m, n = s.shape
    cost = torch.exp(s / xi)
    d0 = torch.ones(m, device=s.device, dtype=s.dtype)
    d1 = torch.ones(n, device=s.device, dtype=s.dtype)
    eps = 1e-8
    iterations = 0
    while True:
        d0 = (1 / m) / (torch.sum(d1 * cost, 1) + eps)
        col = torch.sum(d0.unsqueeze(1) * cost, 0)
        iterations += 1
        # Plan m * d0 cost d1 has rows summing to 1; its column error, as ssr defines it.
        err = torch.sum(torch.abs(m * d1 * col - m / n)) / m
        if err.item() < tol or iterations >= max_iters:  # the host synchronisation Megatron's loop makes
            break
        d1 = (1 / n) / (col + eps)
    plan = d1 * cost * d0.unsqueeze(1)
    w, e = torch.topk(plan, k, dim=-1)
    return e, w / w.sum(dim=-1, keepdim=True), iterations


def run_bench(path, extra):
    cmd = [path, "--benchmark_format=json"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {b["name"]: b for b in json.loads(out)["benchmarks"]}


def seconds(b):
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
    return b["real_time"] * scale


# bench_cuda.cu's routing_shapes: the paper's, Mixtral's, Switch's and DeepSeek-V3's (n, k) at two batch sizes,
# and the decode-sized batches of published fused routers.
SOFTMAX_SHAPES = [(m, n, k) for m in (24576, 1 << 20) for n, k in ((16, 2), (8, 2), (128, 1), (256, 8))] + [
    (4096, 128, 8), (8192, 256, 8)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/cuda/bench/ssr_cuda_bench")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("peers_cuda.py: no CUDA device visible to PyTorch")

    ssr = run_bench(args.bench, ["--benchmark_min_time=0.2"])
    copy = next(b for name, b in ssr.items() if name.startswith("BM_CopyBandwidth"))
    print(f"GPU: {torch.cuda.get_device_name()}  copy {copy['copy_GB/s']:.0f} GB/s  peak {copy['peak_GB/s']:.0f} GB/s")
    rows = []

    print("\nsoftmax top-k (ssr: fused kernel; peer: torch.softmax + torch.topk)")
    print(f"{'dtype':>9} {'m':>8} {'n':>4} {'k':>2} {'ssr us':>9} {'torch us':>9} {'ratio':>6} {'ssr GB/s':>9} {'of copy':>8}")
    for dtype, tag in ((torch.float32, "float"), (torch.bfloat16, "__nv_bfloat16")):
        for m, n, k in SOFTMAX_SHAPES:
            b = ssr.get(f"BM_FusedSoftmaxTopK<{tag}>/{m}/{n}/{k}/manual_time")
            if b is None:
                continue
            s = logits(m, n, dtype)
            t = cuda_time(lambda: torch_softmax_topk(s, k))
            rows.append({"what": "softmax_topk", "dtype": str(dtype), "m": m, "n": n, "k": k, "ssr_s": seconds(b),
                         "torch_s": t, "ssr_GBps": b["GB/s"], "frac_copy": b["frac_copy"]})
            print(f"{tag[:9]:>9} {m:>8} {n:>4} {k:>2} {seconds(b) * 1e6:9.1f} {t * 1e6:9.1f} {t / seconds(b):6.1f} "
                  f"{b['GB/s']:9.0f} {b['frac_copy']:8.2f}")

    print("\nSinkhorn top-k, converged (tol 1e-4; ssr: Router<SinkhornTopK, CudaBackend<float>>, finiteness checked;"
          " peer: Megatron-style loop)")
    print(f"{'m':>8} {'n':>4} {'k':>2} {'xi':>5} {'ssr us':>9} {'iters':>5} {'torch us':>9} {'iters':>5} {'ratio':>6}")
    unchecked = []
    for name, b in ssr.items():
        if not name.startswith("BM_SinkhornSolve/"):
            continue
        m, n, k, xi, checked = (int(v) for v in name.split("/")[1:6])
        xi /= 1000
        if not checked:
            unchecked.append((m, n, k, xi, b))
            continue
        s = logits(m, n)
        iters = megatron_sinkhorn_topk(s, k, xi)[2]
        t = cuda_time(lambda: megatron_sinkhorn_topk(s, k, xi), reps=20)
        rows.append({"what": "sinkhorn_solve", "m": m, "n": n, "k": k, "xi": xi, "ssr_s": seconds(b),
                     "ssr_iterations": b["iterations"], "torch_s": t, "torch_iterations": iters})
        print(f"{m:>8} {n:>4} {k:>2} {xi:5.2f} {seconds(b) * 1e6:9.1f} {int(b['iterations']):5d} {t * 1e6:9.1f} {iters:5d} "
              f"{t / seconds(b):6.1f}")

    print("\nthe same route unchecked (no finiteness check), and the fused solve alone (converged, from a built kernel)")
    for m, n, k, xi, b in unchecked:
        rows.append({"what": "sinkhorn_route_unchecked", "m": m, "n": n, "k": k, "xi": xi, "ssr_s": seconds(b),
                     "ssr_iterations": b["iterations"]})
        print(f"{m:>8} {n:>4} {k:>2} {xi:5.2f} {seconds(b) * 1e6:9.1f} us  {int(b['iterations'])} iterations, route unchecked")
    for name, b in ssr.items():
        if name.startswith("BM_SinkhornConvergedSolve/"):
            m, n = (int(v) for v in name.split("/")[1:3])
            rows.append({"what": "sinkhorn_solve_alone", "m": m, "n": n, "ssr_s": seconds(b),
                         "ssr_iterations": b["iterations"]})
            print(f"{m:>8} {n:>4}  -  0.50 {seconds(b) * 1e6:9.1f} us  {int(b['iterations'])} iterations, solve alone")

    print("\none fused Sinkhorn iteration (reads the m x n kernel once)")
    print(f"{'m':>8} {'n':>4} {'us/iter':>8} {'GB/s':>6} {'of copy':>8} {'of peak':>8}")
    for name, b in ssr.items():
        if name.startswith("BM_SinkhornIteration/"):
            m, n = (int(v) for v in name.split("/")[1:3])
            rows.append({"what": "sinkhorn_iteration", "m": m, "n": n, "ns_per_iteration": b["ns_per_iteration"],
                         "GBps": b["GB/s"], "frac_copy": b["frac_copy"], "frac_peak": b.get("frac_peak", 0)})
            print(f"{m:>8} {n:>4} {b['ns_per_iteration'] * 1e-3:8.1f} {b['GB/s']:6.0f} {b['frac_copy']:8.2f} "
                  f"{b.get('frac_peak', 0):8.2f}")

    print("\nwhole routing call, softmax top-k with load (checked: one read-back; unchecked: nothing waits)")
    for name, b in ssr.items():
        if name.startswith("BM_RouteSoftmaxTopK/"):
            m, n, k, checked = (int(v) for v in name.split("/")[1:5])
            rows.append({"what": "route_softmax_topk", "m": m, "n": n, "k": k, "checked": bool(checked),
                         "ssr_s": seconds(b)})
            print(f"{m:>8} {n:>4} {k:>2} {'checked' if checked else 'unchecked':>9} {seconds(b) * 1e6:9.1f} us")

    try:
        import ssr_torch
    except ImportError as e:
        print(f"\nthe PyTorch operator: not run (cannot import ssr_torch: {e})")
    else:
        print("\nthe PyTorch operator torch.ops.ssr.route at the paper's shape (24576 x 16, top-2), against the peers")
        print(f"{'logits':>9} {'ssr.route':>26} {'us':>8} {'peer':>28} {'us':>8} {'peer/ssr':>8}")
        for dtype in (torch.float32, torch.bfloat16):
            s = logits(24576, 16, dtype)
            for policy, peer_name, peer in (("softmax", "torch.softmax + torch.topk", lambda: torch_softmax_topk(s, 2)),
                                            ("sinkhorn", "Megatron-style loop", lambda: megatron_sinkhorn_topk(s.float(), 2))):
                t_ssr = cuda_time(lambda: ssr_torch.route(s, policy, 2), reps=50)
                t_peer = cuda_time(peer, reps=20)
                rows.append({"what": "torch_op", "policy": policy, "dtype": str(dtype), "m": 24576, "n": 16, "k": 2,
                             "ssr_s": t_ssr, "peer": peer_name, "peer_s": t_peer})
                print(f"{str(dtype)[6:]:>9} {policy:>26} {t_ssr * 1e6:8.1f} {peer_name:>28} {t_peer * 1e6:8.1f} "
                      f"{t_peer / t_ssr:8.1f}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "copy_GBps": copy["copy_GB/s"],
                       "peak_GBps": copy["peak_GB/s"], "rows": rows, "ssr_raw": ssr}, f, indent=1)


if __name__ == "__main__":
    main()
