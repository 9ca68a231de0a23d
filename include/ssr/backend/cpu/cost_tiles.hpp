// The CPU backend's cost and Sinkhorn kernel of tiles in double, for what the float kernel does not take
// (the softmax cost; the linear cost where 1 / xi is not a power of two; noise): math::cost_row, then
// math::kernel_row, of eight rows at a time, a row a lane, over tiles by columns (columns.hpp), written
// once over GNU vectors (lanes.hpp) of L doubles (a tile's column or part of one), and with AVX2 and FMA
// or AVX-512 where a baseline x86-64 build runs on a processor that has them. Each lane takes the
// definitions' operations on its row in their order (the softmax's sum adds the columns in order; its exp
// is math::exp, whose formula is written over lanes too), so every width and path gives the definitions'
// bits. No product meets a sum outside math::exp's own fused steps: nothing else can be fused. The same
// machinery takes the softmax score weights of 32 rows at a time (softmax_weights).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cpu {
namespace cost_tiles {
inline namespace SSR_LANES_NAMESPACE {

constexpr index_t tile = 8;  // rows a tile (Simd<T>::tile)

// Doubles in the build's widest vector, at most a tile's column (1 without vector extensions).
constexpr int widest = lanes::widest_lanes<double>(static_cast<int>(tile));

// What the kernel of a tile needs besides its logits: the cost, 1 / xi where it is a power of two (a product
// then gives the quotient's bits) or else xi, and the cost bound.
struct Spec {
  Cost cost;
  double xi, inv_xi;
  bool exact_inverse;
  double bound;
};

// The cost of `count` tiles of logits s (tiles by columns, n columns each), with the noise z (the same
// layout, noise::tiles; null: none), in vectors of L doubles. For each row: top = max_j S_ij; the softmax
// cost's e_j = exp(S_ij - top) and sum = sum_j e_j in order; the shifted cost c_j (S_ij - top, or e_j / sum
// - 1 / sum) clamped to +-bound, then with noise clamp(c_j + clamp(z_j)) (math::cost_shift, shifted_cost and
// cost_value; each clamp is math::clamp's std::min(std::max(v, lo), hi)). Where kernel is null, the costs
// go to c (count tiles of doubles). Else c is a tile of scratch and each tile's kernel goes to kernel (which
// may be s): shift = max(-bound, max_j c_j), K_ij = clamp((c_j - shift) / xi, -bound, 0)
// (math::kernel_shift, kernel_value).
template <class T, int L>
SSR_LANES_INLINE void costs_in_lanes(const T* s, index_t n, index_t count, const Spec& spec, const double* z, double* c,
                                     T* kernel) {
  using D = typename lanes::Doubles<L>::Double;
  using U = typename lanes::Doubles<L>::Bits;
  constexpr index_t per = tile / L;  // vectors a column
  const D none = D{} - std::numeric_limits<double>::infinity(), lo = D{} - spec.bound, hi = D{} + spec.bound;
  const D zero = D{}, one = D{} + 1.0;
  for (index_t t = 0; t < count; ++t) {
    const index_t at = t * n * tile;  // the tile's first element
    SSR_UNROLL
    for (index_t h = 0; h < per; ++h) {  // L rows at a time
      const T* column = s + at + h * L;
      double* cost_at = c + (kernel ? 0 : at) + h * L;
      D top = none, v;
      for (index_t j = 0; j < n; ++j) {
        lanes::widen<L>(column + j * tile, v);
        top = top < v ? v : top;  // std::max(top, v)
      }
      D shift = lo, cost;
      // The shifted cost of column j, clamped, with its noise; stored, and into the kernel's shift. Inlined
      // always: a lambda's own body is compiled for the build's target, not the path's.
      const auto finish = [&](const D& value, index_t j) SSR_LANES_ALWAYS_INLINE {
        D shifted = value < lo ? lo : value;
        shifted = hi < shifted ? hi : shifted;
        if (z) {
          D noise;
          std::memcpy(&noise, z + at + j * tile + h * L, sizeof noise);
          noise = noise < lo ? lo : noise;
          noise = hi < noise ? hi : noise;
          shifted += noise;
          shifted = shifted < lo ? lo : shifted;
          shifted = hi < shifted ? hi : shifted;
        }
        std::memcpy(cost_at + j * tile, &shifted, sizeof shifted);
        shift = shift < shifted ? shifted : shift;  // std::max(shift, cost)
      };
      if (spec.cost == Cost::softmax) {
        D sum = zero, e;
        for (index_t j = 0; j < n; ++j) {
          lanes::widen<L>(column + j * tile, v);
          math::exp_of<D, U>(v - top, e, lanes::Fused<L>{});
          std::memcpy(cost_at + j * tile, &e, sizeof e);
          sum += e;
        }
        const D inv = one / sum;
        for (index_t j = 0; j < n; ++j) {
          std::memcpy(&e, cost_at + j * tile, sizeof e);
          finish(e / sum - inv, j);
        }
      } else {
        for (index_t j = 0; j < n; ++j) {
          lanes::widen<L>(column + j * tile, v);
          finish(v - top, j);
        }
      }
      if (!kernel) continue;
      for (index_t j = 0; j < n; ++j) {
        std::memcpy(&cost, cost_at + j * tile, sizeof cost);
        const D d = cost - shift;
        D k = spec.exact_inverse ? d * spec.inv_xi : d / spec.xi;
        k = k < lo ? lo : k;
        k = zero < k ? zero : k;
        lanes::narrow<L>(k, kernel + at + h * L + j * tile);
      }
    }
  }
}

// Rows softmax_weights takes at once (Simd::group_rows): four tiles' exps are independent chains whose
// latencies overlap (one tile at a time waited on each exp's and each quotient's latency).
constexpr index_t weight_rows = 4 * tile;

// Softmax score weights of weight_rows rows, a row a lane, in vectors of L doubles: math::score_weights for
// softmax scores (math::softmax_weights of the chosen experts' logits) of k <= tile experts, from
// logit[r * weight_rows + q], the r-th chosen expert's logit of row q, into weight[r * weight_rows + q].
// The same operations in each lane as the definition on its row: top = max_r, e_r = exp(v_r - top) (exp(0)
// is 1 exactly, as the definition takes it), sum in r's order, w_r = e_r / sum. k at run time: one copy of
// the loops, not one a k.
template <class T, int L>
SSR_LANES_INLINE void softmax_weights_in_lanes(const double* logit, int k, T* weight) {
  using D = typename lanes::Doubles<L>::Double;
  using U = typename lanes::Doubles<L>::Bits;
  constexpr index_t per = weight_rows / L;          // vectors a list entry
  const int count = k < int{tile} ? k : int{tile};  // k <= tile: told to the compiler
  alignas(64) double e[tile * weight_rows];         // the exps, as logit
  D top[per], sum[per], v;
  for (index_t h = 0; h < per; ++h) {
    top[h] = D{} - std::numeric_limits<double>::infinity();
    sum[h] = D{};
  }
  for (int r = 0; r < count; ++r)
    for (index_t h = 0; h < per; ++h) {
      std::memcpy(&v, logit + r * weight_rows + h * L, sizeof v);
      top[h] = top[h] < v ? v : top[h];  // std::max(top, v)
    }
  for (int r = 0; r < count; ++r)
    for (index_t h = 0; h < per; ++h) {
      std::memcpy(&v, logit + r * weight_rows + h * L, sizeof v);
      math::exp_of<D, U>(v - top[h], v, lanes::Fused<L>{});
      std::memcpy(e + r * weight_rows + h * L, &v, sizeof v);
      sum[h] += v;
    }
  for (int r = 0; r < count; ++r)
    for (index_t h = 0; h < per; ++h) {
      std::memcpy(&v, e + r * weight_rows + h * L, sizeof v);
      lanes::narrow<L>(v / sum[h], weight + r * weight_rows + h * L);
    }
}

#if defined(SSR_DISPATCH_AVX2)
template <class T>
SSR_TARGET_AVX2_FMA void softmax_weights_avx2(const double* logit, int k, T* weight) {
  softmax_weights_in_lanes<T, 4>(logit, k, weight);
}
#endif
#if defined(SSR_DISPATCH_AVX512)
template <class T>
SSR_TARGET_AVX512_FMA void softmax_weights_avx512(const double* logit, int k, T* weight) {
  softmax_weights_in_lanes<T, 8>(logit, k, weight);
}
#endif

#if defined(SSR_DISPATCH_AVX512)
// logit[r * weight_rows + q] = s[(q0 + q) * stride + e[(q0 + q) * es + r]] as a double for the `here` rows
// from q0 and r < k, zeros past them: the chosen logits softmax_weights reads, gathered eight rows at a time.
// A Sinkhorn route reads them again after its solve, from beyond L2; more of those reads overlap so than a
// value at a time (its score weights 1.07-1.08 times as fast). The conversions take their masked forms: the
// plain ones read an undefined vector, which GCC 12 warns of.
template <class T>
SSR_TARGET_AVX512 void chosen_logits_avx512(const T* s, index_t stride, const std::int32_t* e, index_t es, index_t q0,
                                            index_t here, int k, double* logit) {
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i lane_s = _mm512_mullo_epi64(lane, _mm512_set1_epi64(stride)),
                lane_e = _mm512_mullo_epi64(lane, _mm512_set1_epi64(es));
  for (index_t h = 0; h < weight_rows; h += 8) {
    const index_t live_rows = here - h < 0 ? 0 : (here - h < 8 ? here - h : 8);
    const auto live = static_cast<__mmask8>((1U << live_rows) - 1);  // masked lanes read nothing
    const __m512i row_s = _mm512_add_epi64(_mm512_set1_epi64((q0 + h) * stride), lane_s);
    for (int r = 0; r < k; ++r) {
      const __m512i at_e = _mm512_add_epi64(_mm512_set1_epi64((q0 + h) * es + r), lane_e);
      const __m256i expert = _mm512_mask_i64gather_epi32(_mm256_setzero_si256(), live, at_e, e, 4);
      const __m512i at = _mm512_add_epi64(row_s, _mm512_maskz_cvtepi32_epi64(0xff, expert));
      __m512d x;
      if constexpr (std::is_same<T, float>::value)
        x = _mm512_maskz_cvtps_pd(0xff, _mm512_mask_i64gather_ps(_mm256_setzero_ps(), live, at, s, 4));
      else
        x = _mm512_mask_i64gather_pd(_mm512_setzero_pd(), live, at, s, 8);
      _mm512_store_pd(logit + r * weight_rows + h, x);
    }
  }
}
#endif

// softmax_weights_in_lanes on the widest path this processor runs.
template <class T>
inline void softmax_weights(const double* logit, int k, T* weight) {
#if defined(SSR_DISPATCH_AVX512)
  if (lanes::has_avx512()) return softmax_weights_avx512<T>(logit, k, weight);
#endif
#if defined(SSR_DISPATCH_AVX2)
  if (lanes::has_avx2_fma()) return softmax_weights_avx2<T>(logit, k, weight);
#endif
  softmax_weights_in_lanes<T, widest>(logit, k, weight);
}

#if defined(SSR_DISPATCH_AVX2)
template <class T>
SSR_TARGET_AVX2_FMA void costs_avx2(const T* s, index_t n, index_t count, const Spec& spec, const double* z, double* c,
                                    T* kernel) {
  costs_in_lanes<T, 4>(s, n, count, spec, z, c, kernel);
}
#endif
#if defined(SSR_DISPATCH_AVX512)
template <class T>
SSR_TARGET_AVX512_FMA void costs_avx512(const T* s, index_t n, index_t count, const Spec& spec, const double* z,
                                        double* c, T* kernel) {
  costs_in_lanes<T, 8>(s, n, count, spec, z, c, kernel);
}
#endif

// costs_in_lanes on the widest path this processor runs (a baseline build's own code has no FMA
// instruction: std::fma a lane, slow but exact, for processors without AVX2 and FMA).
template <class T>
inline void costs(const T* s, index_t n, index_t count, const Spec& spec, const double* z, double* c, T* kernel) {
#if defined(SSR_DISPATCH_AVX512)
  if (lanes::has_avx512()) return costs_avx512(s, n, count, spec, z, c, kernel);
#endif
#if defined(SSR_DISPATCH_AVX2)
  if (lanes::has_avx2_fma()) return costs_avx2(s, n, count, spec, z, c, kernel);
#endif
  costs_in_lanes<T, widest>(s, n, count, spec, z, c, kernel);
}

}  // namespace SSR_LANES_NAMESPACE
}  // namespace cost_tiles
}  // namespace cpu
}  // namespace ssr
