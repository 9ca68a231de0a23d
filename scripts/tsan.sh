#!/usr/bin/env bash
# ThreadSanitizer over the tests that run threads: OpenMP teams of the CPU backend (thread counts 1..4 in
# the determinism, SIMD and workspace tests) and many Routers on concurrent std::threads (test_threads).
# Built by clang with LLVM's OpenMP runtime, whose Archer tool tells TSan about OpenMP's synchronisation
# (GCC's libgomp is not instrumented and would report its own barriers). Debian: clang, libomp-14-dev.
#   bash scripts/tsan.sh            # exit status non-zero on any report
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset tsan >/dev/null
cmake --build --preset tsan --target ssr_threaded_tests -j"$(nproc)"
export OMP_TOOL_LIBRARIES=/usr/lib/llvm-14/lib/libarcher.so
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1"
build-tsan/tests/ssr_threaded_tests "[threads],[determinism],[simd],[workspace]" --order rand --rng-seed 1
