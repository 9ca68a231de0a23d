// Fused Sinkhorn iterations on the GPU: the whole solve is one cooperative kernel, so neither the
// iterations nor the convergence test cost a launch or a host round trip.
//
// Per iteration, two grid-wide barriers:
//   1. rows: each row block (rows_per_block(m) rows, a warp per row) computes its rows' potentials f_i
//      and adds its plan into per-warp column sums in shared memory, then writes the block's column
//      sums, added in warp order, to partial[block];
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
  int done;
  int iterations;
  double err;
};

constexpr int sinkhorn_threads = 256;  // 8 warps per block
constexpr int sinkhorn_warps = sinkhorn_threads / 32;

// Rows per row block: enough blocks to fill a large GPU at any m, at most 256 rows, a multiple of the
// warp count. A function of m alone.
inline index_t rows_per_block(index_t m) {
  const index_t want = (m + 2047) / 2048;
  const index_t rounded = (want + sinkhorn_warps - 1) / sinkhorn_warps * sinkhorn_warps;
  return rounded < sinkhorn_warps ? sinkhorn_warps : rounded > 256 ? 256 : rounded;
}

inline index_t row_blocks(index_t m) { return (m + rows_per_block(m) - 1) / rows_per_block(m); }

// Shared memory of the solve kernel for n experts; the fused path needs it to fit in 48 KiB.
inline std::size_t sinkhorn_shared_bytes(index_t n) {
  return static_cast<std::size_t>(sinkhorn_warps * n + sinkhorn_threads) * sizeof(double);
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

template <class T>
__global__ void __launch_bounds__(sinkhorn_threads) sinkhorn_solve(const T* logk, double* f, double* g, double* partial,
                                                                    double* colsum, double* colerr, index_t m, index_t n,
                                                                    index_t rows, double tol, int max_iters,
                                                                    SinkhornState* state) {
  namespace cg = cooperative_groups;
  cg::grid_group grid = cg::this_grid();
  extern __shared__ double shared[];
  double* warp_sums = shared;                               // warps x n
  double* scratch = shared + sinkhorn_warps * n;            // threads
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const index_t blocks = (m + rows - 1) / rows;
  const double target = static_cast<double>(m) / static_cast<double>(n);
  double* g_now = g;
  double* g_next = g + n;
  if (blockIdx.x == 0 && threadIdx.x == 0) *state = SinkhornState{0, 0, 0.0};

  for (int it = 1;; ++it) {
    // 1. Rows.
    for (index_t b = blockIdx.x; b < blocks; b += gridDim.x) {
      double* mine = warp_sums + warp * n;
      for (index_t j = lane; j < n; j += 32) mine[j] = 0;
      const index_t first = b * rows, last = first + rows < m ? first + rows : m;
      for (index_t i = first + warp; i < last; i += sinkhorn_warps) {
        const T* k = logk + i * n;
        double top = -INFINITY;
        for (index_t j = lane; j < n; j += 32) top = fmax(top, static_cast<double>(k[j]) + g_now[j]);
        for (int o = 16; o > 0; o >>= 1) top = fmax(top, __shfl_xor_sync(0xffffffffu, top, o));
        double sum = 0;
        for (index_t j = lane; j < n; j += 32) sum += exp(static_cast<double>(k[j]) + g_now[j] - top);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const double fi = -(top + log(sum));
        if (lane == 0) f[i] = fi;
        for (index_t j = lane; j < n; j += 32) mine[j] += exp(static_cast<double>(k[j]) + g_now[j] + fi);
      }
      __syncthreads();
      for (index_t j = threadIdx.x; j < n; j += blockDim.x) {
        double total = 0;
        for (int w = 0; w < sinkhorn_warps; ++w) total += warp_sums[w * n + j];
        partial[b * n + j] = total;
      }
      __syncthreads();
    }
    grid.sync();

    // 2. Columns: plan sums, errors, next potentials.
    for (index_t j = blockIdx.x; j < n; j += gridDim.x) {
      const double sum = block_sum(blocks, [=](index_t b) { return partial[b * n + j]; }, scratch);
      if (threadIdx.x == 0) {
        colsum[j] = sum;
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
        if (threadIdx.x == 0) *state = SinkhornState{1, it, err};
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
  index_t f, g, partial, colsum, colerr;
  static SinkhornWorkspace of(index_t m, index_t n) { return {m, 2 * n, row_blocks(m) * n, n, n}; }
};

// Runs the solve on stream from g = 0: logk is m x n, and f, g, partial, colsum, colerr and state are
// device memory of SinkhornWorkspace::of(m, n)'s sizes. Requires sinkhorn_fits(n). On return g[0, n)
// holds the column potentials. Returns the state after the last iteration (one read-back).
template <class T>
SinkhornState sinkhorn_iterate(const T* logk, double* f, double* g, double* partial, double* colsum, double* colerr,
                               SinkhornState* state, index_t m, index_t n, const SinkhornParams& params,
                               cudaStream_t stream) {
  int device = 0, sms = 0, per_sm = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
  const std::size_t shared = sinkhorn_shared_bytes(n);
  const auto kernel = detail::sinkhorn_solve<T>;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, sinkhorn_threads, shared), "occupancy");
  // Every block must be resident for the grid barrier; more than the work needs would only wait.
  const index_t needed = row_blocks(m) > n ? row_blocks(m) : n;
  const index_t resident = static_cast<index_t>(per_sm) * sms;
  const unsigned grid = static_cast<unsigned>(needed < resident ? needed : resident);
  cudaMemsetAsync(g, 0, static_cast<std::size_t>(n) * sizeof(double), stream);
  index_t rows = rows_per_block(m);
  int max_iters = params.max_iters;
  double tol = params.tol;
  void* args[] = {&logk, &f, &g, &partial, &colsum, &colerr, &m, &n, &rows, &tol, &max_iters, &state};
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
