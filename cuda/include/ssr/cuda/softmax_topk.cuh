// Fused softmax top-k: a group of lanes per token (4, 16 or 32 by n) reads the row once, keeps each
// lane's best k in registers, merges them across the group (ties to the lower index), and writes
// experts and weights.
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

// Softmax top-k of rows; K is the compile-time bound on k (k <= K). Each row is read by a group of
// Lanes lanes of a warp (Lanes a power of two up to 32), so small n does not leave most of a warp idle.
template <class In, class Out, int K, int Lanes>
__global__ void softmax_topk_kernel(ConstMatrixView<In> s, RouteSpec spec, MatrixView<std::int32_t> experts,
                                    MatrixView<Out> weights, MatrixView<Out> noise) {
  using V = compute_t<In>;
  constexpr unsigned all = 0xffffffffu;
  const int sub = threadIdx.x & (Lanes - 1);
  const index_t row = (static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x) / Lanes;
  // Groups past the last row stay to the end: the shuffles below need every lane of the warp.
  const bool live = row < s.rows;
  const In* in = live ? s.row(row) : s.data;
  const index_t n = live ? s.cols : 0;
  const int k = spec.k;

  // With noise the score is the noisy shifted cost: it needs the row maximum and, for the softmax
  // cost, the normaliser, reduced across the group.
  V top = -INFINITY, sum = 0;
  if (spec.noisy()) {
    for (index_t j = sub; j < n; j += Lanes) top = max(top, load(in + j));
    for (int o = Lanes / 2; o > 0; o >>= 1) top = max(top, __shfl_xor_sync(all, top, o, Lanes));
    if (spec.cost == Cost::softmax) {
      for (index_t j = sub; j < n; j += Lanes) sum += exp(load(in + j) - top);
      for (int o = Lanes / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(all, sum, o, Lanes);
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

  // Each lane's best k of its columns j = sub, sub + Lanes, ..., sorted, kept in registers: every index
  // into best and idx is known at compile time (a bubble pass inserts, a shift pops).
  V best[K];
  int idx[K];
#pragma unroll
  for (int r = 0; r < K; ++r) {
    best[r] = -INFINITY;
    idx[r] = 0x7fffffff;
  }
  for (index_t j = sub; j < n; j += Lanes) {
    V v = score(j, load(in + j));
    int jv = static_cast<int>(j);
#pragma unroll
    for (int r = 0; r < K; ++r) {
      if (r < k && better(v, jv, best[r], idx[r])) {
        const V tv = best[r];
        const int tj = idx[r];
        best[r] = v;
        idx[r] = jv;
        v = tv;
        jv = tj;
      }
    }
  }

  // k rounds of an arg-max over the group's heads; the winning lane pops its head.
  int chosen[K];
  V logit[K];
  V wtop = -INFINITY;
#pragma unroll
  for (int r = 0; r < K; ++r) {
    if (r >= k) break;
    V v = best[0];
    int j = idx[0];
    for (int o = Lanes / 2; o > 0; o >>= 1) {
      const V ov = __shfl_xor_sync(all, v, o, Lanes);
      const int oj = __shfl_xor_sync(all, j, o, Lanes);
      if (better(ov, oj, v, j)) {
        v = ov;
        j = oj;
      }
    }
    if (idx[0] == j) {
#pragma unroll
      for (int q = 0; q + 1 < K; ++q) {
        best[q] = best[q + 1];
        idx[q] = idx[q + 1];
      }
      best[K - 1] = -INFINITY;
      idx[K - 1] = 0x7fffffff;
    }
    chosen[r] = j;
    if (live) logit[r] = load(in + j);  // weights use the clean logits
    wtop = live ? max(wtop, logit[r]) : wtop;
  }
  if (!live) return;
  if (sub == 0) {
    V wsum = 0;
#pragma unroll
    for (int r = 0; r < K; ++r)
      if (r < k) wsum += exp(logit[r] - wtop);
    std::int32_t* out_idx = experts.row(row);
#pragma unroll
    for (int r = 0; r < K; ++r) {
      if (r < k) {
        out_idx[r] = chosen[r];
        weights(row, r) = static_cast<Out>(exp(logit[r] - wtop) / wsum);
      }
    }
  }
  if (!spec.noisy() && noise.data)
    for (index_t j = sub; j < n; j += Lanes) noise(row, j) = Out(0);
}

template <class In, class Out, int Lanes>
void launch_softmax_topk(ConstMatrixView<In> s, const RouteSpec& spec, MatrixView<std::int32_t> experts,
                         MatrixView<Out> weights, MatrixView<Out> noise, cudaStream_t stream) {
  constexpr int threads = 256;
  const auto blocks = static_cast<unsigned>((s.rows * Lanes + threads - 1) / threads);
  if (spec.k <= 2) {
    softmax_topk_kernel<In, Out, 2, Lanes><<<blocks, threads, 0, stream>>>(s, spec, experts, weights, noise);
  } else {
    softmax_topk_kernel<In, Out, fused_max_k, Lanes><<<blocks, threads, 0, stream>>>(s, spec, experts, weights, noise);
  }
}

}  // namespace detail

// Launches the fused softmax top-k on stream; spec.k must be at most fused_max_k.
template <class In, class Out>
void softmax_topk(ConstMatrixView<In> s, const RouteSpec& spec, MatrixView<std::int32_t> experts, MatrixView<Out> weights,
                  MatrixView<Out> noise, cudaStream_t stream) {
  if (s.rows == 0) return;
  // About four columns per lane: 4 lanes per row up to n = 16, 16 up to n = 64, else a whole warp.
  if (s.cols <= 16) {
    detail::launch_softmax_topk<In, Out, 4>(s, spec, experts, weights, noise, stream);
  } else if (s.cols <= 64) {
    detail::launch_softmax_topk<In, Out, 16>(s, spec, experts, weights, noise, stream);
  } else {
    detail::launch_softmax_topk<In, Out, 32>(s, spec, experts, weights, noise, stream);
  }
}

}  // namespace cuda
}  // namespace ssr
