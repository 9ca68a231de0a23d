"""ssr for PyTorch: Selective Sinkhorn Routing operators, a Router module and the balancing losses.

``import ssr_torch`` registers ``torch.ops.ssr.route``, ``route_backward`` and ``replay_weights`` (CPU kernels,
and CUDA kernels when built with CUDA), their fake kernels for ``torch.compile`` and their autograd.
``ssr_torch.backends()`` says which kernels this build has, ``ssr_torch.missing_backends()`` why one is
missing and how to build it.
"""
import torch  # loads libtorch before the operators' library

from . import _C  # noqa: F401  registers the operators
from . import _build
from . import _ops  # noqa: F401  fake kernels
from ._ops import replay_weights, route
from ._version import __version__
from .losses import (global_load_balancing_loss, load_balancing_loss, normalised_scores, sequence_balance_loss,
                     update_expert_bias, z_loss)
from .replay import Replays, RouterReplay, attach_replay
from .router import ROUTERS, Router

__all__ = ["Router", "ROUTERS", "route", "replay_weights", "RouterReplay", "Replays", "attach_replay", "load_balancing_loss", "global_load_balancing_loss", "sequence_balance_loss",
           "normalised_scores", "update_expert_bias", "z_loss", "backends", "missing_backends", "__version__"]


def backends():
    """Returns the device types this build has kernels for, a tuple of str: ("cpu",) or ("cpu", "cuda")."""
    return tuple(_build.BACKENDS)


def missing_backends():
    """Returns the backends this build has no kernels for: a dict from device type to a one-line note (str)
    saying why and how to build them, e.g. {"cuda": "the CUDA kernels were not built: ..."}; empty when
    every backend was built."""
    return dict(_build.MISSING)
