"""Router replay: recorded and replayed bits, weights recomputed with their gradient (finite differences),
micro-batches in order, checkpointed recomputation, buffers that allocate nothing per call, clear errors;
capture in a CUDA graph where a GPU is present. The engines' adaptors replay in their own tests."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

import ssr_torch
from conftest import make_logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_replayed_weights_are_the_softmax_path_s_bits(dtype, score):
    s = make_logits(3000, 16, 1, dtype=dtype)
    for noise_alpha in ((0.0, 0.5) if score == "softmax" else (0.0,)):  # noisy selection, clean weights
        experts, weights, _, _ = ssr_torch.route(s, "softmax", 4, noise_alpha=noise_alpha, score=score, step=3)
        assert torch.equal(ssr_torch.replay_weights(s, experts, score), weights)
        assert torch.equal(ssr_torch.replay_weights(s, experts.long(), score), weights)


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_replayed_weights_pass_the_gradient_of_their_formula(score):
    s = make_logits(12, 6, 2, dtype=torch.float64).requires_grad_()
    experts = ssr_torch.route(s.detach(), "softmax", 3, score=score)[0]
    assert torch.autograd.gradcheck(lambda x: ssr_torch.replay_weights(x, experts, score), (s,))


def test_a_call_replayed_on_its_logits_gives_the_recorded_bits():
    # Recorded in evaluation (a rollout: softmax top-k), replayed in training, where SSR would route otherwise.
    router = ssr_torch.Router("sinkhorn", k=2, weights="scores")
    replay = ssr_torch.attach_replay([router], tokens=2000, record_weights=True, weights_dtype=torch.float64)[0]
    batches = [make_logits(700, 16, seed) for seed in (1, 2)]  # two micro-batches, one after the other
    router.eval()
    replay.record()
    recorded = [router(s) for s in batches]
    assert replay.recorded == 1400 and torch.equal(replay.weights[700:1400], recorded[1][1])
    router.train()
    replay.replay()
    for s, (experts, weights) in zip(batches, recorded):
        replayed_experts, replayed_weights = router(s)
        assert torch.equal(replayed_experts, experts) and torch.equal(replayed_weights, weights)
        assert torch.equal(router.load, torch.bincount(experts.reshape(-1), minlength=16).int())
    assert router.step == 2
    replay.stop()
    experts, _ = router(batches[0])
    assert router.info[0] == 1 and not torch.equal(experts, recorded[0][0])  # routing as usual again


def test_replay_keeps_the_recorded_experts_and_recomputes_the_weights():
    router = ssr_torch.Router("sinkhorn", k=2).train()  # plan weights when recorded
    replay = ssr_torch.attach_replay([router], tokens=500)[0]
    s = make_logits(500, 8, 3)
    replay.record()
    experts, plan_weights = router(s)
    assert router.info[0] == 1
    replay.replay()
    moved = (s + 0.1 * make_logits(500, 8, 4)).requires_grad_()  # the policy has moved since the rollout
    replayed, weights = router(moved)
    assert torch.equal(replayed, experts)
    expected = torch.softmax(moved.detach().gather(1, experts), dim=1)
    torch.testing.assert_close(weights.detach(), expected, rtol=0, atol=1e-6)
    weights[:, 0].sum().backward()
    assert moved.grad is not None and torch.count_nonzero(moved.grad) > 0  # the gradient reaches the gate


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gate = torch.nn.Linear(8, 8, bias=False)
        self.router = ssr_torch.Router("ssr", k=2, p=0.5, seed=5)

    def forward(self, x):
        experts, weights = self.router(self.gate(x))
        return (weights * experts.float()).sum()


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointed_recomputation_replays_the_forward_it_recomputes(use_reentrant):
    grads = []
    for checkpointed in (False, True):
        block = Block().train()
        replays = ssr_torch.attach_replay(block, tokens=64)
        x = [make_logits(32, 8, seed, dtype=torch.float32).requires_grad_() for seed in (6, 7)]
        replays.record()
        with torch.no_grad():
            for xi in x:
                block(xi)
        replays.replay()
        total = []
        for xi in x:  # forward and backward of each micro-batch, as gradient accumulation runs them
            out = checkpoint(block, xi, use_reentrant=use_reentrant) if checkpointed else block(xi)
            out.backward()
            total.append(block.gate.weight.grad.clone())
        grads.append(total)
        assert replays[0].recorded == 64 and replays[0].offset == 64
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_checkpointed_forward_is_recorded_once():
    block = Block().train()
    replays = ssr_torch.attach_replay(block, tokens=32)
    replays.record()
    checkpoint(block, make_logits(32, 8, 8, dtype=torch.float32).requires_grad_(), use_reentrant=False).backward()
    assert replays[0].recorded == 32  # the recompute inside backward wrote nothing


def _allocations(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(1 for event in prof.events() if event.cpu_memory_usage > 0)


def test_recording_and_replaying_reuse_the_buffers_and_allocate_nothing_more():
    router = ssr_torch.Router("softmax", k=2).train()
    s = make_logits(256, 16, 9)
    router(s)
    plain = _allocations(lambda: router(s))
    replay = ssr_torch.attach_replay([router], tokens=256, record_weights=True)[0]
    pointers = (replay.experts.data_ptr(), replay.weights.data_ptr())
    for _ in range(3):  # steps: the same buffers every time
        replay.record()
        assert _allocations(lambda: router(s)) == plain
        replay.replay()
        assert _allocations(lambda: router(s)) <= plain + 2  # the load's ones, the info
    assert (replay.experts.data_ptr(), replay.weights.data_ptr()) == pointers


def test_misuse_is_named():
    router = ssr_torch.Router("softmax", k=2)
    replay = ssr_torch.attach_replay([router], tokens=100)[0]
    with pytest.raises(RuntimeError, match="nothing recorded"):
        replay.replay()
    replay.record()
    router(make_logits(60, 8, 1))
    with pytest.raises(RuntimeError, match="cannot record a call of 60 tokens at row 60: only 100 rows"):
        router(make_logits(60, 8, 1))
    replay.replay()
    router(make_logits(60, 8, 1))
    with pytest.raises(RuntimeError, match="cannot replay a call of 60 tokens at row 60: only 60 recorded rows"):
        router(make_logits(60, 8, 1))
    with pytest.raises(ValueError, match="k = 3"):
        ssr_torch.attach_replay([ssr_torch.Router("softmax", k=3)], tokens=10)[0].record().write(
            torch.zeros(4, 2, dtype=torch.int64), None)
    with pytest.raises(RuntimeError, match=r"experts must lie in \[0, 8\)"):
        ssr_torch.replay_weights(make_logits(4, 8, 1), torch.full((4, 2), 8))
    bad = make_logits(4, 8, 1)
    bad[2, 5] = float("nan")  # named as a routing call names it, even outside the recorded experts
    with pytest.raises(RuntimeError, match=r"logits\(2, 5\) = nan: logits must be finite"):
        ssr_torch.replay_weights(bad, torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="no ssr_torch.Router"):
        ssr_torch.attach_replay(torch.nn.Linear(2, 2), tokens=10)


@pytest.mark.skipif(not torch.cuda.is_available() or "cuda" not in ssr_torch.backends(), reason="needs a GPU")
def test_a_replayed_call_is_captured_in_a_cuda_graph():
    router = ssr_torch.Router("softmax", k=2).train()
    replay = ssr_torch.attach_replay([router], tokens=4096, device="cuda")[0]
    s = make_logits(4096, 16, 4).cuda()
    replay.record()
    expected, _ = router(s)
    replay.replay()
    router(s)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    replay.replay()
    with torch.cuda.graph(graph):
        experts, weights = router(s)
    fresh = make_logits(4096, 16, 5).cuda()
    s.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(experts, expected)
    assert torch.equal(weights, ssr_torch.replay_weights(fresh, expected))


def test_recorded_weights_leave_the_graph_and_the_model_copies():
    import copy

    block = Block().train()
    replays = ssr_torch.attach_replay(block, tokens=32, record_weights=True)
    replays.record()
    block(make_logits(32, 8, 3, dtype=torch.float32).requires_grad_()).backward()  # a training forward recorded
    assert not replays[0].weights.requires_grad and replays[0].weights.grad_fn is None
    twin = copy.deepcopy(block)
    assert torch.equal(twin.router.replay.experts, replays[0].experts) and twin.router.step == block.router.step
