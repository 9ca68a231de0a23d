// The fused Sinkhorn solve on the GPU: the iterations are one cooperative kernel, so neither they nor the
// convergence test cost a launch or a host round trip. The mathematics is ssr/math/sinkhorn.hpp in its
// scaled form, as the CPU backend sweeps it: the kernel keeps Q_ij = exp(K_ij + h_j - c_i) for an absorbed
// copy h of g (in T) and c_i = max_j (K_ij + h_j), and v = exp(g - h), so an iteration reads Q once and
// takes no exp: a row's t = Q_i * v sums to r, its plan is t / r (f_i = -(c_i + log r)). When some
// |g_j - h_j| passes math::absorb_bound, h takes g and each block recomputes Q for its own rows.
// This file decides only who adds what in which order.
//
// Per iteration, two grid-wide barriers:
//   1. rows: each row block (CudaTuning::rows_per_block(m, n) rows; a group of lanes per row, each lane
//      holding its columns in registers) computes its rows' r and f_i (the sum reduced across the group)
//      and adds its plan into per-lane column sums, in double, in row order; the groups' sums are added in
//      a fixed butterfly within each warp and a fixed tree over the warps, and written to
//      partial[column][block];
//   2. columns: each column's block sums are added in a fixed order (block_sum),
//      giving its plan sum, its share of the error and its next potential (written to the other half
//      of g, so the current one stays intact);
//   3. every block adds the columns' errors in the same fixed order, and rounds the next g to T for v and
//      the absorption test, so all reach the same decisions.
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
  T *q, *row_top;                    // m x n scaled kernel Q; m row maxima c_i
  double *f, *g, *partial, *colerr;  // m; 2 n (current and next potentials); n x row blocks; n
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
  b.q = c.take<T>(static_cast<std::size_t>(m * n));
  b.row_top = c.take<T>(static_cast<std::size_t>(m));
  b.g = c.take<double>(static_cast<std::size_t>(2 * n));
  b.partial = c.take<double>(static_cast<std::size_t>(CudaTuning::row_blocks(m, n) * n));
  b.colerr = c.take<double>(static_cast<std::size_t>(n));
  b.stats = c.take<SolveStats>(1);
  return b;
}

namespace detail {

// The sum over t of values(t), t in [0, count), in an order fixed by count: each thread adds a strided
// subset in order, then a fixed butterfly within each warp and another over the warps. Every thread of
// the block returns the sum (a + b and b + a are the same bits, so every lane holds the same).
template <class Values>
__device__ double block_sum(index_t count, Values values, double* scratch) {
  constexpr unsigned all = 0xffffffffu;
  double local = 0;
#pragma unroll 8
  for (index_t t = threadIdx.x; t < count; t += blockDim.x) local += values(t);
  for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(all, local, o);
  __syncthreads();  // scratch may still be read from the previous call
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x / 32] = local;
  __syncthreads();
  double total = scratch[threadIdx.x & (CudaTuning::sinkhorn_warps - 1)];
  for (int o = CudaTuning::sinkhorn_warps / 2; o > 0; o >>= 1) total += __shfl_xor_sync(all, total, o);
  return total;
}

// Q and c_i of the rows of this block's row blocks from K and h: c_i = max_j (K_ij + h_j) (reduced across
// the row's group of lanes), Q_ij = exp(K_ij + h_j - c_i), in T.
template <class T, int Lanes>
__device__ void absorb_rows(const SinkhornBuffers<T>& b, index_t m, index_t n, index_t rows, const T* h) {
  constexpr unsigned all = 0xffffffffu;
  constexpr int slot = CudaTuning::sinkhorn_warps * (32 / Lanes);
  const int sub = threadIdx.x & (Lanes - 1), mine_slot = threadIdx.x / Lanes;
  const index_t blocks = (m + rows - 1) / rows;
  for (index_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const index_t first = blk * rows, last = first + rows < m ? first + rows : m;
    for (index_t base = first; base < last; base += slot) {
      const index_t i = base + mine_slot;
      const index_t cols = i < last ? n : 0;  // groups past the last row take part in the shuffles alone
      const T* krow = b.logk + i * n;
      T top = -INFINITY;
      for (index_t j = sub; j < cols; j += Lanes) top = max(top, krow[j] + h[j]);
      for (int o = Lanes / 2; o > 0; o >>= 1) top = max(top, __shfl_xor_sync(all, top, o, Lanes));
      if (cols == 0) continue;
      T* qrow = b.q + i * n;
      for (index_t j = sub; j < n; j += Lanes) qrow[j] = exp((krow[j] + h[j]) - top);
      if (sub == 0) b.row_top[i] = top;
    }
  }
}

// Cols: the most columns a lane holds (n <= Lanes * Cols), each in registers, so a lane issues all its
// loads of Rows rows at once and keeps its column sums over the row block's rows. MinBlocks: blocks per
// multiprocessor the registers are budgeted for.
template <class T, int Lanes, int Cols, int Rows, int MinBlocks>
__global__ void __launch_bounds__(CudaTuning::sinkhorn_threads, MinBlocks)
    sinkhorn_solve(SinkhornBuffers<T> b, index_t m, index_t n, index_t rows, SinkhornParams params) {
  namespace cg = cooperative_groups;
  constexpr unsigned all = 0xffffffffu;
  constexpr int slot = CudaTuning::sinkhorn_warps * (32 / Lanes);  // groups of a block
  cg::grid_group grid = cg::this_grid();
  extern __shared__ double shared[];
  double* warp_sums = shared;                                         // warps x n
  double* scratch = shared + CudaTuning::sinkhorn_warps * n;          // warps
  T* h = reinterpret_cast<T*>(scratch + CudaTuning::sinkhorn_warps);  // n: g absorbed into Q
  T* v = h + n;                                                       // n: exp(g - h)
  const int sub = threadIdx.x & (Lanes - 1), mine_slot = threadIdx.x / Lanes;
  const index_t blocks = (m + rows - 1) / rows;
  const math::ColumnTarget target = math::column_target(m, n);
  double* g_now = b.g;
  double* g_next = b.g + n;

  // g = 0: h = 0, v = 1, and Q from K.
  for (index_t j = threadIdx.x; j < n; j += blockDim.x) {
    h[j] = 0;
    v[j] = 1;
  }
  __syncthreads();
  absorb_rows<T, Lanes>(b, m, n, rows, h);

  for (int it = 1;; ++it) {
    // 1. Rows. A lane's columns are j = sub + Lanes * c.
    T vc[Cols];
#pragma unroll
    for (int c = 0; c < Cols; ++c) vc[c] = sub + Lanes * c < n ? v[sub + Lanes * c] : T(0);
    for (index_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
      double sums[Cols];
#pragma unroll
      for (int c = 0; c < Cols; ++c) sums[c] = 0;
      const index_t first = blk * rows, last = first + rows < m ? first + rows : m;
      // A step takes the group's rows base, base + slot, ..., base + (Rows - 1) slot, all their loads issued
      // at once; a lane adds its rows in row order whatever Rows is.
      for (index_t base = first + mine_slot; base < last + mine_slot; base += slot * Rows) {
        T t[Rows][Cols], top[Rows], r[Rows];
#pragma unroll
        for (int q = 0; q < Rows; ++q) {
          const index_t i = base + slot * q;
          const bool real = i < last;  // groups past the last row take part in the shuffles with nothing
          const T* qrow = b.q + i * n;
#pragma unroll
          for (int c = 0; c < Cols; ++c) t[q][c] = real && sub + Lanes * c < n ? qrow[sub + Lanes * c] : T(0);
          top[q] = real && sub == 0 ? b.row_top[i] : T(0);
        }
#pragma unroll
        for (int q = 0; q < Rows; ++q) {
          r[q] = 0;
#pragma unroll
          for (int c = 0; c < Cols; ++c) {
            t[q][c] *= vc[c];
            r[q] += t[q][c];
          }
        }
        for (int o = Lanes / 2; o > 0; o >>= 1)
#pragma unroll
          for (int q = 0; q < Rows; ++q) r[q] += __shfl_xor_sync(all, r[q], o, Lanes);
#pragma unroll
        for (int q = 0; q < Rows; ++q) {
          const index_t i = base + slot * q;
          if (i >= last) break;
          // r >= exp(-absorb_bound): Q holds a 1 in every row.
          if (sub == 0) b.f[i] = -(static_cast<double>(top[q]) + log(static_cast<double>(r[q])));
          const T inv = T(1) / r[q];
#pragma unroll
          for (int c = 0; c < Cols; ++c) sums[c] += static_cast<double>(t[q][c] * inv);
        }
      }
      // The groups' sums, added in a fixed butterfly within each warp and a fixed tree over the warps, are
      // the row block's column sums.
#pragma unroll
      for (int c = 0; c < Cols; ++c)
        for (int o = Lanes; o < 32; o <<= 1) sums[c] += __shfl_xor_sync(all, sums[c], o);
      if ((threadIdx.x & 31) < Lanes)
#pragma unroll
        for (int c = 0; c < Cols; ++c)
          if (sub + Lanes * c < n) warp_sums[threadIdx.x / 32 * n + sub + Lanes * c] = sums[c];
      __syncthreads();
      for (int half = CudaTuning::sinkhorn_warps / 2; half > 0; half /= 2) {
        for (index_t e = threadIdx.x; e < half * n; e += blockDim.x) warp_sums[e] += warp_sums[e + half * n];
        __syncthreads();
      }
      for (index_t j = threadIdx.x; j < n; j += blockDim.x) b.partial[j * blocks + blk] = warp_sums[j];
      __syncthreads();
    }
    grid.sync();

    // 2. Columns: plan sums, errors, next potentials.
    for (index_t j = blockIdx.x; j < n; j += gridDim.x) {
      const double* partial = b.partial;
      const double sum = block_sum(
          blocks, [=](index_t blk) { return partial[j * blocks + blk]; }, scratch);
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
    // v = exp(g - h) from g rounded to T, after h absorbed g where some |g_j - h_j| passed the bound.
    int far = 0;
    for (index_t j = threadIdx.x; j < n; j += blockDim.x) far |= math::absorbs(static_cast<T>(g_now[j]), h[j]);
    const bool absorb = __syncthreads_or(far) != 0;
    for (index_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T gt = static_cast<T>(g_now[j]);
      if (absorb) h[j] = gt;
      v[j] = math::scaling(gt, h[j]);
    }
    __syncthreads();
    if (absorb) absorb_rows<T, Lanes>(b, m, n, rows, h);
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
  // Lanes per row (CudaTuning::lanes), the most columns per lane, rows per group at once
  // (CudaTuning::sinkhorn_rows_per_group) and blocks per multiprocessor the registers are budgeted for:
  // n <= 16 (from and below 2^18 rows), 64, 128, 256, else up to sinkhorn_max_n. Three blocks (80
  // registers) where the loads in flight bind (on an H200 they alone made one iteration 1.06-1.23x faster at
  // n = 128 and 256); two where the barriers do (n <= 16 below 2^18 rows) and where a lane holds 19 columns
  // (three would spill).
  const bool many = CudaTuning::sinkhorn_many_rows(m);
  const auto kernel = n <= 16 && many ? detail::sinkhorn_solve<T, 4, 4, 4, 3>
                      : n <= 16       ? detail::sinkhorn_solve<T, 4, 4, 2, 2>
                      : n <= 64       ? detail::sinkhorn_solve<T, 16, 4, 2, 3>
                      : n <= 128      ? detail::sinkhorn_solve<T, 32, 4, 2, 3>
                      : n <= 256      ? detail::sinkhorn_solve<T, 32, 8, 2, 3>
                                      : detail::sinkhorn_solve<T, 32, CudaTuning::sinkhorn_max_n / 32, 1, 2>;
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
