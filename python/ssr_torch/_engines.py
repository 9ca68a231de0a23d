"""What the Megatron-core and torchtitan adaptors share: the release they follow, the class swap that puts
routing by an ssr_torch.Router in front of an engine's router class, and the step a recompute repeats."""
import collections
import importlib.metadata
import sys

import torch

from .router import _in_backward

_classes = {}


def require(package, series, tested, module):
    """Raises ImportError unless `package` is installed at release `series` (e.g. "0.16")."""
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"{module} needs {package} {series} (pip install {package}=={tested})") from None
    if not version.startswith(series + "."):
        raise ImportError(f"{module} follows {package} {series} (tested {tested}); this is {package} {version}")


def swap(module, mixin, router, **attributes):
    """Puts `mixin` in front of the module's class (one subclass per class) and the Router on it, as `ssr`."""
    if not isinstance(module, mixin):
        cls = type(module)
        if (mixin, cls) not in _classes:
            _classes[mixin, cls] = type("Ssr" + cls.__name__, (mixin, cls),
                                        {"__module__": mixin.__module__, "_original_class": cls})
        module.__class__ = _classes[mixin, cls]
    attach(module, router, **attributes)


def attach(module, router, **attributes):
    """Puts the Router on a module whose class has the mixin, as `ssr`, with what the mixin reads."""
    module.ssr = router.train(module.training)
    module._ssr_steps = collections.deque()
    for name, value in attributes.items():
        setattr(module, "_ssr_" + name, value)


def restore(model, mixin):
    """Undoes swap on every module of `model`; returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, mixin):
            del module.ssr
            for name in [name for name in vars(module) if name.startswith("_ssr_")]:
                delattr(module, name)
            module.__class__ = module._original_class
            count += 1
    return count


def call_step(module, checkpointed):
    """The step of a training call: None (the Router's counter) for a plain forward; inside backward, the step
    of the checkpointed forward it recomputes, which that forward remembered (`checkpointed`), or None, with
    which the Router takes the step before its counter's."""
    ssr = module.ssr
    if not ssr.training:
        return None
    if _in_backward():
        return module._ssr_steps.popleft() if module._ssr_steps else None
    if checkpointed and not torch.compiler.is_compiling():  # a compiled recompute reads its saved step
        module._ssr_steps.append(ssr.step)
    return None


def in_checkpoint_forward():
    """Whether this call runs inside the forward of a reentrant activation checkpoint that backward will run
    again: an autograd Function named *Checkpoint* (Megatron's, Transformer Engine's, torch.utils.checkpoint's)
    found on the stack, in the graph (applied with gradient on, to an input that needs it: its node has
    edges). A forward without gradient (e.g. log-probabilities in train mode), checkpointed or not, so leaves
    no step for a recompute to take."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "forward" and code.co_varnames[:1] == ("ctx",):  # f_locals of Functions' frames only
            ctx = frame.f_locals.get("ctx")
            if isinstance(ctx, torch.autograd.function.BackwardCFunction) and "Checkpoint" in type(ctx).__name__:
                return len(ctx.next_functions) > 0  # needs_input_grad ignores the grad mode
        frame = frame.f_back
    return False
