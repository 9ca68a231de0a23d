"""A tiny PyTorch SMoE trained with torch.ops.ssr.route (SSR-L, Sinkhorn on a fraction p of steps).

Usage: python3 train_smoe.py path/to/libssr_torch.so [--steps N] [--p P]
Regression on a target that is piecewise linear in the input, so experts can specialise. Exits 1 unless the
loss falls and no expert is left without tokens.
"""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("library")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--p", type=float, default=0.05)
args = parser.parse_args()
torch.ops.load_library(args.library)
torch.manual_seed(0)

d, n_experts, k, batch = 16, 8, 2, 256
gate = torch.nn.Linear(d, n_experts, bias=False)
experts = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(d, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
                              for _ in range(n_experts))
opt = torch.optim.Adam(list(gate.parameters()) + list(experts.parameters()), lr=3e-3)
centres = torch.randn(n_experts, d)
maps = torch.randn(n_experts, d) / d ** 0.5


def target(x):
    region = (x @ centres.T).argmax(1)  # the centre the input leans to picks its linear map
    return (x * maps[region]).sum(1)


def smoe(x, step, training=True):
    idx, w, load, info = torch.ops.ssr.route(gate(x), "selective", k, p=args.p, step=step, training=training)
    out = torch.zeros(x.shape[0])
    for j in range(n_experts):
        token, slot = (idx == j).nonzero(as_tuple=True)
        if token.numel():
            out = out.index_add(0, token, w[token, slot] * experts[j](x[token]).squeeze(1))
    return out, load, info


losses, sinkhorn_steps = [], 0
for step in range(args.steps):
    x = torch.randn(batch, d)
    y, load, info = smoe(x, step)
    loss = torch.nn.functional.mse_loss(y, target(x))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
    sinkhorn_steps += int(info[0].item())
    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}  load {load.tolist()}  path {'sinkhorn' if info[0] else 'softmax'}")

with torch.no_grad():
    x = torch.randn(4096, d)
    y, load, _ = smoe(x, 0, training=False)
    eval_loss = torch.nn.functional.mse_loss(y, target(x)).item()
first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
print(f"loss {first:.4f} -> {last:.4f}; eval loss {eval_loss:.4f}; Sinkhorn on {sinkhorn_steps} of {args.steps} steps; "
      f"eval load {load.tolist()}")
if not (last < 0.7 * first and (load > 0).all()):
    raise SystemExit("training did not improve, or an expert received no token")
