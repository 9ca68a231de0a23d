"""A complete MoE layer routed by ssr_torch.Router: dispatch, experts, combine, then checkpoint and resume.

Trains a small regression model of two MoE layers on generated data, saves a checkpoint halfway (model,
optimizer and the routers' steps), resumes from it in a fresh process state, and checks that the resumed
run's losses are those of the uninterrupted run, bit for bit: the routers draw the same coins and noise.

    python python/examples/moe_layer.py [--steps 40] [--p 0.1] [--checkpoint /tmp/moe.pt]
"""

import argparse
import os
import tempfile

import torch

import ssr_torch


class MoE(torch.nn.Module):
    """Top-k mixture of feed-forward experts; ssr_torch.Router chooses each token's experts and weights."""

    def __init__(self, d, hidden, n_experts, k, layer, **router_options):
        super().__init__()
        self.gate = torch.nn.Linear(d, n_experts, bias=False)
        self.w_in = torch.nn.Parameter(torch.randn(n_experts, d, hidden) / d**0.5)
        self.w_out = torch.nn.Parameter(torch.randn(n_experts, hidden, d) / hidden**0.5)
        self.router = ssr_torch.Router("ssr", k=k, layer=layer, **router_options)

    def forward(self, x):  # x: tokens x d
        experts, weights = self.router(self.gate(x))  # tokens x k: expert ids (int64) and weights
        # Dispatch: the (token, slot) assignments grouped by expert, so each expert runs on one batch.
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # assignment indices token * k + slot, by expert
        counts = torch.bincount(flat, minlength=self.w_in.shape[0]).tolist()
        out = torch.zeros_like(x)
        for j, rows in enumerate(torch.split(order, counts)):
            if rows.numel() == 0:
                continue
            t = rows // experts.shape[1]
            y = torch.relu(x[t] @ self.w_in[j]) @ self.w_out[j]
            # Combine: each assignment's output scaled by its weight, added back to its token.
            out = out.index_add(0, t, weights.reshape(-1)[rows, None] * y)
        return out


def model_and_optimizer(args):
    torch.manual_seed(0)
    model = torch.nn.Sequential(MoE(args.d, 2 * args.d, args.experts, 2, layer=0, p=args.p),
                                torch.nn.LayerNorm(args.d),
                                MoE(args.d, 2 * args.d, args.experts, 2, layer=1, p=args.p))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def batch(args, step):
    """Generated data: a fixed random map of the inputs, the same batch for the same step."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(args.tokens, args.d, generator=g)
    return x, torch.tanh(x.roll(1, dims=1) * 2)


def train(model, optimizer, args, steps):
    losses, sinkhorn_steps = [], 0
    for step in steps:
        x, y = batch(args, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        sinkhorn_steps += int(model[0].router.info[0].item())  # info[0]: this call took the Sinkhorn path
    return losses, sinkhorn_steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--p", type=float, default=0.1, help="SSR's Sinkhorn probability (the paper's 1e-3 "
                        "would show few Sinkhorn steps in a short run)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), "ssr_moe_layer.pt"))
    args = parser.parse_args()
    half = args.steps // 2

    model, optimizer = model_and_optimizer(args)
    straight, sinkhorn_steps = train(model, optimizer, args, range(args.steps))

    model, optimizer = model_and_optimizer(args)
    first, _ = train(model, optimizer, args, range(half))
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.checkpoint)

    model, optimizer = model_and_optimizer(args)  # a fresh start, as after a restart
    state = torch.load(args.checkpoint)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    second, _ = train(model, optimizer, args, range(half, args.steps))

    resumed = first + second
    print(f"loss {straight[0]:.4f} -> {straight[-1]:.4f} over {args.steps} steps, "
          f"{sinkhorn_steps} of them on the Sinkhorn path (layer 0)")
    same = resumed == straight
    print("resumed from the checkpoint at step", half, ":", "the same losses, bit for bit" if same else
          "DIFFERENT losses")
    return 0 if same and sinkhorn_steps > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
