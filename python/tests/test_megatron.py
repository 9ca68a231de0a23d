"""ssr_torch.megatron on the CPU: a replaced Megatron-core TopKRouter routes as the engine in evaluation and as
ssr's Router in training, keeps Megatron's outputs, losses, capacity and keys, and restores the engine's routing."""
import warnings

import pytest
import torch
import torch.distributed as dist

megatron = pytest.importorskip("megatron.core", reason="megatron-core is not installed")
from megatron.core import parallel_state  # noqa: E402
from megatron.core.transformer.moe.moe_utils import get_default_pg_collection  # noqa: E402
from megatron.core.transformer.moe.router import TopKRouter  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

import ssr_torch  # noqa: E402
from ssr_torch import megatron as ssr_megatron  # noqa: E402

EXPERTS = 8


@pytest.fixture(scope="module", autouse=True)
def one_rank(tmp_path_factory):
    """Megatron's routers need its process groups: one Gloo rank."""
    store = tmp_path_factory.mktemp("megatron") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def cpu_buffers(monkeypatch):
    # TopKRouter puts its expert-bias buffers on torch.cuda.current_device(); these tests run on the CPU.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: torch.device("cpu"))


def make_router(layer=2, **moe):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TransformerConfig(num_layers=4, hidden_size=16, num_attention_heads=4, num_moe_experts=EXPERTS,
                                   add_bias_linear=False, use_cpu_initialization=True,
                                   **{"moe_router_topk": 2, "moe_router_load_balancing_type": "none", **moe})
    router = TopKRouter(config=config, pg_collection=get_default_pg_collection())
    router.set_layer_number(layer)
    return router


def logits_of(seed, dtype=torch.float32, shape=(24, 4)):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, EXPERTS, generator=gen, dtype=torch.float64) * 2).to(dtype)


CONFIGS = [dict(), dict(moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2, moe_z_loss_coeff=1e-3),
           dict(moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True),
           dict(moe_router_score_function="sigmoid", moe_router_topk=4, moe_router_num_groups=4,
                moe_router_group_topk=2, moe_router_topk_scaling_factor=2.5),
           # Groups that limit nothing: Megatron routes these as plain top-k.
           dict(moe_router_num_groups=4), dict(moe_router_num_groups=4, moe_router_group_topk=4)]


@pytest.mark.parametrize("moe", CONFIGS)
def test_in_evaluation_a_replaced_router_routes_as_megatron(moe):
    engine, replaced = make_router(**moe).eval(), make_router(**moe).eval()
    if engine.expert_bias is not None:
        for r in (engine, replaced):
            r.expert_bias.copy_(torch.linspace(-0.3, 0.3, EXPERTS))
    keys = list(replaced.state_dict())
    grouped = moe.get("moe_router_num_groups")  # group-limited top-k: the softmax path's rule alone
    ssr_megatron.replace_routers(replaced, "softmax" if grouped else "ssr", p=1.0)
    assert list(replaced.state_dict()) == keys and isinstance(replaced, TopKRouter)
    logits = logits_of(1)
    with torch.no_grad():
        probs, routing_map = replaced.routing(logits)
        expected_probs, expected_map = engine.routing(logits)
    assert probs.shape == (96, EXPERTS) and probs.dtype == torch.float32 and routing_map.dtype == torch.bool
    assert torch.equal(routing_map, expected_map)
    torch.testing.assert_close(probs, expected_probs, rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_in_training_a_replaced_router_routes_as_ssr(dtype):
    megatron_router = make_router(layer=3).train()
    (router,) = ssr_megatron.replace_routers(megatron_router, "sinkhorn", xi=0.5)
    assert router.layer == 3 and router.k == 2
    reference = ssr_torch.Router("sinkhorn", k=2, layer=3).train()
    for seed in range(3):
        logits = logits_of(seed, dtype)
        probs, routing_map = megatron_router.routing(logits)
        experts, weights = reference(logits.reshape(-1, EXPERTS))
        assert probs.dtype == dtype
        assert torch.equal(routing_map, torch.zeros_like(routing_map).scatter(1, experts, True))
        assert torch.equal(probs, torch.zeros_like(probs).scatter(1, experts, weights))
        assert router.info[0] == 1 and router.info[3] < 1e-4  # took the Sinkhorn path, and it converged
    assert router.step == 3


def test_softmax_path_gradients_are_autograd_s():
    replaced = make_router().train()
    ssr_megatron.replace_routers(replaced, "softmax")
    logits = logits_of(4, torch.float64).requires_grad_()
    probs, _ = replaced.routing(logits)
    cost = torch.randn(probs.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    (grad,) = torch.autograd.grad((probs * cost).sum(), logits)
    plain = logits.detach().reshape(-1, EXPERTS).requires_grad_()
    values, experts = plain.topk(2, dim=1)
    expected = torch.zeros_like(plain).scatter(1, experts, torch.softmax(values, dim=1))
    (expected_grad,) = torch.autograd.grad((expected * cost).sum(), plain)
    torch.testing.assert_close(grad.reshape(-1, EXPERTS), expected_grad, rtol=1e-12, atol=1e-14)


def test_megatron_capacity_drops_tokens_after_ssr_chooses():
    replaced = make_router(moe_expert_capacity_factor=1.0).train()
    (router,) = ssr_megatron.replace_routers(replaced, "softmax")
    logits = logits_of(6) + torch.arange(EXPERTS) * 3.0  # most tokens want the last experts
    _, routing_map = replaced.routing(logits)
    capacity = 96 * 2 // EXPERTS
    assert routing_map.sum(0).max() <= capacity < router.load.max()


def test_restore_routers_gives_megatron_s_routing_back():
    engine, replaced = make_router().eval(), make_router().eval()
    ssr_megatron.replace_routers(torch.nn.ModuleDict({"router": replaced}), "ssr", p=1.0)
    assert ssr_megatron.restore_routers(torch.nn.ModuleDict({"router": replaced})) == 1
    assert type(replaced) is TopKRouter and not hasattr(replaced, "ssr")
    logits = logits_of(7)
    with torch.no_grad():
        assert torch.equal(replaced.routing(logits)[1], engine.routing(logits)[1])


@pytest.mark.parametrize("moe, router, message", [
    (dict(moe_router_pre_softmax=True), "ssr", "moe_router_pre_softmax"),
    (dict(moe_router_score_function="sigmoid", moe_router_topk=1), "ssr", "raw sigmoid score"),
    (dict(moe_router_num_groups=4, moe_router_group_topk=2), "softmax", "softmax scores"),
    (dict(moe_router_score_function="sigmoid", moe_router_num_groups=4, moe_router_group_topk=2), "softmax",
     "moe_router_group_topk = 1"),
    (dict(moe_router_score_function="sigmoid", moe_router_topk=4, moe_router_num_groups=4, moe_router_group_topk=2),
     "ssr", "Sinkhorn path selects by its plan")])
def test_configurations_ssr_cannot_route_as_asked_are_named_before_anything_changes(moe, router, message):
    engine = make_router(**moe)
    with pytest.raises(ValueError, match=message):
        ssr_megatron.replace_routers(engine, router)
    assert type(engine) is TopKRouter
    with pytest.raises(TypeError, match="holds no megatron.core TopKRouter"):
        ssr_megatron.replace_routers(torch.nn.Linear(2, 2))


def recorded_routing(router):
    """router.routing returning its probs alone, and the list each call appends its routing map to."""
    seen = []

    def route(x):
        probs, routing_map = router.routing(x)
        seen.append(routing_map.clone())
        return probs

    return route, seen


def test_checkpointed_recompute_routes_with_the_step_it_repeats():
    replaced = make_router().train()
    (router,) = ssr_megatron.replace_routers(replaced, "ssr", p=0.5, seed=7)
    logits = logits_of(8).requires_grad_()
    route, seen = recorded_routing(replaced)

    for _ in range(6):
        torch.utils.checkpoint.checkpoint(route, logits, use_reentrant=True).sum().backward()
    assert router.step == 6
    assert all(torch.equal(seen[i], seen[i + 1]) for i in range(0, 12, 2))  # forward, then its recompute


def test_a_training_forward_without_gradient_outside_a_checkpoint_leaves_recomputes_alone():
    # E.g. log-probabilities computed in train mode under no_grad between training steps: no recompute
    # repeats their steps.
    replaced = make_router().train()
    (router,) = ssr_megatron.replace_routers(replaced, "ssr", p=0.5, seed=7, noise_alpha=1.0)
    logits = logits_of(8).requires_grad_()
    route, seen = recorded_routing(replaced)

    for _ in range(4):
        with torch.no_grad():
            replaced.routing(logits)
            # A model's checkpointed layers run without gradient too, whether their inputs require it or not
            # (a pipeline stage's received activations do).
            torch.utils.checkpoint.checkpoint(replaced.routing, logits.detach(), use_reentrant=True)
            torch.utils.checkpoint.checkpoint(replaced.routing, logits, use_reentrant=True)
        torch.utils.checkpoint.checkpoint(route, logits, use_reentrant=True).sum().backward()
    assert router.step == 16 and not replaced._ssr_steps
    assert all(torch.equal(seen[i], seen[i + 1]) for i in range(0, 8, 2))  # forward, then its recompute


def test_megatron_s_router_replay_records_ssr_s_experts_and_replays_them():
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    replaced = make_router(moe_enable_routing_replay=True).train()
    (router,) = ssr_megatron.replace_routers(replaced, "sinkhorn")
    replay = replaced.router_replay
    replay.set_router_replay_action(RouterReplayAction.RECORD)
    logits = logits_of(9)
    _, recorded_map = replaced.routing(logits)
    experts, _ = router(logits.reshape(-1, EXPERTS), step=0)
    assert torch.equal(replay.get_recorded_indices(), experts)
    replay.set_target_indices(replay.get_recorded_indices())
    replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    _, replayed_map = replaced.routing(logits_of(10))  # other logits, the recorded experts
    assert torch.equal(replayed_map, recorded_map)


def test_router_replay_replays_the_recorded_routing():
    megatron_router = make_router().eval()
    ssr_megatron.replace_routers(megatron_router, "ssr", p=1.0)
    replays = ssr_torch.attach_replay(megatron_router, tokens=96)
    logits = logits_of(6)
    replays.record()
    probs, routing_map = megatron_router.routing(logits)
    megatron_router.train()
    replays.replay()
    moved = (logits + 0.3 * logits_of(7)).requires_grad_()
    replayed_probs, replayed_map = megatron_router.routing(logits)
    assert torch.equal(replayed_map, routing_map) and torch.equal(replayed_probs, probs)
    replays.replay()
    moved_probs, moved_map = megatron_router.routing(moved)
    assert torch.equal(moved_map, routing_map)
    moved_probs.pow(2).sum().backward()
    assert torch.count_nonzero(moved.grad) > 0
