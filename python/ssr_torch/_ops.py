"""The operators' fake kernels (shapes and dtypes, for torch.compile and meta tensors), ``route``, the operator
with keyword arguments, and ``replay_weights``. Their autograd is C++ (csrc/autograd.cpp, csrc/replay.cpp)."""
import torch

from . import _build


def _weights_dtype(logits):
    # Weights are computed and returned in float32 for half and bfloat16 logits.
    return logits.dtype if logits.dtype in (torch.float32, torch.float64) else torch.float32


@torch.library.register_fake("ssr::route")
def _route_fake(logits, policy="selective", k=2, cost="linear", xi=0.5, tol=1e-4, max_iters=100, weights="plan",
                p=1e-3, noise_alpha=0.0, noise_sigma=1.0, seed=0, step=0, layer=0, training=True, first_row=0, group="",
                score="softmax", n_groups=1, topk_groups=1, expert_bias=None, step_tensor=None):
    torch._check(logits.dim() == 2, lambda: f"ssr.route: logits must be 2-d, got {logits.dim()} dimensions")
    m, n = logits.shape
    return (logits.new_empty((m, k), dtype=torch.int32), logits.new_empty((m, k), dtype=_weights_dtype(logits)),
            logits.new_empty((n,), dtype=torch.int32), logits.new_empty((4,), dtype=torch.float64))


@torch.library.register_fake("ssr::replay_weights")
def _replay_weights_fake(logits, experts, score="softmax"):
    return logits.new_empty(experts.shape, dtype=_weights_dtype(logits))


@torch.library.register_fake("ssr::route_backward")
def _route_backward_fake(grad_weights, experts, weights, n, passes_gradient, info=None, score="softmax", logits=None):
    return weights.new_empty((experts.shape[0], n))


def route(logits, policy="selective", k=2, cost="linear", xi=0.5, tol=1e-4, max_iters=100, weights="plan", p=1e-3,
          noise_alpha=0.0, noise_sigma=1.0, seed=0, step=0, layer=0, training=True, first_row=0, group=None,
          score="softmax", n_groups=1, topk_groups=1, expert_bias=None):
    """Routes logits (m x n: float32 or float64; on CUDA also float16 and bfloat16) with the router policy
    ("softmax", "sinkhorn", "ssr" or "selective"). Returns experts (m x k, int32), weights (m x k, the
    logits' dtype, float32 for float16 and bfloat16; each row sums to 1), load (n, int32: tokens per expert)
    and info [took Sinkhorn, weights pass gradient, iterations, marginal error] (4, float64), all on the
    logits' device. See ssr-route's options; training=False routes by softmax top-k. step may also be a
    one-element int64 CPU tensor, read when the call runs: torch.compile then traces it as an input instead
    of recompiling for each value.

    With group (a torch.distributed process group), the Sinkhorn path balances the plan over the tokens of
    every rank of the group, whose rows start at global row first_row; every rank makes the call.

    score ("softmax" or "sigmoid"), n_groups and topk_groups (group-limited top-k) and expert_bias (n float32
    values on the logits' device, added to the scores when the softmax path selects) are the selection
    rules of docs/routers.md.

    Raises RuntimeError for an invalid option or logits the operator does not take (not 2-d, another dtype,
    fewer than k experts), and for CUDA logits when this build has no CUDA kernels (ssr_torch.backends())."""
    if logits.device.type == "cuda" and "cuda" in _build.MISSING:
        raise RuntimeError(f"ssr_torch: {_build.MISSING['cuda']}")
    step_tensor = step if isinstance(step, torch.Tensor) else None
    return torch.ops.ssr.route(logits, policy, k, cost, xi, tol, max_iters, weights, p, noise_alpha, noise_sigma, seed,
                               0 if step_tensor is not None else step, layer, training, first_row, group_name(group),
                               score, n_groups, topk_groups, expert_bias, step_tensor)


def replay_weights(logits, experts, score="softmax"):
    """Returns the weights the softmax path gives `experts` (m x k, int32 or int64: recorded by an earlier
    call) from `logits` (m x n): the score weights over the chosen experts, each row summing to 1, in the
    logits' dtype (float32 for float16 and bfloat16), with the softmax path's gradient to the logits. The same formula as
    the route's, so where the recorded call took the softmax path (or score weights) on the same logits, the
    same bits. Raises RuntimeError on the CPU for an expert outside [0, n); on a GPU, which reads nothing
    back, such a token's weights are NaN."""
    if logits.device.type == "cuda" and "cuda" in _build.MISSING:
        raise RuntimeError(f"ssr_torch: {_build.MISSING['cuda']}")
    return torch.ops.ssr.replay_weights(logits, experts, score)


def group_name(group):
    """The name under which a process group is registered ("" for none): what the operator takes."""
    return "" if group is None else group.group_name
