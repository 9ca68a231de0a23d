// Fused Sinkhorn iterations on the GPU. One iteration is two kernels: a row pass that reads K once
// (each warp a row: f_i by warp reductions, the row's plan added to its warp's column sums in shared
// memory, the warps' sums added in warp order per block of rows), and a one-block update that adds the
// blocks' sums in block order, computes the column error, decides convergence on the device and
// updates g. The host enqueues up to max_iters iterations without waiting; once the device has
// decided, the remaining launches return at once. One read-back at the end gives iterations and error.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ssr/backend/thrust.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cuda {

struct SinkhornState {
  int done;
  int iterations;
  double err;
};

namespace detail {

constexpr int update_threads = 256;

template <class T>
__global__ void sinkhorn_rows(const T* logk, const double* g, double* f, double* partial, index_t m, index_t n,
                              const SinkhornState* state) {
  if (state->done) return;
  extern __shared__ double warp_sums[];  // warps x n
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  double* mine = warp_sums + warp * n;
  for (index_t j = lane; j < n; j += 32) mine[j] = 0;
  const index_t first = static_cast<index_t>(blockIdx.x) * ThrustTuning::block_rows;
  const index_t last = first + ThrustTuning::block_rows < m ? first + ThrustTuning::block_rows : m;
  for (index_t i = first + warp; i < last; i += warps) {
    const T* k = logk + i * n;
    double top = -INFINITY;
    for (index_t j = lane; j < n; j += 32) top = fmax(top, static_cast<double>(k[j]) + g[j]);
    for (int o = 16; o > 0; o >>= 1) top = fmax(top, __shfl_xor_sync(0xffffffffu, top, o));
    double sum = 0;
    for (index_t j = lane; j < n; j += 32) sum += exp(static_cast<double>(k[j]) + g[j] - top);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const double fi = -(top + log(sum));
    if (lane == 0) f[i] = fi;
    for (index_t j = lane; j < n; j += 32) mine[j] += exp(static_cast<double>(k[j]) + g[j] + fi);
  }
  __syncthreads();
  for (index_t j = threadIdx.x; j < n; j += blockDim.x) {
    double total = 0;
    for (int w = 0; w < warps; ++w) total += warp_sums[w * n + j];
    partial[static_cast<index_t>(blockIdx.x) * n + j] = total;
  }
}

template <class T>
__global__ void sinkhorn_update(const T* logk, const double* f, const double* partial, double* colsum, double* g, index_t m,
                                index_t n, index_t blocks, double tol, int max_iters, SinkhornState* state) {
  if (state->done) return;
  __shared__ double reduce[update_threads];
  __shared__ int done;
  const double target = static_cast<double>(m) / static_cast<double>(n);
  double local = 0;
  for (index_t j = threadIdx.x; j < n; j += blockDim.x) {
    double sum = 0;
    for (index_t b = 0; b < blocks; ++b) sum += partial[b * n + j];
    colsum[j] = sum;
    local += fabs(sum - target);
  }
  reduce[threadIdx.x] = local;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (static_cast<int>(threadIdx.x) < stride) reduce[threadIdx.x] += reduce[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double err = reduce[0] / static_cast<double>(m);
    state->iterations += 1;
    state->err = err;
    done = err < tol || state->iterations >= max_iters;
    state->done = done;
  }
  __syncthreads();
  if (done) return;
  for (index_t j = threadIdx.x; j < n; j += blockDim.x)
    g[j] = ssr::detail::thrust_kernels::next_column_potential(logk, f, m, n, j, colsum[j], g[j]);
}

}  // namespace detail

// Warps per row-pass block for n experts: the warps' column sums must fit in shared memory.
inline int sinkhorn_warps(index_t n) {
  const index_t fit = 40960 / (n * static_cast<index_t>(sizeof(double)));
  return fit >= 8 ? 8 : static_cast<int>(fit);
}

// Runs the iterations on stream from g = 0; logk, f, g, partial, colsum and state are device memory.
// Requires sinkhorn_warps(n) >= 1. Returns the state after the last iteration (one read-back).
template <class T>
SinkhornState sinkhorn_iterate(const T* logk, double* f, double* g, double* partial, double* colsum, SinkhornState* state,
                               index_t m, index_t n, const SinkhornParams& params, cudaStream_t stream) {
  const index_t blocks = (m + ThrustTuning::block_rows - 1) / ThrustTuning::block_rows;
  const int warps = sinkhorn_warps(n);
  cudaMemsetAsync(g, 0, static_cast<std::size_t>(n) * sizeof(double), stream);
  cudaMemsetAsync(state, 0, sizeof(SinkhornState), stream);
  for (int it = 0; it < params.max_iters; ++it) {
    detail::sinkhorn_rows<T><<<static_cast<unsigned>(blocks), 32 * warps, static_cast<std::size_t>(warps * n) * sizeof(double), stream>>>(
        logk, g, f, partial, m, n, state);
    detail::sinkhorn_update<T><<<1, detail::update_threads, 0, stream>>>(logk, f, partial, colsum, g, m, n, blocks, params.tol,
                                                                          params.max_iters, state);
  }
  SinkhornState host{};
  cudaMemcpyAsync(&host, state, sizeof(SinkhornState), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  return host;
}

}  // namespace cuda
}  // namespace ssr
