// One Sinkhorn pass over a block of tiles on the CPU (math/sinkhorn_scaled.hpp): each tile's row sums r
// (a row a lane, so they need no horizontal addition) and 1 / r, then the block's column sums, each column
// adding its tiles' vectors lane by lane, so that a lane holds the rows of the definition's lane.
#pragma once

#include <cstring>

#include "ssr/backend/cpu/tiles.hpp"
#include "ssr/math/sinkhorn_scaled.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace cpu {

// The most tiles a block of the column sums holds (n = 1).
constexpr index_t max_block_tiles = math::sum_block_rows(1) / tile;

// Columns [j0, j0 + C) of pass_block's column sums; C a constant, so that the sums stay in registers.
template <class T, class Isa, index_t C>
SSR_INLINE void column_sums(const T* q, const Lanes<T>* inv, const T* v, index_t n, index_t count, index_t j0,
                            T* part) {
  using V = Lanes<T>;
  const typename Isa::Fma fma;
  V acc[C] = {}, x;
  for (index_t t = 0; t < count; ++t)
    for (index_t c = 0; c < C; ++c) {
      read(q + (t * n + j0 + c) * tile, x);
      fma(acc[c], x, inv[t], acc[c]);
    }
  if constexpr (C == lanes) {  // the eight columns' folds at once: lane l of each into acc[l]
    static_assert(math::sum_lanes == lanes, "a column's block sum interleaves its rows over a tile's lanes");
    transpose(acc);
    V folded;
    math::fold_lanes_of(acc, folded);
    read(v + j0, x);
    write(part + j0, V(folded * x));
  } else {
    for (index_t c = 0; c < C; ++c) {
      T lane[math::sum_lanes];
      std::memcpy(lane, &acc[c], sizeof lane);
      part[j0 + c] = math::fold_lanes(lane) * v[j0 + c];
    }
  }
}

// For the `count` tiles of Q at q (a block's, from its first row): each row's r into row_sum, and the block's
// share of each column's plan sum, v_j fold(sum of Q_ij / r_i), into part. The caller flushes subnormals.
template <class T, class Isa>
SSR_INLINE void pass_block(const T* q, const T* v, index_t n, index_t count, T* row_sum, T* part) {
  using V = Lanes<T>;
  const typename Isa::Fma fma;
  V inv[max_block_tiles], r;
  for (index_t t = 0; t < count; ++t) {
    const T* x = q + t * n * tile;
    math::row_sum_of(
        n,
        [&](index_t j, V& y) SSR_INLINE_LAMBDA {
          read(x + j * tile, y);
          prefetch(x + j * tile, n * tile);  // the next tile's
        },
        [&](index_t j, V& y) SSR_INLINE_LAMBDA { y = V{} + v[j]; }, fma, r);
    write(row_sum + t * tile, r);
    math::inverse_row_sum_of<T, Isa::piece>(r, inv[t]);
  }
  // Eight columns at a time, each sum its own chain (the adds of one column wait on each other), then the
  // rest one at a time.
  index_t j0 = 0;
  for (; j0 + lanes <= n; j0 += lanes) column_sums<T, Isa, lanes>(q, inv, v, n, count, j0, part);
  for (; j0 < n; ++j0) column_sums<T, Isa, 1>(q, inv, v, n, count, j0, part);
}

}  // namespace cpu
}  // namespace ssr
SSR_LANES_END
