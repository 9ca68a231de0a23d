"""The balancing losses SSR is compared with, as differentiable functions of the gating logits (the
formulas of ssr/losses.hpp)."""
import torch


def load_balancing_loss(logits, experts):
    """Switch/GShard: n * sum_j f_j P_j, f_j the share of the m * k assignments sent to expert j (a constant)
    and P_j the mean router softmax probability of expert j."""
    m, n = logits.shape
    f = torch.bincount(experts.reshape(-1).long(), minlength=n).to(logits.dtype) / experts.numel()
    return n * (f * torch.softmax(logits, dim=1).mean(0)).sum()


def z_loss(logits):
    """ST-MoE router z-loss: mean_i (logsumexp_j S_ij)^2."""
    return torch.logsumexp(logits, dim=1).square().mean()
