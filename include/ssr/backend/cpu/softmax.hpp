// The softmax path on the CPU: math::softmax_row's outputs, a tile's rows at once in lanes where the
// selection is plain top-k (of the logits, or of the noisy cost) and k <= tile_k, else row by row.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ssr/backend/cpu/isa.hpp"
#include "ssr/backend/cpu/kernel.hpp"
#include "ssr/backend/cpu/noise.hpp"
#include "ssr/backend/cpu/topk.hpp"
#include "ssr/context.hpp"
#include "ssr/math/rows.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace cpu {

template <class T>
struct Softmax {
  const RouteSpec& spec;
  const Context& ctx;  // the noise's stream and the expert bias
  ConstMatrixView<T> s;
  const RouteOutputs<T>& out;

  // Whether the call's rows go by tiles (a noisy cost is always plain: NoisyCost::validate).
  bool by_tiles() const { return spec.k <= tile_k && spec.plain_selection(ctx.expert_bias.data); }

  // The outputs of tiles [t0, t1); scratch: a tile of T and two of doubles.
  void tiles(index_t t0, index_t t1, T* logits, double* noise, double* costs) const {
    // One kernel a (K, instruction set): each compiled on its own, looping over the tiles itself.
    with_k(spec.k, [&](auto k_constant) {
      constexpr int K = decltype(k_constant)::value;
      with_isa([&](auto isa) SSR_INLINE_LAMBDA {
        if (spec.noisy()) {
          for (index_t tl = t0; tl < t1; ++tl) noisy_tile<K, decltype(isa)>(tl, logits, noise, costs);
          return;
        }
        for (index_t tl = t0; tl < t1; ++tl) plain_tile<K, decltype(isa)>(tl, logits);
      });
    });
  }

 private:
  // The outputs of tile tl by the top-k of its logits, whose softmax over the chosen is the weights;
  // scratch: a tile of T.
  template <int K, class Ops>
  SSR_INLINE void plain_tile(index_t tl, T* logits) const {
    const index_t n = s.cols, i0 = tl * tile, rows = std::min(tile, s.rows - i0);
    const MatrixView<std::int32_t> experts(out.experts.row(i0), rows, spec.k, out.experts.stride);
    const MatrixView<T> weights(out.weights.row(i0), rows, spec.k, out.weights.stride);
    load_tile(s.row(i0), s.stride, rows, n, logits);
    Chosen<K, Lanes<T>> chosen;  // NOLINT(cppcoreguidelines-pro-type-member-init): topk_tile writes it
    topk_tile<K, Ops::piece>(
        n, [&](index_t j, Lanes<T>& x) SSR_INLINE_LAMBDA { read(logits + j * tile, x); }, chosen);
    for_halves(rows, [&](index_t at, index_t count) SSR_INLINE_LAMBDA {
      Half<double> w[K];
      softmax_weights_lanes<K, Ops>(
          spec.k, [&](int r, Half<double>& x) SSR_INLINE_LAMBDA { doubles_at(chosen.value[r] + at, x); }, w);
      store_chosen(chosen.expert, at, w, spec.k, at, count, experts, weights);
    });
    if (!out.noise.empty())
      for (index_t q = 0; q < rows; ++q) std::fill(out.noise.row(i0 + q), out.noise.row(i0 + q) + n, T(0));
  }

  // The outputs of tile tl by the top-k of its noisy costs (by halves, in double), its weights from the
  // clean logits; scratch: a tile of T and two of doubles.
  template <int K, class Ops>
  SSR_INLINE void noisy_tile(index_t tl, T* logits, double* noise, double* costs) const {
    const index_t n = s.cols, i0 = tl * tile, rows = std::min(tile, s.rows - i0);
    const MatrixView<std::int32_t> experts(out.experts.row(i0), rows, spec.k, out.experts.stride);
    const MatrixView<T> weights(out.weights.row(i0), rows, spec.k, out.weights.stride);
    using D = Half<double>;
    load_tile(s.row(i0), s.stride, rows, n, logits);
    noise_tile<Ops>(spec, ctx, i0, rows, n, noise);
    Half<double> shift[2];  // the kernel's, which top-k does not need
    costs_tile<T, Ops>(spec, logits, n, noise, costs, shift);
    for_halves(rows, [&](index_t at, index_t count) SSR_INLINE_LAMBDA {
      Chosen<K, D> chosen;  // NOLINT(cppcoreguidelines-pro-type-member-init): topk_tile writes it
      D w[K];
      topk_tile<K, Ops::piece>(
          n, [&](index_t j, D& x) SSR_INLINE_LAMBDA { read(costs + j * tile + at, x); }, chosen);
      softmax_weights_lanes<K, Ops>(
          spec.k,
          [&](int r, D& x) SSR_INLINE_LAMBDA {
            for (index_t q = 0; q < half; ++q) x[q] = static_cast<double>(logits[chosen.expert[r][q] * tile + at + q]);
          },
          w);
      store_chosen(chosen.expert, 0, w, spec.k, at, count, experts, weights);
    });
    if (!out.noise.empty())
      write_noise_tile(spec, noise, n, rows, MatrixView<T>(out.noise.row(i0), rows, n, out.noise.stride));
  }

 public:
  void row_outputs(index_t i) const {
    math::softmax_row<T>(spec, ctx, s.row(i), i, s.cols, out.experts.row(i), out.weights.row(i),
                         out.noise.empty() ? nullptr : out.noise.row(i));
  }
};

}  // namespace cpu
}  // namespace ssr
SSR_LANES_END
