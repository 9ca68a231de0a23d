"""The balancing losses SSR is compared with, as differentiable functions of the gating logits, and the
expert-bias update of auxiliary-loss-free balancing (the formulas of ssr/losses.hpp and ssr/expert_bias.hpp)."""
import math

import torch
import torch.distributed as dist

_SCORES = ("softmax", "sigmoid")


def _check_score(score):
    if score not in _SCORES:
        raise ValueError(f"ssr_torch: invalid score = {score!r}: must be softmax or sigmoid")


def normalised_scores(logits, score="softmax"):
    """The normalised scores of gating logits: s(S_ij) / sum_j s(S_ij) per row, the softmax for score
    "softmax" and the sigmoids divided by their sum for "sigmoid" (DeepSeek-V3's selection score).

    logits: m x n of a floating dtype, on any device (with more dimensions, normalised along dim 1).
    Returns a tensor of the same shape, dtype and device whose rows sum to 1, differentiable with respect
    to the logits. Raises ValueError for another score, logits of fewer than 2 dimensions or of an integer
    or complex dtype."""
    _check_score(score)
    if logits.dim() < 2 or not logits.is_floating_point():
        raise ValueError(f"ssr_torch: logits must be m x n of a floating dtype, got {tuple(logits.shape)} "
                         f"{logits.dtype}")
    if score == "softmax":
        return torch.softmax(logits, dim=1)
    # The softmax of log s: finite where every sigmoid of a row underflows (ssr/losses.hpp's form).
    return torch.softmax(torch.nn.functional.logsigmoid(logits), dim=1)


def _check_logits(logits, name):
    # The losses average over the tokens: m x n floating logits with at least one token and one expert.
    if logits.dim() != 2 or not logits.is_floating_point() or logits.shape[0] < 1 or logits.shape[1] < 1:
        raise ValueError(f"ssr_torch.{name}: logits must be m x n floating with m, n >= 1, got "
                         f"{tuple(logits.shape)} {logits.dtype}")


def _share_dtype(logits):
    # Counts and shares in at least float32: float16 holds no count above 65504, bfloat16 none above 256 exactly.
    return torch.promote_types(logits.dtype, torch.float32)


def _group_device(group):
    # Where the group's collectives take tensors: NCCL's on the current GPU, the others' (Gloo) on the host.
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")


def _agree(group, n, error=None):
    """Has the ranks of group add up who failed and their n before a collective sized by n (one all-reduce of
    three integers, read on the host): re-raises this rank's error, and raises on every rank when another
    failed or the ranks' n differ, so that no rank waits for a collective another left. Every rank calls it."""
    if error is None and not 0 <= n < 2 ** 31:
        error = ValueError(f"ssr_torch: {n} experts: must be fewer than 2^31")
    n = 0 if error is not None else n
    status = torch.tensor([error is not None, n, n * n], dtype=torch.int64, device=_group_device(group))
    dist.all_reduce(status, group=group)
    if error is not None:
        raise error
    failed, total, squares = status.tolist()
    ranks = dist.get_world_size(group)
    if failed:
        raise RuntimeError(f"ssr_torch: the call failed on {failed} of {ranks} ranks (see their errors)")
    if ranks * squares != total * total:  # n alike on every rank: the variance of the ranks' n is 0
        raise ValueError("ssr_torch: the ranks made the call with different numbers of experts")


def _agreed(group, n, prepare, data, name):
    """prepare(), this rank's checks and the tensor its collective reduces; with group, agreed on by its ranks
    (_agree, n their length), data (the caller's tensor called name) checked to be on a device the group's
    collectives take."""
    if group is None:
        return prepare()
    error = result = None
    try:
        if dist.get_backend(group) == "nccl" and data.device.type != "cuda":
            raise ValueError(f"ssr_torch: {name} is on {data.device}: an NCCL group reduces CUDA tensors")
        result = prepare()
    except Exception as e:  # noqa: BLE001  every rank learns of it, then _agree raises it here
        error = e
    _agree(group, n, error)
    return result


def load_balancing_loss(logits, experts, score="softmax"):
    """Switch/GShard: n * sum_j f_j P_j, f_j the share of the m * k assignments sent to expert j (a constant)
    and P_j the mean normalised score of expert j (the router softmax for softmax scores).

    logits: m x n floating; experts: m x k integer indices in [0, n) (a Router's or top-k's). Returns a
    0-d tensor of the logits' dtype and device, 1 for uniform scores and assignments, differentiable with
    respect to the logits. Raises ValueError for an unknown score, logits not m x n with m, n >= 1 or an
    expert beyond n - 1 (RuntimeError for a negative one, torch.bincount's)."""
    _check_logits(logits, "load_balancing_loss")
    m, n = logits.shape
    counts = torch.bincount(experts.reshape(-1).long(), minlength=n)
    if counts.numel() != n:  # its length is known on the host, as bincount's output size needs it
        raise ValueError(f"ssr_torch.load_balancing_loss: experts must lie in [0, {n}), got {counts.numel() - 1}")
    f = counts.to(_share_dtype(logits)) / experts.numel()
    return n * (f.to(logits.dtype) * normalised_scores(logits, score).mean(0)).sum()


def global_load_balancing_loss(logits, counts, tokens, k, score="softmax", group=None):
    """The global-batch load-balancing loss: n * sum_j f_j P_j with f_j = counts_j / (k * tokens) from the
    assignments of the whole batch (the caller's counts over micro-batches, summed here over the ranks of
    group when given) and P_j the mean normalised score of these logits' tokens.

    logits: m x n floating; counts: n assignment counts (any integer dtype, e.g. the sum of Router.load
    over micro-batches); tokens: the tokens they count (an int). Returns a 0-d tensor of the logits' dtype
    and device, differentiable with respect to the logits. Raises ValueError when counts has not n entries,
    the logits are not m x n with m, n >= 1, the score is unknown, tokens < 0 or, summed (on the host),
    under 1; with group, every rank of it must call (each with at least one token), and an error on one
    rank (or counts of different lengths) raises on every rank."""
    def prepare():
        _check_score(score)
        _check_logits(logits, "global_load_balancing_loss")
        if tokens < 0:
            raise ValueError(f"ssr_torch.global_load_balancing_loss: invalid tokens = {tokens}: must be >= 0")
        if counts.numel() != logits.shape[1]:
            raise ValueError(f"ssr_torch.global_load_balancing_loss: counts has {counts.numel()} entries, expected "
                             f"{logits.shape[1]}")
        return torch.cat([counts.reshape(-1).to(torch.int64),
                          torch.as_tensor([tokens], dtype=torch.int64, device=counts.device)])

    totals = _agreed(group, counts.numel(), prepare, counts, "counts")
    n = logits.shape[1]
    if group is not None:
        dist.all_reduce(totals, group=group)
    # The batch's tokens where known without waiting for a GPU (an NCCL group's sum of none gives NaN).
    counted = tokens if group is None else int(totals[n]) if totals.device.type == "cpu" else None
    if counted is not None and counted < 1:
        raise ValueError(f"ssr_torch.global_load_balancing_loss: invalid tokens = {counted} summed over the "
                         "batch: must be at least 1")
    f = totals[:n].to(_share_dtype(logits)) / (k * totals[n].to(_share_dtype(logits)))
    return n * (f.to(logits.dtype).to(logits.device) * normalised_scores(logits, score).mean(0)).sum()


def sequence_balance_loss(logits, experts, seq_len, alpha, score="softmax"):
    """DeepSeek-V3's sequence-wise balance loss, averaged over the sequences of seq_len consecutive rows:
    alpha * sum_j f_j P_j per sequence, f_j = n / (k * seq_len) * the sequence's assignments to expert j and
    P_j the sequence's mean normalised score.

    logits: m x n floating, m a multiple of seq_len; experts: m x k integer indices in [0, n). Returns a
    0-d tensor of the logits' dtype and device, differentiable with respect to the logits. Raises
    ValueError when seq_len does not divide m, the logits are not m x n with m, n >= 1 or the score is
    unknown."""
    _check_logits(logits, "sequence_balance_loss")
    m, n = logits.shape
    k = experts.shape[1]
    if seq_len < 1 or m % seq_len:
        raise ValueError(f"ssr_torch.sequence_balance_loss: invalid seq_len = {seq_len}: must divide the rows m = {m}")
    q = m // seq_len
    one_hot = torch.zeros(q, seq_len * k, n, dtype=_share_dtype(logits), device=logits.device)
    one_hot.scatter_(2, experts.reshape(q, seq_len * k, 1).long(), 1.0)
    f = (one_hot.sum(1) * (n / (k * seq_len))).to(logits.dtype)
    p = normalised_scores(logits, score).reshape(q, seq_len, n).mean(1)
    return alpha * (f * p).sum(1).mean()


def z_loss(logits):
    """ST-MoE router z-loss: mean_i (logsumexp_j S_ij)^2.

    logits: m x n floating. Returns a 0-d tensor of the logits' dtype and device, differentiable with
    respect to them. Raises ValueError for logits not m x n with m, n >= 1."""
    _check_logits(logits, "z_loss")
    return torch.logsumexp(logits, dim=1).square().mean()


@torch.no_grad()
def update_expert_bias(bias, load, rate, group=None):
    """Auxiliary-loss-free balancing (DeepSeek-V3): bias_j += rate * sign(mean load - load_j), in place, from
    this step's loads (summed over micro-batches by the caller, over the ranks of group here), in exact
    integer arithmetic: every rank makes the same update. Without group nothing waits for the host.

    bias: n floating values (a Router's float32 `expert_bias`), updated in place; load: n integer counts
    (Router.load), on any device. Returns bias. Raises ValueError for a rate not finite and >= 0 or when
    load and bias differ in size; with group, every rank of it must call, and an error on one rank (or
    loads of different lengths) raises on every rank."""
    def prepare():
        if not 0 <= rate < math.inf:
            raise ValueError(f"ssr_torch.update_expert_bias: invalid rate = {rate}: must be finite and >= 0")
        if load.numel() != bias.numel():
            raise ValueError(f"ssr_torch.update_expert_bias: load has {load.numel()} entries, bias {bias.numel()}")
        return load.reshape(-1).to(torch.int64, copy=True)

    counts = _agreed(group, load.numel(), prepare, load, "load")
    if group is not None:
        dist.all_reduce(counts, group=group)
    direction = torch.sign(counts.sum() - counts.numel() * counts)
    bias.add_(direction.to(bias.dtype).to(bias.device), alpha=rate)
    return bias
