#!/usr/bin/env bash
# Builds, here, the CUDA programs cuda/run_gpu_checks.sh runs (the `gpu` preset: Release, sm_90) and packs
# them into one folder that can travel to a GPU machine with the sources, with the shared libraries they
# need that such a machine may lack (Google Benchmark's, the CUDA runtime, OpenMP's). NCCL, too large to
# carry, is found there (run_gpu_checks.sh looks in torch's copy); glibc and the C++ runtime are the
# machine's own. Usage, from anywhere:
#   bash cuda/gpu_bundle.sh [BUNDLE]          # default .gpu in the sources' root, which git ignores
# then on the GPU machine, from the sources' root:
#   bash cuda/run_gpu_checks.sh BUNDLE OUT
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$(realpath -m "${1:-$root/.gpu}")
cd "$root"
cmake --preset gpu >/dev/null
cmake --build --preset gpu
programs=(cuda/tests/ssr_cuda_tests cuda/bench/ssr_cuda_bench cuda/examples/ssr-cuda-engine-step tests/ssr_tests
          examples/ssr-route)
rm -rf "$bundle"
mkdir -p "$bundle/lib"
for program in "${programs[@]}"; do
  mkdir -p "$bundle/$(dirname "$program")"
  cp "build-gpu/$program" "$bundle/$program"
done
# Every library the programs load but glibc's, the C++ runtime's and NCCL.
for program in "${programs[@]}"; do ldd "build-gpu/$program"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/lib(c|m|dl|rt|pthread|stdc\+\+|gcc_s|nccl)\.so' |
  while read -r library; do cp -L "$library" "$bundle/lib/"; done
# The header-only libraries the PyTorch package's build there needs: Random123, and Eigen with its CMake
# package, which finds the headers three folders above itself (PREFIX/share/eigen3/cmake, PREFIX/include/eigen3).
cache() { sed -n "s|^$1:[A-Z]*=||p" build-gpu/CMakeCache.txt; }
eigen=$(cache Eigen3_DIR)
mkdir -p "$bundle/include/eigen3" "$bundle/share/eigen3"
cp -r "$eigen/../../../include/eigen3/Eigen" "$bundle/include/eigen3/"
cp -r "$eigen" "$bundle/share/eigen3/cmake"
cp -r "$(cache Random123_INCLUDE_DIR)/Random123" "$bundle/include/"
echo "$bundle: $(du -sh "$bundle" | cut -f1) ($(ls "$bundle/lib" | tr '\n' ' '))"
