"""torch.ops.ssr against plain PyTorch implementations of the same routers: values, gradients, opcheck,
and errors that name the argument."""
import pytest
import torch

from conftest import make_logits, plain_sinkhorn

route = torch.ops.ssr.route


def test_softmax_topk_matches_plain_pytorch():
    s = make_logits(300, 16, 1)
    experts, weights, load, info = route(s, "softmax", 3)
    vals, idx = torch.topk(s, 3, dim=1)
    assert torch.equal(experts.long(), idx)
    torch.testing.assert_close(weights, torch.softmax(vals, dim=1), rtol=1e-12, atol=1e-12)
    assert torch.equal(load.long(), torch.bincount(idx.flatten(), minlength=16))
    assert info[0].item() == 0.0 and info[1].item() == 1.0


@pytest.mark.parametrize("cost", ["linear", "softmax"])
def test_sinkhorn_plan_weights_match_plain_pytorch(cost):
    s = make_logits(400, 8, 2)
    c = s if cost == "linear" else torch.softmax(s, dim=1)
    plan = plain_sinkhorn(c, 0.5, 1e-11, 100000)
    experts, weights, _, info = route(s, "sinkhorn", 2, cost, 0.5, 1e-11, 100000, "plan")
    ref = plan.gather(1, experts.long())
    torch.testing.assert_close(weights, ref / ref.sum(1, keepdim=True), rtol=1e-8, atol=1e-9)
    assert torch.equal(experts.long(), torch.topk(plan, 2, dim=1).indices)
    assert info[0].item() == 1.0 and info[1].item() == 0.0
    assert info[3].item() < 1e-11 and 1 <= info[2].item() < 100000
    # Stopped by max_iters: info counts them and keeps the error it stopped at.
    info = route(s, "sinkhorn", 2, cost, 0.5, 1e-11, 3, "plan")[3]
    assert info.dtype == torch.float64 and info.shape == (4,)
    assert info[2].item() == 3.0 and info[3].item() > 1e-11


def test_softmax_gradient_matches_autograd_of_plain_pytorch():
    s = make_logits(50, 8, 3).requires_grad_()
    g = torch.randn(50, 2, dtype=torch.float64)
    experts, weights, _, _ = route(s, "softmax", 2)
    (weights * g).sum().backward()
    s2 = s.detach().clone().requires_grad_()
    (torch.softmax(s2.gather(1, experts.long()), dim=1) * g).sum().backward()
    torch.testing.assert_close(s.grad, s2.grad, rtol=1e-12, atol=1e-12)


def test_gradcheck_in_double():
    s = make_logits(20, 6, 4).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: route(x, "softmax", 2)[1], (s,))
    assert torch.autograd.gradcheck(lambda x: route(x, "sinkhorn", 2, "linear", 0.5, 1e-12, 10000, "scores")[1], (s,))


def test_only_the_weights_carry_gradient_and_only_where_the_logits_ask_for_it():
    for needs_gradient in (False, True):
        s = make_logits(30, 8, 6).requires_grad_(needs_gradient)
        for policy in ("softmax", "sinkhorn"):
            experts, weights, load, info = route(s, policy, 2, weights="scores")
            assert not experts.requires_grad and not load.requires_grad and not info.requires_grad
            assert weights.requires_grad == needs_gradient and (weights.grad_fn is not None) == needs_gradient
            with torch.no_grad():
                assert not route(s, policy, 2, weights="scores")[1].requires_grad


def test_plan_weights_pass_no_gradient():
    s = make_logits(40, 8, 5).requires_grad_()
    _, weights, _, _ = route(s, "sinkhorn", 2)
    weights.sum().backward()
    assert s.grad.abs().max().item() == 0.0


# opcheck's AOT dispatch test adds up every output starting with the first, here int32 experts, and then
# cannot add the float weights to that integer sum: route is checked by its other tests, and the compiled
# MoE layer of test_router.py runs it through AOT autograd.
ROUTE_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.mark.parametrize("policy", ["softmax", "sinkhorn", "selective", "ssr"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(policy, dtype):
    s = make_logits(64, 8, 6, dtype=dtype).requires_grad_()
    torch.library.opcheck(torch.ops.ssr.route.default, (s, policy, 2, "linear", 0.5, 1e-4, 100, "scores", 0.5),
                          test_utils=ROUTE_CHECKS)
    experts, weights, _, info = route(s.detach(), policy, 2, weights="scores", p=0.5)
    g = torch.randn_like(weights)
    torch.library.opcheck(torch.ops.ssr.route_backward.default, (g, experts, weights, 8, True, info))


def test_float32_weights_and_first_row():
    experts, weights, _, _ = route(make_logits(10, 4, 6, dtype=torch.float32), "softmax", 2)
    assert weights.dtype == torch.float32
    # A shard starting at global row r draws the noise of rows r, r + 1, ... of the whole matrix.
    s = make_logits(100, 8, 7)
    whole = route(s, "softmax", 2, noise_alpha=1.0, step=3)[0]
    shard = route(s[40:], "softmax", 2, noise_alpha=1.0, step=3, first_row=40)[0]
    assert torch.equal(whole[40:], shard)


@pytest.mark.parametrize("args, message", [
    (("softmax", 0), "k = 0"),
    (("sinkhorn", 2, "linear", -1.0), "xi = -1"),
    (("sinkhorn", 2, "quadratic"), "cost = quadratic"),
    (("sinkorn", 2), "router = sinkorn"),
    (("sinkhorn", 2, "linear", 0.5, 1e-4, 100, "plans"), "weights = plans"),
    (("softmax", 5), "k = 5"),
    (("softmax", 2 ** 33), r"k = 8589934592: must be in \[1, 2\^31\)"),
])
def test_bad_arguments_name_themselves(args, message):
    with pytest.raises(RuntimeError, match=message):
        route(make_logits(10, 4, 6), *args)


def test_non_finite_logits_are_named():
    bad = make_logits(10, 4, 6)
    bad[3, 1] = float("nan")
    with pytest.raises(RuntimeError, match=r"logits\(3, 1\) = nan"):
        route(bad, "softmax", 2)
    with pytest.raises(RuntimeError, match="2-d"):
        route(torch.zeros(3), "softmax", 1)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        route(torch.zeros(3, 4, dtype=torch.int32), "softmax", 1)


def test_route_backward_rejects_tensors_that_do_not_match_the_experts():
    experts = torch.zeros(1000, 2, dtype=torch.int32)
    half = torch.full((1000, 2), 0.5, dtype=torch.float64)
    backward = torch.ops.ssr.route_backward
    with pytest.raises(RuntimeError, match="grad_weights must be m x k"):
        backward(torch.ones(1, 2, dtype=torch.float64), experts, half, 4, True)
    with pytest.raises(RuntimeError, match="weights must be m x k"):
        backward(half, experts, torch.full((10, 2), 0.5, dtype=torch.float64), 4, True)
    with pytest.raises(RuntimeError, match="logits must be m x n"):
        backward(half, experts, half, 8, True, None, "sigmoid", torch.zeros(1, 1, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="experts must be m x k int32"):
        backward(half, experts.long(), half, 4, True)
    with pytest.raises(RuntimeError, match="n = 0"):
        backward(half, experts, half, 0, True)
    with pytest.raises(RuntimeError, match=r"experts must lie in \[0, 4\), got 0 to 4"):
        backward(half, experts.index_fill(0, torch.tensor([7]), 4), half, 4, True)


def test_logits_of_no_experts_raise_on_every_path():
    for policy in ("softmax", "sinkhorn", "ssr"):
        with pytest.raises(RuntimeError, match="logits.cols = 0"):
            route(torch.zeros(5, 0), policy, 1)


def test_a_non_finite_upstream_gradient_flows_on_as_torch_passes_it():
    # Score weights pass it into the logits' gradient (a gradient scaler reads it as an overflow); plan
    # weights pass no gradient at all.
    up = torch.tensor([float("inf"), 1.0], dtype=torch.float64)
    for policy, weights, passes in (("softmax", "plan", True), ("sinkhorn", "scores", True),
                                    ("sinkhorn", "plan", False)):
        x = make_logits(16, 4, 2).requires_grad_()
        (route(x, policy, 2, weights=weights)[1] * up).sum().backward()
        assert (not torch.isfinite(x.grad).all()) if passes else torch.equal(x.grad, torch.zeros_like(x))


def test_a_second_derivative_raises_rather_than_reading_as_zero():
    x = make_logits(10, 4, 3).requires_grad_()
    for weights in (route(x, "softmax", 2)[1], torch.ops.ssr.replay_weights(x, torch.tensor([[0, 1]] * 10))):
        (g,) = torch.autograd.grad((weights ** 2).sum(), x, create_graph=True)
        with pytest.raises(RuntimeError, match="not implemented"):
            g.sum().backward()


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_a_repeated_expert_gets_the_gradient_of_each_of_its_slots(score):
    # The weights of a row that names an expert twice are the scores' normalisation over its slots, each
    # slot a term; the expert's gradient is the sum over its slots.
    s = torch.tensor([[0.0, 1.0, 2.0], [0.5, -1.0, 0.25]], dtype=torch.float64, requires_grad=True)
    experts = torch.tensor([[0, 0, 1], [2, 1, 2]])
    assert torch.autograd.gradcheck(lambda x: torch.ops.ssr.replay_weights(x, experts, score), (s,))
