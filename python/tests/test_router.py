"""ssr_torch.Router: the routers by name, training and evaluation, the step counter, torch.compile, and
the balancing losses."""
import pytest
import torch

import ssr_torch
from conftest import make_logits


def test_router_by_name_routes_as_the_operator():
    s = make_logits(200, 8, 1, dtype=torch.float32)
    for name in ssr_torch.ROUTERS:
        router = ssr_torch.Router(name, k=2, p=0.5, noise_alpha=0.1, seed=3, layer=2)
        experts, weights = router(s)
        ref = torch.ops.ssr.route(s, name, 2, "linear", 0.5, 1e-4, 100, "plan", 0.5, 0.1, 1.0, 3, 0, 2, True)
        assert torch.equal(experts, ref[0]) and torch.equal(weights, ref[1])
        assert torch.equal(router.load, ref[2]) and torch.equal(router.info, ref[3])


def test_training_counts_steps_and_evaluation_routes_by_softmax():
    s = make_logits(200, 8, 2)
    router = ssr_torch.Router("sinkhorn", k=2)
    router(s)
    router(s)
    assert router.step == 2 and router.info[0].item() == 1.0
    router.eval()
    experts, weights = router(s)
    assert router.step == 2 and router.info[0].item() == 0.0
    assert experts.dtype == torch.int64  # indices as torch's own ops take them
    assert torch.equal(experts, torch.topk(s, 2, dim=1).indices)
    router.train()
    router(s, step=100)  # an engine's own step counter
    assert router.step == 2


def test_selective_router_takes_sinkhorn_with_frequency_p():
    s = make_logits(32, 4, 3)
    router = ssr_torch.Router("ssr", k=1, p=0.25)
    taken = sum(int(router(s) and router.info[0].item()) for _ in range(2000))
    assert abs(taken / 2000 - 0.25) < 5 * (0.25 * 0.75 / 2000) ** 0.5


@pytest.mark.parametrize("kwargs, message", [
    ({"router": "balanced"}, "router = 'balanced'"), ({"k": 0}, "k = 0"), ({"p": 2.0}, "p = 2.0"),
    ({"xi": 0.0}, "xi = 0.0"), ({"cost": "cubic"}, "cost = 'cubic'"), ({"noise_sigma": 0}, "noise_sigma = 0"),
])
def test_bad_options_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ssr_torch.Router(**kwargs)


class MoE(torch.nn.Module):
    def __init__(self, d=16, n=8, k=2):
        super().__init__()
        self.gate = torch.nn.Linear(d, n, bias=False)
        self.experts = torch.nn.Parameter(torch.randn(n, d, d) / d ** 0.5)
        self.router = ssr_torch.Router("sinkhorn", k=k, weights="scores")

    def forward(self, x, step):
        experts, weights = self.router(self.gate(x), step=step)
        chosen = self.experts[experts]                            # m x k x d x d
        out = torch.einsum("mkde,me->mkd", chosen, x)
        return (weights.unsqueeze(-1) * out).sum(1)


def test_compiled_moe_layer_matches_eager_without_graph_breaks():
    torch.manual_seed(0)
    layer = MoE()
    x = torch.randn(128, 16)
    eager = layer(x, 0)
    compiled = torch.compile(layer, fullgraph=True)(x, 0)  # inductor: the whole layer one graph
    torch.testing.assert_close(compiled, eager)
    # And the gradient through the compiled graph (AOT autograd, eager kernels).
    grad_eager = torch.autograd.grad(layer(x, 1).square().sum(), layer.gate.weight)[0]
    grad_compiled = torch.autograd.grad(torch.compile(layer, fullgraph=True, backend="aot_eager")(x, 1).square().sum(),
                                        layer.gate.weight)[0]
    torch.testing.assert_close(grad_compiled, grad_eager)


def test_losses_match_their_formulas_and_are_differentiable():
    s = make_logits(30, 6, 4).requires_grad_()
    experts = torch.topk(s, 2, dim=1).indices
    lb = ssr_torch.load_balancing_loss(s, experts)
    f = torch.bincount(experts.flatten(), minlength=6).double() / experts.numel()
    assert lb.item() == pytest.approx(6 * (f * torch.softmax(s, 1).mean(0)).sum().item())
    z = ssr_torch.z_loss(s)
    assert z.item() == pytest.approx(torch.logsumexp(s, 1).square().mean().item())
    assert torch.autograd.gradcheck(lambda x: ssr_torch.load_balancing_loss(x, experts), (s,))
    assert torch.autograd.gradcheck(ssr_torch.z_loss, (s,))
    # Uniform logits: the load-balancing loss is exactly 1.
    u = torch.zeros(4, 2, dtype=torch.float64)
    assert ssr_torch.load_balancing_loss(u, torch.tensor([[0], [1], [0], [1]])).item() == pytest.approx(1.0)


def test_version_is_the_libraries():
    assert ssr_torch.__version__.count(".") == 2
