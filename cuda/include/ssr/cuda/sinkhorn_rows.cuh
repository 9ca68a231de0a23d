// The Sinkhorn route's row stages around the solve, a group of CudaTuning::lanes(n) lanes a row (lane_group.cuh)
// reading and writing each row in runs of adjacent columns, where the Thrust backend's items give a thread
// a row: the kernel K of the costs and the noise (thrust_kernels::KernelRow's formulas) and the final plan's
// top-k with its weights (thrust_kernels::PlanRow's, without the plan's output). The same formulas in the
// same order, so the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ssr/backend/thrust/row_kernels.hpp"
#include "ssr/cuda/check.cuh"
#include "ssr/cuda/lane_group.cuh"
#include "ssr/cuda/scalar.cuh"
#include "ssr/math/cost.hpp"
#include "ssr/math/noise.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cuda {
namespace detail {

template <class In, class T, int Lanes>
__global__ void sinkhorn_kernel_rows(ConstMatrixView<In> s, RouteSpec spec, T* logk, MatrixView<T> noise) {
  const GroupRow<Lanes> group(s.rows);
  const In* in = group.live ? s.row(group.row) : s.data;
  const index_t n = group.live ? s.cols : 0;
  const auto logit = [in](index_t j) { return ssr::detail::to_double(in[j]); };
  const thrust_kernels::RowCost<In, T> cost(spec, in, n, group.row,
                                            group_cost_shift<Lanes>(n, s.cols, spec.cost, group.sub, logit));
  const double shift = group_max<Lanes>(n, group.sub, -math::cost_bound<T>(), cost);  // math::kernel_shift
  T* out = logk + group.row * n;
  for (index_t j = group.sub; j < n; j += Lanes)
    out[j] = static_cast<T>(math::kernel_value<T>(cost(j), shift, spec.sinkhorn.xi));
  if (!noise.empty())
    for (index_t j = group.sub; j < n; j += Lanes)
      noise(group.row, j) = math::noise_output_at<T>(
          spec, [&cost](index_t c) { return cost.noise(c); }, j);
}

template <class In, class T, int K, int Lanes>
__global__ void plan_topk_rows(ConstMatrixView<In> s, RouteSpec spec, const T* logk, const double* g,
                               MatrixView<std::int32_t> experts, MatrixView<T> weights) {
  const GroupRow<Lanes> group(s.rows);
  const index_t n = group.live ? s.cols : 0;
  const T* krow = logk + (group.live ? group.row * n : 0);
  const auto log_plan = [krow, g](index_t j) { return static_cast<double>(krow[j]) + g[j]; };
  int chosen[K];
  group_topk<double, K, Lanes>(
      n, spec.k, group.sub,
      [&](index_t j) {
        const double v = log_plan(j);
        return v == v ? v : -INFINITY;
      },
      chosen);
  if (!group.live || group.sub != 0) return;
  std::int32_t* idx = experts.row(group.row);
#pragma unroll
  for (int r = 0; r < K; ++r)
    if (r < spec.k) idx[r] = chosen[r];
  thrust_kernels::plan_weights(spec, s.row(group.row), idx, log_plan, weights.row(group.row));
}

}  // namespace detail

// logk (s.rows x s.cols) = the Sinkhorn kernel of the logits' costs, and the noise when asked, on stream.
template <class In, class T>
void sinkhorn_kernel(ConstMatrixView<In> s, const RouteSpec& spec, T* logk, MatrixView<T> noise, cudaStream_t stream) {
  if (s.rows == 0) return;
  detail::with_lanes(s.cols, [&](auto lanes) {
    constexpr int Lanes = decltype(lanes)::value;
    detail::sinkhorn_kernel_rows<In, T, Lanes>
        <<<detail::group_blocks(s.rows, Lanes), detail::group_threads, 0, stream>>>(s, spec, logk, noise);
  });
  check(cudaGetLastError(), "sinkhorn_kernel launch");
}

// The experts (top-k of log Pi_ij = K_ij + g_j) and their weights of every row, on stream; spec.k at most
// CudaTuning::fused_max_k, and no plan asked.
template <class In, class T>
void plan_topk(ConstMatrixView<In> s, const RouteSpec& spec, const T* logk, const double* g,
               MatrixView<std::int32_t> experts, MatrixView<T> weights, cudaStream_t stream) {
  if (s.rows == 0) return;
  detail::with_lanes(s.cols, [&](auto lanes) {
    detail::with_list_length(spec.k, [&](auto list) {
      constexpr int Lanes = decltype(lanes)::value, K = decltype(list)::value;
      detail::plan_topk_rows<In, T, K, Lanes>
          <<<detail::group_blocks(s.rows, Lanes), detail::group_threads, 0, stream>>>(s, spec, logk, g, experts,
                                                                                      weights);
    });
  });
  check(cudaGetLastError(), "plan_topk launch");
}

}  // namespace cuda
}  // namespace ssr
