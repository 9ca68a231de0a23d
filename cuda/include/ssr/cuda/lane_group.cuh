// A group of Lanes lanes working on one row (Lanes a power of two, at most 32, the groups aligned in the
// warp: CudaTuning::lanes(n)): lane sub takes the columns j = sub, sub + Lanes, ... in order, and the group
// merges what its lanes found by shuffles. Every lane of the warp must call these, with the same k and
// cols in every group, a row or none.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "ssr/cuda/tuning.cuh"
#include "ssr/math/cost.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/math/topk.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cuda {
namespace detail {

constexpr unsigned all_lanes = 0xffffffffu;

// A group's row (Lanes consecutive threads a group, the rows in thread order), or none past the last row:
// such groups stay to the end, as the shuffles need every lane of the warp.
template <int Lanes>
struct GroupRow {
  int sub;
  index_t row;
  bool live;
  __device__ explicit GroupRow(index_t rows)
      : sub(static_cast<int>(threadIdx.x & (Lanes - 1))),
        row((static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x) / Lanes),
        live(row < rows) {}
};

// The group's first (v, j) in math::ranks_before's order (the larger value; among equals the lower index),
// into every lane's v and j.
template <int Lanes, class V>
__device__ void group_first(V& v, int& j) {
  for (int o = Lanes / 2; o > 0; o >>= 1) {
    const V ov = __shfl_xor_sync(all_lanes, v, o, Lanes);
    const int oj = __shfl_xor_sync(all_lanes, j, o, Lanes);
    if (math::ranks_before(ov, oj, v, j)) {
      v = ov;
      j = oj;
    }
  }
}

// max(start, value(j) over the row's n columns) in every lane, with std::max's bits in index order: NaN
// skipped, and of equal values (+0 and -0) the first, as the group's first of (value, index) pairs, the
// start's index -1.
template <int Lanes, class Value>
__device__ double group_max(index_t n, int sub, double start, const Value& value) {
  double top = start;
  int at = -1;
  for (index_t j = sub; j < n; j += Lanes) {
    const double v = value(j);
    if (top < v) {
      top = v;
      at = static_cast<int>(j);
    }
  }
  group_first<Lanes>(top, at);
  return top;
}

// math::cost_shift of a row of n columns (n = 0 for a group without a row; s(j) its logit j as a double), in
// every lane: the top by group_max, the softmax cost's sum in index order, each lane's term of a run of
// Lanes columns passed along the group one lane at a time. cols, the same in every group, bounds the runs.
template <int Lanes, class Logit>
__device__ math::CostShift group_cost_shift(index_t n, index_t cols, Cost cost, int sub, const Logit& s) {
  math::CostShift shift{group_max<Lanes>(n, sub, -INFINITY, s), 1.0};
  if (cost == Cost::softmax) {
    shift.sum = 0;
    for (index_t base = 0; base < cols; base += Lanes) {
      const index_t j = base + sub;
      const double term = j < n ? math::exp(s(j) - shift.top) : 0.0;
      for (int l = 0; l < Lanes; ++l) {
        const double t = __shfl_sync(all_lanes, term, l, Lanes);
        if (base + l < n) shift.sum += t;
      }
    }
  }
  return shift;
}

// chosen[0, k) = the first k (k <= K) of the row's n columns in math::ranks_before's order of score(j), in
// every lane. score must not return NaN (rank it as -inf): then every chosen index is a column of the row.
template <class Score, int K, int Lanes, class ScoreOf>
__device__ void group_topk(index_t n, int k, int sub, const ScoreOf& score, int (&chosen)[K]) {
  // Each lane's best k of its columns, in order, kept in registers: every index into best and idx is
  // known at compile time (a bubble pass inserts, a shift pops).
  Score best[K];
  int idx[K];
#pragma unroll
  for (int r = 0; r < K; ++r) {
    best[r] = -INFINITY;
    idx[r] = 0x7fffffff;
  }
  for (index_t j = sub; j < n; j += Lanes) {
    Score v = score(j);
    int jv = static_cast<int>(j);
#pragma unroll
    for (int r = 0; r < K; ++r) {
      if (r < k && math::ranks_before(v, jv, best[r], idx[r])) {
        const Score tv = best[r];
        const int tj = idx[r];
        best[r] = v;
        idx[r] = jv;
        v = tv;
        jv = tj;
      }
    }
  }
  // k rounds of the first of the group's heads; the lane that held it pops its head.
#pragma unroll
  for (int r = 0; r < K; ++r) {
    if (r >= k) break;
    Score v = best[0];
    int j = idx[0];
    group_first<Lanes>(v, j);
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
  }
}

// Threads a block of a row-group kernel, and the blocks that give each of `rows` rows a group of `lanes`.
constexpr int group_threads = CudaTuning::softmax_threads;
inline unsigned group_blocks(index_t rows, int lanes) {
  return static_cast<unsigned>((rows * lanes + group_threads - 1) / group_threads);
}

// f(std::integral_constant<int, Lanes>{}) for the lanes a row of n columns takes (CudaTuning::lanes).
template <class F>
void with_lanes(index_t n, const F& f) {
  switch (CudaTuning::lanes(n)) {
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 16:
      f(std::integral_constant<int, 16>{});
      break;
    default:
      f(std::integral_constant<int, 32>{});
      break;
  }
}

// f(std::integral_constant<int, K>{}) for the lists a top-k of k <= CudaTuning::fused_max_k keeps: 2 for
// k <= 2, else fused_max_k.
template <class F>
void with_list_length(int k, const F& f) {
  if (k <= 2) {
    f(std::integral_constant<int, 2>{});
  } else {
    f(std::integral_constant<int, CudaTuning::fused_max_k>{});
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace ssr
