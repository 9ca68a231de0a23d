// The CPU backend's vector forms of the scalar mathematics in ssr/math/, over rows padded to a multiple of
// CpuTuning::pad elements (aligned, so Eigen runs whole packets whatever the caller's alignment). Each
// mirrors one scalar definition, and tests/test_cpu_simd.cpp holds it to that definition:
//   topk_row    = math::topk, the same experts in the same order;
//   topk_tiles_weights = math::topk over tiles of rows (topk::tiles, topk.hpp), and
//                 math::normalised_weights (bit for bit) or math::score_weights (softmax scores, within 3 ulps);
//   exp_row     = std::exp within 2 float ulps (float), Eigen's exp (double);
//   float_kernel_tiles = math::cost_row + math::kernel_row (where float_kernel holds) of each row, into
//                 tiles: bit for bit for the linear cost, within (n + 8) 2^-24 / xi for the softmax cost;
//   kernel_tiles = math::cost_row + math::kernel_row of each row (with noise or without), into tiles, bit for bit;
//   cost_of_tiles = math::cost_row of each row (with noise or without), into tiles of doubles, bit for bit;
//   softmax_score_weights = math::score_weights (softmax scores) of each row, bit for bit;
//   pass_tiles  = the scaled row update t = Q_i * v, r = sum t, plan row t / r, over tiles by columns.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu/columns.hpp"
#include "ssr/backend/cpu/cost_tiles.hpp"
#include "ssr/backend/cpu/exp.hpp"
#include "ssr/backend/cpu/finite.hpp"
#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/backend/cpu/pass.hpp"
#include "ssr/backend/cpu/topk.hpp"
#include "ssr/backend/cpu/tuning.hpp"
#include "ssr/math/cost.hpp"
#include "ssr/math/numeric.hpp"
#include "ssr/math/weights.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cpu {

template <class T>
struct Simd {
  static constexpr index_t W = CpuTuning::pad;
  using Row = Eigen::Array<T, 1, Eigen::Dynamic>;
  using Chunk = Eigen::Array<T, W, 1>;
  // Rows of padded buffers start at multiples of W elements of an aligned workspace: 32-byte aligned.
  template <class A>
  using At = Eigen::Map<A, Eigen::Aligned32>;
  // The widest Eigen packet that divides a chunk (SSE2: 4 floats; AVX and AVX-512: 8; one T
  // without a vector unit Eigen knows), and its lanes.
  using Packet = typename Eigen::internal::find_best_packet<T, W>::type;
  static constexpr index_t lanes = Eigen::internal::unpacket_traits<Packet>::size;
  // Indices up to this are exact in T.
  static constexpr index_t exact_index = index_t{1} << std::numeric_limits<T>::digits;

  // out = exp(in) for np elements, a multiple of W. Floats: fexp::exp (ssr/backend/cpu/exp.hpp); inputs
  // below about -87.38 (-inf included) give 0, those just above it subnormals, never NaN; the lines of
  // `ahead` are asked for meanwhile. Doubles: Eigen's exp.
  static void exp_row(const T* in, T* out, index_t np, const lanes::Ahead& ahead = {}) {
    if constexpr (std::is_same<T, float>::value) {
      fexp::exp(in, out, np, ahead);
    } else {
      for (index_t c = 0; c < np; c += W) At<Chunk>(out + c) = At<const Chunk>(in + c).exp();
    }
  }

  // math::is_finite of every one of `count` values lying anywhere (finite::all, finite.hpp).
  static bool all_finite(const T* x, index_t count) { return finite::all(x, count); }

  // Whether v is a normal power of two (no mantissa bits), so that multiplying by it is exact.
  static bool is_power_of_two(double v) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    const std::uint64_t exponent = bits >> 52 & 0x7ff;
    return (bits & ((std::uint64_t{1} << 52) - 1)) == 0 && exponent != 0 && exponent != 0x7ff;
  }

  // Whether a tile's kernel without noise runs in T vectors (float_kernel_tiles): floats, and
  // - the linear cost with 1 / xi a power of two >= 1 (xi = 0.5, 1). There it gives the double definition's
  //   bits: S_ij - max S is exact in double exactly where the float difference is (exponents at most 29
  //   apart), and elsewhere both round to the same float; scaling by 2^k >= 1 is exact but for overflow,
  //   which both clamp.
  // - the softmax cost with 1 / xi a normal float. Its double definition takes an exp in double and two
  //   divisions an element, most of a solve's time; in float (columns::softmax_of_tile: the float exp, a
  //   sum in float, a division a row) K lands within (n + 8) 2^-24 / xi of the definition's (3.80 units at
  //   most in the test that holds it to that), so Q = exp(K) within that relative distance.
  static bool float_kernel(const RouteSpec& spec) {
    const double inv_xi = 1.0 / spec.sinkhorn.xi;
    if (!std::is_same<T, float>::value) return false;
    if (spec.cost == Cost::softmax)
      return inv_xi >= static_cast<double>(std::numeric_limits<float>::min()) &&
             inv_xi <= static_cast<double>(std::numeric_limits<float>::max());
    return is_power_of_two(inv_xi) && inv_xi >= 1;
  }

  // math::topk over a padded row whose padding never exceeds a real element (0 after real elements >= 0,
  // or -inf). For k <= 4, k rounds over Eigen packets (topk_rounds); otherwise, or where a round finds no
  // finite maximum (NaN or -inf in an unchecked row), insertion, where a chunk of W elements none of which
  // beats the current k-th is skipped with one vector maximum.
  static void topk_row(const T* x, index_t n, index_t np, int k, std::int32_t* idx) {
    if (k <= 4 && np <= exact_index && topk_rounds(x, n, np, k, idx)) return;
    int count = 0;
    for (index_t j0 = 0; j0 < n; j0 += W) {
      if (count == k && !(At<const Chunk>(x + j0).maxCoeff() > x[idx[k - 1]])) continue;
      for (index_t j = j0; j < std::min(n, j0 + W); ++j) {
        const T value = x[j];
        if (count == k && !(value > x[idx[k - 1]])) continue;
        int pos = count < k ? count++ : k - 1;
        while (pos > 0 && value > x[idx[pos - 1]]) {
          idx[pos] = idx[pos - 1];
          --pos;
        }
        idx[pos] = static_cast<std::int32_t>(j);
      }
    }
  }

  // math::topk (k <= 4) of a padded row: round r takes the largest element not chosen before and the
  // lowest index holding it, in one sweep: each lane keeps its largest element and the first index holding
  // it (indices held as T, exact below 2^24), then the lanes holding the maximum give their lowest index.
  // The chosen elements are masked in registers, not overwritten: x is only read, and no scalar store
  // stalls the next vector load of the same bytes. Returns false where the maximum is not finite (NaN or
  // -inf).
  static bool topk_rounds(const T* x, index_t n, index_t np, int k, std::int32_t* idx) {
    namespace pk = Eigen::internal;
    const Packet none = pk::pset1<Packet>(-std::numeric_limits<T>::infinity()),
                 beyond = pk::pset1<Packet>(std::numeric_limits<T>::infinity());
    Packet chosen[4]{};
    for (int r = 0; r < k; ++r) {
      Packet top = none, at_top = beyond;
      for (index_t c = 0; c < np; c += lanes) {
        const Packet at = pk::plset<Packet>(static_cast<T>(c));
        Packet v = pk::pload<Packet>(x + c);
        for (int l = 0; l < r; ++l) v = pk::pselect(pk::pcmp_eq(at, chosen[l]), none, v);
        const Packet above = pk::pcmp_lt(top, v);
        top = pk::pselect(above, v, top);
        at_top = pk::pselect(above, at, at_top);
      }
      const T best = pk::predux_max(top);
      if (!(best > -std::numeric_limits<T>::infinity() && best < std::numeric_limits<T>::infinity())) return false;
      const T j = pk::predux_min(pk::pselect(pk::pcmp_eq(top, pk::pset1<Packet>(best)), at_top, beyond));
      if (!(j < static_cast<T>(n))) return false;
      idx[r] = static_cast<std::int32_t>(j);
      chosen[r] = pk::pset1<Packet>(j);
    }
    return true;
  }

  // Rows routed together by the tile functions, and the largest k they take.
  static constexpr int tile = 8;
  static constexpr int tile_k = 8;

  // Copies `rows` rows of s (row stride `stride`, n columns) into ceil(rows / tile) tiles by columns, one
  // after another: x[(t * n + j) * tile + q] = s[(t * tile + q) * stride + j]; a last, partial tile repeats
  // its last row (columns::tiles, columns.hpp). Returns whether every value was finite (math::is_finite).
  static bool load_tiles(const T* s, index_t stride, index_t rows, index_t n, T* x) {
    static_assert(columns::tile == tile, "one tile");
    return columns::tiles<T, false>(s, stride, rows, n, T(0), T(0), x);
  }

  // One column of a tile: a value per row, whole packets.
  using Column = Eigen::Array<T, tile, 1>;

  // Tiles routed together by topk_tiles_weights: a group of `group` tiles held one after another, each of
  // n columns by `tile` rows.
  static constexpr int group = 4;
  static constexpr index_t group_rows = index_t{group} * tile;

  // Top-k of a group of tiles by columns (topk::tiles; x holds ceil(rows / tile) tiles one after another)
  // and the weights of its first `rows` rows (at most group_rows) into experts(i, r) and weights(i, r), for
  // k <= tile_k (k at compile time, so the lists stay in registers). Weights::scores: the tiles hold
  // logits, the weights are math::score_weights (softmax scores) with exp_row (within 2 ulps of std::exp:
  // the weights within 3 ulps of T; the largest term is exp(0) = 1). Weights::plan: the tiles hold Q and
  // the values are t = Q_ij * v_j, the plan up to each row's scale; the weights are
  // math::normalised_weights, bit for bit. Empty weights: the experts alone. Returns false, its outputs undefined,
  // where topk::tiles does or where an element chosen is below `least` (as held in the tiles, before v): the caller
  // then routes that group row by row. Where `below` is not null, a row with a chosen element below least does not
  // turn the group down: *below gets bit q set for each such row q of the group, whose outputs are then t's as held
  // (experts in [0, n), which the caller routes again alone), and the other rows' are as above.
  static_assert(group_rows <= 32, "a group's rows are the bits of a 32-bit word");
  static bool topk_tiles_weights(Weights form, const T* x, index_t n, const T* v, int k, index_t rows,
                                 MatrixView<std::int32_t> experts, MatrixView<T> weights,
                                 T least = -std::numeric_limits<T>::infinity(), std::uint32_t* below = nullptr) {
    return with_k(k, [&](auto k_constant) {
      constexpr int K = decltype(k_constant)::value;
      alignas(64) T lists[2 * index_t{K} * group_rows];
      return topk_of_tiles<K>(x, n, v, rows, lists) &&
             outputs_of_tiles<K>(form, x, n, v, rows, lists, experts, weights, least, below);
    });
  }

  // topk_tiles_weights in two steps, so that a caller can keep a group's lists (2 * k * group_rows values,
  // aligned to 64 bytes) between them: the top-k of the group's tiles into `lists`, false where topk::tiles
  // is; then the experts and weights from the lists, false where a chosen element is below `least` (the
  // tiles x are read only where least is finite; `below` as topk_tiles_weights takes it).
  static bool topk_of_tiles(const T* x, index_t n, const T* v, int k, index_t rows, T* lists) {
    return with_k(k, [&](auto k_constant) { return topk_of_tiles<decltype(k_constant)::value>(x, n, v, rows, lists); });
  }
  static bool outputs_of_tiles(Weights form, const T* x, index_t n, const T* v, int k, index_t rows, const T* lists,
                               MatrixView<std::int32_t> experts, MatrixView<T> weights,
                               T least = -std::numeric_limits<T>::infinity(), std::uint32_t* below = nullptr) {
    return with_k(k, [&](auto k_constant) {
      return outputs_of_tiles<decltype(k_constant)::value>(form, x, n, v, rows, lists, experts, weights, least, below);
    });
  }

  // f(std::integral_constant<int, k>{}) for k in [1, tile_k], so that the lists stay in registers; false
  // for a larger k.
  template <class F, int K = 1>
  static bool with_k(int k, const F& f) {
    if (k == K) return f(std::integral_constant<int, K>{});
    if constexpr (K < tile_k) {
      return with_k<F, K + 1>(k, f);
    } else {
      return false;
    }
  }

  // A group's lists of K values and of their experts (as T), each [K][group_rows], one after the other.
  template <int K>
  using Lists = T[K][group_rows];

  template <int K>
  static bool topk_of_tiles(const T* x, index_t n, const T* v, index_t rows, T* lists) {
    static_assert(topk::tile == tile, "one tile");
    const index_t count = (rows + tile - 1) / tile;
    if (n > exact_index) return false;
    T* index = lists + K * group_rows;
    return v ? topk::tiles<T, K, group, true>(x, n, count, v, lists, index, group_rows)
             : topk::tiles<T, K, group, false>(x, n, count, nullptr, lists, index, group_rows);
  }

  template <int K>
  static bool outputs_of_tiles(Weights form, const T* x, index_t n, const T* v, index_t rows, const T* lists,
                               MatrixView<std::int32_t> experts, MatrixView<T> weights, T least, std::uint32_t* below) {
    const index_t count = (rows + tile - 1) / tile;
    if (below) *below = 0;
    const auto& value = *reinterpret_cast<const Lists<K>*>(lists);
    const auto& index = *reinterpret_cast<const Lists<K>*>(lists + K * group_rows);
    // Where Q_ij < least, t = Q_ij * v_j rounds to at most least * max v: a tile whose chosen values are all
    // above that has every chosen Q at least `least`, and only other tiles look their Q up.
    const T above = v && least > -std::numeric_limits<T>::infinity() ? least * *std::max_element(v, v + n) : least;
#if defined(SSR_DISPATCH_AVX2)
    if constexpr (std::is_same<T, float>::value) {
      if (lanes::has_avx2_fma())
        return tiles_outputs_avx2_fma<K>(form, x, n, value, index, count, rows, least, above, experts, weights, below);
    } else {
      if (lanes::has_avx2())
        return tiles_outputs_avx2<K>(form, x, n, value, index, count, rows, least, above, experts, weights, below);
    }
#endif
    return tiles_outputs<K, fexp::widest>(form, x, n, value, index, count, rows, least, above, experts, weights, below);
  }

  // The experts and weights of `count` tiles (`rows` rows) from topk::tiles' values and experts (as T); the
  // float exp of softmax weights in L lanes. False where a chosen Q is below least, or that row's bit set in
  // *below where below is not null (see above).
  template <int K, int L>
  SSR_LANES_INLINE static bool tiles_outputs(Weights form, const T* x, index_t n, const T (&value)[K][group_rows],
                                             const T (&index)[K][group_rows], index_t count, index_t rows, T least,
                                             T above, MatrixView<std::int32_t> experts, MatrixView<T> weights,
                                             std::uint32_t* below) {
    for (index_t g = 0; g < count; ++g) {
      const index_t i0 = g * tile, in_tile = std::min<index_t>(tile, rows - i0);
      std::int32_t at[K][tile];  // the chosen experts (a loop the compiler vectorises)
      for (int r = 0; r < K; ++r)
        for (int q = 0; q < tile; ++q) at[r][q] = static_cast<std::int32_t>(index[r][i0 + q]);
      if (least > -std::numeric_limits<T>::infinity() && any_not_above(value, i0, above)) {
        const T* x_tile = x + g * n * tile;
        for (index_t q = 0; q < in_tile; ++q) {
          bool all = true;
          for (int r = 0; r < K; ++r) all = all && x_tile[static_cast<index_t>(at[r][q]) * tile + q] >= least;
          if (all) continue;
          if (!below) return false;
          *below |= std::uint32_t{1} << (i0 + q);
        }
      }
      store_rows<K>(at, in_tile, MatrixView<std::int32_t>(experts.row(i0), in_tile, K, experts.stride));
      if (!weights.empty())
        tile_weights<K, L>(form, value, i0, in_tile, MatrixView<T>(weights.row(i0), in_tile, K, weights.stride));
    }
    return true;
  }

  // Whether any of a tile's chosen values (its lanes from `lane`) is not above `above`, NaN included: a
  // comparison a tile's column of each list (GCC made a scalar comparison a value of the loop over them).
  template <int K, int V>
  SSR_LANES_INLINE static bool any_not_above(const T (&value)[K][V], index_t lane, T above) {
    constexpr int L = lanes::widest_bytes == 0 ? 1 : tile;
    SSR_LANES(Values, T, L);
    const Values bound = Values{} + above;
    decltype(Values{} > Values{}) not_above{};  // no lane yet
    for (int r = 0; r < K; ++r)
      for (int q = 0; q < tile; q += L) {
        Values chosen;
        std::memcpy(&chosen, &value[r][lane + q], sizeof chosen);
        not_above |= (chosen > bound) == 0;
      }
    return lanes::any_lane(not_above);
  }

#if defined(SSR_DISPATCH_AVX2)
  // tiles_outputs compiled for AVX2: its loops over a tile's lanes in 8 floats or 4 doubles, the same bits.
  // Floats take AVX2 with FMA, for the float exp's fused multiply-adds (no other product there is added to
  // anything, so nothing else fuses); doubles take AVX2 alone, so that the compiler fuses nothing in
  // Eigen's double exp.
  template <int K>
  SSR_TARGET_AVX2 static bool tiles_outputs_avx2(Weights form, const T* x, index_t n, const T (&value)[K][group_rows],
                                                 const T (&index)[K][group_rows], index_t count, index_t rows, T least,
                                                 T above, MatrixView<std::int32_t> experts, MatrixView<T> weights,
                                                 std::uint32_t* below) {
    return tiles_outputs<K, 8>(form, x, n, value, index, count, rows, least, above, experts, weights, below);
  }
  template <int K>
  SSR_TARGET_AVX2_FMA static bool tiles_outputs_avx2_fma(Weights form, const T* x, index_t n,
                                                         const T (&value)[K][group_rows],
                                                         const T (&index)[K][group_rows], index_t count, index_t rows,
                                                         T least, T above, MatrixView<std::int32_t> experts,
                                                         MatrixView<T> weights, std::uint32_t* below) {
    return tiles_outputs<K, 8>(form, x, n, value, index, count, rows, least, above, experts, weights, below);
  }
#endif

  // The weights of one tile's `rows` rows from topk::tiles' values, the tile's lanes starting at `lane`, the
  // float exp in L lanes. Each step is a loop over a tile's lanes, which the compiler vectorises (values
  // converted lane by lane into an array then loaded as packets would make each load wait for its stores).
  template <int K, int L, int V>
  SSR_LANES_INLINE static void tile_weights(Weights form, const T (&value)[K][V], index_t lane, index_t rows,
                                            MatrixView<T> weights) {
    double part[K][tile], sum[tile] = {};
    if (form == Weights::plan) {  // math::normalised_weights, row by row in the same order
      for (int r = 0; r < K; ++r)
        for (int q = 0; q < tile; ++q) part[r][q] = static_cast<double>(value[r][lane + q]);
      for (int r = 0; r < K; ++r)
        for (int q = 0; q < tile; ++q) sum[q] += part[r][q];
      for (int r = 0; r < K; ++r)
        for (int q = 0; q < tile; ++q) part[r][q] /= sum[q];
    } else {
      alignas(64) T term[K][tile];
      for (int r = 1; r < K; ++r)
        for (int q = 0; q < tile; ++q) term[r][q] = value[r][lane + q] - value[0][lane + q];
      if constexpr (K > 1) {  // the float exp in L lanes: the same bits as exp_row's
        if constexpr (std::is_same<T, float>::value)
          fexp::exp_in_lanes<L>(term[1], term[1], (K - 1) * tile);
        else
          exp_row(term[1], term[1], (K - 1) * tile);
      }
      std::fill(sum, sum + tile, 1.0);
      for (int r = 1; r < K; ++r)
        for (int q = 0; q < tile; ++q) part[r][q] = static_cast<double>(term[r][q]);
      for (int r = 1; r < K; ++r)
        for (int q = 0; q < tile; ++q) sum[q] += part[r][q];
      for (int q = 0; q < tile; ++q) part[0][q] = 1 / sum[q];
      for (int r = 1; r < K; ++r)
        for (int q = 0; q < tile; ++q) part[r][q] /= sum[q];
    }
    alignas(64) T by_list[K][tile];
    for (int r = 0; r < K; ++r)
      for (int q = 0; q < tile; ++q) by_list[r][q] = static_cast<T>(part[r][q]);
    store_rows<K>(by_list, rows, weights);
  }

  // out(q, r) = by_list[r][q] for a tile's first `rows` rows: each list's values of a tile (a vector) put row
  // by row (k = 2 and 4 by shuffles, others a value at a time), then stored a row at a time, or a whole
  // tile's rows at once where they are contiguous (k = out.stride).
  template <int K, class E>
  SSR_LANES_INLINE static void store_rows(const E (&by_list)[K][tile], index_t rows, MatrixView<E> out) {
    alignas(64) E by_row[tile][K];
#if defined(SSR_SHUFFLE_VECTOR)
    if constexpr (K == 2 || K == 4) {
      SSR_LANES(C, E, tile);
      C c[K], t[K];
      std::memcpy(c, by_list, sizeof c);
      SSR_UNROLL
      for (int p = 0; p < K; p += 2) {  // lists p and p + 1 interleaved: rows 0-3, then rows 4-7
        t[p] = __builtin_shufflevector(c[p], c[p + 1], 0, 8, 1, 9, 2, 10, 3, 11);
        t[p + 1] = __builtin_shufflevector(c[p], c[p + 1], 4, 12, 5, 13, 6, 14, 7, 15);
      }
      if constexpr (K == 4) {  // then their pairs: two rows a vector
        c[0] = __builtin_shufflevector(t[0], t[2], 0, 1, 8, 9, 2, 3, 10, 11);
        c[1] = __builtin_shufflevector(t[0], t[2], 4, 5, 12, 13, 6, 7, 14, 15);
        c[2] = __builtin_shufflevector(t[1], t[3], 0, 1, 8, 9, 2, 3, 10, 11);
        c[3] = __builtin_shufflevector(t[1], t[3], 4, 5, 12, 13, 6, 7, 14, 15);
        std::memcpy(by_row, c, sizeof c);
      } else {
        std::memcpy(by_row, t, sizeof t);
      }
    } else
#endif
    {
      for (index_t q = 0; q < tile; ++q)
        for (int r = 0; r < K; ++r) by_row[q][r] = by_list[r][q];
    }
    if (out.stride == K && rows == tile) {  // a size known here: moves, not a call
      std::memcpy(out.data, by_row, sizeof by_row);
    } else {
      for (index_t q = 0; q < rows; ++q) std::memcpy(out.row(q), by_row[q], K * sizeof(E));
    }
  }

  // The CPU Sinkhorn keeps K and Q in tiles of `tile` rows by columns: element (i, j) at
  // tile_offset(i, n) + j * tile + i % tile, so that a packet holds one column of several rows and a row's
  // sums need no horizontal additions. The rows past m in the last tile hold K = -inf and Q = 0.
  static constexpr index_t tile_offset(index_t i, index_t n) { return i / tile * n * tile; }
  static constexpr index_t at_tile(index_t i, index_t j, index_t n) { return tile_offset(i, n) + j * tile + i % tile; }

  // kernel_row, where float_kernel holds, of `rows` rows of s into tiles as load_tiles lays them out, with
  // scale = 1 / xi rounded to T. The linear cost: K_ij = max((S_ij - max S) * scale, -bound), kernel_row's
  // clamp(clamp(S_ij - max S, +-bound) * scale, -bound, 0): the difference d is at most 0, and where it is
  // below -bound, so is d * scale (scale >= 1). The softmax cost: columns::softmax_of_tile. Returns whether
  // every S_ij was finite.
  static bool float_kernel_tiles(const T* s, index_t stride, index_t rows, index_t n, T bound, T scale, T* x,
                                 Cost cost = Cost::linear) {
    return columns::tiles<T, true>(s, stride, rows, n, scale, bound, x, cost);
  }

  // math::cost_row + math::kernel_row of `rows` rows of s into tiles as load_tiles lays them out, with the
  // noise z (the same layout: noise::tiles; null for none), eight rows at a time in double
  // (cost_tiles::costs, cost_tiles.hpp: any cost and xi, for what float_kernel_tiles does not take).
  // scratch holds a tile of doubles (n * tile).
  static void kernel_tiles(const T* s, index_t stride, index_t rows, index_t n, const RouteSpec& spec, double* scratch,
                           T* x, const double* z = nullptr) {
    static_assert(cost_tiles::tile == tile, "one tile");
    load_tiles(s, stride, rows, n, x);
    cost_tiles::costs(x, n, (rows + tile - 1) / tile, cost_spec(spec), z, scratch, x);
  }

  // math::cost_row of `rows` rows of s with the noise z (as kernel_tiles) into tiles of doubles, c[(t * n + j)
  // * tile + q] for row t * tile + q (a last, partial tile repeats its last row's logits). x holds the rows'
  // tiles of T.
  static void cost_of_tiles(const T* s, index_t stride, index_t rows, index_t n, const RouteSpec& spec, const double* z,
                            T* x, double* c) {
    load_tiles(s, stride, rows, n, x);
    cost_tiles::costs<T>(x, n, (rows + tile - 1) / tile, cost_spec(spec), z, c, nullptr);
  }

  // What cost_tiles::costs needs of a call.
  static cost_tiles::Spec cost_spec(const RouteSpec& spec) {
    const double xi = spec.sinkhorn.xi, inv_xi = 1.0 / xi;
    return cost_tiles::Spec{spec.cost, xi, inv_xi, is_power_of_two(inv_xi), math::cost_bound<T>()};
  }

  // math::score_weights for softmax scores of `rows` rows of s (row stride `stride`) and their chosen
  // experts, into weights: a group's rows at a time, a row a lane, in double (cost_tiles::softmax_weights),
  // the definition's bits. k in [1, tile_k].
  static void softmax_score_weights(const T* s, index_t stride, index_t rows, int k,
                                    MatrixView<const std::int32_t> experts, MatrixView<T> weights) {
    static_assert(tile_k <= cost_tiles::tile, "a lane's list fits softmax_weights' vectors");
    constexpr index_t at_once = cost_tiles::weight_rows;
    // The r-th chosen logit of row q at r * at_once + q; zeros first, as GCC cannot see that softmax_weights
    // reads only what the loop below writes (-Wmaybe-uninitialized).
    alignas(64) double logit[tile_k * at_once] = {};
    alignas(64) T weight[tile_k * at_once];
    for (index_t q0 = 0; q0 < rows; q0 += at_once) {
      const index_t here = std::min<index_t>(at_once, rows - q0);
#if defined(SSR_DISPATCH_AVX512)
      if (lanes::has_avx512())
        cost_tiles::chosen_logits_avx512<T>(s, stride, experts.data, experts.stride, q0, here, k, logit);
      else
#endif
        for (int r = 0; r < k; ++r)
          for (index_t q = 0; q < at_once; ++q) {
            const index_t i = q0 + std::min(q, here - 1);  // past the last row: the last row again
            logit[index_t{r} * at_once + q] = static_cast<double>(s[i * stride + experts(i, r)]);
          }
      cost_tiles::softmax_weights<T>(logit, k, weight);
      for (index_t q = 0; q < here; ++q)
        for (int r = 0; r < k; ++r) weights(q0 + q, r) = weight[index_t{r} * at_once + q];
    }
  }

  // Sets lanes [rows, tile) of every column of a tile by columns to value (nothing for a full tile).
  static void fill_lanes(T* x, index_t n, index_t rows, T value) {
    if (rows >= tile) return;
    for (index_t j = 0; j < n; ++j) std::fill(x + j * tile + rows, x + (j + 1) * tile, value);
  }

  // vt[j * tile + l] = v[j] for every lane l (n * tile elements): v spread over a tile's columns, so that
  // a vector of two columns is scaled by one load.
  static void spread(const T* v, index_t n, T* vt) {
    for (index_t j = 0; j < n; ++j) At<Column>(vt + j * tile).setConstant(v[j]);
  }

  // One scaled pass over `count` tiles of Q by columns, v and v spread (vt), inside the caller's scope that
  // flushes subnormals: pass::scaled (pass.hpp).
  static void pass_tiles(const lanes::FlushSubnormals& flushed, const T* q, const T* v, const T* vt, index_t n,
                         index_t count, T* row_sum, T* part, const T* next = nullptr) {
    static_assert(pass::tile == tile, "one tile");
    pass::scaled(flushed, q, v, vt, n, count, row_sum, part, next);
  }

  // Row i of a matrix in tiles into a padded row (np elements; padding `pad`), times v where v is not null.
  static void gather_row(const T* tiles, index_t i, index_t n, index_t np, const T* v, T pad, T* row) {
    const T* x = tiles + tile_offset(i, n) + i % tile;
    for (index_t j = 0; j < n; ++j) row[j] = v ? x[j * tile] * v[j] : x[j * tile];
    std::fill(row + n, row + np, pad);
  }
};

}  // namespace cpu
}  // namespace ssr
