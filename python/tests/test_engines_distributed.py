"""The engines' adaptors over two Gloo processes: a Megatron-core TopKRouter balancing over its data-parallel
group and a torchtitan TokenChoiceTopKRouter given the world group each route their rank's tokens, and together
reach the Sinkhorn plan of one process routing every token."""
import os
import warnings

import pytest
import torch
import torch.distributed as dist

import ssr_torch
from conftest import run_ranks

RANKS, EXPERTS, SEQ, BATCH, DIM = 2, 8, 12, 2, 16


def _megatron_logits(rank):
    gen = torch.Generator().manual_seed(30 + rank)
    return torch.randn(SEQ, BATCH, EXPERTS, generator=gen) * 2


def _titan_inputs(rank):
    return torch.randn(BATCH, SEQ, DIM, generator=torch.Generator().manual_seed(40 + rank))


def _megatron_router():
    from megatron.core.transformer.moe.moe_utils import get_default_pg_collection
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.transformer_config import TransformerConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TransformerConfig(num_layers=4, hidden_size=DIM, num_attention_heads=4, num_moe_experts=EXPERTS,
                                   add_bias_linear=False, use_cpu_initialization=True, moe_router_topk=2,
                                   moe_router_load_balancing_type="none")
    router = TopKRouter(config=config, pg_collection=get_default_pg_collection())
    router.set_layer_number(2)
    return router


def _titan_router():
    from torchtitan.models.common.config_utils import make_router_config

    torch.manual_seed(0)
    router = make_router_config(dim=DIM, num_experts=EXPERTS, top_k=2, score_func="softmax", route_norm=True,
                                gate_param_init={"weight": lambda w: torch.nn.init.normal_(w, std=0.5)}).build()
    router.init_states()
    return router


def _worker(rank, store, out, engine):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS)
    results = {}
    try:
        if engine == "megatron":
            from megatron.core import parallel_state

            torch.cuda.current_device = lambda: torch.device("cpu")  # its expert-bias buffers, on the CPU here
            parallel_state.initialize_model_parallel()  # tensor, pipeline, context 1: data parallel over both
            router = _megatron_router().train()
            from ssr_torch import megatron as adaptor

            adaptor.replace_routers(router, "sinkhorn", group="tp_dp_cp")
            probs, routing_map = router.routing(_megatron_logits(rank))
            results["probs"], results["map"] = probs, routing_map
            parallel_state.destroy_model_parallel()
        else:
            from ssr_torch import torchtitan as adaptor

            router = _titan_router().train()
            adaptor.replace_routers(router, "sinkhorn", group=dist.group.WORLD)
            with torch.no_grad():
                weights, experts, _ = router(_titan_inputs(rank))
            results["weights"], results["experts"] = weights, experts
        results["info"] = router.ssr.info
    except Exception as e:  # noqa: BLE001  reported to the test, which fails with it
        results["error"] = repr(e)
    finally:
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
        dist.destroy_process_group()


def _run(tmp_path, engine):
    run_ranks(_worker, (str(tmp_path / "store"), str(tmp_path), engine), RANKS)
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(RANKS)]
    for r in results:
        assert "error" not in r, r["error"]
    return results


def test_megatron_routers_balance_over_the_data_parallel_group(tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    ranks = _run(tmp_path, "megatron")
    everything = torch.cat([_megatron_logits(r).reshape(-1, EXPERTS) for r in range(RANKS)])
    experts, weights = ssr_torch.Router("sinkhorn", k=2, layer=2).train()(everything)
    expected = torch.zeros_like(everything).scatter(1, experts, weights)
    assert torch.equal(torch.cat([r["map"] for r in ranks]), expected != 0)
    torch.testing.assert_close(torch.cat([r["probs"] for r in ranks]), expected, rtol=0, atol=1e-5)
    assert all(r["info"][0] == 1 for r in ranks)


def test_torchtitan_routers_balance_over_the_group(tmp_path):
    pytest.importorskip("torchtitan", reason="torchtitan is not installed")
    ranks = _run(tmp_path, "torchtitan")
    gate = _titan_router().gate
    with torch.no_grad():
        everything = torch.cat([gate(_titan_inputs(r)).reshape(-1, EXPERTS) for r in range(RANKS)])
    experts, weights = ssr_torch.Router("sinkhorn", k=2, layer=0).train()(everything)
    assert torch.equal(torch.cat([r["experts"].reshape(-1, 2) for r in ranks]), experts)
    torch.testing.assert_close(torch.cat([r["weights"].reshape(-1, 2) for r in ranks]), weights, rtol=0, atol=1e-5)
    # A rank alone would balance its own tokens: a different plan.
    alone, _ = ssr_torch.Router("sinkhorn", k=2, layer=0).train()(everything[:BATCH * SEQ])
    assert not torch.equal(alone, experts[:BATCH * SEQ])
