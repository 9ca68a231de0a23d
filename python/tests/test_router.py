"""ssr_torch.Router: the routers by name, training and evaluation, the step counter, torch.compile, and
the balancing losses."""
import warnings

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


def test_state_dict_resumes_the_random_stream(tmp_path):
    batches = [make_logits(64, 8, seed, dtype=torch.float32) for seed in range(16)]

    def make(**options):
        return ssr_torch.Router("ssr", k=2, p=0.5, n_experts=8, expert_bias=True,
                                bias_update_rate=1e-2, **options)

    uninterrupted = make(seed=5, layer=3)
    for x in batches[:6]:
        uninterrupted(x)
    torch.save(uninterrupted.state_dict(), tmp_path / "router.pt")
    resumed = make()  # the checkpoint brings seed and layer as well as the step
    resumed.load_state_dict(torch.load(tmp_path / "router.pt", weights_only=True))
    assert (resumed.seed, resumed.layer, resumed.step) == (5, 3, 6)
    started_over = make(seed=5, layer=3)
    started_over.load_state_dict({"expert_bias": uninterrupted.expert_bias.clone()})  # all but the step
    paths, other_paths = [], []
    for x in batches[6:]:
        experts, weights = uninterrupted(x)
        experts_resumed, weights_resumed = resumed(x)
        assert torch.equal(resumed.info, uninterrupted.info)  # the same path, iterations and error
        assert torch.equal(experts_resumed, experts) and torch.equal(weights_resumed, weights)
        started_over(x)
        paths.append(resumed.info[0].item())
        other_paths.append(started_over.info[0].item())
    assert 0 < sum(paths) < len(paths)  # both paths were taken
    assert paths != other_paths  # without the step, the coins differ
    assert resumed.step == uninterrupted.step == 16


def test_step_stays_an_int_and_the_state_dict_follows_it():
    router = ssr_torch.Router("sinkhorn", seed=9, layer=1)
    router.step = 41
    router(make_logits(16, 4, 0))
    assert type(router.step) is int and router.step == 42
    assert router.state_dict()["_extra_state"].tolist() == [9, 1, 42]
    assert list(ssr_torch.Router(persistent=False).state_dict()) == []
    with pytest.raises(ValueError, match="saved state"):
        router.load_state_dict({"_extra_state": torch.tensor([1, 2])})
    with pytest.raises(ValueError, match="saved state"):
        router.load_state_dict({"_extra_state": torch.tensor([2 ** 32, 0, 0])})


def test_a_training_call_in_inference_mode_leaves_a_step_that_can_be_set_and_loaded():
    router = ssr_torch.Router("ssr", seed=3).train()
    with torch.inference_mode():
        router(make_logits(16, 4, 0))
    router(make_logits(16, 4, 1))
    assert router.step == 2
    router.step = 5
    router.load_state_dict({"_extra_state": torch.tensor([3, 0, 9])})
    assert router.step == 9


def test_a_state_dict_without_the_step_still_loads_strictly_and_says_so():
    router = ssr_torch.Router("ssr", n_experts=4, expert_bias=True, seed=2)
    router.step = 7
    old = {"expert_bias": torch.full((4,), 0.5)}  # a Router's state_dict before it held the step
    with pytest.warns(UserWarning, match="holds no seed, layer and step; the Router keeps its own \\(step 7\\)"):
        router.load_state_dict(old)
    assert (router.seed, router.step) == (2, 7) and torch.equal(router.expert_bias, old["expert_bias"])
    model = torch.nn.ModuleDict({"gate": torch.nn.Linear(4, 8), "router": ssr_torch.Router(seed=1)})
    old = {key: value for key, value in model.state_dict().items() if not key.endswith("_extra_state")}
    assert list(old) == ["gate.weight", "gate.bias"]
    with pytest.warns(UserWarning, match="Router router: the state_dict holds no seed"):
        model.load_state_dict(old)
    assert model["router"].seed == 1
    quiet = ssr_torch.Router(persistent=False)  # a Router that saves no step expects none
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet.load_state_dict({})
    with pytest.raises(RuntimeError, match="Unexpected key"):  # strict loading still reports other keys
        model.load_state_dict({**old, "router.expert_bias": torch.zeros(8)})


def test_selective_router_takes_sinkhorn_with_frequency_p():
    s = make_logits(32, 4, 3)
    router = ssr_torch.Router("ssr", k=1, p=0.25)
    taken = sum(int(router(s) and router.info[0].item()) for _ in range(2000))
    assert abs(taken / 2000 - 0.25) < 5 * (0.25 * 0.75 / 2000) ** 0.5


@pytest.mark.parametrize("kwargs, message", [
    ({"router": "balanced"}, "router = 'balanced'"), ({"k": 0}, "k = 0"), ({"p": 2.0}, "p = 2.0"),
    ({"xi": 0.0}, "xi = 0.0"), ({"cost": "cubic"}, "cost = 'cubic'"), ({"noise_sigma": 0}, "noise_sigma = 0"),
    ({"xi": float("inf")}, "xi = inf"), ({"noise_alpha": float("nan")}, "noise_alpha = nan"),
    ({"noise_alpha": 0.5, "score": "sigmoid"}, "cost noise needs softmax scores without groups .score = 'sigmoid'"),
    ({"noise_alpha": 0.5, "n_groups": 4, "topk_groups": 2, "router": "softmax"}, "n_groups = 4, topk_groups = 2"),
    ({"noise_alpha": 0.5, "expert_bias": True, "n_experts": 8}, "an expert bias that of the scores"),
    ({"expert_bias": True, "n_experts": 8, "bias_update_rate": float("inf")}, "bias_update_rate = inf"),
])
def test_bad_options_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ssr_torch.Router(**kwargs)


def test_the_options_the_router_accepts_route_in_training_and_evaluation():
    # What the constructor lets through, every call takes: noise with an expert bias where only the Sinkhorn
    # path trains (the plan ignores the bias; evaluation adds no noise), noise with sigmoid scores nowhere.
    s = make_logits(64, 8, 4)
    for kwargs in ({"router": "sinkhorn", "noise_alpha": 0.5, "expert_bias": True, "n_experts": 8},
                   {"router": "ssr", "p": 1.0, "noise_alpha": 0.5, "expert_bias": True, "n_experts": 8},
                   {"router": "softmax", "score": "sigmoid", "n_groups": 4, "topk_groups": 2, "expert_bias": True,
                    "n_experts": 8}):
        router = ssr_torch.Router(**kwargs)
        for training in (True, False):
            router.train(training)
            experts, weights = router(s)
            assert experts.shape == (64, 2) and torch.isfinite(weights).all()


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


def test_a_compiled_router_counts_its_steps_without_recompiling():
    """The step counter is traced as an input: one graph serves every step, each step drawing its own coin
    (SSR's path) as the eager Router does."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    gate = torch.nn.Linear(16, 8)
    x = torch.randn(64, 16)
    compiled_router, eager_router = (ssr_torch.Router("ssr", k=2, p=0.5, noise_alpha=0.5).train() for _ in range(2))
    compiled = torch.compile(lambda x: compiled_router(gate(x)) + (compiled_router.info,), fullgraph=True)
    paths = set()
    for _ in range(10):
        experts, weights, info = compiled(x)
        expected_experts, expected_weights = eager_router(gate(x))
        assert torch.equal(experts, expected_experts) and torch.equal(weights, expected_weights)
        paths.add(int(info[0]))
    assert compiled_router.step == eager_router.step == 10
    assert paths == {0, 1}  # both paths, from one graph
    assert counters["stats"]["unique_graphs"] == 1


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


def test_normalised_scores_keep_shape_and_dtype_and_reject_what_they_cannot_normalise():
    s = make_logits(6, 4, 5, dtype=torch.float32)
    for score in ("softmax", "sigmoid"):
        p = ssr_torch.normalised_scores(s, score)
        assert p.shape == s.shape and p.dtype == torch.float32
        torch.testing.assert_close(p.sum(1), torch.ones(6))
    torch.testing.assert_close(ssr_torch.normalised_scores(s), torch.softmax(s, 1))
    with pytest.raises(ValueError, match="invalid score = 'relu'"):
        ssr_torch.normalised_scores(s, "relu")
    for bad in (torch.zeros(4), torch.zeros(2, 3, dtype=torch.int64)):
        for score in ("softmax", "sigmoid"):
            with pytest.raises(ValueError, match="logits must be m x n of a floating dtype"):
                ssr_torch.normalised_scores(bad, score)


def test_every_public_function_says_what_it_returns():
    import ssr_torch.hf

    public = [getattr(ssr_torch, name) for name in ssr_torch.__all__ if callable(getattr(ssr_torch, name))]
    public += [ssr_torch.Router.forward, ssr_torch.hf.replace_routers, ssr_torch.hf.restore_routers]
    for function in public:
        assert function.__doc__ and "return" in function.__doc__.lower(), function.__name__


def test_version_is_the_libraries():
    assert ssr_torch.__version__.count(".") == 2


def test_a_router_pickled_with_an_int_step_loads():
    import pickle

    router = ssr_torch.Router("ssr", p=0.5).train()
    state = router.__dict__.copy()
    del state["_step"], state["replay"]
    state["step"] = 7  # as an earlier version pickled it
    old = ssr_torch.Router.__new__(ssr_torch.Router)
    old.__setstate__(pickle.loads(pickle.dumps(state)))
    assert old.step == 7 and old.replay is None
    old(make_logits(16, 8, 1))
    assert old.step == 8


def test_a_router_with_expert_bias_pickled_by_an_earlier_version_loads_and_updates():
    import pickle

    router = ssr_torch.Router("softmax", score="sigmoid", n_experts=8, expert_bias=True, bias_update_rate=0.25)
    keys = set(router.state_dict())
    state = router.__dict__.copy()
    state["_buffers"] = {"expert_bias": router.expert_bias.clone()}  # as an earlier version pickled it
    state["_non_persistent_buffers_set"] = set()
    old = ssr_torch.Router.__new__(ssr_torch.Router)
    old.__setstate__(pickle.loads(pickle.dumps(state)))
    old(make_logits(64, 8, 1).float())
    router(make_logits(64, 8, 1).float())
    assert torch.equal(old.expert_bias, router.expert_bias) and torch.count_nonzero(old.expert_bias) > 0
    assert set(old.state_dict()) == keys


def test_the_step_counter_stays_on_the_cpu_whatever_the_default_device():
    with torch.device("meta"):
        router = ssr_torch.Router("softmax")
    assert router._step.device.type == "cpu" and router.step == 0
