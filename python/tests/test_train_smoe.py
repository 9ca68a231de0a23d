"""A tiny PyTorch SMoE trained with ssr_torch.Router (SSR-L, Sinkhorn on a fraction p of steps): the loss
falls and no expert is left without tokens. A regression on a target that is piecewise linear in the input,
so that experts can specialise."""
import torch

import ssr_torch


def test_training_an_smoe_with_ssr_lowers_the_loss():
    torch.manual_seed(0)
    d, n_experts, k, batch, steps = 16, 8, 2, 256, 300
    gate = torch.nn.Linear(d, n_experts, bias=False)
    experts = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(d, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
                                  for _ in range(n_experts))
    router = ssr_torch.Router("ssr", k=k, p=0.05)
    opt = torch.optim.Adam(list(gate.parameters()) + list(experts.parameters()), lr=3e-3)
    centres = torch.randn(n_experts, d)
    maps = torch.randn(n_experts, d) / d ** 0.5

    def target(x):
        region = (x @ centres.T).argmax(1)  # the centre the input leans to picks its linear map
        return (x * maps[region]).sum(1)

    def smoe(x):
        idx, w = router(gate(x))
        out = torch.zeros(x.shape[0])
        for j in range(n_experts):
            token, slot = (idx == j).nonzero(as_tuple=True)
            if token.numel():
                out = out.index_add(0, token, w[token, slot] * experts[j](x[token]).squeeze(1))
        return out

    losses, sinkhorn_steps = [], 0
    for _ in range(steps):
        x = torch.randn(batch, d)
        loss = torch.nn.functional.mse_loss(smoe(x), target(x))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        sinkhorn_steps += int(router.info[0].item())
    router.eval()
    with torch.no_grad():
        smoe(torch.randn(4096, d))
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    assert last < 0.7 * first
    assert (router.load > 0).all()
    assert 0 < sinkhorn_steps < steps
