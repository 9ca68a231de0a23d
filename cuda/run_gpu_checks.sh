#!/usr/bin/env bash
# The CUDA backend's checks on a machine with an NVIDIA GPU, from a build configured with
# -DSSR_ENABLE_CUDA=ON (and Google Benchmark for the benchmarks):
#   cmake --build BUILD --target ssr_cuda_tests ssr_cuda_bench ssr_tests ssr-route ssr-cuda-engine-step
#   bash cuda/run_gpu_checks.sh BUILD [OUT]
# Runs the CUDA tests (the property suite of tests/ on the CUDA backend, its agreement with the CPU backend,
# and the CUDA call tests), the quick ones under compute-sanitizer (memcheck, racecheck, synccheck),
# ssr-route --backend cuda against the CPU backend, and the benchmarks against PyTorch
# (cuda/bench/peers_cuda.py, when PyTorch with CUDA is installed: SSR_PYTHON names its interpreter), and
# with the PyTorch package built (SSR_BUILD_PYTHON), its tests on the GPU, its operator's timings and the step
# time of the language-model recipe (python/examples/train_lm.py) at the paper's enwik8 sizes. Logs go to OUT (default: BUILD/gpu-checks);
# each check is stopped after SSR_CHECK_TIMEOUT seconds (default 600).
set -uo pipefail
build=${1:?usage: run_gpu_checks.sh BUILD [OUT]}
out=${2:-$build/gpu-checks}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
status=0
step() {  # step NAME COMMAND...: runs and logs one check, remembering a failure
  local name=$1
  shift
  echo "== $name: $*"
  if timeout "${SSR_CHECK_TIMEOUT:-600}" "$@" >"$out/$name.log" 2>&1; then echo "   ok"; else echo "   FAILED (exit $?)"; status=1; fi
  tail -n 5 "$out/$name.log" | sed 's/^/   | /'
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
step cuda_tests "$build/cuda/tests/ssr_cuda_tests"
# Under the sanitizers, the quick tests: every path and call option, without the large agreement grids
# and the stream test, whose time limit the sanitizers' slowdown would exceed; racecheck, slower still (it
# had not finished those in 90 s on an H100), the CUDA call tests (half and bfloat16 logits, a Sinkhorn
# solve, the graph capture). memcheck leaves out CUDA API errors: a test provokes a failed allocation, and
# NCCL probes for kernel images of other architectures.
quick="[workspace],[checks],[errors],[softmax],[backward],[cuda]~[stream]"
if command -v compute-sanitizer >/dev/null; then
  step sanitizer_memcheck compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 \
    "$build/cuda/tests/ssr_cuda_tests" "$quick"
  step sanitizer_synccheck compute-sanitizer --tool synccheck --error-exitcode 1 "$build/cuda/tests/ssr_cuda_tests" \
    "$quick"
  step sanitizer_racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$build/cuda/tests/ssr_cuda_tests" \
    "[cuda]~[stream]"
else
  echo "compute-sanitizer not found: sanitizer checks not run"
  status=1
fi
step engine_step "$build/cuda/examples/ssr-cuda-engine-step"
step route_tool env SSR_EXPECT_GPU=1 "$build/tests/ssr_tests" "[cuda]"
python=${SSR_PYTHON:-python3}
if [ -d "$build/python/ssr_torch" ] && "$python" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  step python_cuda env PYTHONPATH="$build/python" "$python" -m pytest -q -p no:cacheprovider \
    "$here/../python/tests/test_cuda.py" "$here/../python/tests/test_ops.py" "$here/../python/tests/test_replay.py"
  # The language-model recipe on the GPU: every router for a few steps with Sinkhorn on every call (the
  # noise generator, the expert bias and the losses on the device, bf16 products), then 50 steps at the
  # paper's enwik8 sizes and p, whose step time the 80k-step run's duration follows from.
  step recipe_every_router env PYTHONPATH="$build/python" "$python" "$here/../python/examples/train_lm.py" \
    --routers all --steps 5 --p 1 --eval-tokens 4096
  step recipe_enwik8_steps env PYTHONPATH="$build/python" "$python" "$here/../python/examples/train_lm.py" \
    --preset enwik8 --steps 50 --routers softmax,ssr-l --eval-tokens 24576
  grep -E "^\| (router|softmax|ssr-l) " "$out/recipe_enwik8_steps.log"
fi
if PYTHONPATH="$build/python" "$python" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  PYTHONPATH="$build/python" "$python" "$here/bench/peers_cuda.py" --bench "$build/cuda/bench/ssr_cuda_bench" --json "$out/peers.json" | tee "$out/peers.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "PyTorch with CUDA not found: peers not run; ssr's figures alone:"
  "$build/cuda/bench/ssr_cuda_bench" | tee "$out/bench.txt"
fi
exit $status
