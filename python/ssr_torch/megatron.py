"""SSR routing for Megatron-core's MoE layers.

`replace_routers(model)` makes every Megatron-core `TopKRouter` of a model choose its experts and weights
with an `ssr_torch.Router`. `routing(logits)` still returns Megatron's `(probs, routing_map)`: ssr's weights
at the chosen experts and 0 elsewhere, and the boolean map, so every token dispatcher works unchanged. The
rest of Megatron's routing stays as it is: the z-loss, capacity and token dropping (after ssr's choice), the
auxiliary losses its config asks for, the expert bias and its token counts.

Supported: megatron-core 0.16 (tested 0.16.1), whose `TopKRouter.routing` this module follows; importing it
with another version raises ImportError.
"""
import abc

import torch

from ._engines import call_step, in_checkpoint_forward, require, restore, swap
from .router import Router

TESTED = "0.16.1"
require("megatron-core", "0.16", TESTED, __name__)

from megatron.core.transformer.moe.moe_utils import (apply_router_token_dropping,  # noqa: E402
                                                     compute_routing_scores_for_aux_loss)
from megatron.core.transformer.moe.router import TopKRouter  # noqa: E402
from megatron.core.transformer.moe.router_replay import RouterReplayAction  # noqa: E402


class SsrTopKRouter(abc.ABC):
    """Mixin put in front of a TopKRouter class: `routing` chooses with `self.ssr`, the rest is Megatron's.

    It derives from ABC as TopKRouter's base does: CPython refuses to swap an object's class for one whose
    first base has another layout.
    """

    def routing(self, logits, padding_mask=None):
        replay = self.router_replay
        if replay is not None and replay.router_replay_action in (RouterReplayAction.REPLAY_FORWARD,
                                                                    RouterReplayAction.REPLAY_BACKWARD):
            return super().routing(logits, padding_mask)  # Megatron's replay of the experts it recorded
        seq_length, batch = logits.shape[:2]
        logits = logits.view(-1, self.config.num_moe_experts)
        if padding_mask is not None:
            padding_mask = padding_mask.reshape(-1)
        logits = self.apply_z_loss(logits, padding_mask=padding_mask)

        experts, weights = self._ssr_choose(logits)
        if replay is not None and replay.router_replay_action == RouterReplayAction.RECORD:
            replay.record_indices(experts)
        if self.config.moe_router_topk_scaling_factor:
            weights = weights * self.config.moe_router_topk_scaling_factor
        probs = torch.zeros_like(logits).scatter(1, experts, weights.to(logits.dtype))
        routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, experts, True)

        # The rest of TopKRouter.routing (megatron-core 0.16), on ssr's choice.
        if self.config.moe_expert_capacity_factor is not None:
            probs, routing_map = apply_router_token_dropping(
                probs, routing_map, router_topk=self.topk, capacity_factor=self.config.moe_expert_capacity_factor,
                drop_policy=self.config.moe_token_drop_policy,
                pad_to_capacity=self.config.moe_pad_expert_input_to_capacity)
        if self.training and torch.is_grad_enabled() and self.is_aux_loss_enabled():
            aux_map, aux_scores = compute_routing_scores_for_aux_loss(
                logits, self.topk, self.score_function, fused=self.config.moe_router_fusion, padding_mask=padding_mask)
            padded = padding_mask is not None
            probs = self._apply_aux_loss(probs, aux_scores, aux_map, with_padding_mask=padded)
            probs = self._apply_seq_aux_loss(probs, aux_scores, aux_map, seq_length, batch, with_padding_mask=padded)
            probs = self._apply_global_aux_loss(probs, aux_scores, aux_map, with_padding_mask=padded)
        self._apply_expert_bias(routing_map, padding_mask=padding_mask)  # the counts its bias update reads
        return probs, routing_map

    def _ssr_choose(self, logits):
        # Megatron's activation recompute runs the first forward under no_grad (reentrant checkpoint).
        checkpointed = self.ssr.training and not torch.is_grad_enabled() and in_checkpoint_forward()
        step = call_step(self, checkpointed=checkpointed)
        route_logits = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
        return self.ssr(route_logits, step=step, expert_bias=self.expert_bias)


def _unsupported(config):
    """Why ssr cannot route as this config asks, or None."""
    if config.moe_router_pre_softmax:
        return ("moe_router_pre_softmax=True weights the experts by a softmax over all of them; ssr's weights "
                "sum to 1 over the chosen experts")
    if config.moe_router_score_function == "sigmoid" and config.moe_router_topk == 1:
        return ("moe_router_score_function='sigmoid' with moe_router_topk=1 weights each token by its expert's raw "
                "sigmoid score; ssr's weight of a single expert is 1")
    if _group_limited(config):
        if config.moe_router_score_function != "sigmoid":
            return "group-limited routing with softmax scores (Megatron ranks the groups by raw logits)"
        if config.moe_router_topk // config.moe_router_group_topk != 2:
            return (f"group-limited routing with moe_router_topk // moe_router_group_topk = "
                    f"{config.moe_router_topk // config.moe_router_group_topk} (ssr ranks a group by its two best "
                    "scores)")
    return None


def _group_limited(config):
    # Megatron limits the groups only with moe_router_group_topk set, and keeping every group limits nothing.
    groups, kept = config.moe_router_num_groups or 1, config.moe_router_group_topk
    return bool(kept) and kept < groups


def replace_routers(model, router="ssr", group=None, **router_options):
    """Routes every Megatron-core `TopKRouter` in `model` (a router itself, or a model holding them) with an
    `ssr_torch.Router`; returns the Routers in model order.

    From Megatron's config: k (`moe_router_topk`), the score function (`moe_router_score_function`), the
    groups (`moe_router_num_groups`, `moe_router_group_topk`), the expert bias
    (`moe_router_enable_expert_bias`, updated by Megatron from ssr's choices) and the weights' scaling factor;
    `layer` is the router's global `layer_number`, so pipeline stages draw as one model. `router_options`
    are the Router's (p, cost, xi, weights, noise, seed). `group` balances the Sinkhorn path over ranks:
    None (each rank its own tokens, as Megatron's own Sinkhorn), `"tp_cp"` (the ranks of Megatron's
    aux_loss), `"tp_dp_cp"` (the global batch) or a process group.

    Megatron's `moe_router_load_balancing_type` losses, z-loss and capacity still apply. The Routers hold no
    parameters and are not saved (persistent=False), so the model's state_dict keeps its keys.

    Raises, before changing anything, TypeError when `model` holds no TopKRouter and ValueError naming a
    configuration ssr does not route as Megatron would (pre-softmax weights; sigmoid scores with top-1, whose
    weight is the raw score; group-limited routing other than sigmoid scores with moe_router_topk //
    moe_router_group_topk = 2) or a bad option.
    """
    if "layer" in router_options or "k" in router_options:
        raise TypeError("replace_routers: k and layer come from each router's Megatron config; do not pass them")
    found = [module for module in model.modules() if isinstance(module, TopKRouter)]
    if not found:
        raise TypeError(f"replace_routers: {type(model).__name__} holds no megatron.core TopKRouter")
    routers = []
    for position, module in enumerate(found):
        config = module.config
        reason = _unsupported(config)
        if reason:
            raise ValueError(f"replace_routers: not supported: {reason}")
        limited = _group_limited(config)
        process_group = {"tp_cp": getattr(module, "tp_cp_group", None),
                         "tp_dp_cp": getattr(module, "tp_dp_cp_group", None)}.get(group, group)
        routers.append(Router(router, k=config.moe_router_topk, score=config.moe_router_score_function,
                              n_groups=config.moe_router_num_groups if limited else 1,
                              topk_groups=config.moe_router_group_topk if limited else 1,
                              layer=module.layer_number if module.layer_number is not None else position,
                              group=process_group, **{"persistent": False, **router_options}))
    for module, r in zip(found, routers):
        swap(module, SsrTopKRouter, r)
    return routers


def restore_routers(model):
    """Undoes replace_routers: the TopKRouters route by Megatron's own rule again. Returns how many."""
    return restore(model, SsrTopKRouter)
