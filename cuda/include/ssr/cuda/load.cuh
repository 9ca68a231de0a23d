// Per-expert load on the GPU: each block counts its share of the assignments in shared memory and adds
// its counts to the totals. Integer atomics, so the result is exact and independent of scheduling.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ssr/cuda/check.cuh"
#include "ssr/cuda/tuning.cuh"
#include "ssr/view.hpp"

namespace ssr {
namespace cuda {
namespace detail {

// A template, so that every translation unit may define it.
template <int = 0>
__global__ void count_load_kernel(ConstMatrixView<std::int32_t> experts, std::int32_t* load, index_t n) {
  extern __shared__ int counts[];
  for (index_t j = threadIdx.x; j < n; j += blockDim.x) counts[j] = 0;
  __syncthreads();
  const index_t total = experts.rows * experts.cols;
  for (index_t a = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; a < total;
       a += static_cast<index_t>(gridDim.x) * blockDim.x)
    atomicAdd(&counts[experts(a / experts.cols, a % experts.cols)], 1);
  __syncthreads();
  for (index_t j = threadIdx.x; j < n; j += blockDim.x)
    if (counts[j] != 0) atomicAdd(&load[j], counts[j]);
}

}  // namespace detail

// load[j] = number of assignments to expert j, on stream. Experts must be in [0, n);
// n <= CudaTuning::count_max_experts.
inline void count_load(ConstMatrixView<std::int32_t> experts, VectorView<std::int32_t> load, cudaStream_t stream) {
  constexpr int threads = CudaTuning::count_threads;
  check(cudaMemsetAsync(load.data, 0, static_cast<std::size_t>(load.size) * sizeof(std::int32_t), stream),
        "cudaMemsetAsync (load)");
  const index_t total = experts.rows * experts.cols;
  if (total == 0) return;
  const index_t wanted = (total + threads - 1) / threads;
  const auto blocks =
      static_cast<unsigned>(wanted < CudaTuning::count_max_blocks ? wanted : CudaTuning::count_max_blocks);
  detail::count_load_kernel<>
      <<<blocks, threads, static_cast<std::size_t>(load.size) * sizeof(int), stream>>>(experts, load.data, load.size);
  check(cudaGetLastError(), "count_load launch");
}

}  // namespace cuda
}  // namespace ssr
