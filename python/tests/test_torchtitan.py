"""ssr_torch.torchtitan on the CPU: a replaced TokenChoiceTopKRouter routes as torchtitan in evaluation and as
ssr's Router in training, keeps torchtitan's outputs and keys, trains a tiny MoE, and restores the engine's routing."""
import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("torchtitan", reason="torchtitan is not installed")
from torchtitan.models.common.config_utils import make_moe_config, make_router_config  # noqa: E402
from torchtitan.models.common.moe import GroupedExperts, RoutedExperts, TokenChoiceTopKRouter  # noqa: E402
from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher  # noqa: E402

import ssr_torch  # noqa: E402
from ssr_torch import torchtitan as ssr_torchtitan  # noqa: E402

DIM, EXPERTS = 16, 8
INIT = {"weight": lambda w: nn.init.normal_(w, std=0.5)}


def make_router(seed=0, **options):
    torch.manual_seed(seed)
    router = make_router_config(dim=DIM, num_experts=EXPERTS, gate_param_init=INIT,
                                **{"top_k": 2, "score_func": "softmax", "route_norm": True, **options}).build()
    router.init_states()
    return router


def inputs(seed, batch=4, length=24):
    return torch.randn(batch, length, DIM, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("options", [dict(), dict(score_func="sigmoid", route_scale=2.5),
                                     dict(score_func="sigmoid", top_k=4, num_expert_groups=4, num_limited_groups=2)])
def test_in_evaluation_a_replaced_router_routes_as_torchtitan(options):
    engine, replaced = make_router(**options).eval(), make_router(**options).eval()
    keys = list(replaced.state_dict())
    grouped = "num_expert_groups" in options  # group-limited top-k: the softmax path's rule alone
    ssr_torchtitan.replace_routers(replaced, "softmax" if grouped else "ssr", p=1.0)
    assert list(replaced.state_dict()) == keys and isinstance(replaced, TokenChoiceTopKRouter)
    bias = torch.linspace(-0.2, 0.2, EXPERTS) if options.get("score_func") == "sigmoid" else None
    x = inputs(1)
    with torch.no_grad():
        weights, experts, scores = replaced(x, bias)
        expected_weights, expected_experts, expected_scores = engine(x, bias)
    assert experts.dtype == torch.int64 and experts.shape == expected_experts.shape
    order, expected_order = experts.sort(-1), expected_experts.sort(-1)  # torchtitan's top-k is unsorted
    assert torch.equal(order.values, expected_order.values)
    torch.testing.assert_close(weights.gather(-1, order.indices), expected_weights.gather(-1, expected_order.indices),
                               rtol=0, atol=2e-6)
    torch.testing.assert_close(scores, expected_scores)


def test_in_training_a_replaced_router_routes_as_ssr():
    titan = make_router().train()
    (router,) = ssr_torchtitan.replace_routers(titan, "sinkhorn")
    reference = ssr_torch.Router("sinkhorn", k=2, layer=router.layer).train()
    for seed in range(3):
        x = inputs(seed)
        weights, experts, _ = titan(x)
        expected_experts, expected_weights = reference(titan.gate(x).reshape(-1, EXPERTS))
        assert torch.equal(experts.reshape(-1, 2), expected_experts)
        assert torch.equal(weights.reshape(-1, 2), expected_weights)
        assert router.info[0] == 1
    assert router.step == 3


def tiny_moe_config(load_balance_coeff=1e-3):
    experts_init = {name: (lambda w: nn.init.normal_(w, std=0.1)) for name in ("w1_EFD", "w2_EDF", "w3_EFD")}
    return make_moe_config(
        num_experts=EXPERTS,
        router=make_router_config(dim=DIM, num_experts=EXPERTS, gate_param_init=INIT, top_k=2, score_func="softmax",
                                  route_norm=True),
        routed_experts=RoutedExperts.Config(
            inner_experts=GroupedExperts.Config(dim=DIM, hidden_dim=32, num_experts=EXPERTS, param_init=experts_init),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=EXPERTS, top_k=2)),
        load_balance_coeff=load_balance_coeff)


def tiny_moe(config=None):
    torch.manual_seed(0)
    moe = (config or tiny_moe_config()).build()
    moe.init_states()
    return moe


def test_a_tiny_torchtitan_moe_trains_with_ssr_and_its_loss_falls():
    moe = tiny_moe()
    keys = list(moe.state_dict())
    (router,) = ssr_torchtitan.replace_routers(moe, "ssr", p=0.2, seed=3)
    assert list(moe.state_dict()) == keys
    optimizer = torch.optim.Adam(moe.parameters(), lr=1e-2)
    x = inputs(9, batch=2, length=32)
    target = torch.tanh(x.roll(1, dims=-1))
    losses, sinkhorn = [], 0
    moe.train()
    for _ in range(30):
        loss = nn.functional.mse_loss(moe(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        sinkhorn += int(router.info[0])
    assert 0 < sinkhorn < 30 and router.step == 30
    assert losses[-1] < 0.7 * losses[0]
    assert moe.tokens_per_expert_E.sum() == 30 * 64 * 2  # the MoE counted ssr's choices for its bias update


def test_restore_routers_and_errors():
    engine, replaced = make_router().eval(), make_router().eval()
    moe = nn.ModuleDict({"layers": nn.ModuleList([nn.ModuleDict({"router": replaced})])})
    (router,) = ssr_torchtitan.replace_routers(moe, "ssr")
    assert router.layer == 0
    assert ssr_torchtitan.restore_routers(moe) == 1 and type(replaced) is TokenChoiceTopKRouter
    x = inputs(2)
    with torch.no_grad():
        assert torch.equal(replaced(x)[1], engine(x)[1])
    with pytest.raises(TypeError, match="holds no torchtitan TokenChoiceTopKRouter"):
        ssr_torchtitan.replace_routers(nn.Linear(2, 2))
    grouped = make_router(score_func="sigmoid", top_k=4, num_expert_groups=4, num_limited_groups=2)
    with pytest.raises(ValueError, match="Sinkhorn path selects by its plan"):
        ssr_torchtitan.replace_routers(grouped, "ssr")
    assert type(grouped) is TokenChoiceTopKRouter
    with pytest.warns(UserWarning, match="route_norm=False"):
        ssr_torchtitan.replace_routers(make_router(route_norm=False), "ssr")


def test_checkpointed_recompute_routes_with_the_step_it_repeats():
    titan = make_router().train()
    (router,) = ssr_torchtitan.replace_routers(titan, "ssr", p=0.5, seed=7, recomputed=True)
    x = inputs(3).requires_grad_()
    seen = []

    def route(inp):
        weights, experts, _ = titan(inp)
        seen.append(experts.clone())
        return weights

    with warnings.catch_warnings(), torch.utils.checkpoint.set_checkpoint_early_stop(False):  # recompute it all
        warnings.simplefilter("ignore")
        with torch.no_grad():
            titan(x)  # a training-mode forward without gradient (log-probabilities of a rollout): no recompute
        for _ in range(6):
            torch.utils.checkpoint.checkpoint(route, x, use_reentrant=False).sum().backward()
    assert router.step == 7 and not titan._ssr_steps
    assert all(torch.equal(seen[i], seen[i + 1]) for i in range(0, 12, 2))  # forward, then its recompute


def test_router_replay_replays_the_recorded_routing():
    titan = make_router().eval()
    ssr_torchtitan.replace_routers(titan, "ssr", p=1.0)
    replays = ssr_torch.attach_replay(titan, tokens=96)
    x = inputs(3)
    replays.record()
    with torch.no_grad():
        weights, experts, _ = titan(x)
    titan.train()
    replays.replay()
    replayed_weights, replayed_experts, _ = titan(x)
    assert torch.equal(replayed_experts, experts) and torch.equal(replayed_weights, weights)
    replayed_weights.pow(2).sum().backward()
    assert torch.count_nonzero(titan.gate.weight.grad) > 0


def test_a_compiled_moe_routes_every_step_with_one_graph():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    moe, eager = tiny_moe().train(), tiny_moe().train()
    (router,) = ssr_torchtitan.replace_routers(moe, "ssr", p=0.5)
    (eager_router,) = ssr_torchtitan.replace_routers(eager, "ssr", p=0.5)
    compiled = torch.compile(moe)
    x = inputs(5)
    paths = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU autocast to float32 is not supported: torchtitan's gate runs as is
        for _ in range(6):
            # The same routing each step; the experts' arithmetic is inductor's, close to eager's.
            torch.testing.assert_close(compiled(x), eager(x), rtol=0, atol=5e-3)
            assert torch.equal(router.load, eager_router.load) and torch.equal(router.info, eager_router.info)
            paths.add(int(router.info[0]))
    assert router.step == 6 and paths == {0, 1}
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


@pytest.mark.parametrize("recomputed", [False, True])
def test_a_compiled_checkpointed_moe_recomputes_with_its_forwards_step(recomputed):
    # torchtitan compiles each checkpointed block with fullgraph=True; the compiled recompute in backward must
    # route with the step its forward took, also where the next step takes the other path.
    from torch._dynamo.utils import counters
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    torch._dynamo.reset()
    counters.clear()
    moe, eager = tiny_moe().train(), tiny_moe().train()
    (router,) = ssr_torchtitan.replace_routers(moe, "ssr", p=0.5, seed=1, recomputed=recomputed)
    (eager_router,) = ssr_torchtitan.replace_routers(eager, "ssr", p=0.5, seed=1)
    compiled = torch.compile(checkpoint_wrapper(moe, preserve_rng_state=False), fullgraph=True)
    paths = []
    config = torch._dynamo.config
    with warnings.catch_warnings(), config.patch(capture_scalar_outputs=True,
                                                 skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        warnings.simplefilter("ignore")
        for step in range(8):
            x = inputs(step)
            compiled(x).square().sum().backward()
            eager(x).square().sum().backward()
            paths.append(int(eager_router.info[0]))
            torch.testing.assert_close(moe.router.gate.weight.grad, eager.router.gate.weight.grad, rtol=0,
                                       atol=5e-3)
            moe.zero_grad()
            eager.zero_grad()
    assert any(a != b for a, b in zip(paths, paths[1:])), paths  # the path changed from a step to the next
    assert router.step == 8 and not moe.router._ssr_steps
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    with warnings.catch_warnings(), config.patch(capture_scalar_outputs=True), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.compile(moe, fullgraph=True)(inputs(9))  # a training forward without gradient compiles too
    assert router.step == 9 and not moe.router._ssr_steps


def test_a_model_with_replaced_routers_keeps_torchtitans_module_protocol():
    # torchtitan's Trainer checks every submodule of the model it built, then initialises its states.
    from torchtitan.models.qwen3 import model_registry

    with torch.device("meta"):
        model = model_registry("debugmodel_moe").model.build()
    keys = list(model.state_dict())
    routers = ssr_torchtitan.replace_routers(model, "ssr", p=1e-3)
    model.verify_module_protocol()
    model.to_empty(device="cpu")
    model.init_states()
    assert routers and all(isinstance(r, ssr_torch.Router) for r in routers)
    assert list(model.state_dict()) == keys


def test_a_model_config_converted_by_ssrrouters_builds_the_routers_replace_routers_makes():
    # What a trainer config gives torchtitan: the model built with SSR routers, each of its layer, routing as
    # replace_routers' on the same weights, step by step, on both paths; the module protocol and the state_dict
    # keys are torchtitan's, and restore_routers undoes it.
    from torchtitan.models.qwen3 import model_registry

    spec = model_registry("debugmodel_moe", converters=[ssr_torchtitan.SsrRouters.Config(p=0.5, seed=3)])
    assert spec.model.to_dict()  # the Trainer logs its config (its config registries need tensorboard, absent here)
    with torch.device("meta"):
        converted, plain = spec.model.build(), model_registry("debugmodel_moe").model.build()
    converted.verify_module_protocol()
    converted.to_empty(device="cpu")
    converted.init_states()
    plain.to_empty(device="cpu")
    ssr_torchtitan.replace_routers(plain, "ssr", p=0.5, seed=3)
    plain.load_state_dict(converted.state_dict())
    pairs = list(zip(*([m for m in model.modules() if isinstance(m, TokenChoiceTopKRouter)]
                       for model in (converted, plain))))
    assert [a.ssr.layer for a, _ in pairs] == list(range(8))
    paths = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchtitan's float32 autocast on the CPU
        for step in range(4):
            x = torch.randn(2, 16, 256, generator=torch.Generator().manual_seed(step))
            for a, b in pairs:
                assert all(torch.equal(u, v) for u, v in zip(a(x), b(x)))
                paths.add(a.ssr.info[0].item())
    assert paths == {0.0, 1.0}
    assert ssr_torchtitan.restore_routers(converted) == 8
    assert type(pairs[0][0]) is TokenChoiceTopKRouter and list(converted.state_dict()) == list(plain.state_dict())


def test_ssrrouters_names_a_bad_option_or_a_config_without_routers_when_converting():
    from torchtitan.models.qwen3 import model_registry

    with pytest.raises(ValueError, match="xi = 0"):
        model_registry("debugmodel_moe", converters=[ssr_torchtitan.SsrRouters.Config(xi=0.0)])
    with pytest.raises(TypeError, match="holds no TokenChoiceTopKRouter config"):
        model_registry("debugmodel", converters=[ssr_torchtitan.SsrRouters.Config()])
    # Cost noise beside the expert bias a MoE with load_balance_coeff passes: every training call would fail.
    noisy = ssr_torchtitan.SsrRouters.Config(noise_alpha=0.5).build()
    config = tiny_moe_config()
    with pytest.raises(ValueError, match="an expert bias that of the scores"):
        noisy.convert(config)
    assert isinstance(config.router, TokenChoiceTopKRouter.Config) and not isinstance(
        config.router, ssr_torchtitan.SsrConfiguredRouter.Config)  # nothing changed
    with pytest.raises(ValueError, match="an expert bias that of the scores"):
        ssr_torchtitan.replace_routers(nn.ModuleDict({"moe": tiny_moe()}), "ssr", noise_alpha=0.5)
    moe = tiny_moe(noisy.convert(tiny_moe_config(load_balance_coeff=None)))  # no bias: noise is fine
    moe.train()
    assert torch.isfinite(moe(inputs(0))).all()
    shared = model_registry("debugmodel_moe").model
    shared.layers[1] = shared.layers[0]
    with pytest.raises(ValueError, match="layers share one config object"):
        ssr_torchtitan.SsrRouters.Config().build().convert(shared)


@pytest.mark.parametrize("recomputed", [False, True])
def test_torchtitans_selective_checkpointing_recomputes_each_router_with_its_forwards_step(recomputed):
    # torchtitan's SelectiveAC (its MoE trainer configs' default) lets the recompute make only the forward's
    # operations; the gradients equal those of the same MoE without checkpointing, step by step, on both paths.
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    options = ssr_torchtitan.SsrRouters.Config(p=0.5, seed=1, recomputed=recomputed)
    config = options.build().convert(tiny_moe_config())
    plain, wrapped = tiny_moe(config), nn.Module()
    wrapped.layers = nn.ModuleDict({"0": tiny_moe(config)})
    assert wrapped.layers["0"].router._ssr_recomputed is recomputed
    SelectiveAC.Config().build().apply(wrapped)
    paths = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchtitan's float32 autocast on the CPU
        for step in range(6):
            x = inputs(step)
            wrapped.zero_grad()
            plain.zero_grad()
            wrapped.layers["0"](x).square().sum().backward()
            plain(x).square().sum().backward()
            for a, b in zip(wrapped.parameters(), plain.parameters()):
                torch.testing.assert_close(a.grad, b.grad)
            paths.add(plain.router.ssr.info[0].item())
    assert paths == {0.0, 1.0}
