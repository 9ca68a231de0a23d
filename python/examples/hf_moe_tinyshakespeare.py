"""A small byte-level MoE language model of Hugging Face transformers (Qwen3-MoE by default), trained on a
text (tiny-shakespeare with --data, a generated play-like text without) once with each router: the model's
own softmax top-k with its auxiliary load-balancing loss, and ssr_torch's routers dropped in by
ssr_torch.hf.replace_routers (no auxiliary loss). Same seed, same initial weights, same batches. Prints
training and validation bits per byte and the expert load. Needs ssr_torch and transformers installed.

    python python/examples/hf_moe_tinyshakespeare.py --steps 30 --routers original,ssr   # a few seconds
    python python/examples/hf_moe_tinyshakespeare.py --data tinyshakespeare.txt          # 400 steps
"""
import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers

from byte_text import random_windows, split_bytes
from train_lm import print_table
from ssr_torch.hf import replace_routers

ROUTERS = ("original", "softmax", "ssr", "sinkhorn")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=400, help="training steps per router")
    parser.add_argument("--routers", default="original,ssr,sinkhorn",
                        help="comma-separated, of: original (the model's softmax top-k + its aux loss at the "
                             "config's coefficient), softmax (the same without aux loss), ssr, sinkhorn")
    parser.add_argument("--arch", default="qwen3_moe", choices=("qwen3_moe", "mixtral", "olmoe"))
    parser.add_argument("--data", help="text file, read as bytes: the first 90%% train, the last 10%% validate "
                                       "(default: a generated play-like text, see byte_text.py)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16, help="sequences per step")
    parser.add_argument("--seq", type=int, default=64, help="bytes per sequence")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--k", type=int, default=2, help="experts per token")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--p", type=float, default=0.05,
                        help="SSR's Sinkhorn probability per layer and step; the paper's 1e-4..1e-2 are for "
                             "long runs, a few hundred steps at 1e-3 would hardly ever run Sinkhorn")
    parser.add_argument("--val-batches", type=int, default=16, help="validation batches of --batch x --seq")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    args.routers = args.routers.split(",")
    for name in args.routers:
        if name not in ROUTERS:
            parser.error(f"unknown router {name!r}: choose from {', '.join(ROUTERS)}")
    if args.data is not None and not Path(args.data).is_file():
        parser.error(f"no such file: {args.data}")
    return args


def make_config(args):
    heads = 4
    common = dict(vocab_size=256, hidden_size=args.hidden, num_hidden_layers=args.layers,
                  num_attention_heads=heads, num_key_value_heads=heads // 2, max_position_embeddings=args.seq,
                  num_experts_per_tok=args.k, tie_word_embeddings=False, use_cache=False,
                  pad_token_id=None, bos_token_id=None, eos_token_id=None,
                  # The per-expert loop: on CPU it is faster than the grouped_mm fallback at this size.
                  experts_implementation="eager")
    if args.arch == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, head_dim=args.hidden // heads, num_experts=args.experts,
                                           moe_intermediate_size=2 * args.hidden, norm_topk_prob=True)
    if args.arch == "mixtral":
        return transformers.MixtralConfig(**common, head_dim=args.hidden // heads,
                                          num_local_experts=args.experts, intermediate_size=2 * args.hidden)
    # OLMoE's default weights the experts by the raw softmax; normalised top-k weights are ssr's convention.
    return transformers.OlmoeConfig(**common, num_experts=args.experts, intermediate_size=2 * args.hidden,
                                    norm_topk_prob=True)


def make_model(name, args):
    torch.manual_seed(args.seed)  # the same initial weights for every router
    model = transformers.AutoModelForCausalLM.from_config(make_config(args))
    if name == "original":
        return model, []
    # sinkhorn: Sinkhorn on every training step with softmax weights (S-BASE), the SMoE demo's baseline.
    options = {"softmax": {}, "ssr": dict(p=args.p), "sinkhorn": dict(xi=1.0, weights="scores")}[name]
    return model, replace_routers(model, name, seed=args.seed, **options)


def byte_loss(model, x, aux):
    """Next-byte cross-entropy (nats), the model's router logits and, with aux, its aux loss."""
    out = model(input_ids=x[:, :-1], output_router_logits=True)
    loss = F.cross_entropy(out.logits.reshape(-1, 256).float(), x[:, 1:].reshape(-1))
    return loss, out.router_logits, out.aux_loss if aux else None


def load_ratio(router_logits, routers, k):
    """Tokens of the busiest expert over the mean, averaged over layers: from the routers' own counts, or
    from softmax top-k of the logits for the model's router."""
    ratios = []
    for layer, logits in enumerate(router_logits):
        if routers:
            load = routers[layer].load.double()
        else:
            load = torch.bincount(logits.topk(k, dim=1).indices.reshape(-1), minlength=logits.shape[1]).double()
        ratios.append((load.max() / load.mean()).item())
    return sum(ratios) / len(ratios)


def run(name, args, train, valid):
    model, routers = make_model(name, args)
    aux = name == "original"
    coef = model.config.router_aux_loss_coef
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)  # the same batches for every router
    span = args.seq + 1
    losses, loads, times, sinkhorn_calls = [], [], [], 0
    model.train()
    start = time.perf_counter()
    for step in range(args.steps):
        step_start = time.perf_counter()
        x = random_windows(train, span, args.batch, gen)
        loss, router_logits, aux_loss = byte_loss(model, x, aux)
        total = loss + coef * aux_loss if aux else loss
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()
        times.append(time.perf_counter() - step_start)
        losses.append(loss.item())
        loads.append(load_ratio(router_logits, routers, args.k))
        sinkhorn_calls += sum(int(r.info[0].item()) for r in routers)
        if (step + 1) % 50 == 0 or step + 1 == args.steps:
            print(f"  {name:>8} step {step + 1:4d}  loss {loss.item() / math.log(2):.3f} bits/byte  "
                  f"{time.perf_counter() - start:5.1f} s", file=sys.stderr, flush=True)
    # Validation as deployed: eval mode routes by softmax top-k for every router.
    model.eval()
    val_losses, val_loads = [], []
    count = args.val_batches * args.batch  # evenly spaced windows in integers, the last ending the text
    starts = torch.arange(count) * (len(valid) - span) // max(1, count - 1)
    with torch.no_grad():
        for batch in starts.split(args.batch):
            x = torch.stack([valid[o:o + span] for o in batch.tolist()])
            loss, router_logits, _ = byte_loss(model, x, False)
            val_losses.append(loss.item())
            val_loads.append(load_ratio(router_logits, routers, args.k))
    tail = max(1, args.steps // 10)  # the last 10% of steps
    ms_per_step = 1000 * sum(times[tail:] or times) / len(times[tail:] or times)  # the first steps warm up
    bits = 1 / math.log(2)
    return dict(router=name + (f" (aux {coef:g})" if aux else f" (p {args.p:g})" if name == "ssr" else ""),
                first=sum(losses[:tail]) / tail * bits, train=sum(losses[-tail:]) / tail * bits,
                valid=sum(val_losses) / len(val_losses) * bits, load=sum(loads[-tail:]) / tail,
                val_load=sum(val_loads) / len(val_loads), sinkhorn=sinkhorn_calls, ms=ms_per_step)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    source = Path(args.data).name if args.data else "a generated text"
    train, valid = split_bytes(args.data)
    print(f"{args.arch}, transformers {transformers.__version__}: {args.layers} layers, hidden {args.hidden}, "
          f"{args.experts} experts, top-{args.k}; {args.steps} steps of {args.batch} x {args.seq} bytes "
          f"from {source} ({len(train)} train / {len(valid)} validation bytes), seed {args.seed}")
    results = [run(name, args, train, valid) for name in args.routers]
    calls = args.layers * args.steps
    rows = [("router", "train bits/byte", "val bits/byte", "load max/mean train", "load max/mean val",
             "Sinkhorn calls", "ms/step")]
    rows += [(r["router"], f"{r['first']:.3f} -> {r['train']:.3f}", f"{r['valid']:.3f}", f"{r['load']:.2f}",
              f"{r['val_load']:.2f}", f"{r['sinkhorn']} / {calls}", f"{r['ms']:.1f}") for r in results]
    print_table(rows)
    print("train bits/byte: mean over the first -> last 10% of steps; val: eval mode (softmax top-k) on held-out "
          "bytes; load: tokens of the busiest expert / mean, averaged over layers (train: as routed, last 10% of "
          "steps); ms/step: after the first 10%")


if __name__ == "__main__":
    main()
