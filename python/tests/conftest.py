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


@pytest.fixture
def logits():
    return make_logits
