// The CPU backend's copy of rows into tiles held by columns, and the float kernel over it (for
// Simd::load_tiles and Simd::float_kernel_tiles), written once over GNU vectors (lanes.hpp): in vectors of
// a tile's column (8 floats) or less, and with AVX2 and FMA (or, for floats, AVX-512 in vectors of two
// columns) where a baseline x86-64 build runs on a processor that has them. Every width and path gives the
// same bits: the linear cost's kernel is moves, maxima, one subtraction, one multiplication and a clamp; the
// softmax cost's adds the float exp (exp.hpp, the same bits in every width), a sum in the pass's order, a
// division a row and a product an element.
//
// `rows` rows of s (row stride `stride`, n columns) become ceil(rows / tile) tiles one after another, tile
// t's element (q, j) at x[(t * n + j) * tile + q] = s[(t * tile + q) * stride + j]; a last, partial tile
// repeats its last row. Square blocks of L rows by L columns are transposed in registers, with
// __builtin_shufflevector (GCC 12, Clang); the columns past the last whole block, and every column where
// the compiler has no shuffle, are copied one value at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu/exp.hpp"
#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cpu {
namespace columns {
inline namespace SSR_LANES_NAMESPACE {

constexpr index_t tile = 8;  // rows a tile (Simd<T>::tile)

// Lanes of T in the vectors of the build's own path: its widest, at most a tile's column; 1 without
// vector extensions or without shuffles.
template <class T>
constexpr int widest() {
#if defined(SSR_SHUFFLE_VECTOR)
  return lanes::widest_lanes<T>(static_cast<int>(tile));
#else
  return 1;
#endif
}

// The bits of x - x (+0 where x is finite, NaN else) OR-ed into seen, integers of x's size: no comparison,
// which GCC makes a lane at a time for 64-byte vectors here, and no chain of latencies.
template <class Seen, class V>
SSR_LANES_INLINE void note_finite(Seen& seen, const V& x) {
  const V d = x - x;  // NOLINT(misc-redundant-expression)
  Seen bits;
  std::memcpy(&bits, &d, sizeof bits);
  seen |= bits;
}

// The rows of the tile from row i0 of s (a last, partial tile repeats its last row), one add each: as
// products the compiler made them 64-bit vector multiplies and lane extractions, a tile's longest chain.
template <class T>
SSR_LANES_INLINE void tile_rows(const T* s, index_t stride, index_t i0, index_t rows, const T* (&row)[tile]) {
  const index_t last = std::min(tile, rows - i0) - 1;  // the tile's last real row
  row[0] = s + i0 * stride;
  for (index_t q = 1; q < tile; ++q) row[q] = q <= last ? row[q - 1] + stride : row[q - 1];
}

// One tile from the rows at row[0..tile) (n columns, from column `from` on) into x by columns, in vectors of
// L lanes. Where Top, also the maximum of each row over those columns, into top (a tile's column: tile / L
// vectors): the maximum of finite values, which no order changes; else whether each value is finite, into
// seen (note_finite; where Top, the kernel looks).
template <class T, int L, bool Top, class Seen>
SSR_LANES_INLINE void copy_tile(const T* const* row, index_t n, T* x, T* top, Seen& seen, index_t from = 0) {
  SSR_LANES(V, T, L);
  constexpr index_t per = tile / L;  // vectors a column
  V best[per];
  for (auto& b : best) b = V{} - std::numeric_limits<T>::infinity();
  index_t j0 = from;
#if defined(SSR_SHUFFLE_VECTOR)
  if constexpr (L > 1)
    for (; j0 + L <= n; j0 += L)
      for (index_t h = 0; h < per; ++h) {
        V r[L], c[L];
        SSR_UNROLL
        for (index_t l = 0; l < L; ++l) std::memcpy(&r[l], row[h * L + l] + j0, sizeof(V));
        if constexpr (!Top) {
          SSR_UNROLL
          for (index_t l = 0; l < L; ++l) note_finite(seen, r[l]);
        }
        if constexpr (L == 2) {
          c[0] = __builtin_shufflevector(r[0], r[1], 0, 2);
          c[1] = __builtin_shufflevector(r[0], r[1], 1, 3);
        } else if constexpr (L == 4) {
          const V t0 = __builtin_shufflevector(r[0], r[1], 0, 4, 1, 5),
                  t1 = __builtin_shufflevector(r[0], r[1], 2, 6, 3, 7),
                  t2 = __builtin_shufflevector(r[2], r[3], 0, 4, 1, 5),
                  t3 = __builtin_shufflevector(r[2], r[3], 2, 6, 3, 7);
          c[0] = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
          c[1] = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
          c[2] = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
          c[3] = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
        } else {
          static_assert(L == 8, "a tile's column holds 2, 4 or 8 lanes");
          // Pairs of rows interleaved within halves, then pairs of pairs, then the halves exchanged.
          V t[8], u[8];
          SSR_UNROLL
          for (int p = 0; p < 4; ++p) {
            t[2 * p] = __builtin_shufflevector(r[2 * p], r[2 * p + 1], 0, 8, 1, 9, 4, 12, 5, 13);
            t[2 * p + 1] = __builtin_shufflevector(r[2 * p], r[2 * p + 1], 2, 10, 3, 11, 6, 14, 7, 15);
          }
          SSR_UNROLL
          for (int p = 0; p < 2; ++p) {
            SSR_UNROLL
            for (int o = 0; o < 2; ++o) {
              const V &a = t[4 * p + o], &b = t[4 * p + o + 2];
              u[4 * p + 2 * o] = __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13);
              u[4 * p + 2 * o + 1] = __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15);
            }
          }
          SSR_UNROLL
          for (int l = 0; l < 4; ++l) {
            c[l] = __builtin_shufflevector(u[l], u[l + 4], 0, 1, 2, 3, 8, 9, 10, 11);
            c[l + 4] = __builtin_shufflevector(u[l], u[l + 4], 4, 5, 6, 7, 12, 13, 14, 15);
          }
        }
        SSR_UNROLL
        for (index_t l = 0; l < L; ++l) std::memcpy(x + (j0 + l) * tile + h * L, &c[l], sizeof(V));
        if constexpr (Top) {  // the block's columns in a tree (std::max), then into the running maximum
          SSR_UNROLL
          for (index_t d = 1; d < L; d *= 2) {
            SSR_UNROLL
            for (index_t l = 0; l + d < L; l += 2 * d) c[l] = c[l] < c[l + d] ? c[l + d] : c[l];
          }
          best[h] = best[h] < c[0] ? c[0] : best[h];
        }
      }
#endif
  for (index_t j = j0; j < n; ++j) {
    for (index_t q = 0; q < tile; ++q) x[j * tile + q] = row[q][j];
    for (index_t h = 0; h < per; ++h) {
      V e;
      std::memcpy(&e, x + j * tile + h * L, sizeof e);
      if constexpr (Top)
        best[h] = best[h] < e ? e : best[h];
      else
        note_finite(seen, e);
    }
  }
  if constexpr (Top) std::memcpy(top, best, sizeof best);
}

// The float kernel of the values e, from their rows' maxima t: e = max((e - t) * scale, least).
template <class V, class T>
SSR_LANES_INLINE void kernel_step(V& e, const V& t, T scale, const V& least) {
  e = (e - t) * scale;
  e = e < least ? least : e;  // std::max(e, -bound)
}

// The float kernel in place over `count` values of a tile by columns at x (a whole number of steps), in
// vectors of L lanes (L divides a tile's column, or is two columns), from the maximum of each of the tile's
// rows (top, a tile's column): K_ij = max((S_ij - max_j S_ij) * scale, -bound). Lanes that met a
// non-finite S_ij (S - S is NaN for a NaN or an infinity, 0 else) are set in non_finite.
template <class T, int L, class Mask>
SSR_LANES_INLINE void kernel_over_tile(T* x, index_t count, const T* top, T scale, T bound, Mask& non_finite) {
  SSR_LANES(V, T, L);
  constexpr index_t per = L < tile ? tile / L : 1, step = per * L;  // vectors a step, values a step
  V t[per];                                                         // top, repeated over a step
#if defined(SSR_SHUFFLE_VECTOR)
  if constexpr (L > tile) {  // two columns: top in both halves by a shuffle (two narrower stores and a
    SSR_LANES(H, T, tile);   // wider load would wait on each other)
    static_assert(L == 16 && tile == 8, "two columns of 8 rows");
    H column;
    std::memcpy(&column, top, sizeof column);
    t[0] = __builtin_shufflevector(column, column, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
  } else
#endif
  {
    std::memcpy(t, top, sizeof t);
  }
  const V least = V{} - bound;
  for (index_t c = 0; c < count; c += step) {
    SSR_UNROLL
    for (index_t h = 0; h < per; ++h) {
      V e;
      std::memcpy(&e, x + c + h * L, sizeof e);
      non_finite |= (e - e) != V{};  // NOLINT(misc-redundant-expression): an or, no chain of latencies
      kernel_step(e, t[h], scale, least);
      std::memcpy(x + c + h * L, &e, sizeof e);
    }
  }
}

// Floats in the float exp's vectors for a path in vectors of l floats compiled for the build's own target:
// at most its widest, at least 4 (the exp's narrowest vector); 1 without vector extensions. The AVX2 and
// AVX-512 paths name their own widths.
constexpr int own_exp_lanes(int l) {
  const int fit = l < fexp::widest ? l : fexp::widest;
  return fexp::widest == 1 ? 1 : (fit < 4 ? 4 : fit);
}

// The softmax cost's float kernel of a tile by columns (n columns) at x, in place, from the differences
// d_ij = S_ij - max_j S_ij it holds (kernel_over_tile with scale 1 and no bound), in vectors of E lanes
// (a tile's column or less, or two adjacent columns): e_ij = exp(d_ij); sum_i = sum_j e_ij in the scaled
// pass's order (pass.hpp: the columns j = 0, 1, 2, 3 (mod 4) in four sums, then (0 + 2) + (1 + 3));
// a_i = scale / sum_i; K_ij = clamp((e_ij - 1) * a_i, -bound, 0). With scale = 1 / xi this is the
// definition's (e_ij / sum_i - 1 / sum_i) / xi (its shift is 0: the row's largest logit has e = 1, cost 0),
// computed in float (Simd::float_kernel states how far from the double definition).
template <int E>
SSR_LANES_INLINE void softmax_of_tile(float* x, index_t n, float scale, float bound) {
  constexpr index_t per_pair = 2 * tile / E, per_column = E < tile ? tile / E : 1;  // vectors
  SSR_LANES(V, float, E);
  fexp::exp_in_lanes<E>(x, x, n * tile);
  V s01[per_pair] = {}, s23[per_pair] = {}, e;  // the sums of columns 0 and 1 (mod 4), and of 2 and 3
  index_t j = 0;
  for (; j + 4 <= n; j += 4) {
    SSR_UNROLL
    for (index_t h = 0; h < per_pair; ++h) {
      std::memcpy(&e, x + j * tile + h * E, sizeof e);
      s01[h] += e;
      std::memcpy(&e, x + (j + 2) * tile + h * E, sizeof e);
      s23[h] += e;
    }
  }
  if (j + 2 <= n) {
    SSR_UNROLL
    for (index_t h = 0; h < per_pair; ++h) {
      std::memcpy(&e, x + j * tile + h * E, sizeof e);
      s01[h] += e;
    }
  }
  // The last column of an odd n in the first half of a pair's lanes (zeros after: they add nothing).
  V last[per_pair] = {};
  if (n % 2 != 0) {
    std::memcpy(last, x + (n - 1) * tile, tile * sizeof(float));
    SSR_UNROLL
    for (index_t h = 0; h < per_pair; ++h) ((n - 1) % 4 == 0 ? s01[h] : s23[h]) += last[h];
  }
  // (0 + 2) + (1 + 3), then a in every vector of a pair.
  V a[per_pair];
  SSR_UNROLL
  for (index_t h = 0; h < per_pair; ++h) s01[h] += s23[h];
  if constexpr (E <= tile) {
    SSR_UNROLL
    for (index_t h = 0; h < per_column; ++h) a[h] = a[per_column + h] = scale / (s01[h] + s01[per_column + h]);
  } else {
#if defined(SSR_SHUFFLE_VECTOR)
    static_assert(E == 2 * tile, "two columns a vector");
    a[0] = scale / (s01[0] + __builtin_shufflevector(s01[0], s01[0], 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6,
                                                     7));  // the same sum in both halves
#else
    static_assert(E <= tile, "two columns in one vector need __builtin_shufflevector");
#endif
  }
  const V least = V{} - bound, zero = V{};
  const auto kernel = [&](V& v, index_t h) SSR_LANES_ALWAYS_INLINE {
    v = (v - 1.0f) * a[h];
    v = v < least ? least : v;  // std::max(v, -bound)
    v = zero < v ? zero : v;    // std::min(v, 0)
  };
  for (j = 0; j + 2 <= n; j += 2) {
    SSR_UNROLL
    for (index_t h = 0; h < per_pair; ++h) {
      std::memcpy(&e, x + j * tile + h * E, sizeof e);
      kernel(e, h);
      std::memcpy(x + j * tile + h * E, &e, sizeof e);
    }
  }
  if (n % 2 != 0) {
    SSR_UNROLL
    for (index_t h = 0; h < per_pair; ++h) kernel(last[h], h);
    std::memcpy(x + (n - 1) * tile, last, tile * sizeof(float));
  }
}

// The scale and bound kernel_over_tile takes for the cost: the linear cost's kernel, or the softmax cost's
// differences (scale 1, no bound), which softmax_of_tile then takes.
template <class T>
struct OverTile {
  T scale, bound;
};
template <class T>
SSR_LANES_INLINE OverTile<T> over_tile(Cost cost, T scale, T bound) {
  if (cost == Cost::softmax) return {T(1), std::numeric_limits<T>::infinity()};
  return {scale, bound};
}

// The float kernel of a tile at x (n columns, vectors of L lanes, the rows' maxima at top) for the cost:
// kernel_over_tile, then for the softmax cost softmax_of_tile in exps of E lanes (floats only).
template <class T, int L, int E, class Mask>
SSR_LANES_INLINE void kernel_of_tile(T* x, index_t n, const T* top, T scale, T bound, Cost cost, Mask& non_finite) {
  const OverTile<T> step = over_tile(std::is_same<T, float>::value ? cost : Cost::linear, scale, bound);
  kernel_over_tile<T, L>(x, n * tile, top, step.scale, step.bound, non_finite);
  if constexpr (std::is_same<T, float>::value)
    if (cost == Cost::softmax) softmax_of_tile<E>(x, n, scale, bound);
}

// The tiles of `rows` rows (see the top of this file) in vectors of L lanes; where Kernel, each tile then
// holds the float kernel of its rows for the cost (kernel_of_tile, its exps in vectors of E floats). Returns
// whether every S_ij was finite.
template <class T, int L, bool Kernel, int E = own_exp_lanes(L)>
SSR_LANES_INLINE bool tiles_in_lanes(const T* s, index_t stride, index_t rows, index_t n, T scale, T bound, T* x,
                                     Cost cost = Cost::linear) {
  SSR_LANES(V, T, L);
  using Word = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  SSR_LANES(Bits, Word, L);
  auto non_finite = V{} != V{};  // lanes that met a non-finite value in the kernel: a mask, all clear
  Bits seen{};                   // note_finite of the values copied, where no kernel
  for (index_t i0 = 0; i0 < rows; i0 += tile, x += n * tile) {
    const T* row[tile];
    tile_rows(s, stride, i0, rows, row);
    alignas(64) T top[tile];
    copy_tile<T, L, Kernel>(row, n, x, top, seen);
    if constexpr (Kernel) kernel_of_tile<T, L, E>(x, n, top, scale, bound, cost, non_finite);
  }
  return !lanes::any_lane(non_finite) && !lanes::any_bit(seen);
}

#if defined(SSR_DISPATCH_AVX2)
template <class T, bool Kernel>
SSR_TARGET_AVX2_FMA bool tiles_avx2(const T* s, index_t stride, index_t rows, index_t n, T scale, T bound, T* x,
                                    Cost cost = Cost::linear) {
  return tiles_in_lanes<T, 32 / static_cast<int>(sizeof(T)), Kernel, 8>(s, stride, rows, n, scale, bound, x, cost);
}
#endif

#if defined(SSR_SHUFFLE_VECTOR)
// tiles_in_lanes for floats in vectors of two adjacent columns of a tile (16 floats: the
// first column's rows, then the second's). A tile's 16 columns at a time, 8 rows of 16 floats, become 8
// such vectors in three exchanges of a bit of the vector's index (first the row) with a bit of the lane's
// (first the column): rows q and q + 4 exchange lane bit 3, then q and q + 2 lane bit 2, then q and q + 1
// lane bit 1, the last exchange also putting each column's rows together (each step a shuffle of two
// vectors); then 8 columns at a time, two rows a vector, in two exchanges. The last n % 8 columns go as
// tiles_in_lanes takes them, and the kernel (kernel_over_tile, softmax_of_tile) two columns a vector, on
// the tile's vectors still in registers where n = 16; the same operations on each element, so the same
// bits. Compiled for AVX-512 (tiles_avx512, or a build for a processor with it; the exps in vectors of E
// floats).
template <bool Kernel, int E = own_exp_lanes(2 * tile)>
SSR_LANES_INLINE bool tiles_two_columns(const float* s, index_t stride, index_t rows, index_t n, float scale,
                                        float bound, float* x, Cost cost = Cost::linear) {
  SSR_LANES(W, float, 16);
  SSR_LANES(V, float, 8);
  SSR_LANES(WBits, std::uint32_t, 16);
  SSR_LANES(VBits, std::uint32_t, 8);
  auto non_finite = W{} != W{};
  auto non_finite_last = V{} != V{};  // an odd n's last column
  WBits seen{};                       // note_finite of the values copied, where no kernel or where n = 16 (below)
  VBits seen_last{};                  // the same, of the columns copy_tile takes
  // Columns j0 to j0 + 16 of the tile's rows into b, two columns a vector, in the three exchanges above.
  const auto sixteen_columns = [&](const float* const* row, index_t j0, W(&b)[tile]) SSR_LANES_ALWAYS_INLINE {
    W a[tile];
    SSR_UNROLL
    for (index_t q = 0; q < tile; ++q) std::memcpy(&a[q], row[q] + j0, sizeof(W));
    if (!Kernel || n == 2 * tile) {  // else the kernel looks at its values
      SSR_UNROLL
      for (const W& values : a) note_finite(seen, values);
    }
    SSR_UNROLL
    for (int v = 0; v < 4; ++v) {
      b[v] = __builtin_shufflevector(a[v], a[v + 4], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
      b[v + 4] = __builtin_shufflevector(a[v], a[v + 4], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
    SSR_UNROLL
    for (int v : {0, 1, 4, 5}) {
      a[v] = __builtin_shufflevector(b[v], b[v + 2], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
      a[v + 2] = __builtin_shufflevector(b[v], b[v + 2], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    }
    SSR_UNROLL
    for (int v = 0; v < tile; v += 2) {
      b[v] = __builtin_shufflevector(a[v], a[v + 1], 0, 16, 4, 20, 8, 24, 12, 28, 1, 17, 5, 21, 9, 25, 13, 29);
      b[v + 1] = __builtin_shufflevector(a[v], a[v + 1], 2, 18, 6, 22, 10, 26, 14, 30, 3, 19, 7, 23, 11, 27, 15, 31);
    }
  };
  // The maximum of each lane over b's vectors, in a tree (std::max), into top (no vector is returned: see
  // lanes.hpp).
  const auto lane_maxima = [](const W(&b)[tile], W& top) SSR_LANES_ALWAYS_INLINE {
    W m[tile];
    SSR_UNROLL
    for (index_t p = 0; p < tile; ++p) m[p] = b[p];
    SSR_UNROLL
    for (index_t d = 1; d < tile; d *= 2) {
      SSR_UNROLL
      for (index_t p = 0; p + d < tile; p += 2 * d) m[p] = m[p] < m[p + d] ? m[p + d] : m[p];
    }
    top = m[0];
  };
  // The maxima of the even columns' lanes (0-7) and the odd ones' (8-15) joined into a tile's column.
  const auto join_halves = [](const W& best, V& column) SSR_LANES_ALWAYS_INLINE {
    const V even = __builtin_shufflevector(best, best, 0, 1, 2, 3, 4, 5, 6, 7),
            odd = __builtin_shufflevector(best, best, 8, 9, 10, 11, 12, 13, 14, 15);
    column = even < odd ? odd : even;
  };
  for (index_t i0 = 0; i0 < rows; i0 += tile, x += n * tile) {
    const float* row[tile];
    tile_rows(s, stride, i0, rows, row);
    if constexpr (Kernel) {
      // One block of 16 columns: kept in registers for the kernel, each vector stored once, not stored and read
      // back. Its finiteness goes into seen: the kernel's comparison into a 16-lane mask, unrolled here, GCC
      // made a lane at a time (the copy then took twice as long).
      if (n == 2 * tile) {
        W b[tile];
        sixteen_columns(row, 0, b);
        W best;
        V column;
        lane_maxima(b, best);
        join_halves(best, column);
        const W top = __builtin_shufflevector(column, column, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
        const OverTile<float> step = over_tile(cost, scale, bound);  // as kernel_of_tile
        const W least = W{} - step.bound;
        SSR_UNROLL
        for (index_t p = 0; p < tile; ++p) {
          kernel_step(b[p], top, step.scale, least);  // the values' finiteness in seen
          std::memcpy(x + 2 * p * tile, &b[p], sizeof(W));
        }
        if (cost == Cost::softmax) softmax_of_tile<E>(x, n, scale, bound);
        continue;
      }
    }
    W best = W{} - std::numeric_limits<float>::infinity();  // lanes 0-7 over even columns, 8-15 odd
    index_t j0 = 0;
    for (; j0 + 2 * tile <= n; j0 += 2 * tile) {
      W b[tile];
      sixteen_columns(row, j0, b);
      SSR_UNROLL
      for (index_t p = 0; p < tile; ++p) std::memcpy(x + (j0 + 2 * p) * tile, &b[p], sizeof(W));
      if constexpr (Kernel) {  // the pairs in a tree, then into the running maximum
        W m;
        lane_maxima(b, m);
        best = best < m ? m : best;
      }
    }
    for (; j0 + tile <= n; j0 += tile) {  // 8 columns: two rows a vector, two exchanges
      W a[4], b[4];
      SSR_UNROLL
      for (index_t k = 0; k < 4; ++k) {
        V first, second;
        std::memcpy(&first, row[2 * k] + j0, sizeof first);
        std::memcpy(&second, row[2 * k + 1] + j0, sizeof second);
        a[k] = __builtin_shufflevector(first, second, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        if constexpr (!Kernel) note_finite(seen, a[k]);
      }
      SSR_UNROLL
      for (int v = 0; v < 2; ++v) {
        b[v] = __builtin_shufflevector(a[v], a[v + 2], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
        b[v + 2] = __builtin_shufflevector(a[v], a[v + 2], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
      }
      SSR_UNROLL
      for (int v = 0; v < 4; v += 2) {
        a[v] = __builtin_shufflevector(b[v], b[v + 1], 0, 8, 16, 24, 4, 12, 20, 28, 1, 9, 17, 25, 5, 13, 21, 29);
        a[v + 1] = __builtin_shufflevector(b[v], b[v + 1], 2, 10, 18, 26, 6, 14, 22, 30, 3, 11, 19, 27, 7, 15, 23, 31);
      }
      SSR_UNROLL
      for (index_t p = 0; p < 4; ++p) std::memcpy(x + (j0 + 2 * p) * tile, &a[p], sizeof(W));
      if constexpr (Kernel) {
        a[0] = a[0] < a[1] ? a[1] : a[0];
        a[2] = a[2] < a[3] ? a[3] : a[2];
        a[0] = a[0] < a[2] ? a[2] : a[0];
        best = best < a[0] ? a[0] : best;
      }
    }
    alignas(64) float top[tile];
    copy_tile<float, 8, Kernel>(row, n, x, top, seen_last, j0);
    if constexpr (Kernel) {  // the maxima of the even and odd columns' blocks join the rest's
      V t;
      std::memcpy(&t, top, sizeof t);
      V pairs;
      join_halves(best, pairs);
      t = t < pairs ? pairs : t;
      std::memcpy(top, &t, sizeof t);
      const OverTile<float> step = over_tile(cost, scale, bound);  // as kernel_of_tile
      kernel_over_tile<float, 2 * tile>(x, n / 2 * 2 * tile, top, step.scale, step.bound, non_finite);
      if (n % 2 != 0)
        kernel_over_tile<float, tile>(x + (n - 1) * tile, tile, top, step.scale, step.bound, non_finite_last);
      if (cost == Cost::softmax) softmax_of_tile<E>(x, n, scale, bound);
    }
  }
  return !lanes::any_lane(non_finite) && !lanes::any_lane(non_finite_last) && !lanes::any_bit(seen) &&
         !lanes::any_bit(seen_last);
}
#endif

#if defined(SSR_DISPATCH_AVX512) && defined(SSR_SHUFFLE_VECTOR)
template <bool Kernel>
SSR_TARGET_AVX512_FMA bool tiles_avx512(const float* s, index_t stride, index_t rows, index_t n, float scale,
                                        float bound, float* x, Cost cost = Cost::linear) {
  return tiles_two_columns<Kernel, 2 * tile>(s, stride, rows, n, scale, bound, x, cost);
}
#endif

// The tiles (and, where Kernel, the float kernel of the cost) of `rows` rows on the widest path this
// processor runs; returns whether every value was finite.
template <class T, bool Kernel>
inline bool tiles(const T* s, index_t stride, index_t rows, index_t n, T scale, T bound, T* x,
                  Cost cost = Cost::linear) {
#if defined(SSR_DISPATCH_AVX512) && defined(SSR_SHUFFLE_VECTOR)
  if constexpr (std::is_same<T, float>::value)
    if (lanes::has_avx512()) return tiles_avx512<Kernel>(s, stride, rows, n, scale, bound, x, cost);
#endif
#if defined(SSR_DISPATCH_AVX2) && defined(SSR_SHUFFLE_VECTOR)
  if (lanes::has_avx2_fma()) return tiles_avx2<T, Kernel>(s, stride, rows, n, scale, bound, x, cost);
#endif
#if defined(SSR_SHUFFLE_VECTOR)
  if constexpr (std::is_same<T, float>::value && lanes::widest_bytes >= 64)  // a build for AVX-512
    return tiles_two_columns<Kernel>(s, stride, rows, n, scale, bound, x, cost);
#endif
  return tiles_in_lanes<T, widest<T>(), Kernel>(s, stride, rows, n, scale, bound, x, cost);
}

}  // namespace SSR_LANES_NAMESPACE
}  // namespace columns
}  // namespace cpu
}  // namespace ssr
