// The fused Sinkhorn solve on the GPU: the iterations are one cooperative kernel, so neither they nor the
// convergence test cost a launch or a host round trip. The mathematics is ssr/math/sinkhorn.hpp in the
// log domain; this file decides only who adds what in which order.
//
// Per iteration, two grid-wide barriers:
//   1. rows: each row block (CudaTuning::rows_per_block(m, n) rows; a group of lanes per row) computes
//      its rows' potentials f_i (math::row_potential, the maximum and the sum reduced across the group)
//      and adds its plan into per-group column sums in shared memory, then writes the block's column
//      sums, added in group order, to partial[block];
//   2. columns: each column's block sums are added in a fixed order (a strided pass then a fixed tree),
//      giving its plan sum, its share of the error and its next potential (written to the other half
//      of g, so the current one stays intact);
//   3. every block adds the columns' errors in the same fixed order, so all reach the same decision.
// The partition into row blocks and every order of addition depend on the shape only, not on the grid
// size or the GPU, so a solve gives the same bits on every run and every device.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ssr/cuda/check.cuh"
#include "ssr/cuda/tuning.cuh"
#include "ssr/detail/workspace.hpp"
#include "ssr/math/sinkhorn.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cuda {

// The solve's buffers in the call's workspace (device memory).
template <class T>
struct SinkhornBuffers {
  T* logk;                           // m x n kernel, built before the solve
  double *f, *g, *partial, *colerr;  // m; 2 n (current and next potentials); row blocks x n; n
  SolveStats* stats;                 // where the solve reports
};

// Lays out the buffers of an m x n solve, the kernel and the row potentials at logk and f (m x n and m
// elements, laid out by the caller) when given, else in c too.
template <class T>
SinkhornBuffers<T> sinkhorn_layout(ssr::detail::Carve& c, index_t m, index_t n, T* logk = nullptr,
                                   double* f = nullptr) {
  SinkhornBuffers<T> b{};
  const bool own = logk == nullptr;
  b.logk = own ? c.take<T>(static_cast<std::size_t>(m * n)) : logk;
  b.f = own ? c.take<double>(static_cast<std::size_t>(m)) : f;
  b.g = c.take<double>(static_cast<std::size_t>(2 * n));
  b.partial = c.take<double>(static_cast<std::size_t>(CudaTuning::row_blocks(m, n) * n));
  b.colerr = c.take<double>(static_cast<std::size_t>(n));
  b.stats = c.take<SolveStats>(1);
  return b;
}

namespace detail {

// The sum over t of values(t), t in [0, count), in an order fixed by count: each thread adds a strided
// subset in order, then a fixed tree over the threads. Every thread of the block returns the sum.
template <class Values>
__device__ double block_sum(index_t count, Values values, double* scratch) {
  double local = 0;
  for (index_t t = threadIdx.x; t < count; t += blockDim.x) local += values(t);
  __syncthreads();  // scratch may still be read from the previous call
  scratch[threadIdx.x] = local;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (static_cast<int>(threadIdx.x) < stride) scratch[threadIdx.x] += scratch[threadIdx.x + stride];
    __syncthreads();
  }
  return scratch[0];
}

template <class T, int Lanes>
__global__ void __launch_bounds__(CudaTuning::sinkhorn_threads)
    sinkhorn_solve(SinkhornBuffers<T> b, index_t m, index_t n, index_t rows, SinkhornParams params) {
  namespace cg = cooperative_groups;
  constexpr unsigned all = 0xffffffffu;
  constexpr int groups = 32 / Lanes;                         // rows of a warp at once
  constexpr int slot = CudaTuning::sinkhorn_warps * groups;  // rows of a block at once
  cg::grid_group grid = cg::this_grid();
  extern __shared__ double shared[];
  double* group_sums = shared;          // slot x n
  double* scratch = shared + slot * n;  // threads
  const int sub = threadIdx.x & (Lanes - 1), mine_slot = threadIdx.x / Lanes;
  const index_t blocks = (m + rows - 1) / rows;
  const math::ColumnTarget target = math::column_target(m, n);
  double* g_now = b.g;
  double* g_next = b.g + n;

  for (int it = 1;; ++it) {
    // 1. Rows.
    for (index_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
      double* mine = group_sums + mine_slot * n;
      for (index_t j = sub; j < n; j += Lanes) mine[j] = 0;
      const index_t first = blk * rows, last = first + rows < m ? first + rows : m;
      for (index_t base = first; base < last; base += slot) {
        // Groups past the last row take part in the shuffles with nothing to add.
        const index_t i = base + mine_slot;
        const index_t cols = i < last ? n : 0;
        const T* krow = b.logk + i * n;
        // f_i = -logsumexp_j(K_ij + g_j), its maximum and sum reduced across the group.
        double top = -INFINITY;
        for (index_t j = sub; j < cols; j += Lanes) top = fmax(top, static_cast<double>(krow[j]) + g_now[j]);
        for (int o = Lanes / 2; o > 0; o >>= 1) top = fmax(top, __shfl_xor_sync(all, top, o, Lanes));
        double sum = 0;
        for (index_t j = sub; j < cols; j += Lanes) sum += exp(static_cast<double>(krow[j]) + g_now[j] - top);
        for (int o = Lanes / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(all, sum, o, Lanes);
        if (cols == 0) continue;
        const double fi = -(top + log(sum));
        if (sub == 0) b.f[i] = fi;
        for (index_t j = sub; j < n; j += Lanes) mine[j] += exp(static_cast<double>(krow[j]) + g_now[j] + fi);
      }
      __syncthreads();
      for (index_t j = threadIdx.x; j < n; j += blockDim.x) {
        double total = 0;
        for (int q = 0; q < slot; ++q) total += group_sums[q * n + j];
        b.partial[blk * n + j] = total;
      }
      __syncthreads();
    }
    grid.sync();

    // 2. Columns: plan sums, errors, next potentials.
    for (index_t j = blockIdx.x; j < n; j += gridDim.x) {
      const double* partial = b.partial;
      const double sum = block_sum(
          blocks, [=](index_t blk) { return partial[blk * n + j]; }, scratch);
      if (threadIdx.x == 0) {
        b.colerr[j] = math::column_error(sum, target);
        if (!math::column_underflowed<T>(sum)) {
          g_next[j] = math::next_column_potential<T>(g_now[j], sum, target);
        } else {
          const T* logk = b.logk;
          const double* f = b.f;
          g_next[j] = math::recovered_column_potential<T>(
              m, [=](index_t i) { return static_cast<double>(logk[i * n + j]) + f[i]; }, target);
        }
      }
    }
    grid.sync();

    // 3. The decision, the same in every block.
    const double* colerr = b.colerr;
    const double err = math::marginal_error(block_sum(
                                                n, [=](index_t j) { return colerr[j]; }, scratch),
                                            m);
    if (math::stop(err, it, params)) {
      if (blockIdx.x == 0) {
        // The solve ends with the potentials its last row pass used.
        if (g_now != b.g)
          for (index_t j = threadIdx.x; j < n; j += blockDim.x) b.g[j] = g_now[j];
        if (threadIdx.x == 0) *b.stats = SolveStats{it, math::converged(err, params) ? 1 : 0, err};
      }
      return;
    }
    double* swap = g_now;
    g_now = g_next;
    g_next = swap;
  }
}

}  // namespace detail

// Queues the solve on stream from g = 0: b.logk holds the m x n kernel. Requires
// CudaTuning::sinkhorn_fits(n). When the kernel has run, b.g[0, n) holds the column potentials and
// *b.stats the iterations and error. Nothing is read back.
template <class T>
void sinkhorn_solve(const SinkhornBuffers<T>& b, index_t m, index_t n, const SinkhornParams& params,
                    cudaStream_t stream) {
  const CudaTuning& tuning = CudaTuning::current();
  const std::size_t shared = CudaTuning::sinkhorn_shared_bytes(n);
  const int lanes = CudaTuning::lanes(n);
  const auto kernel = lanes == 4    ? detail::sinkhorn_solve<T, 4>
                      : lanes == 16 ? detail::sinkhorn_solve<T, 16>
                                    : detail::sinkhorn_solve<T, 32>;
  const int per_sm =
      tuning.resident_blocks(reinterpret_cast<const void*>(kernel), CudaTuning::sinkhorn_threads, shared);
  // Every block must be resident for the grid barrier; more than the work needs would only wait.
  const index_t needed = CudaTuning::row_blocks(m, n) > n ? CudaTuning::row_blocks(m, n) : n;
  const index_t resident = static_cast<index_t>(per_sm) * tuning.multiprocessors;
  const auto grid = static_cast<unsigned>(needed < resident ? needed : resident);
  check(cudaMemsetAsync(b.g, 0, static_cast<std::size_t>(n) * sizeof(double), stream), "cudaMemsetAsync (potentials)");
  SinkhornBuffers<T> buffers = b;
  index_t rows = CudaTuning::rows_per_block(m, n);
  SinkhornParams p = params;
  void* args[] = {&buffers, &m, &n, &rows, &p};
  check(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid),
                                    dim3(CudaTuning::sinkhorn_threads), args, shared, stream),
        "sinkhorn_solve launch");
}

}  // namespace cuda
}  // namespace ssr
