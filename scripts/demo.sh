#!/usr/bin/env bash
# Sets up, builds, and trains a small byte-level SMoE language model (2 layers of 8 experts, top-2, expert
# capacity factor 1) on a generated corpus with each router of the paper's Table 1 — softmax top-k, with
# the load-balancing loss, with the z-loss, trainable noisy gating, Sinkhorn every step (S-BASE), SSR-L and
# SSR-S with and without noise — and of today's engines (the sequence-wise loss, sigmoid scores with the
# auxiliary-loss-free expert bias, group-limited top-k, SSR with sigmoid scores), same seed and data for
# each. Prints validation bits per byte (clean, attacked, without capacity), dropped tokens, expert load,
# step time and the blocks' output norms, and leaves per-step metrics (steps.csv) and charts (load.svg,
# loss.svg) in build/smoe-demo.
# Extra arguments go to ssr-smoe-demo (see build/examples/ssr-smoe-demo --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j"$(nproc)" --target ssr-smoe-demo >/dev/null
build/examples/ssr-smoe-demo --out build/smoe-demo "$@"
