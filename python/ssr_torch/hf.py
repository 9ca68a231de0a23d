"""Drop-in SSR routing for Hugging Face `transformers` MoE models.

`replace_routers(model)` makes every sparse-MoE block of a model route its gate logits with an
`ssr_torch.Router` instead of softmax top-k. The block keeps its gate weight, its experts and its forward:
only the gate's choice of experts and weights changes, so the model's state_dict, its `router_logits`
output and its auxiliary loss work as before.

Supported (transformers >= 5, whose MoE blocks call a `...TopKRouter` gate and fused experts): Qwen3-MoE,
Qwen2-MoE, Mixtral and OLMoE.
"""
import importlib
import warnings

import torch
import torch.nn.functional as F

from .router import Router

# Gates whose forward is softmax top-k over F.linear(hidden, weight), returning (logits, weights, experts):
# the blocks that own them pass the gate's weights and experts straight to their experts module. Each with
# its model's module name in transformers.models.
SUPPORTED_GATES = {"Qwen3MoeTopKRouter": "qwen3_moe", "Qwen2MoeTopKRouter": "qwen2_moe",
                   "MixtralTopKRouter": "mixtral", "OlmoeTopKRouter": "olmoe"}
# Gates that return their weights in float32 whatever the logits' dtype; the others in the logits' dtype.
FLOAT32_WEIGHTS = {"MixtralTopKRouter"}


class SsrGate:
    """Mixin put in front of a supported gate class: the same module and parameters, routed by `self.ssr`.

    Being a subclass of the original gate keeps the model's `router_logits` capture (transformers hooks
    gates by isinstance) and the parameter names; the Router holds no parameters, and puts its step in the
    state_dict only when asked to (replace_routers' persistent=True).
    """

    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.weight.shape[-1])
        logits = F.linear(hidden_states, self.weight)
        # The operators take float32/float64 logits; transformers' gates also route in float.
        route_logits = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
        experts, weights = self.ssr(route_logits)  # a recompute under gradient checkpointing routes as its forward
        return logits, weights if self._float32_weights else weights.to(logits.dtype), experts


_ssr_classes = {}


def _ssr_class(cls):
    if cls not in _ssr_classes:
        name = "Ssr" + cls.__name__
        _ssr_classes[cls] = globals()[name] = type(name, (SsrGate, cls), {
            "__module__": __name__, "_original_class": cls, "_float32_weights": cls.__name__ in FLOAT32_WEIGHTS})
    return _ssr_classes[cls]


def __getattr__(name):
    # Unpickling a model in a new process finds its gates' classes here (pickle stores them by name).
    gate = name[3:] if name.startswith("Ssr") else None
    if gate in SUPPORTED_GATES:
        model = SUPPORTED_GATES[gate]
        return _ssr_class(getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), gate))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _moe_blocks(model):
    """(name, block) of every module with an `experts` child: the layout of transformers' sparse-MoE
    blocks, supported or not, so that an unsupported one is reported rather than skipped."""
    return [(name, module) for name, module in model.named_modules()
            if isinstance(getattr(module, "experts", None), torch.nn.Module)]


def _describe(block):
    for attr in ("gate", "router"):
        if isinstance(getattr(block, attr, None), torch.nn.Module):
            return f"{type(block).__name__} ({attr} {type(getattr(block, attr)).__name__})"
    return f"{type(block).__name__} (no gate)"


def _layer_index(name, position):
    # The decoder layer's index ("model.layers.3.mlp" -> 3), so a layer keeps its random stream when the
    # model has dense layers between MoE blocks; the block's position where the name has no index.
    digits = [part for part in name.split(".") if part.isdigit()]
    return int(digits[-1]) if digits else position


def replace_routers(model, router="ssr", **router_options):
    """Routes every sparse-MoE block of a `transformers` model with an `ssr_torch.Router`.

    `router` is `"ssr"`, `"sinkhorn"` or `"softmax"`; `router_options` are the Router's (p, cost, xi,
    weights, seed, ...; k defaults to the model's `num_experts_per_tok`). Each block gets its own Router
    with `layer=` the index of its decoder layer, so every layer draws its own random numbers. The Router
    is a submodule of the gate (`block.gate.ssr`), so `model.train()` and `model.eval()` reach it: in eval
    it routes by softmax top-k.

    The block multiplies its experts' outputs by the Router's weights, which sum to 1 over the k chosen
    experts (plan or softmax weights renormalised over the chosen ones). That is the original routing when
    the model normalises its top-k weights (Mixtral, `norm_topk_prob=True`); a model with
    `norm_topk_prob=False` (the default of transformers' OLMoE, Qwen2-MoE and Qwen3-MoE configs) weights its
    experts by the raw softmax probabilities instead, so its outputs change (a warning says so). The weights
    keep the original gate's dtype: float32 for Mixtral, the logits' dtype for the others.

    The model's `router_logits` (`output_router_logits=True`) are still the gate logits, and its
    `aux_loss` is still computed from them (from softmax top-k, as transformers does). SSR balances without
    it: turn it off with `output_router_logits=False` or `config.router_aux_loss_coef = 0`.

    With gradient checkpointing, the forward that backward runs again routes with the step it recomputes
    (the same experts; the step is counted once). Calling replace_routers again replaces the Routers.

    The model's state_dict keeps its keys (unless router_options add a buffer, e.g. expert_bias=True): the
    Routers are made with persistent=False. With
    persistent=True each Router's seed, layer and step are saved too (`...gate.ssr._extra_state`), so that
    a training run resumed with load_state_dict draws the same random numbers; the original model then
    reports these keys as unexpected.

    Returns the Routers in layer order; each one's `load` (tokens per expert) and `info` describe its last
    call. Raises, before changing anything, TypeError when a block has a gate of another kind or the model
    has no MoE block, and the Router's ValueError for a bad option.
    """
    if "layer" in router_options:
        raise TypeError("replace_routers: layer is set per block (the decoder layer's index); do not pass it")
    blocks = _moe_blocks(model)
    unsupported = sorted({_describe(block) for _, block in blocks
                          if not isinstance(getattr(block, "gate", None), SsrGate)
                          and type(getattr(block, "gate", None)).__name__ not in SUPPORTED_GATES})
    if unsupported or not blocks:
        found = ("unsupported MoE block " + ", ".join(unsupported) if unsupported
                 else "no MoE block (a module with an `experts` child)")
        raise TypeError(f"replace_routers: {type(model).__name__} has {found}; supported are the blocks of "
                        f"transformers >= 5 whose gate is one of {', '.join(SUPPORTED_GATES)}")
    routers = [Router(router, layer=_layer_index(name, position),
                      **{"k": block.gate.top_k, "persistent": False, **router_options})
               for position, (name, block) in enumerate(blocks)]
    if any(getattr(block.gate, "norm_topk_prob", True) is False for _, block in blocks):
        warnings.warn("ssr_torch.hf: ssr's weights sum to 1 over the chosen experts; this model's gates "
                      "(norm_topk_prob=False) weighted them by their raw softmax probabilities, so its outputs "
                      "change", stacklevel=2)
    for (_, block), r in zip(blocks, routers):
        gate = block.gate
        if not isinstance(gate, SsrGate):
            gate.__class__ = _ssr_class(type(gate))
        gate.ssr = r.to(gate.weight.device).train(gate.training)  # its bias, if any, on the gate's device
    return routers


def restore_routers(model):
    """Undoes replace_routers: the gates route by their own softmax top-k again. Returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, SsrGate):
            del module.ssr
            module.__class__ = module._original_class
            count += 1
    return count
