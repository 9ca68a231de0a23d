#!/usr/bin/env bash
# Sets up, builds, and routes a synthetic batch at the paper's layer shape (24576 tokens, 16 experts,
# top-2) whose experts are unevenly popular: softmax top-k leaves the load skewed, Sinkhorn balances it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j"$(nproc)" --target ssr-route ssr-example-logits >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build/examples/ssr-example-logits --rows 24576 --experts 16 --skew 4 --out "$work/logits.npy"
route() {
  echo
  echo "== ssr-route $*"
  build/examples/ssr-route --logits "$work/logits.npy" --out "$work/out" "$@"
}
route --policy softmax                       # vanilla softmax top-2: the popular experts overflow
route --policy sinkhorn                      # SSR-L's Sinkhorn step: balanced, plan weights
route --policy sinkhorn --cost softmax --xi 0.1  # SSR-S: costs in [0, 1] want a smaller xi
route --policy sinkhorn --noise-alpha 0.01   # with noise on the cost
route --mode eval                            # inference: softmax top-k, whatever the policy
