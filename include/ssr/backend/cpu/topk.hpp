// Top-k and weights of a tile's rows on the CPU: math::topk_insert over lanes (a row a lane), each column
// of the tile one step, and the weights of math/weights.hpp in lanes of doubles.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ssr/backend/cpu/kernel.hpp"
#include "ssr/backend/cpu/tiles.hpp"
#include "ssr/math/topk.hpp"
#include "ssr/math/weights.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace cpu {

// The largest k whose lists stay in registers; a larger k goes a row at a time.
constexpr int tile_k = 8;

// f(std::integral_constant<int, K>{}) for the least K in {1, 2, 4, tile_k} with k <= K, and true; false for
// a larger k. A tile keeps the top K of each row, whose first k are its top-k (math::topk's order).
template <class F>
bool with_k(int k, const F& f) {
  using std::integral_constant;
  if (k > tile_k) return false;
  if (k <= 1) {
    f(integral_constant<int, 1>{});
  } else if (k <= 2) {
    f(integral_constant<int, 2>{});
  } else if (k <= 4) {
    f(integral_constant<int, 4>{});
  } else {
    f(integral_constant<int, tile_k>{});
  }
  return true;
}

// The lists of a tile's rows, K entries each, as math::topk_insert keeps them: values (V: lanes of T or
// of doubles) and experts (I: lanes of integers of the same width, which are also the masks), compared in
// pieces of Piece bytes (math::by_pieces).
template <int K, class V, int Piece>
struct TileList {
  using I = MaskOf<V>;
  using Mask = I;
  static constexpr int piece = Piece;
  V best[K] = {};
  I at[K] = {};

  SSR_INLINE void less(int p, const V& v, Mask& m) const { math::less_of<Piece>(best[p], v, m); }
  SSR_INLINE static void all(Mask& m) { m = Mask{} - 1; }
  SSR_INLINE void move(int p, const Mask& up, const Mask& here, const V& v, const I& j) {
    math::select_into<Piece>(here, v, best[p]);
    math::select_into<Piece>(here, j, at[p]);
    math::select_into<Piece>(up, best[p - 1], best[p]);
    math::select_into<Piece>(up, at[p - 1], at[p]);
  }
  SSR_INLINE void put(const Mask& here, const V& v, const I& j) {
    math::select_into<Piece>(here, v, best[0]);
    math::select_into<Piece>(here, j, at[0]);
  }
  // For K <= 2 the insertion costs less than a branch around it, which varied data mispredicts.
  SSR_INLINE static bool any(const Mask& m) { return K <= 2 || cpu::any(m); }
};

// A tile's top-K out of registers, for the work a row at a time after it: the r-th value and expert of
// lane q at value[r][q] and expert[r][q].
template <int K, class V>
struct Chosen {
  math::lane_t<V> value[K][count_of<V>];
  std::int32_t expert[K][count_of<V>];
};

// The top-K of a tile's rows (or a half's: V's lanes) by value(j, x) (x: column j's values), j in [0, n),
// into chosen. The list stays in registers: its places are constants once the loops are unrolled.
template <int K, int Piece, class V, class Value>
SSR_INLINE void topk_tile(index_t n, const Value& value, Chosen<K, V>& chosen) {
  using List = TileList<K, V, Piece>;
  using I = typename List::I;
  List list;
  V x;
  for (int j = 0; j < K; ++j)  // the first K columns take the next place each
    if (j < n) {
      value(j, x);
      math::topk_insert(list, K, j, x, I{} + static_cast<math::lane_t<I>>(j));
    }
  for (index_t j = K; j < n; ++j) {
    value(j, x);
    math::topk_insert(list, K, K, x, I{} + static_cast<math::lane_t<I>>(j));
  }
  MaskOf<V, std::int32_t> e;
  for (int r = 0; r < K; ++r) {
    write(chosen.value[r], list.best[r]);
    convert(list.at[r], e);
    write(chosen.expert[r], e);
  }
}

// The softmax weights (math::softmax_weights) of k <= K values a row, a row a lane of D (doubles: a
// tile's rows or half a tile's), v(r, x) setting x to the r-th values, into w.
template <int K, class Isa, class D, class Value>
SSR_INLINE void softmax_weights_lanes(int k, const Value& v, D (&w)[K]) {
  math::softmax_weights_of<D, Isa::piece>(
      k < K ? k : K, v, [&](int r, const D& x) SSR_INLINE_LAMBDA { w[r] = x; },
      [](const D& x, D& y) SSR_INLINE_LAMBDA { exp_lanes<D, Isa>(x, y); });
}

// The plan weights (math::normalised_weights) of k <= K values a row, a row a lane of D, into w.
template <int K, class D, class Value>
SSR_INLINE void normalised_weights_lanes(int k, const Value& v, D (&w)[K]) {
  math::normalised_weights_of<D>(k < K ? k : K, v, [&](int r, const D& x) SSR_INLINE_LAMBDA { w[r] = x; });
}

// f(at, count) for each half of a tile's first `rows` rows: rows [at, at + count).
template <class F>
SSR_INLINE void for_halves(index_t rows, const F& f) {
  for (index_t at = 0; at < rows; at += half) f(at, rows - at < half ? rows - at : index_t{half});
}

// Rows [at, at + count) of the outputs: the first k experts from lanes [from, from + count) of `chosen`,
// and the weights from lanes [0, count) of w.
template <int K, int N, class D, class T>
SSR_INLINE void store_chosen(const std::int32_t (&chosen)[K][N], index_t from, const D (&w)[K], int k, index_t at,
                             index_t count, MatrixView<std::int32_t> experts, MatrixView<T> weights) {
  const int kept = k < K ? k : K;
  for (index_t q = 0; q < count; ++q)
    for (int r = 0; r < kept; ++r) {
      experts(at + q, r) = chosen[r][from + q];
      weights(at + q, r) = static_cast<T>(w[r][q]);
    }
}

}  // namespace cpu
}  // namespace ssr
SSR_LANES_END
