"""The SSR paper's language-modelling setting as a recipe: a byte-level transformer whose layers interleave
causal self-attention and a Switch-style SMoE (16 experts, top-2 by default), trained once per router with the
same seed, initial weights, batches and dropout masks. Every router goes through ssr_torch.Router: those of
the paper's Table 1 and of today's engines (--list). Reports training and validation bits per byte, on clean
and attacked text (a fraction of the validation bytes randomised), the expert load, and with two seeds or
more each router's paired difference to softmax top-k (and softmax+lb) with its 95% interval.

    # on a CPU, about two minutes
    python python/examples/train_lm.py --routers softmax,ssr-l,ssr-s --seeds 2
    # the paper's enwik8 setting (8 layers, hidden 352, batch 48 x 512, 80k steps, lr 7e-4, 4k warm-up)
    python python/examples/train_lm.py --preset enwik8 --data enwik8 --routers softmax,softmax+lb,ssr-l \\
        --seeds 3 --json enwik8.json
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import ssr_torch
from byte_text import attacked, random_windows, split_bytes

# name: (description, Router options, auxiliary losses {name: coefficient}, trainable noisy gating)
ROUTERS = {
    "softmax": ("softmax top-k (vanilla SMoE)", dict(router="softmax"), {}, False),
    "softmax+lb": ("softmax top-k + load-balancing loss 0.01 (Switch)", dict(router="softmax"), {"lb": 0.01}, False),
    "softmax+z": ("softmax top-k + z-loss 0.001 (ST-MoE)", dict(router="softmax"), {"z": 0.001}, False),
    "noisy-gating": ("trainable noisy gating (Shazeer et al. 2017)", dict(router="softmax"), {}, True),
    "sinkhorn": ("Sinkhorn every step, score weights, xi = 1 (S-BASE)",
                 dict(router="sinkhorn", xi=1.0, weights="scores"), {}, False),
    "ssr-l": ("SSR-L: linear cost, plan weights, xi = 0.5, Sinkhorn with probability p",
              dict(router="ssr", cost="linear", xi=0.5), {}, False),
    "ssr-s": ("SSR-S: softmax cost, plan weights, xi = 0.1, Sinkhorn with probability p",
              dict(router="ssr", cost="softmax", xi=0.1), {}, False),
    "ssr-l-noise": ("SSR-L with cost noise alpha", dict(router="ssr", cost="linear", xi=0.5), {}, False),
    "ssr-s-noise": ("SSR-S with cost noise alpha", dict(router="ssr", cost="softmax", xi=0.1), {}, False),
    "softmax+seq": ("softmax top-k + sequence-wise balance loss 0.01 (DeepSeek-V3)", dict(router="softmax"),
                    {"seq": 0.01}, False),
    "sigmoid+bias": ("sigmoid scores + auxiliary-loss-free expert bias, rate 1e-3 (DeepSeek-V3)",
                     dict(router="softmax", score="sigmoid", expert_bias=True, bias_update_rate=1e-3), {}, False),
    "grouped+bias": ("sigmoid + bias, group-limited top-k: 4 groups, best 2 kept",
                     dict(router="softmax", score="sigmoid", expert_bias=True, bias_update_rate=1e-3, n_groups=4,
                          topk_groups=2), {}, False),
    "ssr-l-sigmoid": ("SSR-L with sigmoid scores on its softmax path",
                      dict(router="ssr", cost="linear", xi=0.5, score="sigmoid"), {}, False),
}

# Presets: "small" runs in about a minute per router and seed on a CPU; "enwik8" is the paper's setting.
PRESETS = {
    "small": dict(layers=2, hidden=64, inner=64, heads=4, experts=16, k=2, seq=64, batch=16, steps=300, lr=3e-3,
                  warmup=30, dropout=0.0, valid=0.1, eval_tokens=32768, p=0.05),
    "enwik8": dict(layers=8, hidden=352, inner=352, heads=8, experts=16, k=2, seq=512, batch=48, steps=80000,
                   lr=7e-4, warmup=4000, dropout=0.1, valid=0.05, eval_tokens=0, p=1e-3),
}

NOISE_STREAMS = 1 << 31  # the noisy gate's seeds start here (torch's CPU generator keeps a seed's low 32 bits)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog="routers:\n" +
                                     "\n".join(f"  {name}: {r[0]}" for name, r in ROUTERS.items()))
    add = parser.add_argument
    add("--preset", default="small", choices=tuple(PRESETS), help="sizes and schedule; the options below override "
        "it (small: 2 layers, hidden 64, 300 steps of 16 x 64 bytes; enwik8: the paper's)")
    add("--routers", default="softmax,softmax+lb,ssr-l,ssr-s", help="comma-separated names, or 'all'")
    add("--data", help="a text file read as bytes: the first 90%% train, the next --valid fraction validates "
        "(default: a generated play-like text)")
    add("--seeds", type=int, default=1, help="seeds S, S+1, ...: with 2 or more, paired differences and intervals")
    add("--seed", type=int, default=0, help="first seed")
    for name, kind in (("layers", int), ("hidden", int), ("inner", int), ("heads", int), ("experts", int),
                       ("k", int), ("seq", int), ("batch", int), ("steps", int), ("lr", float), ("warmup", int),
                       ("dropout", float), ("valid", float), ("eval-tokens", int), ("p", float)):
        key = name.replace("-", "_")
        add(f"--{name}", type=kind, help="presets': " + ", ".join(f"{p} {v[key]}" for p, v in PRESETS.items()))
    add("--xi", type=float, help="every Sinkhorn router's xi (default: each one's own, see the routers)")
    add("--noise", type=float, default=0.05, help="cost noise alpha of the -noise routers (the demo's)")
    add("--momentum", type=float, default=0.0, help="Momentum SMoE's mu: p_l = -SMoE_l(x_l) + mu p_(l-1), "
        "x_(l+1) = x_l - gamma p_l (0: the plain residual)")
    add("--step-size", type=float, default=1.0, help="Momentum SMoE's gamma")
    add("--attack", type=float, default=0.1, help="fraction of validation bytes randomised for the attacked text")
    add("--clip", type=float, default=0.0, help="gradient norm clipping (0: none)")
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--precision", choices=("bf16", "fp32"), help="bf16: matrix products in bfloat16 (torch.autocast), the "
        "router's logits and the losses in float32 (default: bf16 on CUDA, fp32 elsewhere)")
    add("--log-every", type=int, default=0, help="print and record the loss every N steps (0: steps / 10)")
    add("--json", help="write the setup, every run's results and loss curve, and the paired differences here")
    add("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    for name, value in PRESETS[args.preset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.routers = list(ROUTERS) if args.routers == "all" else args.routers.split(",")
    for name in args.routers:
        if name not in ROUTERS:
            parser.error(f"unknown router {name!r}: choose from {', '.join(ROUTERS)}")
    if len(set(args.routers)) < len(args.routers):
        parser.error("--routers names a router twice")
    if min(args.layers, args.hidden, args.inner, args.heads, args.seq, args.batch, args.steps, args.seeds) < 1:
        parser.error("sizes, --steps and --seeds must be at least 1")
    floats = ("lr", "dropout", "valid", "p", "noise", "momentum", "step_size", "attack", "clip")
    bad = [name for name in floats if not math.isfinite(getattr(args, name))]
    if bad or (args.xi is not None and not math.isfinite(args.xi)):
        parser.error(f"--{(bad or ['xi'])[0].replace('_', '-')} must be a finite number")
    if not 0 <= args.seed <= NOISE_STREAMS - args.seeds:
        parser.error("--seed must lie in [0, 2**31 - --seeds]")
    if args.hidden % args.heads or not 1 <= args.k <= args.experts:
        parser.error("--hidden must be a multiple of --heads, and 1 <= --k <= --experts")
    if args.data is not None and not Path(args.data).is_file():
        parser.error(f"no such file: {args.data}")
    if not 0 < args.valid <= 0.1 or not 0 <= args.attack <= 1:
        parser.error("--valid must lie in (0, 0.1] and --attack in [0, 1]")
    if args.eval_tokens < 0 or 0 < args.eval_tokens < args.seq:
        parser.error(f"--eval-tokens must be 0 (all) or at least --seq ({args.seq})")
    if args.precision is None:
        args.precision = "bf16" if torch.device(args.device).type == "cuda" else "fp32"
    if args.log_every <= 0:
        args.log_every = max(1, args.steps // 10)
    for name in args.routers:  # every router's options checked before the first one trains
        try:
            ssr_torch.Router(**router_options(args, name, args.seed, 0)).eval()(torch.zeros(1, args.experts))
        except (ValueError, RuntimeError) as e:
            parser.error(f"router {name}: {e}")
    return args


def router_options(args, name, seed, layer):
    """The ssr_torch.Router options of a named router in this run's setting."""
    options = dict(ROUTERS[name][1], k=args.k, seed=seed, layer=layer)
    if options["router"] != "softmax":
        options.update(p=args.p, noise_alpha=args.noise if name.endswith("-noise") else 0.0)
        if args.xi is not None:
            options["xi"] = args.xi
    if options.get("expert_bias"):
        options["n_experts"] = args.experts
    return options


class SMoE(torch.nn.Module):
    """Top-k mixture of feed-forward experts routed by ssr_torch.Router, with the router's auxiliary losses."""

    def __init__(self, args, name, seed, layer):
        super().__init__()
        _, _, self.losses, noisy = ROUTERS[name]
        self.router = ssr_torch.Router(**router_options(args, name, seed, layer))
        d, h, n = args.hidden, args.inner, args.experts
        self.gate = torch.nn.Linear(d, n, bias=False)
        # Shazeer's noise gate starts at zero; made without the random generator, every router starts alike.
        self.noise_gate = torch.nn.Parameter(torch.zeros(n, d)) if noisy else None
        self.w_in = torch.nn.Parameter(torch.randn(n, d, h) / d ** 0.5)
        self.b_in = torch.nn.Parameter(torch.zeros(n, h))
        self.w_out = torch.nn.Parameter(torch.randn(n, h, d) / h ** 0.5)
        self.b_out = torch.nn.Parameter(torch.zeros(n, d))
        self.dropout = torch.nn.Dropout(args.dropout)

    def forward(self, x, seq_len, noise):  # x: tokens x d; noise: a generator for noisy gating
        with torch.autocast(x.device.type, enabled=False):  # the router sees float32 logits
            logits = F.linear(x.float(), self.gate.weight.float())
            if self.noise_gate is not None and self.training:
                scale = F.softplus(F.linear(x.float(), self.noise_gate))
                logits = logits + scale * torch.randn(logits.shape, generator=noise, device=x.device)
        experts, weights = self.router(logits)
        aux = logits.new_zeros(())
        if "lb" in self.losses:
            aux = aux + self.losses["lb"] * ssr_torch.load_balancing_loss(logits, experts, self.router.score)
        if "z" in self.losses:
            aux = aux + self.losses["z"] * ssr_torch.z_loss(logits)
        if "seq" in self.losses:
            aux = aux + ssr_torch.sequence_balance_loss(logits, experts, seq_len, self.losses["seq"],
                                                        self.router.score)
        # Dispatch the (token, slot) assignments grouped by expert, run each expert on its batch, combine.
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.w_in.shape[0]).tolist()
        out = torch.zeros_like(x)
        for j, rows in enumerate(torch.split(order, counts)):
            if rows.numel():
                t = rows // experts.shape[1]
                y = F.gelu(x[t] @ self.w_in[j] + self.b_in[j]) @ self.w_out[j] + self.b_out[j]
                out = out.index_add(0, t, weights.reshape(-1)[rows, None] * y.float())
        return self.dropout(out), aux


class Layer(torch.nn.Module):
    """Pre-norm causal self-attention, then a pre-norm SMoE."""

    def __init__(self, args, name, seed, layer):
        super().__init__()
        self.heads, self.dropout = args.heads, args.dropout
        self.norm1, self.norm2 = torch.nn.LayerNorm(args.hidden), torch.nn.LayerNorm(args.hidden)
        self.qkv = torch.nn.Linear(args.hidden, 3 * args.hidden)
        self.proj = torch.nn.Linear(args.hidden, args.hidden)
        self.smoe = SMoE(args, name, seed, layer)

    def attend(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0)
        return F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, d)), self.dropout, self.training)


class ByteLM(torch.nn.Module):
    """Byte embeddings and learned positions, the layers, a final norm and a read-out to 256 logits. With
    momentum the SMoE residuals are Momentum SMoE's heavy ball (Teo et al. 2024)."""

    def __init__(self, args, name, seed):
        super().__init__()
        self.mu, self.gamma = args.momentum, args.step_size
        self.embed = torch.nn.Embedding(256, args.hidden)
        self.position = torch.nn.Parameter(torch.randn(args.seq, args.hidden) * 0.02)
        self.layers = torch.nn.ModuleList(Layer(args, name, seed, layer) for layer in range(args.layers))
        self.norm = torch.nn.LayerNorm(args.hidden)
        self.out = torch.nn.Linear(args.hidden, 256)

    def forward(self, x, noise=None):  # x: batch x seq bytes; returns logits and the summed auxiliary losses
        b, t = x.shape
        h = self.embed(x) + self.position[:t]
        p, aux = torch.zeros_like(h), h.new_zeros((), dtype=torch.float32)
        for layer in self.layers:
            h = h + layer.attend(h)
            y, layer_aux = layer.smoe(layer.norm2(h).reshape(b * t, -1), t, noise)
            p = self.mu * p - y.view(b, t, -1)
            h = h - self.gamma * p
            aux = aux + layer_aux
        with torch.autocast(h.device.type, enabled=False):  # the logits, and so the loss, in float32
            return self.out(self.norm(h.float())), aux

    def routers(self):
        return [layer.smoe.router for layer in self.layers]


def load_ratio(routers):
    """Tokens of the busiest expert over the mean, averaged over the layers of the last call."""
    return sum((r.load.max() / r.load.float().mean()).item() for r in routers) / len(routers)


BITS = 1 / math.log(2)


def autocast(args):
    return torch.autocast(torch.device(args.device).type, torch.bfloat16, enabled=args.precision == "bf16")


def evaluate(model, data, args):
    """Bits per byte and load max/mean of the text in non-overlapping sequences, as deployed: eval mode,
    where every router routes by softmax top-k."""
    model.eval()
    usable = len(data) - 1 if args.eval_tokens == 0 else min(len(data) - 1, args.eval_tokens)
    starts = torch.arange(0, usable - args.seq + 1, args.seq)
    total, count, loads = 0.0, 0, []
    with torch.no_grad(), autocast(args):
        for batch in starts.split(args.batch):
            index = batch[:, None] + torch.arange(args.seq + 1)
            x = data[index].to(args.device)
            logits, _ = model(x[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, 256).float(), x[:, 1:].reshape(-1), reduction="sum").item()
            count += x[:, 1:].numel()
            loads.append(load_ratio(model.routers()))
    model.train()
    return total / count * BITS, sum(loads) / len(loads)


def generators(seed, device):
    """A seed's batch order (the same for every router) and the noisy gate's draws: no seed's noise is
    another seed's batches."""
    return (torch.Generator().manual_seed(seed),
            torch.Generator(device=device).manual_seed(NOISE_STREAMS + seed))


def run(name, seed, args, train, valid, attacked_valid):
    torch.manual_seed(seed)  # the same initial weights and dropout masks for every router
    model = ByteLM(args, name, seed).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / max(1, args.warmup)))
    batches, noise = generators(seed, args.device)
    losses, loads, times, curve, sinkhorn = [], [], [], [], 0
    start = time.perf_counter()
    for step in range(args.steps):
        step_start = time.perf_counter()
        x = random_windows(train, args.seq + 1, args.batch, batches).to(args.device)
        with autocast(args):
            logits, aux = model(x[:, :-1], noise)
            loss = F.cross_entropy(logits.reshape(-1, 256).float(), x[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        (loss + aux).backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        schedule.step()
        losses.append(loss.item() * BITS)
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"{name}, seed {seed}: the training loss is {losses[-1]} at step {step + 1}")
        loads.append(load_ratio(model.routers()))
        sinkhorn += sum(int(r.info[0].item()) for r in model.routers())  # info[0]: the call took Sinkhorn
        times.append(time.perf_counter() - step_start)
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            done = len(curve) and curve[-1][0]
            curve.append((step + 1, mean(losses[done:]), mean(loads[done:])))
            print(f"  {name:>13} seed {seed} step {step + 1:6d}  loss {curve[-1][1]:.3f} bits/byte  load "
                  f"{curve[-1][2]:.2f}  {time.perf_counter() - start:7.1f} s", file=sys.stderr, flush=True)
    valid_bits, valid_load = evaluate(model, valid, args)
    attacked_bits = evaluate(model, attacked_valid, args)[0] if args.attack > 0 else None  # null: not run
    tail = max(1, args.steps // 10)  # the last 10% of steps; step times after the first 10% (warm-up)
    return dict(train=mean(losses[-tail:]), valid=valid_bits, attacked=attacked_bits, load=valid_load,
                train_load=mean(loads[-tail:]), sinkhorn=sinkhorn, ms=1000 * mean(times[tail:] or times),
                curve=curve)


def mean(values):
    return sum(values) / len(values)


def t_quantile(df, q=0.975):
    """Student's t quantile for an integer df >= 1, by bisection on its exact distribution function
    (Abramowitz and Stegun 26.7.3 and 26.7.4: a finite series in theta = atan(t / sqrt(df)))."""
    def inside(t):  # P(|T| <= t)
        theta = math.atan(t / math.sqrt(df))
        c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
        if df % 2 == 0:
            for j in range(1, df // 2):
                term *= c2 * (2 * j - 1) / (2 * j)
                total += term
            return math.sin(theta) * total
        for j in range(1, (df - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        return 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0))
    lo, hi = 0.0, 1e4
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if inside(mid) < 2 * q - 1 else (lo, mid)
    return (lo + hi) / 2


def paired(values, reference):
    """The mean of values - reference over seeds and its 95% paired-t interval (mean, low, high)."""
    if len(values) != len(reference):
        raise ValueError(f"paired: {len(values)} values against {len(reference)} of the reference")
    d = [a - b for a, b in zip(values, reference)]
    centre = mean(d)
    half = t_quantile(len(d) - 1) * math.sqrt(sum((x - centre) ** 2 for x in d) / (len(d) - 1) / len(d))
    return centre, centre - half, centre + half


METRICS = (("valid", "val bits/byte", 4), ("attacked", "attacked bits/byte", 4), ("load", "val load max/mean", 3))


def spread(values, decimals):
    if None in values:
        return "-"
    if len(values) < 2:
        return f"{values[0]:.{decimals}f}"
    centre = mean(values)
    sd = math.sqrt(sum((v - centre) ** 2 for v in values) / (len(values) - 1))
    return f"{centre:.{decimals}f} ± {sd:.{decimals}f}"


def print_table(rows):
    """Prints rows of strings as a Markdown table, the first row the header, the first column left-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        cells = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        print("| " + " | ".join(cells) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|")


def summarise(results, args):
    """Prints the results table and, with two seeds or more, the paired differences; returns the latter."""
    rows = [("router", "train bits/byte", "val bits/byte", "attacked bits/byte", "val load max/mean",
             "Sinkhorn calls", "ms/step")]
    for name, runs in results.items():
        rows.append((name, spread([r["train"] for r in runs], 4), spread([r["valid"] for r in runs], 4),
                     spread([r["attacked"] for r in runs], 4), spread([r["load"] for r in runs], 3),
                     f"{round(mean([r['sinkhorn'] for r in runs]))} / {args.steps * args.layers}",
                     f"{mean([r['ms'] for r in runs]):.1f}"))
    print_table(rows)
    differences = {}
    for reference in ("softmax", "softmax+lb"):
        if reference not in results or args.seeds < 2:
            continue
        rows = [("router",) + tuple(f"Δ {label} vs {reference}" for _, label, _ in METRICS)]
        for name, runs in results.items():
            if name == reference:
                continue
            cells = []
            for key, _, decimals in METRICS:
                entry = differences.setdefault(reference, {}).setdefault(name, {})
                if args.attack == 0 and key == "attacked":
                    entry[key] = None  # not run
                    cells.append("-")
                    continue
                centre, low, high = paired([r[key] for r in runs], [r[key] for r in results[reference]])
                entry[key] = dict(mean=centre, low=low, high=high)
                star = "*" if low > 0 or high < 0 else ""
                cells.append(f"{centre:+.{decimals}f} [{low:+.{decimals}f}, {high:+.{decimals}f}]{star}")
            rows.append((name,) + tuple(cells))
        print()
        print_table(rows)
    print(f"\n{args.seeds} seed(s) x {args.steps} steps of {args.batch} x {args.seq} bytes; train: mean of the "
          "last 10% of steps; val and attacked: eval mode (every router routes by softmax top-k) on held-out "
          f"bytes, the attacked text with {args.attack:g} of them randomised; load: tokens of the busiest expert / "
          "mean, averaged over layers and batches; Δ: mean paired difference over seeds [95% t interval], * where "
          "the interval excludes zero")
    return differences


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    train, valid = split_bytes(args.data, args.valid)
    if len(valid) <= args.seq:  # the training split, nine times longer, then holds a window too
        sys.exit(f"train_lm.py: the text is too short for sequences of {args.seq} bytes: {len(train)} train and "
                 f"{len(valid)} validation bytes")
    attacked_valid = attacked(valid, args.attack)
    print(f"{args.layers} layers of attention + SMoE ({args.experts} experts of {args.inner}, top-{args.k}), hidden "
          f"{args.hidden}, {args.heads} heads{f', momentum {args.momentum:g}' if args.momentum else ''}; "
          f"{args.steps} steps of {args.batch} x {args.seq} bytes, lr {args.lr:g} after {args.warmup} warm-up steps; "
          f"p {args.p:g}{f', xi {args.xi:g}' if args.xi else ''}; {args.data or 'a generated text'} "
          f"({len(train)} train / {len(valid)} validation bytes); seeds {args.seed}..{args.seed + args.seeds - 1}; "
          f"{args.device}, {args.precision}", flush=True)
    results = {name: [] for name in args.routers}
    for seed in range(args.seed, args.seed + args.seeds):
        for name in args.routers:
            results[name].append(run(name, seed, args, train, valid, attacked_valid))
    differences = summarise(results, args)
    if args.json:
        setup = {k: v for k, v in vars(args).items() if k != "json"}
        text = json.dumps(dict(setup=setup, results=results, paired=differences), indent=1, allow_nan=False)
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
