// The CPU Sinkhorn's scaled pass over tiles of Q by columns (the one pass of an iteration), written once
// over GNU vectors (lanes.hpp): in the build's widest vectors, and with AVX2 and FMA or AVX-512 where a
// baseline x86-64 build runs on a processor that has them. Every width, path and build gives the same
// bits: each product is fused into its sum, rounded once (lanes::FusedOwn, FusedAvx2, FusedAvx512): one
// instruction where the processor fuses, std::fma a lane (exact, slow) on the baseline's own path, which
// only processors without FMA take. Fused, an element costs the pass two vector operations instead of
// four: on cores that issue them on two ports, the pass is bound by them more than by its reads.
//
// For each row of `count` tiles (at most a block's rows; padding rows zeros), with v and v spread over a
// tile's columns (vt[j * tile + l] = v_j): t = Q_i * v and r = sum_j t_j (into row_sum, a tile's 8 rows at a
// time), and the column sums of the plan rows t / r over all the rows (into part, n elements), as
// v_j * sum_i Q_ij / r_i: one product a column, not one an element. First each tile's r and 1 / r (two
// tiles at a time, sharing the loads of vt), then the column sums several columns at a time over every
// tile, in registers, reading the block a second time from the nearest cache. A vector holds whole columns
// of a tile, or two adjacent ones (16 floats with AVX-512); in the latter, an even n up to 32 puts a
// tile's columns in registers (two tiles' up to 16), read once for both sums (an iteration 1.1-1.5 times as
// fast as with the two reads). The order is fixed: r adds Q_ij v_j over the columns j = 0, 1, 2, 3 (mod 4)
// in four sums, then (0 + 2) + (1 + 3); each lane of a column sum adds its rows' Q_ij (1 / r_i) in order,
// then the 8 lanes fold in halves: lane l + lane l + 4, then + 2, then + 1, and the sum is multiplied by
// v_j. A real row's r is at least Q_ij v_j for each j (Q has a 1 in it, v is within
// exp(+-math::absorb_bound)), so Q_ij / r_i is at most exp(absorb_bound) and a column's sum stays far from
// overflow; r is far above the least normal T, which keeps a padding row's 0 * (1 / r) at 0.
#pragma once

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/backend/cpu/tuning.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cpu {
namespace pass {
inline namespace SSR_LANES_NAMESPACE {

constexpr index_t tile = 8;  // rows a tile (Simd<T>::tile)

// Lanes of T in the vectors of the build's pass: its widest, at most two columns of a tile (one column
// where the compiler cannot shuffle lanes); 1 without vector extensions.
template <class T>
constexpr int widest() {
#if defined(SSR_SHUFFLE_VECTOR)
  constexpr int most = 2 * static_cast<int>(tile);
#else
  constexpr int most = static_cast<int>(tile);
#endif
  return lanes::widest_lanes<T>(most);
}

// Folds the w lanes of a column in halves (w = 8, or fewer left after adding whole vectors): a[0] ends
// as the sum.
template <class T>
SSR_LANES_INLINE T fold(T* a, index_t w) {
  for (index_t k = w / 2; k >= 1; k /= 2)
    for (index_t l = 0; l < k; ++l) a[l] += a[l + k];
  return a[0];
}

// part[j] for the 2P columns [j0, j0 + 2P) from their sums over the rows, in vectors of L lanes:
// acc[c][h] holds vector h of columns j0 + 2c and j0 + 2c + 1 (each lane the sum of its rows' Q_ij / r_i),
// folded (see the top of this file) and multiplied by v_j.
template <class T, int L, int P, class V>
SSR_LANES_INLINE void fold_columns(V (&acc)[P][2 * tile / L], const T* v, index_t j0, T* part) {
#if defined(SSR_SHUFFLE_VECTOR)
  if constexpr (L == tile && P == 4) {
    // Eight columns (acc[c][h]: column 2c + h) folded together as fold() folds each (lane l + lane l + 4,
    // then + 2, then + 1), a step adding two vectors that hold the halves of two or four columns.
    V x[4], y[2];
    SSR_UNROLL
    for (int c = 0; c < 4; ++c)  // columns 2c and 2c + 1: lanes 0-3 plus lanes 4-7
      x[c] = __builtin_shufflevector(acc[c][0], acc[c][1], 0, 1, 2, 3, 8, 9, 10, 11) +
             __builtin_shufflevector(acc[c][0], acc[c][1], 4, 5, 6, 7, 12, 13, 14, 15);
    SSR_UNROLL
    for (int p = 0; p < 2; ++p)  // columns 4p + 0, 2, 1, 3, two lanes each: lanes 0-1 plus lanes 2-3
      y[p] = __builtin_shufflevector(x[2 * p], x[2 * p + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
             __builtin_shufflevector(x[2 * p], x[2 * p + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    // Lane 0 plus lane 1: the columns in the order 0, 2, 4, 6, 1, 3, 5, 7.
    const V z = __builtin_shufflevector(y[0], y[1], 0, 2, 8, 10, 4, 6, 12, 14) +
                __builtin_shufflevector(y[0], y[1], 1, 3, 9, 11, 5, 7, 13, 15);
    SSR_UNROLL
    for (index_t c = 0; c < tile; ++c) part[j0 + c] = z[c % 2 * 4 + c / 2] * v[j0 + c];
    return;
  }
  if constexpr (L == 2 * tile && P == 8) {
    // Sixteen columns (acc[c][0]: columns 2c and 2c + 1, 8 lanes each) folded together as fold() folds
    // each, a step adding two vectors that hold the halves of four, eight, then sixteen columns; then
    // multiplied by v a vector at once.
    V x[4], y[2];
    SSR_UNROLL
    for (int k = 0; k < 4; ++k)  // columns 4k to 4k + 3, four lanes each: lanes 0-3 plus lanes 4-7
      x[k] = __builtin_shufflevector(acc[2 * k][0], acc[2 * k + 1][0], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                                     26, 27) +
             __builtin_shufflevector(acc[2 * k][0], acc[2 * k + 1][0], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                                     29, 30, 31);
    SSR_UNROLL
    for (int p = 0; p < 2; ++p)  // columns 8p to 8p + 7, two lanes each: lanes 0-1 plus lanes 2-3
      y[p] =
          __builtin_shufflevector(x[2 * p], x[2 * p + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
          __builtin_shufflevector(x[2 * p], x[2 * p + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    // Lane 0 plus lane 1: the sixteen columns in order.
    V z = __builtin_shufflevector(y[0], y[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
          __builtin_shufflevector(y[0], y[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    V vj;
    std::memcpy(&vj, v + j0, sizeof vj);
    z *= vj;
    std::memcpy(part + j0, &z, sizeof z);
    return;
  }
#endif
  SSR_UNROLL
  for (index_t c = 0; c < P; ++c) {
    V* a = acc[c];
    if constexpr (L <= tile) {
      // The halves of a column that are whole vectors first: vector h plus vector h + k.
      constexpr index_t per_column = tile / L;
      SSR_UNROLL
      for (index_t k = per_column / 2; k >= 1; k /= 2) {
        SSR_UNROLL
        for (index_t h = 0; h < k; ++h) {
          a[h] += a[h + k];
          a[per_column + h] += a[per_column + h + k];
        }
      }
      SSR_UNROLL
      for (index_t col = 0; col < 2; ++col) {
        V e = a[col * per_column];
#if defined(SSR_SHUFFLE_VECTOR)
        if constexpr (L == tile) {  // then its lanes, by 4, 2 and 1 apart
          e += __builtin_shufflevector(e, e, 4, 5, 6, 7, 0, 1, 2, 3);
          e += __builtin_shufflevector(e, e, 2, 3, 0, 1, 6, 7, 4, 5);
          e += __builtin_shufflevector(e, e, 1, 0, 3, 2, 5, 4, 7, 6);
          part[j0 + 2 * c + col] = e[0] * v[j0 + 2 * c + col];
          continue;
        }
#endif
        T lanes_of[L];
        std::memcpy(lanes_of, &e, sizeof lanes_of);
        part[j0 + 2 * c + col] = fold(lanes_of, L) * v[j0 + 2 * c + col];
      }
    } else {
#if defined(SSR_SHUFFLE_VECTOR)
      // Two columns in one vector of 16 lanes: the halves of each, by lanes 4, 2 and 1 apart.
      V e = a[0];
      e += __builtin_shufflevector(e, e, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
      e += __builtin_shufflevector(e, e, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
      e += __builtin_shufflevector(e, e, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
      part[j0 + 2 * c] = e[0] * v[j0 + 2 * c];
      part[j0 + 2 * c + 1] = e[tile] * v[j0 + 2 * c + 1];
#else
      static_assert(L <= tile, "two columns in one vector need __builtin_shufflevector (widest caps L)");
#endif
    }
  }
}

// part[j] for the 2P columns [j0, j0 + 2P): v_j * sum_i Q_ij * inv_i, in vectors of L lanes (two
// adjacent columns take 2 * tile / L of them); inv holds each tile's 1 / r twice, so that it multiplies
// two columns at once. Where next is not null, the same columns of the tiles at next (the next block's)
// are prefetched as these are read.
template <class T, int L, int P, class Fused>
SSR_LANES_INLINE void column_sums(const T* q, const T* v, index_t n, index_t count, const T* inv, index_t j0, T* part,
                                  const T* next) {
  SSR_LANES(V, T, L);
  constexpr index_t per_pair = 2 * tile / L;
  constexpr index_t line_elements = 64 / sizeof(T);
  V acc[P][per_pair] = {};
  for (index_t tl = 0; tl < count; ++tl) {
    const T* x = q + (tl * n + j0) * tile;
    if (next) {  // the same columns of the next block's tile: as many lines as this step reads
      SSR_UNROLL
      for (index_t c = 0; c < 2 * index_t{P} * tile; c += line_elements)
        lanes::prefetch<lanes::Into::l2>(next + (tl * n + j0) * tile + c);
    }
    V w[per_pair];
    std::memcpy(w, inv + 2 * tl * tile, sizeof w);
    SSR_UNROLL
    for (index_t c = 0; c < P; ++c) {
      SSR_UNROLL
      for (index_t h = 0; h < per_pair; ++h) {
        V e;
        std::memcpy(&e, x + 2 * c * tile + h * L, sizeof e);
        Fused::apply(acc[c][h], e, w[h], acc[c][h]);
      }
    }
  }
  fold_columns<T, L, P>(acc, v, j0, part);
}

// f(std::integral_constant<int, P>{}, j0) for the columns from j0 on, 2P a call while they last, then fewer
// (P halves down to 1): j0 ends at the last column of an odd n, or at n.
template <int P, class F>
SSR_LANES_INLINE void by_pairs(index_t n, index_t& j0, const F& f) {
  for (; j0 + 2 * index_t{P} <= n; j0 += 2 * index_t{P}) f(std::integral_constant<int, P>{}, j0);
  if constexpr (P > 1) by_pairs<P / 2>(n, j0, f);
}

// r = (0 + 2) + (1 + 3) for G tiles from their sums r01 (columns 0 and 1 mod 4) and r23 (2 and 3), in
// vectors of L lanes, into row_sum (the first tile's rows at row_sum); and 1 / r twice (the two halves of a
// pair), for the column sums, into inv (the first tile's at inv).
template <class T, int L, int G, class V>
SSR_LANES_INLINE void row_reciprocals(V (&r01)[G][2 * tile / L], V (&r23)[G][2 * tile / L], T* row_sum, T* inv) {
  constexpr index_t per_pair = 2 * tile / L, per_column = L < tile ? tile / L : 1;
  const V least = V{} + std::numeric_limits<T>::min(), one = V{} + T(1);
#if defined(SSR_SHUFFLE_VECTOR)
  if constexpr (L == 2 * tile && G == 2) {
    // Two tiles whose pairs fill 16 lanes: their row sums side by side in one vector (tl's 8 rows, then
    // tl + 1's), so that one division serves both (a division's throughput bounds the pass otherwise).
    SSR_UNROLL
    for (int g = 0; g < G; ++g) r01[g][0] += r23[g][0];
    const V sum =
        __builtin_shufflevector(r01[0][0], r01[1][0], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
        __builtin_shufflevector(r01[0][0], r01[1][0], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    std::memcpy(row_sum, &sum, sizeof sum);
    const V w = one / (sum < least ? least : sum);
    const V w0 = __builtin_shufflevector(w, w, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    const V w1 = __builtin_shufflevector(w, w, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
    std::memcpy(inv, &w0, sizeof w0);
    std::memcpy(inv + 2 * tile, &w1, sizeof w1);
    return;
  }
#endif
  SSR_UNROLL
  for (int g = 0; g < G; ++g) {
    V w[per_pair];
    SSR_UNROLL
    for (index_t h = 0; h < per_pair; ++h) r01[g][h] += r23[g][h];
    if constexpr (L <= tile) {
      SSR_UNROLL
      for (index_t h = 0; h < per_column; ++h) {
        const V sum = r01[g][h] + r01[g][per_column + h];
        std::memcpy(row_sum + g * tile + h * L, &sum, sizeof sum);
        w[h] = w[per_column + h] = one / (sum < least ? least : sum);
      }
    } else {
#if defined(SSR_SHUFFLE_VECTOR)
      const V sum = r01[g][0] + __builtin_shufflevector(r01[g][0], r01[g][0], 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3,
                                                        4, 5, 6, 7);  // the same sum in both halves
      std::memcpy(row_sum + g * tile, &sum, tile * sizeof(T));
      w[0] = one / (sum < least ? least : sum);
#else
      static_assert(L <= tile, "two columns in one vector need __builtin_shufflevector (widest caps L)");
#endif
    }
    std::memcpy(inv + 2 * tile * g, w, sizeof w);
  }
}

// The row sums' products for G tiles in the pass's order (see the top of this file), in vectors of L lanes:
// columns 0 and 1 (mod 4) into r01, 2 and 3 into r23, a last pair into r01, and the last column of an odd
// n by its place; the tiles share each load of vt. pair(g, j, h, e) sets e to vector h of columns j and
// j + 1 (j even) of tile g; last(g, j, e) puts column j of tile g in the first tile lanes of e (2 * tile / L
// vectors, zeros after: they add nothing).
template <class T, int L, int G, class Fused, class V, class Pair, class Last>
SSR_LANES_INLINE void row_products(const T* vt, index_t n, V (&r01)[G][2 * tile / L], V (&r23)[G][2 * tile / L],
                                   const Pair& pair, const Last& last) {
  constexpr index_t per_pair = 2 * tile / L;
  index_t j = 0;
  for (; j + 4 <= n; j += 4) {
    SSR_UNROLL
    for (index_t h = 0; h < per_pair; ++h) {
      V v01, v23;
      std::memcpy(&v01, vt + j * tile + h * L, sizeof(V));
      std::memcpy(&v23, vt + (j + 2) * tile + h * L, sizeof(V));
      SSR_UNROLL
      for (int g = 0; g < G; ++g) {
        V e01, e23;
        pair(g, j, h, e01);
        pair(g, j + 2, h, e23);
        Fused::apply(r01[g][h], e01, v01, r01[g][h]);
        Fused::apply(r23[g][h], e23, v23, r23[g][h]);
      }
    }
  }
  if (j + 2 <= n) {
    SSR_UNROLL
    for (index_t h = 0; h < per_pair; ++h) {
      V v;
      std::memcpy(&v, vt + j * tile + h * L, sizeof v);
      SSR_UNROLL
      for (int g = 0; g < G; ++g) {
        V e;
        pair(g, j, h, e);
        Fused::apply(r01[g][h], e, v, r01[g][h]);
      }
    }
    j += 2;
  }
  if (j < n) {
    const V vj = V{} + vt[j * tile];
    SSR_UNROLL
    for (int g = 0; g < G; ++g) {
      V e[per_pair] = {};
      last(g, j, e);
      SSR_UNROLL
      for (index_t h = 0; h < per_pair; ++h) {
        if (j % 4 == 0)
          Fused::apply(r01[g][h], e[h], vj, r01[g][h]);
        else
          Fused::apply(r23[g][h], e[h], vj, r23[g][h]);
      }
    }
  }
}

// r and 1 / r for the G tiles from tile t0 (see the top of this file), in vectors of L lanes, read from q.
// inv gets each tile's 1 / r twice, so that it multiplies two columns at once.
template <class T, int L, int G, class Fused>
SSR_LANES_INLINE void row_sums(const T* q, const T* vt, index_t n, index_t t0, T* row_sum, T* inv) {
  constexpr index_t per_pair = 2 * tile / L;
  SSR_LANES(V, T, L);
  V r01[G][per_pair] = {}, r23[G][per_pair] = {};
  row_products<T, L, G, Fused>(
      vt, n, r01, r23,
      [&](int g, index_t j, index_t h, V& e)
          SSR_LANES_ALWAYS_INLINE { std::memcpy(&e, q + ((t0 + g) * n + j) * tile + h * L, sizeof e); },
      [&](int g, index_t j, V* e)
          SSR_LANES_ALWAYS_INLINE { std::memcpy(e, q + ((t0 + g) * n + j) * tile, tile * sizeof(T)); });
  row_reciprocals<T, L, G>(r01, r23, row_sum + t0 * tile, inv + 2 * t0 * tile);
}

// The pass over `count` tiles of N columns (N even, at most 32) in vectors of two columns (L = 2 * tile):
// each tile's N / 2 vectors are read once, into registers, two tiles at a time up to N = 16 (one at a
// time beyond: a tile's 16 vectors and its 16 column sums fill AVX-512's registers), for their row sums
// (row_products, row_reciprocals) and then, with 1 / r, into the column sums (column_sums' order: tile
// after tile, folded as there), the same bits as reading them twice. Where next is not null, the same
// lines of the next block are prefetched as these are read (see scaled_in_lanes).
template <class T, int L, int N, class Fused>
SSR_LANES_INLINE void scaled_in_registers(const T* q, const T* v, const T* vt, index_t count, T* row_sum, T* part,
                                          const T* next) {
  static_assert(L == 2 * tile && N % 2 == 0 && N <= 4 * tile, "two columns a vector, N even");
  SSR_LANES(V, T, L);
  constexpr int P = N / 2;  // vectors a tile
  constexpr index_t line_elements = 64 / sizeof(T);
  V acc[P][1] = {};
  const auto tiles = [&](index_t t0, auto g_constant) SSR_LANES_ALWAYS_INLINE {
    constexpr int G = decltype(g_constant)::value;
    V e[G][P];
    SSR_UNROLL
    for (int g = 0; g < G; ++g) {
      SSR_UNROLL
      for (int p = 0; p < P; ++p) std::memcpy(&e[g][p], q + ((t0 + g) * N + index_t{2} * p) * tile, sizeof(V));
    }
    if (next) {
      SSR_UNROLL
      for (index_t c = 0; c < index_t{G} * N * tile; c += line_elements)
        lanes::prefetch<lanes::Into::l2>(next + t0 * N * tile + c);
    }
    V r01[G][1] = {}, r23[G][1] = {};
    row_products<T, L, G, Fused>(
        vt, N, r01, r23, [&](int g, index_t j, index_t, V& x) SSR_LANES_ALWAYS_INLINE { x = e[g][j / 2]; },
        [](int, index_t, V*) {});  // N is even
    alignas(64) T inv[2 * tile * G];
    row_reciprocals<T, L, G>(r01, r23, row_sum + t0 * tile, inv);
    V w[G];
    std::memcpy(w, inv, sizeof w);
    SSR_UNROLL
    for (int g = 0; g < G; ++g) {
      SSR_UNROLL
      for (int p = 0; p < P; ++p) Fused::apply(acc[p][0], e[g][p], w[g], acc[p][0]);
    }
  };
  index_t tl = 0;
  if constexpr (N <= 2 * tile)
    for (; tl + 2 <= count; tl += 2) tiles(tl, std::integral_constant<int, 2>{});
  for (; tl < count; ++tl) tiles(tl, std::integral_constant<int, 1>{});
  index_t j0 = 0;  // the columns folded 16 at a time, then fewer (fold_columns' fastest form first)
  by_pairs<8>(N, j0, [&](auto pairs, index_t from) SSR_LANES_ALWAYS_INLINE {
    constexpr int G = decltype(pairs)::value;
    V some[G][1];
    SSR_UNROLL
    for (int c = 0; c < G; ++c) some[c][0] = acc[from / 2 + c][0];
    fold_columns<T, L, G>(some, v, from, part);
  });
}

// scaled_in_registers where n is one of N, N - 2, ..., 2 (N even); false, having done nothing, elsewhere.
template <class T, int L, int N, class Fused>
SSR_LANES_INLINE bool in_registers_for(const T* q, const T* v, const T* vt, index_t n, index_t count, T* row_sum,
                                       T* part, const T* next) {
  if (n == N) {
    scaled_in_registers<T, L, N, Fused>(q, v, vt, count, row_sum, part, next);
    return true;
  }
  if constexpr (N > 2) return in_registers_for<T, L, N - 2, Fused>(q, v, vt, n, count, row_sum, part, next);
  return false;
}

// The pass in vectors of L lanes of T (L divides 2 * tile). next, where not null, is the next block's
// tiles (at least count of them): the column sums, which read this block from the nearest cache again,
// prefetch it meanwhile into L2, so that the row sums of the next block find it there (without it only the
// row sums asked the memory for anything: an iteration over a matrix beyond L2 took up to 1.6 times as
// long). Not into L1: where n > 32 a block is read twice, the second time from L1, and the next block's
// 16 KiB pushed it out of a 32 KiB L1 (an iteration at n >= 128 beyond L2 1.1-1.4x as fast into L2 on a
// Zen 4 core; the pass in registers, n <= 32, asks the same way, 1.00-1.03x there).
template <class T, int L, class Fused = lanes::FusedOwn>
SSR_LANES_INLINE void scaled_in_lanes(const T* q, const T* v, const T* vt, index_t n, index_t count, T* row_sum,
                                      T* part, const T* next = nullptr) {
#if defined(SSR_SHUFFLE_VECTOR)
  if constexpr (L == 2 * tile)  // an even n up to 32 in registers: each tile read once
    if (in_registers_for<T, L, 4 * tile, Fused>(q, v, vt, n, count, row_sum, part, next)) return;
#endif
  constexpr index_t per_pair = 2 * tile / L;
  SSR_LANES(V, T, L);
  alignas(64) T inv[2 * CpuTuning::block_elements / CpuTuning::pad];  // 1 / r twice a tile
  index_t tl = 0;
  for (; tl + 2 <= count; tl += 2) row_sums<T, L, 2, Fused>(q, vt, n, tl, row_sum, inv);
  if (tl < count) row_sums<T, L, 1, Fused>(q, vt, n, tl, row_sum, inv);
  // The column sums, P pairs of per_pair vectors at a time while they last (up to eight sums in flight:
  // fewer would leave the adds waiting on each other's latency), then fewer; the order of each column's sum
  // does not depend on P.
  index_t j0 = 0;
  by_pairs<(per_pair >= 8 ? 1 : static_cast<int>(8 / per_pair))>(
      n, j0, [&](auto pairs, index_t from) SSR_LANES_ALWAYS_INLINE {
        column_sums<T, L, decltype(pairs)::value, Fused>(q, v, n, count, inv, from, part, next);
      });
  if (j0 < n) {  // the last column of an odd n, in the first tile lanes of a pair (zeros after)
    V acc[per_pair] = {};
    for (index_t t = 0; t < count; ++t) {
      V e[per_pair] = {}, w[per_pair];
      std::memcpy(e, q + (t * n + j0) * tile, tile * sizeof(T));
      std::memcpy(w, inv + 2 * t * tile, sizeof w);
      SSR_UNROLL
      for (index_t h = 0; h < per_pair; ++h) Fused::apply(acc[h], e[h], w[h], acc[h]);
    }
    T a[2 * tile];
    std::memcpy(a, acc, sizeof a);
    part[j0] = fold(a, tile) * v[j0];  // the same halves as column_sums folds
  }
}

#if defined(SSR_DISPATCH_AVX2)
template <class T>
SSR_TARGET_AVX2_FMA void scaled_avx2(const T* q, const T* v, const T* vt, index_t n, index_t count, T* row_sum, T* part,
                                     const T* next = nullptr) {
  scaled_in_lanes<T, 32 / static_cast<int>(sizeof(T)), lanes::FusedAvx2>(q, v, vt, n, count, row_sum, part, next);
}
#endif
#if defined(SSR_DISPATCH_AVX512)
template <class T>
SSR_TARGET_AVX512_FMA void scaled_avx512(const T* q, const T* v, const T* vt, index_t n, index_t count, T* row_sum,
                                         T* part, const T* next = nullptr) {
  scaled_in_lanes<T, 64 / static_cast<int>(sizeof(T)), lanes::FusedAvx512>(q, v, vt, n, count, row_sum, part, next);
}
#endif

// The pass (see the top of this file) on the widest path this processor runs, with subnormals read and
// written as zeros: the caller holds a lanes::FlushSubnormals scope (`flushed`) around it, and around
// nothing else that must keep its subnormals; at small xi many Q_ij v_j are subnormal, and each operation
// on one took a microcode assist. The scope is the caller's so that a walk over many blocks sets and
// restores the control register once, not once a block (that took 5% of a converged route at the paper's
// shape). A flushed value is below half an ulp of any row sum (at least exp(-absorb_bound)) and of any
// column sum the solver keeps (a smaller one takes the log-domain update), so it can move a sum only
// through a rounding tie met on the way (docs/numerics.md).
template <class T>
inline void scaled(const lanes::FlushSubnormals& flushed, const T* q, const T* v, const T* vt, index_t n, index_t count,
                   T* row_sum, T* part, const T* next) {
  static_cast<void>(flushed);
#if defined(SSR_DISPATCH_AVX512)
  if (lanes::has_avx512()) return scaled_avx512(q, v, vt, n, count, row_sum, part, next);
#endif
#if defined(SSR_DISPATCH_AVX2)
  if (lanes::has_avx2_fma()) return scaled_avx2(q, v, vt, n, count, row_sum, part, next);
#endif
  scaled_in_lanes<T, widest<T>()>(q, v, vt, n, count, row_sum, part, next);
}

// The matrix's column sums in double from the blocks' partial sums (part: `blocks` rows of n), added in
// block order: sum_j = ((0 + part_0j) + part_1j) + ...; vectorised over the columns, the same bits in any
// width. A serial step of every iteration, on one thread (24576 x 128: 768 blocks of 128 columns, about 3% of a
// converged route in SSE2's two doubles a vector).
template <class T>
SSR_LANES_INLINE void add_blocks_compiled(const T* part, index_t blocks, index_t n, double* sum) {
  std::fill(sum, sum + n, 0.0);
  for (index_t blk = 0; blk < blocks; ++blk)
    for (index_t j = 0; j < n; ++j) sum[j] += static_cast<double>(part[blk * n + j]);
}

#if defined(SSR_DISPATCH_AVX2)
template <class T>
SSR_TARGET_AVX2_FMA void add_blocks_avx2(const T* part, index_t blocks, index_t n, double* sum) {
  add_blocks_compiled(part, blocks, n, sum);
}
#endif
#if defined(SSR_DISPATCH_AVX512)
template <class T>
SSR_TARGET_AVX512_FMA void add_blocks_avx512(const T* part, index_t blocks, index_t n, double* sum) {
  add_blocks_compiled(part, blocks, n, sum);
}
#endif

// add_blocks_compiled on the widest path this processor runs.
template <class T>
inline void add_blocks(const T* part, index_t blocks, index_t n, double* sum) {
#if defined(SSR_DISPATCH_AVX512)
  if (lanes::has_avx512()) return add_blocks_avx512(part, blocks, n, sum);
#endif
#if defined(SSR_DISPATCH_AVX2)
  if (lanes::has_avx2_fma()) return add_blocks_avx2(part, blocks, n, sum);
#endif
  add_blocks_compiled(part, blocks, n, sum);
}

}  // namespace SSR_LANES_NAMESPACE
}  // namespace pass
}  // namespace cpu
}  // namespace ssr
