"""ssr_torch.Router: an nn.Module that routes gating logits with any of the library's routers by name."""
import math
import warnings

import torch
import torch.distributed as dist

from ._ops import route
from .losses import _SCORES, _agree, update_expert_bias


def _in_backward():
    # A forward that backward runs again (activation checkpointing), as torch.utils.module_tracker tells it.
    return not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1


# The library's routers (ssr::make_policy): softmax top-k; Sinkhorn top-k on every training call; SSR,
# Sinkhorn with probability p per training call. Evaluation always routes by softmax top-k.
ROUTERS = ("softmax", "sinkhorn", "ssr")
_COSTS = ("linear", "softmax")
_WEIGHTS = ("plan", "scores")
# The state_dict key of a module's extra state (torch.nn.Module.get_extra_state).
_EXTRA_STATE = "_extra_state"


class Router(torch.nn.Module):
    """Routes m x n gating logits to k experts per token: forward(logits) returns (experts, weights),
    experts int64 (torch's index type) and weights of the logits' floating type.

    Options and defaults are ssr-route's (the paper's): router "ssr" with p = 1e-3, k = 2, linear cost,
    xi = 0.5, tol = 1e-4, max_iters = 100, plan weights (the Sinkhorn path passes no gradient to the
    logits; "scores" passes the softmax gradient), no noise. In training each call draws its random
    numbers from (seed, layer, step): `step` counts the training calls unless forward is given one.
    After a call, `load` holds the tokens per expert and `info` [took Sinkhorn, weights pass gradient,
    iterations, marginal error].

    state_dict() holds seed, layer and step (an int64 tensor [seed, layer, step] under "_extra_state"), so
    that a run resumed from a checkpoint draws the same random numbers as the uninterrupted one;
    load_state_dict restores them. A state_dict without them (saved by an earlier version) loads, strictly
    too, and keeps the Router's own. With persistent=False, state_dict() leaves them out.

    With group (a torch.distributed process group: Gloo for CPU tensors, NCCL for CUDA tensors), the Sinkhorn path balances the
    plan over the tokens of every rank of the group: every rank calls forward with the same options and
    step. A rank's tokens are global rows rank * m .. rank * m + m - 1 (ranks of equal batches, the
    data-parallel case) unless forward is given first_row (uneven batches: the rows of the lower ranks).

    With `replay` (an ssr_torch.RouterReplay, e.g. from ssr_torch.attach_replay) recording, each call's
    experts (and weights) are copied into its buffers; replaying, a call takes the recorded experts instead
    of routing, with weights recomputed from its logits as the softmax path's, passing gradient (load and
    info describe the replayed choice; the step counts as usual; no expert bias update).

    The selection rules of today's engines (docs/routers.md): score "sigmoid" (DeepSeek-V3) instead of
    "softmax"; group-limited top-k over n_groups equal groups of experts, keeping topk_groups; and with
    expert_bias=True (n_experts needed) a float32 buffer `expert_bias` added to the scores when the softmax
    path selects. With bias_update_rate > 0 each training call that routes with it moves it toward balance
    (ssr_torch.update_expert_bias, loads summed over group, where a call that fails on one rank raises on
    every rank); with 0 the caller updates it, e.g. once per
    optimizer step from the loads of its micro-batches.

    Under activation checkpointing the forward that backward runs again routes as the one it recomputes
    (that call's step and bias) and neither counts nor updates, provided it runs before the Router's next
    training forward. The Megatron and torchtitan adaptors pass each recompute its forward's step and the
    engine's own bias, so there several forwards may run before their recomputes.
    """

    def __init__(self, router="ssr", k=2, cost="linear", xi=0.5, tol=1e-4, max_iters=100, weights="plan", p=1e-3,
                 noise_alpha=0.0, noise_sigma=1.0, seed=0, layer=0, group=None, score="softmax", n_groups=1,
                 topk_groups=1, n_experts=None, expert_bias=False, bias_update_rate=0.0, persistent=True):
        super().__init__()
        _choose("router", router, ROUTERS + ("selective",))
        _choose("cost", cost, _COSTS)
        _choose("weights", weights, _WEIGHTS)
        _choose("score", score, _SCORES)
        if expert_bias and (n_experts is None or n_experts < 1):
            raise ValueError(f"ssr_torch.Router: expert_bias needs n_experts (the number of experts), got {n_experts}")
        if bias_update_rate and not expert_bias:
            raise ValueError("ssr_torch.Router: bias_update_rate needs expert_bias=True")
        for name, value, ok, rule in (("k", k, k >= 1, "must be at least 1"),
                                      ("xi", xi, 0 < xi < math.inf, "must be finite and > 0"),
                                      ("tol", tol, 0 < tol < math.inf, "must be finite and > 0"),
                                      ("max_iters", max_iters, max_iters >= 1, "must be at least 1"),
                                      ("p", p, 0 <= p <= 1, "must be in [0, 1]"),
                                      ("noise_alpha", noise_alpha, 0 <= noise_alpha < math.inf,
                                       "must be finite and >= 0"),
                                      ("noise_sigma", noise_sigma, 0 < noise_sigma < math.inf,
                                       "must be finite and > 0"),
                                      ("seed", seed, 0 <= seed < 2 ** 32, "must be in [0, 2^32)"),
                                      ("layer", layer, 0 <= layer < 2 ** 32, "must be in [0, 2^32)"),
                                      ("n_groups", n_groups, n_groups >= 1, "must be at least 1"),
                                      ("topk_groups", topk_groups, 1 <= topk_groups <= n_groups,
                                       "must be in [1, n_groups]"),
                                      ("bias_update_rate", bias_update_rate, 0 <= bias_update_rate < math.inf,
                                       "must be finite and >= 0")):
            if not ok:
                raise ValueError(f"ssr_torch.Router: invalid {name} = {value}: {rule}")
        if topk_groups < n_groups and router != "softmax" and not (router in ("ssr", "selective") and p == 0):
            raise ValueError(f"ssr_torch.Router: group-limited top-k (topk_groups = {topk_groups} < n_groups = "
                             f"{n_groups}) needs router 'softmax' (or 'ssr' with p = 0): the Sinkhorn path selects "
                             "by its plan")
        # Cost noise perturbs the cost that the softmax path ranks; sigmoid scores, groups and an expert bias
        # rank another quantity (the library's rule, which would otherwise fail every training call).
        if noise_alpha > 0 and (score != "softmax" or topk_groups < n_groups):
            raise ValueError(f"ssr_torch.Router: invalid noise_alpha = {noise_alpha}: cost noise needs softmax "
                             f"scores without groups (score = {score!r}, n_groups = {n_groups}, "
                             f"topk_groups = {topk_groups})")
        softmax_in_training = router == "softmax" or (router in ("ssr", "selective") and p < 1)
        if noise_alpha > 0 and expert_bias and softmax_in_training:
            raise ValueError(f"ssr_torch.Router: invalid noise_alpha = {noise_alpha} with expert_bias=True: cost "
                             "noise perturbs the ranking of the logits, an expert bias that of the scores; use one "
                             "of them")
        self.router, self.k, self.cost, self.weights = router, int(k), cost, weights
        self.xi, self.tol, self.max_iters, self.p = float(xi), float(tol), int(max_iters), float(p)
        self.noise_alpha, self.noise_sigma = float(noise_alpha), float(noise_sigma)
        self.seed, self.layer = int(seed), int(layer)
        self.score, self.n_groups, self.topk_groups = score, int(n_groups), int(topk_groups)
        self.bias_update_rate = float(bias_update_rate)
        self.persistent = bool(persistent)
        if expert_bias:
            self.register_buffer("expert_bias", torch.zeros(int(n_experts), dtype=torch.float32))
            # The bias the last training call routed with, before it updated it: its recompute routes with it.
            self.register_buffer("_routed_bias", torch.zeros(int(n_experts), dtype=torch.float32), persistent=False)
        else:
            self.expert_bias = None
        self.group = group
        self.group_rank = 0 if group is None else dist.get_rank(group)
        # The step counter as a CPU tensor that the operator reads when it runs: torch.compile traces it as
        # an input (an int attribute would be a constant, recompiled for at every step).
        self._step = torch.zeros((), dtype=torch.int64, device="cpu")
        self._counted_step = None  # the step tensor of the last call the counter gave its step
        self.load = None
        self.info = None
        self.replay = None  # an ssr_torch.RouterReplay that records or replays this Router's calls

    def forward(self, logits, step=None, first_row=None, expert_bias=None):
        """Routes logits (m x n: float32 or float64; on CUDA also float16 and bfloat16) to k experts per
        token. Returns experts (m x k, int64) and weights (m x k, the logits' dtype, float32 for float16 and
        bfloat16), on the logits' device; each token's weights sum to 1.

        step (an int >= 0) is this call's step instead of the counter, which it leaves as it is; first_row
        is the global row of this rank's first token when balancing over a group. expert_bias (n float32
        values on the logits' device) is this call's bias instead of the Router's own buffer, for engines that
        own and update it themselves. Sets `load` (n, int32) and
        `info` (4, float64). Raises RuntimeError for logits the operator does not take (not 2-d, another
        dtype, a device without kernels, fewer than k experts).
        """
        # Activation checkpointing runs a training forward again inside backward: it routes as that forward
        # did (its step, the bias before its update), and neither counts nor updates again.
        in_backward = _in_backward()
        recompute = self.training and in_backward
        call_step = self._step if step is None else step
        if recompute and step is None and self._counted_step is not None:
            # The step tensor that forward read, read again inside the operator: reading its value here would be
            # an operation the forward did not make, which selective activation checkpointing rejects.
            call_step = step = self._counted_step
        bias = self.expert_bias if expert_bias is None else expert_bias
        if self.bias_update_rate > 0 and self.training and expert_bias is None:
            if recompute:
                bias = self._routed_bias
            else:
                self._routed_bias.copy_(self.expert_bias)
        replay = self.replay
        if replay is not None and replay.mode == "replay":
            experts, weights = replay.read(logits, self.score, recompute=in_backward)
            self._count_call(step)
            self.load = torch.zeros(logits.shape[1], dtype=torch.int32, device=logits.device).index_add_(
                0, experts.reshape(-1), torch.ones(experts.numel(), dtype=torch.int32, device=logits.device))
            self.info = torch.zeros(4, dtype=torch.float64, device=logits.device)
            self.info[1] = 1  # softmax-path weights: they pass gradient
            return experts, weights
        updates_bias = self.training and self.bias_update_rate > 0 and not recompute and expert_bias is None
        try:
            row = self.group_rank * logits.shape[0] if first_row is None else first_row
            experts, weights, load, info = route(logits, self.router, self.k, self.cost, self.xi, self.tol,
                                                 self.max_iters, self.weights, self.p, self.noise_alpha,
                                                 self.noise_sigma, self.seed, call_step, self.layer, self.training,
                                                 row, self.group, self.score, self.n_groups, self.topk_groups, bias)
        except Exception as error:
            if updates_bias and self.group is not None:  # the other ranks' bias update raises with it
                _agree(self.group, self.expert_bias.numel(), error)
            raise
        if updates_bias:
            update_expert_bias(self.expert_bias, load, self.bias_update_rate, self.group)
        self._count_call(step)
        self.load, self.info = load, info
        experts = experts.long()  # int64, as torch's topk, gather, scatter and one_hot take indices
        if replay is not None and replay.mode == "record" and not in_backward:  # a recompute was recorded
            replay.write(experts, weights)
        return experts, weights

    def _count_call(self, step):
        # A new tensor, never a change in place (here and in the setter): a compiled graph that runs this call
        # again in backward (activation checkpointing) reads the step tensor it saved, which must still hold
        # this call's step.
        if self.training and step is None:
            self._counted_step = self._step
            self._step = self._step + 1

    @property
    def step(self):
        """The number of training calls counted so far (an int): the step of the next one."""
        return int(self._step)

    @step.setter
    def step(self, value):
        self._step = torch.tensor(int(value), dtype=torch.int64, device="cpu")

    def __setstate__(self, state):
        # A Router pickled by an earlier version holds its step as an int, no replay and no _routed_bias.
        if "_step" not in state:
            state["_step"] = torch.tensor(int(state.pop("step", 0)), dtype=torch.int64, device="cpu")
        state.setdefault("replay", None)
        state.setdefault("_counted_step", None)
        buffers = state.get("_buffers", {})
        if buffers.get("expert_bias") is not None and "_routed_bias" not in buffers:
            buffers["_routed_bias"] = buffers["expert_bias"].clone()
            state.setdefault("_non_persistent_buffers_set", set()).add("_routed_bias")
        super().__setstate__(state)

    def _apply(self, fn, recurse=True):
        # The expert bias follows the module's device but stays float32, exactly, under .half(), .double() or
        # .to(dtype): the operator reads float32, and updates of 1e-3 would vanish in half precision.
        kept = {name: self._buffers[name] for name in ("expert_bias", "_routed_bias")
                if self._buffers.get(name) is not None}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            if self._buffers[name].dtype != torch.float32:
                self._buffers[name] = before.to(device=self._buffers[name].device)
        return self

    def get_extra_state(self):
        # What a resumed run needs to draw the same random numbers; a tensor, so that safetensors and
        # torch.load(weights_only=True) take it.
        return torch.tensor([self.seed, self.layer, self.step], dtype=torch.int64)

    def set_extra_state(self, state):
        values = torch.as_tensor(state).reshape(-1).tolist()
        if len(values) != 3 or not all(0 <= v < 2 ** 32 for v in values[:2]) or values[2] < 0:
            raise ValueError(f"ssr_torch.Router: invalid saved state {values}: expected [seed, layer, step], "
                             "seed and layer in [0, 2^32), step >= 0")
        self.seed, self.layer, self.step = (int(v) for v in values)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if not self.persistent:
            destination.pop(prefix + _EXTRA_STATE, None)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        # A state_dict without seed, layer and step keeps the Router's own, strict or not; a persistent
        # Router says so, since a resumed run would then repeat the draws of the steps already taken.
        if prefix + _EXTRA_STATE not in state_dict:
            if prefix + _EXTRA_STATE in missing_keys:
                missing_keys.remove(prefix + _EXTRA_STATE)
            if self.persistent:
                warnings.warn(f"ssr_torch.Router {prefix.rstrip('.') or '(root)'}: the state_dict holds no seed, "
                              f"layer and step; the Router keeps its own (step {self.step})", stacklevel=3)

    def extra_repr(self):
        return (f"router={self.router!r}, k={self.k}, cost={self.cost!r}, xi={self.xi}, weights={self.weights!r}, "
                f"p={self.p}, noise_alpha={self.noise_alpha}, layer={self.layer}, score={self.score!r}, "
                f"n_groups={self.n_groups}, topk_groups={self.topk_groups}, "
                f"expert_bias={self.expert_bias is not None}, bias_update_rate={self.bias_update_rate}")


def _choose(name, value, choices):
    if value not in choices:
        raise ValueError(f"ssr_torch.Router: invalid {name} = {value!r}: must be one of {', '.join(choices)}")
