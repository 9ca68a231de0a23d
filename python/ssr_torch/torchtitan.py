"""SSR routing for torchtitan's MoE layers.

`replace_routers(model)` makes every torchtitan `TokenChoiceTopKRouter` of a model choose its experts and
weights with an `ssr_torch.Router`. Its `forward(x, expert_bias=None)` still returns torchtitan's three
outputs: the weights (ssr's, times `route_scale`), the experts (int64) and the full score tensor of
`score_func`, so the MoE module, its token counts and its expert-bias update work unchanged.

`SsrRouters`, a torchtitan model converter, does the same in a model config before the model is built, so
that a trainer config turns SSR on: `model_registry(..., converters=[SsrRouters.Config(p=1e-3)])`.

Supported: torchtitan 0.3 (tested 0.3.0); importing this module with another version raises ImportError.
"""
import warnings
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from ._engines import attach, call_step, in_checkpoint_forward, require, restore, swap
from .hf import _layer_index
from .router import Router

TESTED = "0.3.0"
require("torchtitan", "0.3", TESTED, __name__)

from torch.distributed.tensor import DTensor  # noqa: E402
from torchtitan.models.common.moe import TokenChoiceTopKRouter  # noqa: E402
from torchtitan.protocols.model import ModelConfigConverter  # noqa: E402
from torchtitan.protocols.module import Module  # noqa: E402


class TorchtitanRouter(Router, Module):
    """An ssr_torch.Router that is also a torchtitan Module, as the Trainer requires of every submodule."""


class SsrTokenChoiceTopKRouter:
    """Mixin put in front of a TokenChoiceTopKRouter class: the same gate and outputs, chosen by `self.ssr`."""

    def forward(self, x, expert_bias=None):
        if self._debug_force_load_balance:
            return super().forward(x, expert_bias)
        with torch.autocast(device_type=x.device.type, dtype=torch.float32):
            logits = self.gate(x)
        if isinstance(logits, DTensor) or isinstance(expert_bias, DTensor):
            raise NotImplementedError("ssr_torch.torchtitan: tensor-parallel router inputs (DTensor) are not "
                                      "supported yet")
        batch, length, n = logits.shape
        flat = logits.reshape(batch * length, n)
        flat = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
        # With recomputed=True an eager training forward that backward will run again (with gradient on, or
        # inside a reentrant checkpoint) leaves its step for that recompute; a forward without gradient leaves
        # none, and a compiled recompute reads the step its forward saved.
        checkpointed = self._ssr_recomputed and not torch.compiler.is_compiling() and (
            torch.is_grad_enabled() or in_checkpoint_forward())
        step = call_step(self, checkpointed=checkpointed)
        experts, weights = self.ssr(flat, step=step, expert_bias=expert_bias)
        scores = torch.sigmoid(logits) if self.score_func == "sigmoid" else F.softmax(logits, dim=-1)
        return (weights * self.route_scale).view(batch, length, -1), experts.view(batch, length, -1), scores


def _make_router(source, router, layer, biased, group=None, **router_options):
    # source: a TokenChoiceTopKRouter or its Config, which name k, the score and the groups alike. biased: its
    # MoE passes an expert bias with each call (load_balance_coeff), which the options are checked against.
    n_groups = source.num_expert_groups or 1
    made = {"router": router, "k": source.top_k, "score": source.score_func, "n_groups": n_groups,
            "topk_groups": source.num_limited_groups or n_groups, "layer": layer, "persistent": False,
            **router_options}
    if biased:  # e.g. cost noise, which the library refuses beside a bias on the softmax path
        TorchtitanRouter(**made, expert_bias=True, n_experts=source.num_experts)
    return TorchtitanRouter(**made, group=group)


def _biased(moe):
    # Whether a torchtitan MoE (module or config) gives its router an expert bias.
    return getattr(moe, "load_balance_coeff", None) is not None


def _warn_route_norm(sources):
    if any(not source.route_norm for source in sources):
        warnings.warn("ssr_torch.torchtitan: ssr's weights sum to 1 over the chosen experts (route_norm=True); "
                      "routers with route_norm=False weighted them by their raw scores", stacklevel=3)


def replace_routers(model, router="ssr", group=None, recomputed=False, **router_options):
    """Routes every torchtitan `TokenChoiceTopKRouter` in `model` (a router itself, or a model holding them)
    with an `ssr_torch.Router`; returns the Routers in model order.

    From the router: k (`top_k`), the score function (`score_func`) and the groups (`num_expert_groups`,
    `num_limited_groups`); the MoE module's expert bias comes with each call. `layer` is the index of the
    module's layer in its name (`layers.3.moe.router` -> 3). `router_options` are the Router's (p, cost, xi,
    weights, noise, seed); `group` is the process group the Sinkhorn path balances over (None: this rank's
    tokens). `recomputed=True` when activation checkpointing wraps the MoE layers (its recompute then draws
    what the first forward drew). The Routers hold no parameters and are not saved (persistent=False), so
    the model's state_dict keeps its keys.

    ssr's weights sum to 1 over the chosen experts, as torchtitan's with `route_norm=True`; a router with
    `route_norm=False` weights its experts by their raw scores, so its outputs change (a warning says so).
    Raises, before changing anything, TypeError when `model` holds no TokenChoiceTopKRouter, and the
    Router's ValueError for a bad option or combination (e.g. group-limited routing on the Sinkhorn path, or
    cost noise beside the expert bias of a MoE with `load_balance_coeff`).
    """
    if "layer" in router_options or "k" in router_options:
        raise TypeError("replace_routers: k and layer come from each router; do not pass them")
    found = [(name, module) for name, module in model.named_modules() if isinstance(module, TokenChoiceTopKRouter)]
    if not found:
        raise TypeError(f"replace_routers: {type(model).__name__} holds no torchtitan TokenChoiceTopKRouter")
    routers = [_make_router(module, router, _layer_index(name, position),
                            "." in name and _biased(model.get_submodule(name.rpartition(".")[0])), group,
                            **router_options)
               for position, (name, module) in enumerate(found)]
    _warn_route_norm(module for _, module in found)
    for (_, module), r in zip(found, routers):
        swap(module, SsrTokenChoiceTopKRouter, r, recomputed=bool(recomputed))
    return routers


def restore_routers(model):
    """Undoes replace_routers: the routers choose by torchtitan's own rule again. Returns how many."""
    return restore(model, SsrTokenChoiceTopKRouter)


class SsrRouters(ModelConfigConverter):
    """A torchtitan model converter: every `TokenChoiceTopKRouter` config of a model config becomes one that
    builds the router with SSR, as `replace_routers` makes it (`layer` from the config's place in the model,
    `layers.3.moe.router` -> 3). Give it where a trainer config names its model:
    `model_registry("debugmodel_moe", converters=[SsrRouters.Config(p=1e-3)])`.

    Its Config holds `replace_routers`' options but the process group, a runtime object: each rank balances
    its own tokens. The Routers are not saved with the model: a resumed run starts them at step 0 unless the
    trainer sets `router.ssr.step`. Raises, when converting, TypeError for a config without a
    TokenChoiceTopKRouter, ValueError for layers sharing one config object, and the Router's ValueError for a
    bad option or combination (cost noise beside the expert bias of a MoE with `load_balance_coeff` too)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ModelConfigConverter.Config):
        router: str = "ssr"
        p: float = 1e-3
        cost: str = "linear"
        xi: float = 0.5
        tol: float = 1e-4
        max_iters: int = 100
        weights: str = "plan"
        noise_alpha: float = 0.0
        noise_sigma: float = 1.0
        seed: int = 0
        recomputed: bool = False
        """True when activation checkpointing wraps the MoE layers (replace_routers' `recomputed`)."""

        def router_options(self):
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("router", "recomputed")}

    def __init__(self, config: Config, **kwargs):
        self.config = config

    def convert(self, model_config):
        found = list(model_config.traverse(TokenChoiceTopKRouter.Config))
        if not found:
            raise TypeError(f"SsrRouters: {type(model_config).__name__} holds no TokenChoiceTopKRouter config")
        places = [(id(parent), attr) for _, _, parent, attr in found]
        if len(set(places)) < len(places):
            raise ValueError("SsrRouters: layers share one config object; each router config needs its own place "
                             "(its layer index)")
        converted, made = model_config, []
        for position, (fqn, router_config, parent, _) in enumerate(found):
            torchtitans = {f.name: getattr(router_config, f.name) for f in fields(TokenChoiceTopKRouter.Config)}
            new = SsrConfiguredRouter.Config(**torchtitans, ssr=self.config, layer=_layer_index(fqn, position),
                                             biased=_biased(parent))
            SsrConfiguredRouter.router(new)  # a bad option raises now, before any config changes
            made.append(new)
        for (_, _, parent, attr), new in zip(found, made):
            if parent is None:
                converted = new
            elif isinstance(parent, list):
                parent[attr] = new
            else:
                setattr(parent, attr, new)
        _warn_route_norm(router_config for _, router_config, _, _ in found)
        return converted


class SsrConfiguredRouter(SsrTokenChoiceTopKRouter, TokenChoiceTopKRouter):
    """A TokenChoiceTopKRouter built with SSR from a config SsrRouters converted (restore_routers undoes it)."""

    _original_class = TokenChoiceTopKRouter

    @dataclass(kw_only=True, slots=True)
    class Config(TokenChoiceTopKRouter.Config):
        ssr: SsrRouters.Config
        layer: int = 0
        biased: bool = False
        """Whether its MoE passes an expert bias with each call (load_balance_coeff)."""

    @staticmethod
    def router(config):
        return _make_router(config, config.ssr.router, config.layer, config.biased, **config.ssr.router_options())

    def __init__(self, config: Config):
        super().__init__(config)
        attach(self, self.router(config), recomputed=bool(config.ssr.recomputed))
