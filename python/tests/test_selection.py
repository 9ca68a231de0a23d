"""The selection rules of today's engines through the operator and the Router: sigmoid scores, the expert
bias, group-limited top-k (against a plain PyTorch version in the style of DeepSeek-V3's and vLLM's grouped
top-k), their gradients, the balancing losses and the expert-bias update."""
import pytest
import torch

import ssr_torch
from conftest import make_logits

route = torch.ops.ssr.route


def plain_grouped_topk(s, k, score, n_groups, topk_groups, bias=None):
    """Experts and weights by the definitions, in plain PyTorch (ties: torch.topk's, none in random logits)."""
    scores = torch.softmax(s, dim=1) if score == "softmax" else torch.sigmoid(s)
    values = scores + (0 if bias is None else bias.to(s.dtype))
    m, n = s.shape
    grouped = values.view(m, n_groups, n // n_groups)
    group_scores = grouped.topk(min(2, n // n_groups), dim=2).values.sum(2)
    keep = torch.zeros(m, n_groups, dtype=torch.bool)
    keep.scatter_(1, group_scores.topk(topk_groups, dim=1).indices, True)
    masked = values.masked_fill(~keep.repeat_interleave(n // n_groups, dim=1), float("-inf"))
    experts = masked.topk(k, dim=1).indices
    chosen = scores.gather(1, experts)
    return experts, chosen / chosen.sum(1, keepdim=True)


def call(s, k, score, n_groups=1, topk_groups=1, bias=None, policy="softmax"):
    return ssr_torch.route(s, policy, k, training=True, score=score, n_groups=n_groups, topk_groups=topk_groups,
                           expert_bias=bias)


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("groups", [(1, 1), (4, 2), (8, 3)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_selection_matches_plain_pytorch(score, groups, with_bias):
    s = make_logits(400, 16, 11)
    bias = (0.2 * torch.randn(16, generator=torch.Generator().manual_seed(3))).float() if with_bias else None
    experts, weights, load, info = call(s, 3, score, *groups, bias)
    ref_experts, ref_weights = plain_grouped_topk(s, 3, score, *groups, bias)
    assert torch.equal(experts.long(), ref_experts)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-12, atol=1e-12)
    assert torch.equal(load.long(), torch.bincount(ref_experts.flatten(), minlength=16))


def test_sigmoid_gradient_matches_autograd_of_plain_pytorch_and_gradcheck():
    s = make_logits(40, 8, 12).requires_grad_()
    bias = torch.linspace(-0.2, 0.2, 8)
    g = torch.randn(40, 2, dtype=torch.float64)
    experts, weights, _, _ = call(s, 2, "sigmoid", 4, 2, bias)
    (weights * g).sum().backward()
    s2 = s.detach().clone().requires_grad_()
    chosen = torch.sigmoid(s2).gather(1, experts.long())
    (chosen / chosen.sum(1, keepdim=True) * g).sum().backward()
    torch.testing.assert_close(s.grad, s2.grad, rtol=1e-12, atol=1e-12)
    x = make_logits(12, 8, 13).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: call(t, 2, "sigmoid", 4, 2, bias)[1], (x,))
    # S-BASE with sigmoid scores: the Sinkhorn plan selects, the sigmoid weights pass their gradient.
    assert torch.autograd.gradcheck(
        lambda t: route(t, "sinkhorn", 2, "linear", 0.5, 1e-12, 10000, "scores", score="sigmoid")[1], (x,))


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_opcheck_with_selection(score):
    s = make_logits(30, 8, 14).requires_grad_()
    bias = torch.zeros(8)
    args = (s, "softmax", 2, "linear", 0.5, 1e-4, 100, "plan", 1e-3, 0.0, 1.0, 0, 0, 0, True, 0, "", score, 4, 2, bias)
    torch.library.opcheck(torch.ops.ssr.route.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(score="tanh"), "score = tanh"),
    (dict(score="softmax", n_groups=3, topk_groups=1), "must divide the number of experts"),
    (dict(score="softmax", n_groups=4, topk_groups=5), "topk_groups = 5"),
    (dict(score="softmax", n_groups=8, topk_groups=1), "k = 2: must be at most topk_groups * n / n_groups = 1"),
    (dict(score="softmax", bias=torch.zeros(7)), "expert_bias has size 7, expected 8"),
    (dict(score="softmax", bias=torch.zeros(8, dtype=torch.float64)), "expert_bias must be float32"),
    (dict(score="softmax", bias=torch.zeros(8, 2)[:, 0]), "contiguous 1-d"),
    (dict(score="sigmoid", bias=torch.full((8,), float("nan"))), "expert_bias must be finite"),
    (dict(score="softmax", n_groups=4, topk_groups=2, policy="ssr"), "Sinkhorn path"),
])
def test_bad_selections_name_themselves(kwargs, message):
    s = make_logits(10, 8, 15)
    with pytest.raises(RuntimeError, match=message.replace("*", r"\*").replace("(", r"\(")):
        call(s, 2, **kwargs)


def test_router_with_expert_bias_balances_a_skewed_batch():
    torch.manual_seed(0)
    s = (torch.randn(512, 8) - torch.linspace(0, 4, 8)).double()
    router = ssr_torch.Router("softmax", k=2, score="sigmoid", n_experts=8, expert_bias=True, bias_update_rate=1e-3)
    assert "expert_bias" in router.state_dict()
    router.train()
    router(s)
    first = router.load.max().item()
    for _ in range(300):
        router(s)
    assert first > 2 * 128 and router.load.max().item() < 1.2 * 128
    # Evaluation selects with the learned bias and leaves it alone.
    bias = router.expert_bias.clone()
    router.eval()
    experts, _ = router(s)
    assert torch.equal(router.expert_bias, bias)
    assert torch.equal(experts, plain_grouped_topk(s, 2, "sigmoid", 1, 1, bias)[0])
    with pytest.raises(ValueError, match="n_experts"):
        ssr_torch.Router(expert_bias=True)
    with pytest.raises(ValueError, match="bias_update_rate needs expert_bias"):
        ssr_torch.Router(bias_update_rate=0.1)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_router_recomputes_its_forward_and_updates_once(reentrant):
    """Activation checkpointing runs forward again inside backward: the recompute routes as the forward did
    (its step's random numbers, the bias before the forward's update), and neither counts nor updates again."""
    routers = {"bias": ssr_torch.Router("softmax", k=2, score="sigmoid", n_experts=8, expert_bias=True,
                                        bias_update_rate=0.5),
               "noise": ssr_torch.Router("ssr", k=2, p=0.5, noise_alpha=1.0, seed=3)}
    for name, router in routers.items():
        reference = ssr_torch.Router("softmax", k=2, score="sigmoid", n_experts=8, expert_bias=True,
                                     bias_update_rate=0.5) if name == "bias" else None
        seen = []

        def layer(x):
            experts, weights = router(x)
            seen.append(experts.clone())
            return weights.sum() * x.sum(0)

        for step in range(3):
            x = make_logits(32, 8, step).float().requires_grad_()
            torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=reentrant).sum().backward()
            if reference is not None:
                reference(x.detach())
        assert router.step == 3, name
        assert len(seen) == 6 and all(torch.equal(seen[i], seen[i + 1]) for i in (0, 2, 4)), name
        if reference is not None:
            assert torch.equal(router.expert_bias, reference.expert_bias)  # three updates, not six


def test_router_with_selection_compiles_without_graph_breaks():
    router = ssr_torch.Router("softmax", k=2, score="sigmoid", n_groups=4, topk_groups=2, n_experts=8,
                              expert_bias=True, bias_update_rate=1e-3)
    router.train()
    s = make_logits(64, 8, 16).float()
    compiled = torch.compile(lambda x: router(x, step=0)[1], fullgraph=True, backend="aot_eager")
    eager = ssr_torch.Router("softmax", k=2, score="sigmoid", n_groups=4, topk_groups=2, n_experts=8,
                             expert_bias=True, bias_update_rate=1e-3)
    eager.train()
    torch.testing.assert_close(compiled(s), eager(s, step=0)[1])
    torch.testing.assert_close(router.expert_bias, eager.expert_bias)


def test_balancing_losses_in_float16_count_beyond_its_range():
    # 2^17 tokens of 8 experts, top-2, 70000 assignments to expert 0: it and k * tokens exceed float16's
    # 65504. With uniform scores every loss is alpha * (the shares' sum) = alpha. (bfloat16 holds any count,
    # and rounds one no more than it rounds the loss itself, so no bfloat16 case could show a count's error.)
    n, k, tokens = 8, 2, 1 << 17
    logits = torch.zeros(tokens, n, dtype=torch.float16)
    assignments = torch.arange(k * tokens) % (n - 1) + 1
    assignments[:70000] = 0
    experts = assignments.reshape(tokens, k)
    counts = torch.bincount(assignments, minlength=n)
    assert ssr_torch.global_load_balancing_loss(logits, counts, tokens, k).item() == pytest.approx(1.0, rel=1e-2)
    assert ssr_torch.load_balancing_loss(logits, experts).item() == pytest.approx(1.0, rel=1e-2)
    assert ssr_torch.sequence_balance_loss(logits, experts, tokens, 0.5).item() == pytest.approx(0.5, rel=1e-2)


@pytest.mark.parametrize("value, dtype", [(-120.0, torch.float32), (-18.0, torch.float16), (-800.0, torch.float64)])
def test_sigmoid_scores_and_their_losses_stay_finite_where_every_sigmoid_of_a_row_underflows(value, dtype):
    # There sigmoid(x) = exp(x) to the type's precision, so the normalised scores are the softmax.
    logits = torch.full((4, 8), value, dtype=dtype)
    logits[:, 3] += 1
    logits.requires_grad_()
    scores = ssr_torch.normalised_scores(logits, "sigmoid")
    torch.testing.assert_close(scores, torch.softmax(logits.double(), 1).to(dtype))
    experts = torch.tensor([[3, 0]] * 4)
    for loss in (ssr_torch.load_balancing_loss(logits, experts, "sigmoid"),
                 ssr_torch.global_load_balancing_loss(logits, torch.bincount(experts.reshape(-1), minlength=8), 4, 2,
                                                      "sigmoid"),
                 ssr_torch.sequence_balance_loss(logits, experts, 2, 0.1, "sigmoid")):
        (grad,) = torch.autograd.grad(loss, logits)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()


def test_losses_of_no_tokens_and_bias_updates_of_no_finite_rate_raise():
    empty, none = torch.zeros(0, 8), torch.zeros(0, 2, dtype=torch.long)
    for loss in (lambda: ssr_torch.load_balancing_loss(empty, none), lambda: ssr_torch.z_loss(empty),
                 lambda: ssr_torch.sequence_balance_loss(empty, none, 4, 0.1),
                 lambda: ssr_torch.global_load_balancing_loss(empty, torch.zeros(8, dtype=torch.long), 0, 2)):
        with pytest.raises(ValueError, match=r"m x n floating with m, n >= 1, got \(0, 8\)"):
            loss()
    logits, counts = make_logits(4, 8, 1), torch.ones(8, dtype=torch.long)
    with pytest.raises(ValueError, match="tokens = 0 summed over the batch"):
        ssr_torch.global_load_balancing_loss(logits, counts, 0, 2)
    with pytest.raises(ValueError, match="tokens = -1"):
        ssr_torch.global_load_balancing_loss(logits, counts, -1, 2)
    with pytest.raises(ValueError, match=r"experts must lie in \[0, 8\), got 8"):
        ssr_torch.load_balancing_loss(logits, torch.tensor([[0, 8]] * 4))
    for rate in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match=f"rate = {rate}: must be finite and >= 0"):
            ssr_torch.update_expert_bias(torch.zeros(8), counts, rate)


def test_a_call_given_the_engine_s_bias_leaves_the_router_s_own():
    router = ssr_torch.Router("softmax", k=2, score="sigmoid", n_experts=8, expert_bias=True, bias_update_rate=0.1)
    router.train()
    s = make_logits(64, 8, 3) - torch.linspace(0, 4, 8)
    engine_bias = torch.zeros(8)
    router(s, expert_bias=engine_bias)
    assert torch.equal(router.expert_bias, torch.zeros(8)) and torch.equal(engine_bias, torch.zeros(8))
    router(s)
    assert not torch.equal(router.expert_bias, torch.zeros(8))  # its own bias, updated


def test_the_expert_bias_stays_float32_when_the_module_changes_dtype():
    # A model cast with .double(), .half() or .to(bfloat16) keeps its routers' bias in float32, exactly (the
    # operator reads float32, and updates of 1e-3 would vanish in half precision); it follows the device.
    router = ssr_torch.Router("softmax", k=2, score="sigmoid", n_experts=8, expert_bias=True, bias_update_rate=1e-3)
    with torch.no_grad():
        router.expert_bias.copy_(torch.linspace(-1, 1, 8) + 1e-4)
    exact = router.expert_bias.clone()
    for cast in (lambda r: r.half(), lambda r: r.to(torch.bfloat16), lambda r: r.double(), lambda r: r.to("meta")):
        router = cast(router)
        assert router.expert_bias.dtype == torch.float32 and router._routed_bias.dtype == torch.float32
    assert router.expert_bias.device.type == "meta"
    router = ssr_torch.Router("softmax", k=2, score="sigmoid", n_experts=8, expert_bias=True,
                              bias_update_rate=1e-3).double()
    with torch.no_grad():
        router.expert_bias.copy_(exact)
    router.half().float()
    assert torch.equal(router.expert_bias, exact)
    experts, weights = router.train()(make_logits(16, 8, 3))
    assert weights.dtype == torch.float64 and experts.shape == (16, 2)


def test_update_expert_bias_is_exact():
    bias = torch.tensor([0.5, 0.25, 0.0, -1.0])
    ssr_torch.update_expert_bias(bias, torch.tensor([5, 3, 0, 4], dtype=torch.int32), 0.125)
    assert bias.tolist() == [0.375, 0.25, 0.125, -1.125]


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_balancing_losses_agree_where_their_definitions_meet(score):
    s = make_logits(24, 6, 17).requires_grad_()
    experts = route(s.detach(), "softmax", 2)[0]
    lb = ssr_torch.load_balancing_loss(s, experts, score)
    counts = torch.bincount(experts.flatten().long(), minlength=6)
    torch.testing.assert_close(ssr_torch.global_load_balancing_loss(s, counts, 24, 2, score), lb)
    torch.testing.assert_close(ssr_torch.sequence_balance_loss(s, experts, 24, 0.5, score), 0.5 * lb)
    per_sequence = torch.stack([ssr_torch.sequence_balance_loss(s[q * 6:(q + 1) * 6], experts[q * 6:(q + 1) * 6], 6,
                                                                0.5, score) for q in range(4)])
    torch.testing.assert_close(ssr_torch.sequence_balance_loss(s, experts, 6, 0.5, score), per_sequence.mean())
    for loss in (lambda x: ssr_torch.load_balancing_loss(x, experts, score),
                 lambda x: ssr_torch.global_load_balancing_loss(x, counts * 3, 72, 2, score),
                 lambda x: ssr_torch.sequence_balance_loss(x, experts, 6, 0.5, score)):
        assert torch.autograd.gradcheck(loss, (s,))
