"""Shared helpers of the package's tests: plain-PyTorch references, written independently of ssr."""
import math

import pytest
import torch

import ssr_torch  # noqa: F401  registers the operators


def plain_sinkhorn(cost, xi, tol, max_iters):
    """Megatron-style log-domain Sinkhorn: rows sum to 1, columns to m/n."""
    m, n = cost.shape
    k = cost / xi
    g = torch.zeros(n, dtype=cost.dtype)
    for _ in range(max_iters):
        f = -torch.logsumexp(k + g, dim=1)
        plan = torch.exp(k + f[:, None] + g)
        if (plan.sum(0) - m / n).abs().sum() / m < tol:
            break
        g = math.log(m / n) - torch.logsumexp(k + f[:, None], dim=0)
    return plan


def make_logits(m, n, seed, skew=3.0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, n, generator=gen, dtype=torch.float64) - skew * torch.arange(n, dtype=torch.float64) / n).to(dtype)


def run_ranks(worker, args, nprocs, timeout=240):
    """Runs worker(rank, *args) in nprocs spawned processes and waits for them, failing the test (and killing
    them) if they have not finished within timeout seconds: a hang."""
    import time

    import torch.multiprocessing as mp

    context = mp.start_processes(worker, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the ranks did not finish within {timeout} s (a hang)")


@pytest.fixture
def logits():
    return make_logits
