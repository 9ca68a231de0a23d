// Fused softmax top-k: a group of lanes per token (CudaTuning::lanes(n)) reads the row once, each lane
// keeps its best k in registers, the group merges them (math::ranks_before: ties to the lower index), and
// one lane writes the experts and the score weights (math::softmax_weights, in double).
// Logits may be float, double, __half or __nv_bfloat16. Without noise the ranking compares the logits in
// float (double for double), which is exact; with noise it compares the costs of ssr/math/cost.hpp in
// double, the row's shift by the group (group_cost_shift: math::cost_shift's bits), so experts match the
// other backends.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ssr/context.hpp"
#include "ssr/cuda/check.cuh"
#include "ssr/cuda/lane_group.cuh"
#include "ssr/cuda/scalar.cuh"
#include "ssr/cuda/tuning.cuh"
#include "ssr/math/cost.hpp"
#include "ssr/math/noise.hpp"
#include "ssr/math/weights.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cuda {
namespace detail {

template <class In>
__device__ inline auto load(const In* p) {
  using V = std::conditional_t<std::is_same<In, double>::value, double, float>;
  return static_cast<V>(ssr::detail::to_double(*p));
}

// Softmax top-k of rows; K bounds k (k <= K). Score is the type experts are ranked by: the logits' own
// (float or double) without noise, double with it. T is the weights' type and the cost bound's.
template <class In, class T, int K, int Lanes, bool Noisy>
__global__ void softmax_topk_kernel(ConstMatrixView<In> s, RouteSpec spec, Context ctx,
                                    MatrixView<std::int32_t> experts, MatrixView<T> weights, MatrixView<T> noise) {
  using Score = std::conditional_t<Noisy, double, decltype(load(s.data))>;
  const GroupRow<Lanes> group(s.rows);
  const int sub = group.sub;
  const index_t row = group.row;
  const bool live = group.live;
  const In* in = live ? s.row(row) : s.data;
  const index_t n = live ? s.cols : 0;
  const int k = spec.k;

  math::CostShift shift{0, 1};
  if (Noisy)
    shift =
        group_cost_shift<Lanes>(n, s.cols, spec.cost, sub, [in](index_t j) { return ssr::detail::to_double(in[j]); });
  // NaN (unchecked non-finite logits) ranks as -inf, so every chosen index is a column of the row.
  auto score = [&](index_t j) -> Score {
    if (!Noisy) {
      const Score v = load(in + j);
      return v == v ? v : -INFINITY;
    }
    const double z = math::noise_value(spec, ctx, row, s.cols, j);
    if (noise.data) noise(row, j) = math::noise_output_value<T>(z);
    const double c = math::cost_value<T>(math::shifted_cost(spec.cost, ssr::detail::to_double(in[j]), shift), &z);
    return c == c ? c : -INFINITY;
  };

  int chosen[K];
  group_topk<Score, K, Lanes>(n, k, sub, score, chosen);
  if (!live) return;
  if (sub == 0) {
    std::int32_t* out = experts.row(row);
    T* w = weights.row(row);
#pragma unroll
    for (int r = 0; r < K; ++r)
      if (r < k) out[r] = chosen[r];
    // Score weights use the clean logits: noise changes which experts, not the weights' formula.
    math::softmax_weights(
        k, [&](int r) { return ssr::detail::to_double(in[chosen[r]]); },
        [w](int r, double v) { w[r] = static_cast<T>(v); });
  }
  if (!Noisy && noise.data)
    for (index_t j = sub; j < n; j += Lanes) noise(row, j) = T(0);
}

}  // namespace detail

// Launches the fused softmax top-k on stream; spec.k must be at most CudaTuning::fused_max_k, and the
// selection plain (RouteSpec::plain_selection): ctx gives the noise's stream only.
template <class In, class T>
void softmax_topk(ConstMatrixView<In> s, const RouteSpec& spec, const Context& ctx, MatrixView<std::int32_t> experts,
                  MatrixView<T> weights, MatrixView<T> noise, cudaStream_t stream) {
  if (s.rows == 0) return;
  detail::with_lanes(s.cols, [&](auto lanes) {
    detail::with_list_length(spec.k, [&](auto list) {
      constexpr int Lanes = decltype(lanes)::value, K = decltype(list)::value;
      const unsigned blocks = detail::group_blocks(s.rows, Lanes);
      constexpr int threads = detail::group_threads;
      if (spec.noisy()) {
        detail::softmax_topk_kernel<In, T, K, Lanes, true>
            <<<blocks, threads, 0, stream>>>(s, spec, ctx, experts, weights, noise);
      } else {
        detail::softmax_topk_kernel<In, T, K, Lanes, false>
            <<<blocks, threads, 0, stream>>>(s, spec, ctx, experts, weights, noise);
      }
    });
  });
  check(cudaGetLastError(), "softmax_topk launch");
}

}  // namespace cuda
}  // namespace ssr
