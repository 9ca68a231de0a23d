// The property tests on the GPU: the Catch2 runner, which exits 77 (ctest's skip) without a CUDA device.
#include <cuda_runtime.h>

#include <cstdio>

#include "catch_session.hpp"

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n");
    return 77;
  }
  return ssr_test::run_catch_session(argc, argv);
}
