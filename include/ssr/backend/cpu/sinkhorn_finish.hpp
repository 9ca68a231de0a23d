// The outputs of a CPU Sinkhorn solve from its last pass: math::solved_row's, a tile's rows at once in
// lanes (the top-k of t = Q v, the weights, the plan t / r), and math::solved_row itself for the rows the
// tile does not take (k > tile_k, sigmoid score weights, a chosen Q below the underflow threshold).
#pragma once

#include <cstdint>

#include "ssr/backend/cpu/isa.hpp"
#include "ssr/backend/cpu/topk.hpp"
#include "ssr/math/numeric.hpp"
#include "ssr/math/rows.hpp"
#include "ssr/math/sinkhorn_scaled.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace cpu {

// A CPU solve's buffers (Sinkhorn::layout): K and Q by tiles; each row's c_i (top) and r_i; each block's
// column shares; the potentials; a tile of scratch per thread; and, for ranks that share the problem, the
// exact sums' limbs and the log-domain columns' flags, maxima and sums.
template <class T>
struct SinkhornBuffers {
  T *k, *q, *top, *row_sum, *part, *gt, *h, *v, *logits;
  double *g, *colsum, *costs, *noise;
  std::int64_t* limbs;
  std::int32_t* log_update;
  double *column_max, *column_sum;
};

template <class T>
struct Finish {
  const SinkhornBuffers<T>& b;
  const RouteSpec& spec;
  ConstMatrixView<T> s;
  const RouteOutputs<T>& out;

  // The outputs of tiles [t0, t1): by tiles where k <= tile_k, every chosen Q at least the underflow
  // threshold and the weights the plan's or softmax scores'; math::solved_row for every other row.
  void tiles(index_t t0, index_t t1) const {
    const bool plan_or_softmax = spec.weights == Weights::plan || spec.select.score == Score::softmax;
    // One kernel a (K, instruction set): each compiled on its own, looping over the tiles itself.
    const bool by_tile = plan_or_softmax && with_k(spec.k, [&](auto k_constant) {
                           constexpr int K = decltype(k_constant)::value;
                           with_isa([&](auto isa) SSR_INLINE_LAMBDA {
                             for (index_t tl = t0; tl < t1; ++tl) tile_outputs<K, decltype(isa)>(tl);
                           });
                         });
    if (!by_tile)
      for (index_t i = t0 * tile; i < std::min(s.rows, t1 * tile); ++i) solved_row(i);
  }

 private:
  template <int K, class Ops>
  SSR_INLINE void tile_outputs(index_t tl) const {
    using V = Lanes<T>;
    const index_t n = s.cols, i0 = tl * tile, rows = std::min(tile, s.rows - i0);
    const T *q = b.q + tl * n * tile, *v = b.v;
    const MatrixView<std::int32_t> experts(out.experts.row(i0), rows, spec.k, out.experts.stride);
    const MatrixView<T> weights(out.weights.row(i0), rows, spec.k, out.weights.stride);
    const int k = spec.k;
    const T tiny = static_cast<T>(math::underflow_threshold<T>());
    MaskOf<V> below{}, m;  // the lanes with some Q under the threshold, or NaN (not >= it, as solved_row asks)
    Chosen<K, V> chosen;   // NOLINT(cppcoreguidelines-pro-type-member-init): topk_tile writes it
    topk_tile<K, Ops::piece>(
        n,
        [&](index_t j, V& x) SSR_INLINE_LAMBDA {
          read(q + j * tile, x);
          math::by_pieces<Ops::piece>(m, x, V{} + tiny,
                                      [](auto& o, const auto& y, const auto& t) SSR_INLINE_LAMBDA { o = ~(y >= t); });
          below |= m;
          x = x * v[j];
        },
        chosen);
    using D = Lanes<double>;
    D w[K];
    if (spec.weights == Weights::plan) {
      normalised_weights_lanes(
          k, [&](int r, D& x) SSR_INLINE_LAMBDA { doubles_at(chosen.value[r], x); }, w);
    } else {
      softmax_weights_lanes<K, Ops>(
          k, [&](int r, D& x) SSR_INLINE_LAMBDA { chosen_logits(chosen, r, i0, rows, x); }, w);
    }
    store_chosen(chosen.expert, 0, w, k, 0, rows, experts, weights);
    // A row whose chosen Q underflowed goes again by math::solved_row; the others' plan rows.
    if (out.plan.empty() && !any(below)) return;
    for (index_t r = 0; r < rows; ++r) {
      bool exact = true;
      for (int e = 0; e < k; ++e) exact = exact && q[chosen.expert[e][r] * tile + r] >= tiny;
      if (!exact) {
        solved_row(i0 + r);
      } else if (!out.plan.empty()) {
        const T inv = math::inverse_row_sum(b.row_sum[i0 + r]);
        for (index_t j = 0; j < n; ++j) out.plan(i0 + r, j) = q[j * tile + r] * v[j] * inv;
      }
    }
  }

  // x = the logits of the r-th expert of the tile's rows (past the tile's rows, its last row's).
  template <class Chosen_>
  SSR_INLINE void chosen_logits(const Chosen_& chosen, int r, index_t i0, index_t rows, Lanes<double>& x) const {
    for (index_t q = 0; q < tile; ++q) x[q] = static_cast<double>(s(i0 + std::min(q, rows - 1), chosen.expert[r][q]));
  }

  __attribute__((noinline)) void solved_row(index_t i) const {  // rare: kept out of the kernels
    const index_t n = s.cols, at = i / tile * n * tile + i % tile;
    math::solved_row<T>(
        spec, n, [&](index_t j) { return b.q[at + j * tile]; }, [&](index_t j) { return b.k[at + j * tile]; }, b.v,
        b.gt, b.row_sum[i], s.row(i), out.experts.row(i), out.weights.row(i),
        out.plan.empty() ? nullptr : out.plan.row(i));
  }
};

}  // namespace cpu
}  // namespace ssr
SSR_LANES_END
