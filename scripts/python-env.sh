#!/usr/bin/env bash
# Creates .venv (if missing) with torch from PyPI and what building and testing the PyTorch package
# needs (transformers for the Hugging Face drop-in), then builds the package's wheel from this checkout and
# installs it: pip wheel --no-build-isolation . builds the operators against the torch they will run with.
# Downloads are cached by pip (~/.cache/pip).
# SSR_PYTHON_CUDA=OFF skips the CUDA kernels (default AUTO: built when torch has CUDA and nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check "torch>=2.4" scikit-build-core pytest ninja numpy transformers
# The engines ssr_torch.megatron and ssr_torch.torchtitan are tested against, pinned, without their own
# dependencies (which would replace PyPI's torch): only the small ones they import.
.venv/bin/pip install --quiet --disable-pip-version-check --no-deps megatron-core==0.16.1 torchtitan==0.3.0 \
  spmd-types==0.3.1 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1
# The wheel is kept in build-wheel/ for scripts/wheel.sh (auditwheel, and a try in a fresh environment).
rm -rf build-wheel
.venv/bin/pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps -w build-wheel \
  -C cmake.define.SSR_PYTHON_CUDA="${SSR_PYTHON_CUDA:-AUTO}" .
.venv/bin/pip install --quiet --disable-pip-version-check --force-reinstall --no-deps build-wheel/ssr_torch-*.whl
.venv/bin/python -c "import ssr_torch, torch; print('ssr_torch', ssr_torch.__version__, 'on torch', torch.__version__)"
