#!/usr/bin/env bash
# The CUDA backend's checks on a machine with an NVIDIA GPU, from a build configured with
# -DSSR_ENABLE_CUDA=ON and Google Benchmark, or from the folder cuda/gpu_bundle.sh packs elsewhere:
#   cmake --build BUILD --target ssr_cuda_tests ssr_cuda_bench ssr_tests ssr-route ssr-cuda-engine-step
#   bash cuda/run_gpu_checks.sh BUILD [OUT]
# Runs the CUDA tests (the property suite of tests/ on the CUDA backend, its agreement with the CPU backend,
# and the CUDA call tests), ssr-route --backend cuda against the CPU backend, the engine example, the quick
# tests under compute-sanitizer (memcheck, synccheck, racecheck), and, where SSR_PYTHON (default python3)
# has PyTorch with CUDA: the PyTorch package's GPU tests (building the package first where BUILD has none),
# the benchmarks against PyTorch (cuda/bench/peers_cuda.py) and the language-model recipe
# (python/examples/train_lm.py) at the paper's enwik8 sizes. Logs go to OUT (default: BUILD/gpu-checks).
# Each check stops after SSR_CHECK_TIMEOUT seconds (default 300) and all of them within SSR_CHECKS_BUDGET
# (default 480): a check that no time is left for is reported as skipped. Ends with a table of the checks.
set -uo pipefail
build=$(realpath "${1:?usage: run_gpu_checks.sh BUILD [OUT]}")
out=$(realpath -m "${2:-$build/gpu-checks}")
here=$(cd "$(dirname "$0")" && pwd)
python=${SSR_PYTHON:-python3}
mkdir -p "$out"
deadline=$((SECONDS + ${SSR_CHECKS_BUDGET:-480}))
status=0
summary=()
record() { summary+=("$(printf '%-22s %-22s %5s' "$1" "$2" "${3:--}")"); }  # record NAME RESULT [SECONDS]
record check result s
step() {  # step NAME COMMAND...: runs and logs one check within the time left, remembering a failure
  local name=$1 left=$((deadline - SECONDS)) start=$SECONDS result rc
  shift
  if [ "$left" -lt 15 ]; then
    record "$name" "skipped (no time left)"
    status=1
    return
  fi
  echo "== $name: $*"
  timeout "$((left < ${SSR_CHECK_TIMEOUT:-300} ? left : ${SSR_CHECK_TIMEOUT:-300}))" "$@" >"$out/$name.log" 2>&1
  rc=$?
  case $rc in
    0) result=ok ;;
    124) result="timed out"; status=1 ;;
    *) result="FAILED (exit $rc)"; status=1 ;;
  esac
  echo "   $result"
  tail -n 5 "$out/$name.log" | sed 's/^/   | /'
  record "$name" "$result" $((SECONDS - start))
}

device=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader) || {
  echo "no NVIDIA GPU answers nvidia-smi here"
  exit 1
}
echo "$device" | tee "$out/gpu.txt"
# A bundle carries its shared libraries in lib/; NCCL, when not installed, is taken from torch's copy.
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$build/cuda/tests/ssr_cuda_tests" | grep -q "libnccl.*not found"; then
  nccl=$("$python" -c "import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null) &&
    export LD_LIBRARY_PATH="$nccl:$LD_LIBRARY_PATH"
fi
export SSR_ROUTE_EXE="$build/examples/ssr-route"  # ssr_tests' tool tests, wherever the build now lies
torch_cuda=false
"$python" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null && torch_cuda=true
# The PyTorch package, where BUILD has none: built beside the first checks, against this machine's torch,
# by the system's g++ (a module with a C++ runtime of its own is refused: docs/pytorch.md, install).
package="$build/python"
if $torch_cuda && [ ! -d "$package/ssr_torch" ]; then
  package="$build/python-package/python"
  cxx=$(command -v /usr/bin/g++ || command -v g++)
  interpreter=$("$python" -c 'import sys; print(sys.executable)')
  headers=()  # a bundle's Eigen and Random123, for a machine without them
  [ -d "$build/share/eigen3/cmake" ] &&
    headers=(-DEigen3_DIR="$build/share/eigen3/cmake" -DRandom123_INCLUDE_DIR="$build/include")
  (cmake -S "$here/.." -B "$build/python-package" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSSR_BUILD_PYTHON=ON \
     -DSSR_PYTHON_CUDA=ON -DSSR_BUILD_TESTS=OFF -DSSR_BUILD_EXAMPLES=OFF -DSSR_BUILD_BENCHMARKS=OFF -DSSR_INSTALL=OFF \
     -DSSR_ENABLE_XTENSOR=OFF -DPython_EXECUTABLE="$interpreter" -DCMAKE_CXX_COMPILER="$cxx" \
     -DCMAKE_CUDA_HOST_COMPILER="$cxx" -DCMAKE_CUDA_ARCHITECTURES="${SSR_CUDA_ARCHITECTURES:-90}" "${headers[@]}" &&
     cmake --build "$build/python-package") >"$out/python_package_build.log" 2>&1 &
  package_build=$!
fi

step cuda_tests "$build/cuda/tests/ssr_cuda_tests"
step route_tool env SSR_EXPECT_GPU=1 "$build/tests/ssr_tests" "[cuda]"
step engine_step "$build/cuda/examples/ssr-cuda-engine-step"
# Under the sanitizers, the quick tests: every path and call option, without the large agreement grids and
# the stream test, whose time limit the sanitizers' slowdown would exceed; racecheck, slower still, the
# CUDA call tests (half and bfloat16 logits, a Sinkhorn solve, the graph capture). memcheck leaves out CUDA
# API errors: a test provokes a failed allocation, and NCCL probes for kernel images of other architectures.
quick="[workspace],[checks],[errors],[softmax],[backward],[cuda]~[stream]"
if command -v compute-sanitizer >/dev/null; then
  step sanitizer_memcheck compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 \
    "$build/cuda/tests/ssr_cuda_tests" "$quick"
  step sanitizer_synccheck compute-sanitizer --tool synccheck --error-exitcode 1 "$build/cuda/tests/ssr_cuda_tests" \
    "$quick"
else
  record compute-sanitizer "not found"
  status=1
fi
package_built=$torch_cuda
if [ -n "${package_build:-}" ] && ! wait "$package_build"; then
  echo "the PyTorch package did not build (python_package_build.log):"
  tail -n 20 "$out/python_package_build.log"
  record python_package_build FAILED
  package_built=false
  status=1
fi
$package_built && step python_cuda env PYTHONPATH="$package" "$python" -m pytest -q -p no:cacheprovider \
  "$here/../python/tests/test_cuda.py" "$here/../python/tests/test_ops.py" "$here/../python/tests/test_replay.py"
if $torch_cuda; then
  step peers env PYTHONPATH="$package" "$python" "$here/bench/peers_cuda.py" \
    --bench "$build/cuda/bench/ssr_cuda_bench" --json "$out/peers.json"
else
  echo "PyTorch with CUDA not found: the package's tests, the peers and the recipe not run; ssr's figures alone:"
  step bench "$build/cuda/bench/ssr_cuda_bench"
fi
# The language-model recipe: 50 steps at the paper's enwik8 sizes and p, whose step time the 80k-step run's
# duration follows from; then every router for a few steps with Sinkhorn on every call (the noise generator,
# the expert bias and the losses on the device, bf16 products).
if $package_built; then
  step recipe_enwik8_steps env PYTHONPATH="$package" "$python" "$here/../python/examples/train_lm.py" \
    --preset enwik8 --steps 50 --routers softmax,ssr-l --eval-tokens 24576
  step recipe_every_router env PYTHONPATH="$package" "$python" "$here/../python/examples/train_lm.py" \
    --routers all --steps 5 --p 1 --eval-tokens 4096
fi
command -v compute-sanitizer >/dev/null &&
  step sanitizer_racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$build/cuda/tests/ssr_cuda_tests" \
    "[cuda]~[stream]"

[ -f "$out/peers.log" ] && grep -v "^==\|^$" "$out/peers.log" | head -n 80
[ -f "$out/recipe_enwik8_steps.log" ] && grep -E "^\| (router|softmax|ssr-l) " "$out/recipe_enwik8_steps.log"
echo
echo "$device"
printf '%s\n' "${summary[@]}"
exit $status
