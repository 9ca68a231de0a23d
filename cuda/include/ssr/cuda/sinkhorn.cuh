// The Sinkhorn solve on the GPU as one cooperative kernel: the steps of thrust_algorithms::sinkhorn_iterate,
// the same work items over the same index ranges (so the same bits as every backend), with a grid barrier
// in place of each launch, so that neither the iterations nor the stopping decision cost a launch or a
// host round trip. The whole grid must be resident at once: where the device cannot hold it (other
// kernels, MPS limits or a green context holding its multiprocessors), sinkhorn_solve says so and the
// caller runs sinkhorn_iterate instead.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ssr/backend/thrust/algorithms.hpp"
#include "ssr/cuda/check.cuh"
#include "ssr/cuda/tuning.cuh"
#include "ssr/math/sinkhorn_scaled.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cuda {
namespace detail {

template <class T>
__global__ void __launch_bounds__(CudaTuning::sinkhorn_threads)
    sinkhorn_solve(thrust_algorithms::SinkhornBuffers<T> b, index_t m, index_t n, SinkhornParams params) {
  namespace k = thrust_kernels;
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  const index_t first = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  // Items [0, count) of a step over the grid, then the barrier every later step reads behind.
  const auto step = [&](index_t count, const auto& item) {
    for (index_t i = first; i < count; i += stride) item(i);
    grid.sync();
  };
  const k::ScaledSolve<T> solve = b.solve(m, n);
  const index_t blocks = math::sum_blocks(m, n);
  if (first == 0) *b.state = k::SolveState{};
  step(n, [&b](index_t j) {
    b.g[j] = 0;
    b.gt[j] = b.h[j] = T(0);
    b.v[j] = T(1);
  });
  for (int it = 0; it < params.max_iters; ++it) {
    step(m, k::ScaledRows<T>{solve});
    step(m, k::RowSum<T>{solve});
    step(blocks * math::sum_lanes * n, k::ColumnLane<T>{solve});
    step(n, k::ColumnSum<T>{b.lanes, b.v, b.colsum, b.state, n, blocks});
    step(1, k::Decide<T>{b.colsum, b.state, params, m, n, false});
    if (*static_cast<volatile const std::int32_t*>(&b.state->done) != 0) return;  // every thread reads the same
    if (*static_cast<volatile const std::int32_t*>(&b.state->log_columns) != 0)
      step(n * math::log_lanes, k::LogLanes<T>{solve, b.colsum, b.log_lanes});
    step(n, k::ColumnUpdate<T>{solve, b.colsum, m, false, b.log_lanes});
    step(1, k::Scale<T>{solve});
  }
}

}  // namespace detail

// Queues the solve of the m x n kernel at b.logk on stream, from g = 0, and returns true; or returns false,
// queuing nothing, where the device cannot hold its grid. When the kernel has run, b.state->stats holds the
// iterations and error and b's last pass the plan (thrust_algorithms::solved_rows). Nothing is read back.
template <class T>
bool sinkhorn_solve(const thrust_algorithms::SinkhornBuffers<T>& b, index_t m, index_t n, const SinkhornParams& params,
                    cudaStream_t stream) {
  const CudaTuning& tuning = CudaTuning::current();
  const auto kernel = detail::sinkhorn_solve<T>;
  const int per_sm = tuning.resident_blocks(reinterpret_cast<const void*>(kernel), CudaTuning::sinkhorn_threads, 0);
  // Enough blocks for the widest step, and no more than the device holds at once.
  const index_t lanes = math::sum_blocks(m, n) * math::sum_lanes * n, log_lanes = math::log_lanes * n;
  const index_t widest = std::max({lanes, log_lanes, m});
  const index_t needed = (widest + CudaTuning::sinkhorn_threads - 1) / CudaTuning::sinkhorn_threads;
  const index_t resident = static_cast<index_t>(per_sm) * tuning.multiprocessors;
  if (resident == 0 || CudaTuning::force_sinkhorn_steps) return false;
  const auto grid = static_cast<unsigned>(needed < resident ? needed : resident);
  thrust_algorithms::SinkhornBuffers<T> buffers = b;
  SinkhornParams p = params;
  void* args[] = {&buffers, &m, &n, &p};
  const cudaError_t launched = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid),
                                                           dim3(CudaTuning::sinkhorn_threads), args, 0, stream);
  if (launched == cudaErrorCooperativeLaunchTooLarge) {
    (void)cudaGetLastError();  // not sticky: clear it, and let the caller take the steps one launch each
    return false;
  }
  check(launched, "sinkhorn_solve launch");
  return true;
}

}  // namespace cuda
}  // namespace ssr
