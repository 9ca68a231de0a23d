"""torch.ops.ssr against plain PyTorch implementations of the same routers: values and gradients.

Usage: python3 test_ssr_torch.py path/to/libssr_torch.so
"""
import math
import sys
import unittest

import torch

torch.ops.load_library(sys.argv.pop(1))
route = torch.ops.ssr.route


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


def logits(m, n, seed, skew=3.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, n, generator=gen, dtype=torch.float64) - skew * torch.arange(n, dtype=torch.float64) / n


class RouteOps(unittest.TestCase):
    def test_softmax_topk_matches_plain_pytorch(self):
        s = logits(300, 16, 1)
        experts, weights, load, info = route(s, "softmax", 3)
        vals, idx = torch.topk(s, 3, dim=1)
        self.assertTrue(torch.equal(experts.long(), idx))
        torch.testing.assert_close(weights, torch.softmax(vals, dim=1), rtol=1e-12, atol=1e-12)
        self.assertTrue(torch.equal(load.long(), torch.bincount(idx.flatten(), minlength=16)))
        self.assertEqual(info[0].item(), 0.0)

    def test_sinkhorn_plan_weights_match_plain_pytorch(self):
        for cost in ("linear", "softmax"):
            s = logits(400, 8, 2)
            c = s if cost == "linear" else torch.softmax(s, dim=1)
            plan = plain_sinkhorn(c, 0.5, 1e-11, 100000)
            experts, weights, _, info = route(s, "sinkhorn", 2, cost, 0.5, 1e-11, 100000, "plan")
            ref = plan.gather(1, experts.long())
            torch.testing.assert_close(weights, ref / ref.sum(1, keepdim=True), rtol=1e-8, atol=1e-9)
            self.assertTrue(torch.equal(experts.long(), torch.topk(plan, 2, dim=1).indices))
            self.assertEqual(info[0].item(), 1.0)
            self.assertLess(info[3].item(), 1e-11)

    def test_softmax_gradient_matches_autograd_of_plain_pytorch(self):
        s = logits(50, 8, 3).requires_grad_()
        g = torch.randn(50, 2, dtype=torch.float64)
        experts, weights, _, _ = route(s, "softmax", 2)
        (weights * g).sum().backward()
        s2 = s.detach().clone().requires_grad_()
        (torch.softmax(s2.gather(1, experts.long()), dim=1) * g).sum().backward()
        torch.testing.assert_close(s.grad, s2.grad, rtol=1e-12, atol=1e-12)

    def test_gradcheck(self):
        s = logits(20, 6, 4).requires_grad_()
        self.assertTrue(torch.autograd.gradcheck(lambda x: route(x, "softmax", 2)[1], (s,)))
        self.assertTrue(torch.autograd.gradcheck(
            lambda x: route(x, "sinkhorn", 2, "linear", 0.5, 1e-12, 10000, "scores")[1], (s,)))

    def test_plan_weights_pass_no_gradient(self):
        s = logits(40, 8, 5).requires_grad_()
        _, weights, _, _ = route(s, "sinkhorn", 2)
        weights.sum().backward()
        self.assertEqual(s.grad.abs().max().item(), 0.0)

    def test_float32_and_errors(self):
        experts, weights, _, _ = route(logits(10, 4, 6).float(), "softmax", 2)
        self.assertEqual(weights.dtype, torch.float32)
        with self.assertRaisesRegex(RuntimeError, "k = 0"):
            route(logits(10, 4, 6), "softmax", 0)
        with self.assertRaisesRegex(RuntimeError, "xi = -1"):
            route(logits(10, 4, 6), "sinkhorn", 2, "linear", -1.0)
        bad = logits(10, 4, 6)
        bad[3, 1] = float("nan")
        with self.assertRaisesRegex(RuntimeError, r"logits\(3, 1\) = nan"):
            route(bad, "softmax", 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
