"""Global balance over a torch.distributed group: two Gloo processes, each routing its rows, reach the plan of
one process routing all of them, take the same decisions, and share every error (never a hang): of the
tensors, of the per-rank arguments, of an allocation, and of the balancing functions over a group."""
import os

import pytest
import torch
import torch.distributed as dist

import ssr_torch
from conftest import make_logits, run_ranks

RANKS = 2
ROWS = (70, 50)  # uneven shards of 120 rows


def _shard(s, rank):
    start = sum(ROWS[:rank])
    return s[start:start + ROWS[rank]], start


def _worker(rank, store, out):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS)
    results = {}
    try:
        group = dist.group.WORLD
        for dtype in (torch.float64, torch.float32):
            for cost in ("linear", "softmax"):
                s, start = _shard(make_logits(120, 8, 11, dtype=dtype), rank)
                results[(dtype, cost)] = ssr_torch.route(s, "sinkhorn", 2, cost=cost, noise_alpha=0.5, step=4,
                                                         first_row=start, group=group)
        # The Router: equal batches (first rows rank * m); SSR takes its path on both ranks alike.
        router = ssr_torch.Router("ssr", p=0.5, group=group)
        results["router"] = [router(make_logits(128, 8, 20 + step)[64 * rank:64 * rank + 64]) + (router.info,)
                             for step in range(6)]
        # An error on one rank is an error on both: non-finite logits, then a 3-d tensor, on rank 1 only.
        for bad in ("nan", "shape"):
            s = make_logits(40, 8, 12)
            if rank == 1:
                s = s.clone().fill_(float("nan")) if bad == "nan" else s.reshape(10, 4, 8)
            try:
                ssr_torch.route(s, "sinkhorn", 2, group=group)
                results[bad] = "no error"
            except RuntimeError as e:
                results[bad] = str(e)
        # Per-rank values the ranks agree on before the solve: a bad first row, another number of experts,
        # other options, logits too large to make contiguous (an allocation that fails on rank 1 only).
        calls = {"first_row": lambda s: dict(first_row=-1) if rank == 1 else {},
                 "experts": lambda s: dict(logits=s[:, :6]) if rank == 1 else {},
                 "options": lambda s: dict(max_iters=50) if rank == 1 else {},
                 "memory": lambda s: dict(logits=s[:1].expand(2 ** 45, 8)) if rank == 1 else {}}
        for name, change in calls.items():
            arguments = dict(logits=make_logits(40, 8, 15), policy="sinkhorn", k=2, group=group)
            arguments.update(change(arguments["logits"]))
            results[name] = _error_of(lambda: ssr_torch.route(**arguments))
        # The balancing functions and a Router that updates its bias over the group: an error on one rank.
        load, bias = torch.full((8,), 10, dtype=torch.int32), torch.zeros(8)
        results["bias_sizes"] = _error_of(lambda: ssr_torch.update_expert_bias(bias[:6] if rank else bias,
                                                                               load[:6] if rank else load, 0.1, group))
        results["bias_error"] = _error_of(lambda: ssr_torch.update_expert_bias(bias, load[:6] if rank else load, 0.1,
                                                                               group))
        results["loss_error"] = _error_of(lambda: ssr_torch.global_load_balancing_loss(
            make_logits(40, 8, 16), load[:6] if rank else load, 40, 2, group=group))
        results["loss_shape"] = _error_of(lambda: ssr_torch.global_load_balancing_loss(
            make_logits(40, 8, 16).reshape(10, 4, 8) if rank else make_logits(40, 8, 16), load, 40, 2, group=group))
        results["loss_score"] = _error_of(lambda: ssr_torch.global_load_balancing_loss(
            make_logits(40, 8, 16), load, 40, 2, score="tanh" if rank else "softmax", group=group))
        router = ssr_torch.Router("softmax", n_experts=8, expert_bias=True, bias_update_rate=0.1, group=group)
        s = make_logits(40, 8, 17)
        results["router_error"] = _error_of(lambda: router(s.reshape(10, 4, 8) if rank else s))
        results["router_bias"] = router(s)[0], router.expert_bias.clone()
        results["after"] = ssr_torch.route(make_logits(40, 8, 13), "sinkhorn", 2, group=group)[3]
        # The softmax path does not communicate: one rank alone routes by it (a collective would hang).
        if rank == 0:
            results["alone"] = ssr_torch.route(make_logits(40, 8, 14), "softmax", 2, group=group)[0]
    finally:
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
        dist.destroy_process_group()


def _error_of(call):
    try:
        call()
        return "no error"
    except (RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("gloo")
    run_ranks(_worker, (str(out / "store"), str(out)), RANKS)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(RANKS)]


# Weights within 1e-10 (double) and 1e-5 (float); the marginal error, a sum in another order, relatively.
@pytest.mark.parametrize("dtype, tolerance, error_tolerance", [(torch.float64, 1e-10, 1e-6), (torch.float32, 1e-5, 1e-3)])
@pytest.mark.parametrize("cost", ["linear", "softmax"])
def test_sharded_plan_equals_the_single_process_plan(ranks, dtype, cost, tolerance, error_tolerance):
    experts, weights, load, info = ssr_torch.route(make_logits(120, 8, 11, dtype=dtype), "sinkhorn", 2, cost=cost,
                                                   noise_alpha=0.5, step=4)
    shards = [r[(dtype, cost)] for r in ranks]
    assert torch.equal(torch.cat([s[0] for s in shards]), experts)
    torch.testing.assert_close(torch.cat([s[1] for s in shards]), weights, rtol=0, atol=tolerance)
    assert torch.equal(shards[0][2] + shards[1][2], load)
    assert torch.equal(shards[0][3], shards[1][3])  # iterations and marginal error: the same bits
    assert shards[0][3][2] == info[2]
    torch.testing.assert_close(shards[0][3][3], info[3], rtol=error_tolerance, atol=0)


def test_router_takes_the_same_path_on_every_rank(ranks):
    router = ssr_torch.Router("ssr", p=0.5)
    paths = []
    for step, (call0, call1) in enumerate(zip(ranks[0]["router"], ranks[1]["router"])):
        experts, weights = router(make_logits(128, 8, 20 + step))
        assert torch.equal(call0[2], call1[2]) and call0[2][0] == router.info[0]
        assert torch.equal(torch.cat([call0[0], call1[0]]), experts)
        torch.testing.assert_close(torch.cat([call0[1], call1[1]]), weights, rtol=0, atol=1e-10)
        paths.append(router.info[0].item())
    assert 0 < sum(paths) < len(paths)  # both paths were taken


def test_an_error_on_one_rank_is_an_error_on_every_rank(ranks):
    assert "logits(0, 0) = nan" in ranks[1]["nan"] and "failed on rank 1 of 2" in ranks[0]["nan"]
    assert "2-d" in ranks[1]["shape"] and "failed on rank 1 of 2" in ranks[0]["shape"]
    assert torch.equal(ranks[0]["after"], ranks[1]["after"]) and ranks[0]["after"][0] == 1


@pytest.mark.parametrize("name, own, other", [
    ("first_row", "invalid first_row = -1", "failed on rank 1 of 2"),
    ("experts", "different numbers of experts or options", "different numbers of experts or options"),
    ("options", "different numbers of experts or options", "different numbers of experts or options"),
    ("memory", "RuntimeError", "failed on rank 1 of 2"),
    ("bias_sizes", "ValueError: ssr_torch: the ranks made the call with different numbers of experts",
     "ValueError: ssr_torch: the ranks made the call with different numbers of experts"),
    ("bias_error", "ValueError: ssr_torch.update_expert_bias: load has 6 entries, bias 8",
     "RuntimeError: ssr_torch: the call failed on 1 of 2 ranks"),
    ("loss_error", "ValueError: ssr_torch.global_load_balancing_loss: counts has 6 entries, expected 8",
     "RuntimeError: ssr_torch: the call failed on 1 of 2 ranks"),
    ("loss_shape", "ValueError: ssr_torch.global_load_balancing_loss: logits must be m x n",
     "RuntimeError: ssr_torch: the call failed on 1 of 2 ranks"),
    ("loss_score", "ValueError: ssr_torch: invalid score = 'tanh'", "RuntimeError: ssr_torch: the call failed on 1 of 2 ranks"),
    ("router_error", "2-d", "RuntimeError: ssr_torch: the call failed on 1 of 2 ranks"),
])
def test_per_rank_arguments_fail_on_every_rank(ranks, name, own, other):
    assert own in ranks[1][name] and other in ranks[0][name], (ranks[0][name], ranks[1][name])


def test_a_router_updates_its_bias_alike_after_an_error_on_one_rank(ranks):
    (experts0, bias0), (experts1, bias1) = ranks[0]["router_bias"], ranks[1]["router_bias"]
    assert torch.equal(experts0, experts1) and torch.equal(bias0, bias1) and bias0.abs().sum() > 0


def test_the_softmax_path_does_not_communicate(ranks):
    assert torch.equal(ranks[0]["alone"], ssr_torch.route(make_logits(40, 8, 14), "softmax", 2)[0])
