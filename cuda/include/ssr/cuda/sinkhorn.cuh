// Fused Sinkhorn iterations on the GPU: the whole solve is one cooperative kernel, so neither the
// iterations nor the convergence test cost a launch or a host round trip.
//
// Per iteration, two grid-wide barriers:
//   1. rows: each row block (rows_per_block(m, n) rows; a group of 4, 16 or 32 lanes per row, by n)
//      computes its rows' potentials f_i and adds its plan into per-group column sums in shared memory,
//      then writes the block's column sums, added in group order, to partial[block];
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

#include "ssr/backend/thrust.hpp"
#include "ssr/cuda/check.cuh"
#include "ssr/view.hpp"

namespace ssr {
namespace cuda {

struct SinkhornState {
  int iterations;
  double err;
};

constexpr int sinkhorn_threads = 256;  // 8 warps per block
constexpr int sinkhorn_warps = sinkhorn_threads / 32;

// Lanes per row: at most four columns per lane up to n = 64, so a warp works on several rows at once.
inline int sinkhorn_lanes(index_t n) { return n <= 16 ? 4 : n <= 64 ? 16 : 32; }

// Rows a block works on at once, and rows per row block: enough blocks to fill a large GPU at any m,
// at most max(256, slot) rows, a multiple of the slot. A function of the shape alone.
inline index_t sinkhorn_slot(index_t n) { return sinkhorn_warps * (32 / sinkhorn_lanes(n)); }
inline index_t rows_per_block(index_t m, index_t n) {
  const index_t slot = sinkhorn_slot(n), cap = slot > 256 ? slot : 256;
  const index_t rounded = ((m + 2047) / 2048 + slot - 1) / slot * slot;
  return rounded < slot ? slot : rounded > cap ? cap : rounded;
}
inline index_t row_blocks(index_t m, index_t n) { return (m + rows_per_block(m, n) - 1) / rows_per_block(m, n); }

// Shared memory of the solve kernel for n experts; the fused path needs it to fit in 48 KiB.
inline std::size_t sinkhorn_shared_bytes(index_t n) {
  return static_cast<std::size_t>(sinkhorn_slot(n) * n + sinkhorn_threads) * sizeof(double);
}
inline bool sinkhorn_fits(index_t n) { return sinkhorn_shared_bytes(n) <= 48 * 1024; }

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
__global__ void __launch_bounds__(sinkhorn_threads) sinkhorn_solve(const T* logk, double* f, double* g, double* partial,
                                                                    double* colerr, index_t m, index_t n,
                                                                    index_t rows, double tol, int max_iters,
                                                                    SinkhornState* state) {
  namespace cg = cooperative_groups;
  constexpr unsigned all = 0xffffffffu;
  constexpr int groups = 32 / Lanes;                     // rows of a warp at once
  constexpr int slot = sinkhorn_warps * groups;          // rows of a block at once
  cg::grid_group grid = cg::this_grid();
  extern __shared__ double shared[];
  double* group_sums = shared;                           // slot x n
  double* scratch = shared + slot * n;                   // threads
  const int sub = threadIdx.x & (Lanes - 1), mine_slot = threadIdx.x / Lanes;
  const index_t blocks = (m + rows - 1) / rows;
  const double target = static_cast<double>(m) / static_cast<double>(n);
  double* g_now = g;
  double* g_next = g + n;
  if (blockIdx.x == 0 && threadIdx.x == 0) *state = SinkhornState{0, 0.0};

  for (int it = 1;; ++it) {
    // 1. Rows.
    for (index_t b = blockIdx.x; b < blocks; b += gridDim.x) {
      double* mine = group_sums + mine_slot * n;
      for (index_t j = sub; j < n; j += Lanes) mine[j] = 0;
      const index_t first = b * rows, last = first + rows < m ? first + rows : m;
      for (index_t base = first; base < last; base += slot) {
        // Groups past the last row take part in the shuffles with nothing to add.
        const index_t i = base + mine_slot;
        const index_t cols = i < last ? n : 0;
        const T* k = logk + i * n;
        double top = -INFINITY;
        for (index_t j = sub; j < cols; j += Lanes) top = fmax(top, static_cast<double>(k[j]) + g_now[j]);
        for (int o = Lanes / 2; o > 0; o >>= 1) top = fmax(top, __shfl_xor_sync(all, top, o, Lanes));
        double sum = 0;
        for (index_t j = sub; j < cols; j += Lanes) sum += exp(static_cast<double>(k[j]) + g_now[j] - top);
        for (int o = Lanes / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(all, sum, o, Lanes);
        if (cols == 0) continue;
        const double fi = -(top + log(sum));
        if (sub == 0) f[i] = fi;
        for (index_t j = sub; j < n; j += Lanes) mine[j] += exp(static_cast<double>(k[j]) + g_now[j] + fi);
      }
      __syncthreads();
      for (index_t j = threadIdx.x; j < n; j += blockDim.x) {
        double total = 0;
        for (int q = 0; q < slot; ++q) total += group_sums[q * n + j];
        partial[b * n + j] = total;
      }
      __syncthreads();
    }
    grid.sync();

    // 2. Columns: plan sums, errors, next potentials.
    for (index_t j = blockIdx.x; j < n; j += gridDim.x) {
      const double sum = block_sum(blocks, [=](index_t b) { return partial[b * n + j]; }, scratch);
      if (threadIdx.x == 0) {
        colerr[j] = fabs(sum - target);
        g_next[j] = ssr::detail::thrust_kernels::next_column_potential(logk, f, m, n, j, sum, g_now[j]);
      }
    }
    grid.sync();

    // 3. The decision, the same in every block.
    const double err = block_sum(n, [=](index_t j) { return colerr[j]; }, scratch) / static_cast<double>(m);
    if (err < tol || it >= max_iters) {
      if (blockIdx.x == 0) {
        // The solve ends with the potentials its last row pass used.
        if (g_now != g)
          for (index_t j = threadIdx.x; j < n; j += blockDim.x) g[j] = g_now[j];
        if (threadIdx.x == 0) *state = SinkhornState{it, err};
      }
      return;
    }
    double* swap = g_now;
    g_now = g_next;
    g_next = swap;
  }
}

}  // namespace detail

// Workspace sizes of sinkhorn_iterate, in doubles.
struct SinkhornWorkspace {
  index_t f, g, partial, colerr;
  static SinkhornWorkspace of(index_t m, index_t n) { return {m, 2 * n, row_blocks(m, n) * n, n}; }
};

// Runs the solve on stream from g = 0: logk is m x n, and f, g, partial, colerr and state are
// device memory of SinkhornWorkspace::of(m, n)'s sizes. Requires sinkhorn_fits(n). On return g[0, n)
// holds the column potentials. Returns the state after the last iteration (one read-back).
template <class T>
SinkhornState sinkhorn_iterate(const T* logk, double* f, double* g, double* partial, double* colerr, SinkhornState* state,
                               index_t m, index_t n, const SinkhornParams& params,
                               cudaStream_t stream) {
  int device = 0, sms = 0, per_sm = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
  const std::size_t shared = sinkhorn_shared_bytes(n);
  const int lanes = sinkhorn_lanes(n);
  const auto kernel = lanes == 4 ? detail::sinkhorn_solve<T, 4> : lanes == 16 ? detail::sinkhorn_solve<T, 16> : detail::sinkhorn_solve<T, 32>;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, sinkhorn_threads, shared), "occupancy");
  // Every block must be resident for the grid barrier; more than the work needs would only wait.
  const index_t needed = row_blocks(m, n) > n ? row_blocks(m, n) : n;
  const index_t resident = static_cast<index_t>(per_sm) * sms;
  const unsigned grid = static_cast<unsigned>(needed < resident ? needed : resident);
  cudaMemsetAsync(g, 0, static_cast<std::size_t>(n) * sizeof(double), stream);
  index_t rows = rows_per_block(m, n);
  int max_iters = params.max_iters;
  double tol = params.tol;
  void* args[] = {&logk, &f, &g, &partial, &colerr, &m, &n, &rows, &tol, &max_iters, &state};
  check(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid), dim3(sinkhorn_threads), args,
                                    shared, stream),
        "sinkhorn_solve launch");
  SinkhornState host{};
  check(cudaMemcpyAsync(&host, state, sizeof(SinkhornState), cudaMemcpyDeviceToHost, stream), "sinkhorn state");
  check(cudaStreamSynchronize(stream), "sinkhorn_solve");
  return host;
}

}  // namespace cuda
}  // namespace ssr
