"""Router replay: the experts that Routers chose in one pass (a rollout, a first forward), replayed in a later
one, so that training sees the routing that generated its data."""
import collections

import torch

from ._ops import replay_weights

class RouterReplay:
    """Preallocated buffers of one Router's routing: `experts` (tokens x k, int64) and, with
    record_weights, `weights` (tokens x k, weights_dtype), on `device`.

    record() starts recording: each call the Router makes (training or evaluation, either path) copies its
    experts (and weights) into the next rows, so that the calls of several micro-batches follow one
    another. replay() goes back to the first row and replays: each call takes the next rows' experts
    instead of routing, with weights recomputed from its own logits as the softmax path computes them
    (ssr_torch.replay_weights, with their gradient to the logits), so a call replayed on the logits it was
    recorded from gives the recorded bits wherever it took the softmax path or score weights. stop()
    routes as usual again; the records stay until the next record(). Each of the three returns the
    RouterReplay.

    A forward that backward runs again (activation checkpointing) records nothing new and replays the rows
    of the forward it recomputes, in the order those forwards ran. A call allocates nothing here beyond its
    own outputs, so a recording or replaying call can be captured in a CUDA graph (the rows it writes or
    reads are those of the capture). The experts a replaying call returns are a view of the buffers: the
    next record() overwrites them, so copy what must outlive it.
    """

    def __init__(self, tokens, k, device=None, record_weights=False, weights_dtype=torch.float32):
        if tokens < 1 or k < 1:
            raise ValueError(f"ssr_torch.RouterReplay: tokens and k must be at least 1, got {tokens} and {k}")
        self.experts = torch.empty((tokens, k), dtype=torch.int64, device=device)
        self.weights = torch.empty((tokens, k), dtype=weights_dtype, device=device) if record_weights else None
        self.mode = "off"
        self.recorded = 0  # rows written by the last recording
        self.offset = 0  # the next row to write or read
        self._replayed = collections.deque()  # first rows of replayed forwards that backward may run again

    def record(self):
        """Starts recording from the first row (the previous records are overwritten)."""
        self.mode, self.recorded, self.offset = "record", 0, 0
        self._replayed.clear()
        return self

    def replay(self):
        """Starts replaying the records from the first row."""
        if self.recorded == 0:
            raise RuntimeError("ssr_torch.RouterReplay: nothing recorded to replay (call record() and route first)")
        self.mode, self.offset = "replay", 0
        self._replayed.clear()
        return self

    def stop(self):
        """Routes as usual again; the records stay."""
        self.mode = "off"
        return self

    def write(self, experts, weights):
        """Records a call's experts and weights in the next rows (the Router's forward calls this)."""
        rows = self._take(experts.shape, "record", self.experts.shape[0])
        self.experts[rows].copy_(experts)
        if self.weights is not None:
            self.weights[rows].copy_(weights.detach())  # records, not part of this call's graph
        self.recorded = self.offset

    def read(self, logits, score, recompute):
        """A replayed call's experts and weights, from the next rows, or for a forward that backward runs
        again (recompute) from the rows of the forward it recomputes."""
        if recompute and self._replayed:
            first = self._replayed.popleft()
            rows = slice(first, first + logits.shape[0])
        else:
            rows = self._take((logits.shape[0], self.experts.shape[1]), "replay", self.recorded)
            self._replayed.append(rows.start)
        experts = self.experts[rows]
        return experts, replay_weights(logits, experts, score)

    def _take(self, shape, action, limit):
        if tuple(shape[1:]) != tuple(self.experts.shape[1:]):
            raise ValueError(f"ssr_torch.RouterReplay: a call of k = {shape[1]} experts a token cannot {action} "
                             f"into buffers of k = {self.experts.shape[1]}")
        first, last = self.offset, self.offset + shape[0]
        if last > limit:
            what = "rows" if action == "record" else "recorded rows"
            raise RuntimeError(f"ssr_torch.RouterReplay: cannot {action} a call of {shape[0]} tokens at row {first}: "
                               f"only {limit} {what} (record fewer tokens, or make the buffers larger)")
        self.offset = last
        return slice(first, last)

    def __repr__(self):
        return (f"RouterReplay(tokens={self.experts.shape[0]}, k={self.experts.shape[1]}, mode={self.mode!r}, "
                f"recorded={self.recorded}, offset={self.offset}, weights={self.weights is not None})")


class Replays:
    """The RouterReplay of each of several Routers (attach_replay), recording, replaying and stopping
    together (record(), replay() and stop() return the Replays); `replays[i]` is the i-th Router's."""

    def __init__(self, replays):
        self.replays = list(replays)

    def record(self):
        for replay in self.replays:
            replay.record()
        return self

    def replay(self):
        for replay in self.replays:
            replay.replay()
        return self

    def stop(self):
        for replay in self.replays:
            replay.stop()
        return self

    def __getitem__(self, index):
        return self.replays[index]

    def __len__(self):
        return len(self.replays)


def attach_replay(routers, tokens, device=None, record_weights=False, weights_dtype=torch.float32):
    """Gives each ssr_torch.Router in `routers` (a module, searched for its Routers, e.g. a model whose
    routers ssr_torch.hf, .megatron or .torchtitan replaced; or an iterable of Routers) a RouterReplay of
    `tokens` rows and its k columns, as its `replay`; returns them as Replays. device: the buffers'
    (default: that of the module's first parameter, else the CPU)."""
    from .router import Router

    if isinstance(routers, torch.nn.Module):
        if device is None:
            device = next(iter(routers.parameters()), torch.empty(0)).device
        routers = [module for module in routers.modules() if isinstance(module, Router)]
    routers = list(routers)
    if not routers:
        raise ValueError("ssr_torch.attach_replay: no ssr_torch.Router found")
    for router in routers:
        router.replay = RouterReplay(tokens, router.k, device, record_weights, weights_dtype)
    return Replays(router.replay for router in routers)
