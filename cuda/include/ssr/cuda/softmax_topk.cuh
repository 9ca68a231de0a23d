// Fused softmax top-k: one warp per token reads the row once, keeps each lane's best k in registers,
// merges them across the warp (ties to the lower index), and writes experts and weights.
// Logits may be float, double, __half or __nv_bfloat16; arithmetic is float (double for double).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ssr/detail/cost.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cuda {

// The largest k the fused kernel handles; larger k takes the Thrust path.
constexpr int fused_max_k = 8;

namespace detail {

template <class In>
using compute_t = std::conditional_t<std::is_same<In, double>::value, double, float>;

template <class In>
__device__ inline compute_t<In> load(const In* p) {
  if constexpr (std::is_same<In, __half>::value) {
    return __half2float(*p);
  } else if constexpr (std::is_same<In, __nv_bfloat16>::value) {
    return __bfloat162float(*p);
  } else {
    return static_cast<compute_t<In>>(*p);
  }
}

// (value, index) ordered by value, then by lower index.
template <class V>
__device__ inline bool better(V a, int ia, V b, int ib) {
  return a > b || (a == b && ia < ib);
}

// Softmax top-k of rows; K is the compile-time bound on k (k <= K).
template <class In, class Out, int K>
__global__ void softmax_topk_kernel(ConstMatrixView<In> s, RouteSpec spec, MatrixView<std::int32_t> experts,
                                    MatrixView<Out> weights, MatrixView<Out> noise) {
  using V = compute_t<In>;
  const int lane = threadIdx.x & 31;
  const index_t row = (static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (row >= s.rows) return;
  const In* in = s.row(row);
  const index_t n = s.cols;
  const int k = spec.k;

  // With noise the score is the noisy shifted cost: it needs the row maximum and, for the softmax
  // cost, the normaliser, reduced across the warp.
  V top = -INFINITY, sum = 0;
  if (spec.noisy()) {
    for (index_t j = lane; j < n; j += 32) top = max(top, load(in + j));
    for (int o = 16; o > 0; o >>= 1) top = max(top, __shfl_xor_sync(0xffffffffu, top, o));
    if (spec.cost == Cost::softmax) {
      for (index_t j = lane; j < n; j += 32) sum += exp(load(in + j) - top);
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
  }
  auto score = [&](index_t j, V v) -> V {
    if (!spec.noisy()) return v;
    const V c = spec.cost == Cost::linear ? v - top : (exp(v - top) - V(1)) / sum;
    const V z = static_cast<V>(spec.noise_alpha * spec.noise_sigma *
                               random::normal(spec.seed, spec.layer, spec.step, static_cast<std::uint64_t>(row) * n + j));
    if (noise.data) noise(row, j) = static_cast<Out>(z);
    return c + z;
  };

  // Each lane's best K of its columns j = lane, lane + 32, ..., sorted.
  V best[K];
  int idx[K];
  for (int r = 0; r < K; ++r) {
    best[r] = -INFINITY;
    idx[r] = 0x7fffffff;
  }
  for (index_t j = lane; j < n; j += 32) {
    const V v = score(j, load(in + j));
    if (!better(v, static_cast<int>(j), best[k - 1], idx[k - 1])) continue;
    int pos = k - 1;
    while (pos > 0 && better(v, static_cast<int>(j), best[pos - 1], idx[pos - 1])) {
      best[pos] = best[pos - 1];
      idx[pos] = idx[pos - 1];
      --pos;
    }
    best[pos] = v;
    idx[pos] = static_cast<int>(j);
  }

  // k rounds of a warp arg-max over the lanes' heads; the winning lane pops its head.
  int head = 0;
  V wsum = 0, wtop = 0;
  std::int32_t* out_idx = experts.row(row);
  for (int r = 0; r < k; ++r) {
    V v = head < K ? best[head] : -INFINITY;
    int j = head < K ? idx[head] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      const V ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oj = __shfl_xor_sync(0xffffffffu, j, o);
      if (better(ov, oj, v, j)) {
        v = ov;
        j = oj;
      }
    }
    if (head < K && idx[head] == j) ++head;
    if (lane == 0) out_idx[r] = j;
    const V logit = load(in + j);  // weights use the clean logits
    if (r == 0) wtop = logit;
    wtop = max(wtop, logit);
  }
  if (lane == 0) {
    for (int r = 0; r < k; ++r) wsum += exp(load(in + out_idx[r]) - wtop);
    for (int r = 0; r < k; ++r) weights(row, r) = static_cast<Out>(exp(load(in + out_idx[r]) - wtop) / wsum);
  }
  if (!spec.noisy() && noise.data)
    for (index_t j = lane; j < n; j += 32) noise(row, j) = Out(0);
}

}  // namespace detail

// Launches the fused softmax top-k on stream; spec.k must be at most fused_max_k.
template <class In, class Out>
void softmax_topk(ConstMatrixView<In> s, const RouteSpec& spec, MatrixView<std::int32_t> experts, MatrixView<Out> weights,
                  MatrixView<Out> noise, cudaStream_t stream) {
  constexpr int threads = 256;
  const auto blocks = static_cast<unsigned>((s.rows * 32 + threads - 1) / threads);
  if (blocks == 0) return;
  if (spec.k <= 2) {
    detail::softmax_topk_kernel<In, Out, 2><<<blocks, threads, 0, stream>>>(s, spec, experts, weights, noise);
  } else {
    detail::softmax_topk_kernel<In, Out, fused_max_k><<<blocks, threads, 0, stream>>>(s, spec, experts, weights, noise);
  }
}

}  // namespace cuda
}  // namespace ssr
