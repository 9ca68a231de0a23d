// The CPU backend's top-k of tiles of rows held by columns (for Simd::topk_tiles_weights), written once
// over GNU vectors (lanes.hpp): in vectors of a tile's column (8 floats) or less, or of the columns of two
// tiles, and with AVX2 or AVX-512 where a baseline x86-64 build runs on a processor that has it. Every width
// and path chooses the same experts with the same values: the work is comparisons and one product.
//
// x holds `count` tiles one after another, tile t's element (q, j) at x[(t * n + j) * tile + q]; each lane
// of a vector is a row, so the work is vertical. Expert j enters each row's sorted list of K where its
// value (times v_j where Scaled) is strictly greater than an entry (ties to the lower index, as
// math::topk), through max and min in std::max's and std::min's argument order, so that a NaN enters no
// list (max(b, NaN) is b). For K <= 4 the update is branch-free, and for K <= 2 in vectors narrower than
// AVX-512's also free of selects by a mask (an expert is kept plus one, so that a max takes the newer); for
// longer lists a column no row of a vector takes skips their update. G tiles are swept at once, each vector
// (a tile's column, part of one, or the columns of two tiles) an independent chain of updates whose
// latencies overlap.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/view.hpp"

#if defined(SSR_VECTOR_EXTENSIONS) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define SSR_HIDE_FROM_GCC 1
#endif

namespace ssr {
namespace cpu {
namespace topk {
inline namespace SSR_LANES_NAMESPACE {

constexpr index_t tile = 8;  // rows a tile (Simd<T>::tile)

// Lanes of T in the vectors of the build's own path: its widest, at most the columns of two tiles (a
// tile's column where the compiler cannot shuffle lanes); 1 without vector extensions.
template <class T>
constexpr int widest() {
#if defined(SSR_SHUFFLE_VECTOR)
  return lanes::widest_lanes<T>(2 * static_cast<int>(tile));
#else
  return lanes::widest_lanes<T>(static_cast<int>(tile));
#endif
}

// Tiles a sweep takes for lists of K in vectors of L lanes (a power of two, at most `most`): vectors of
// lists in `registers` registers (16, or 32 with AVX-512), with room for the values they compare.
template <class T, int K, int L>
constexpr int tiles_at_once(int most, int registers) {
  const int per = std::max(1, static_cast<int>(tile) / L), span = std::max(1, L / static_cast<int>(tile));
  const int chains = K <= 2 ? (K <= 1 ? 4 : 2) * registers / 16 : 1;
  int g = span;  // a vector's tiles
  while (2 * g <= most && 2 * g * per / span <= chains) g *= 2;
  return g;
}

// The top-K of tiles [g0, g0 + G) in vectors of L lanes (tiles past count repeat the last): value[r * stride
// + t * tile + q] and index[...] (as T) are row q of tile t's r-th largest value and its expert. Returns
// false where a chosen value is not finite or a list is not full.
template <class T, int L, int K, int G, bool Scaled, bool InRegisters>
SSR_LANES_INLINE bool sweep(const T* x, index_t n, index_t count, index_t g0, const T* v, T* value, T* index,
                            index_t stride) {
  SSR_LANES(V, T, L);
  using Mask = decltype(V{} < V{});
  constexpr index_t per = L < tile ? tile / L : 1;   // vectors a tile's column
  constexpr index_t span = L > tile ? L / tile : 1;  // tiles a vector
  static_assert(span == 1 || (span == 2 && G % 2 == 0), "a vector holds a column of one tile or of two");
  constexpr index_t C = G * per / span;  // C chains
  const T* at_tile[G];
  SSR_UNROLL
  for (index_t g = 0; g < G; ++g) at_tile[g] = x + std::min(g0 + g, count - 1) * n * tile;
  const V none = V{} - std::numeric_limits<T>::infinity();
  V best[K][C], at[K][C];  // at: the expert plus one, 0 while a list is not full
  SSR_UNROLL
  for (int r = 0; r < K; ++r) {
    SSR_UNROLL
    for (index_t c = 0; c < C; ++c) best[r][c] = none, at[r][c] = V{};
  }
  V here = V{} + T(1);  // j + 1
  for (index_t j = 0; j < n; ++j, here += T(1)) {
    SSR_UNROLL
    for (index_t c = 0; c < C; ++c) {
      V e;
      if constexpr (span == 1) {
        std::memcpy(&e, at_tile[c / per] + j * tile + c % per * L, sizeof e);
      } else {
#if defined(SSR_SHUFFLE_VECTOR)
        SSR_LANES(H, T, tile);  // one tile's column, then the next tile's
        H first, second;
        std::memcpy(&first, at_tile[2 * c] + j * tile, sizeof first);
        std::memcpy(&second, at_tile[2 * c + 1] + j * tile, sizeof second);
        e = __builtin_shufflevector(first, second, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
        static_assert(span == 1, "two tiles in one vector need __builtin_shufflevector");
#endif
      }
      if constexpr (Scaled) e *= v[j];
#if defined(SSR_VECTOR_EXTENSIONS)
      // 64-byte vectors are AVX-512's, whose selects are one masked move each: lists of K <= 2 take them too.
      constexpr bool masked_moves = L * sizeof(T) >= 64;
      if constexpr (K <= 2 && !masked_moves) {
        // Without selects by a mask (blends: three micro-operations each on recent Intel cores): the values
        // by max and min, the experts by max and bit operations, as here exceeds every expert in a list.
        using Int = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
        SSR_LANES(Bits, Int, L);
        V ev = e, ev2 = e;  // e for the min and the max
        Bits above0 = best[0][c] < e;
#if defined(SSR_HIDE_FROM_GCC)
        // GCC makes selects, then blends, of bit operations on masks and of a max or min that shares a
        // comparison with them; the empty statements hide what it would see (where a vector is a register
        // of the function's target: the build's own widths and the AVX2 path).
        if constexpr (InRegisters) __asm__("" : "+v"(ev), "+v"(ev2), "+v"(above0));
#endif
        Bits bits;
        V entered;  // above ? here : 0
        if constexpr (K == 2) {
          Bits above1 = best[1][c] < e;  // true wherever above0 is
#if defined(SSR_HIDE_FROM_GCC)
          if constexpr (InRegisters) __asm__("" : "+v"(above1));
#endif
          const V lower = best[0][c] < ev ? best[0][c] : ev;  // std::min(e, best[0])
          best[1][c] = best[1][c] < lower ? lower : best[1][c];
          std::memcpy(&bits, &here, sizeof bits);
          bits &= above1;
          std::memcpy(&entered, &bits, sizeof entered);
          const V second = at[1][c] < entered ? entered : at[1][c];  // above1 ? here : at[1]
          // above0 ? at[0] : NaN, then the lesser of it and second (second where it is NaN): at[0] where e
          // took the first place (second is then here, above at[0]).
          const V nan = V{} + std::numeric_limits<T>::quiet_NaN();
          Bits nan_bits;
          std::memcpy(&nan_bits, &nan, sizeof nan_bits);
          std::memcpy(&bits, &at[0][c], sizeof bits);
          bits |= ~above0 & nan_bits;
          V first;
          std::memcpy(&first, &bits, sizeof first);
          at[1][c] = first < second ? first : second;
        }
        best[0][c] = best[0][c] < ev2 ? ev2 : best[0][c];
        std::memcpy(&bits, &here, sizeof bits);
        bits &= above0;
        std::memcpy(&entered, &bits, sizeof entered);
        at[0][c] = at[0][c] < entered ? entered : at[0][c];  // above0 ? here : at[0]
        continue;
      }
#endif
      Mask above[K];
      above[K - 1] = best[K - 1][c] < e;
      if constexpr (K > 4)  // long lists: a column no row takes skips their update
        if (!lanes::any_lane(above[K - 1])) continue;
      SSR_UNROLL
      for (int r = 0; r < K - 1; ++r) above[r] = best[r][c] < e;
      SSR_UNROLL
      for (int r = K - 1; r > 0; --r) {
        const V lower = best[r - 1][c] < e ? best[r - 1][c] : e;  // std::min(e, best[r - 1])
        best[r][c] = best[r][c] < lower ? lower : best[r][c];     // std::max(best[r], lower)
        at[r][c] = above[r - 1] ? at[r - 1][c] : (above[r] ? here : at[r][c]);
      }
      best[0][c] = best[0][c] < e ? e : best[0][c];
      at[0][c] = above[0] ? here : at[0][c];
    }
  }
  // A chosen value not finite (x - x is NaN, else +0) or a list not full (1 - min(at, 1) is 1 where an
  // expert is missing, else +0): any bit of their sum set. Arithmetic, not comparisons: GCC lowers a
  // comparison of 64-byte vectors in this code to one lane at a time even where it inlines into AVX-512.
  const V one = V{} + T(1);
  V flags = V{};
  SSR_UNROLL
  for (int r = 0; r < K; ++r) {
    SSR_UNROLL
    for (index_t c = 0; c < C; ++c) {
      flags += best[r][c] - best[r][c];                  // NOLINT(misc-redundant-expression)
      flags += one - (at[r][c] < one ? at[r][c] : one);  // std::min(at, 1)
      const V expert = at[r][c] - T(1);
      std::memcpy(value + r * stride + g0 * tile + c * L, &best[r][c], sizeof(V));
      std::memcpy(index + r * stride + g0 * tile + c * L, &expert, sizeof(V));
    }
  }
  return !lanes::any_bit(flags);
}

// The top-K of `count` tiles (see the top of this file) in vectors of L lanes, G tiles a sweep; value and
// index hold at least ceil(count / G) * G tiles.
template <class T, int L, int K, int G, bool Scaled,
          bool InRegisters = (L > 1 && L * static_cast<int>(sizeof(T)) <= lanes::widest_bytes)>
SSR_LANES_INLINE bool tiles_in_lanes(const T* x, index_t n, index_t count, const T* v, T* value, T* index,
                                     index_t stride) {
  for (index_t g0 = 0; g0 < count; g0 += G)
    if (!sweep<T, L, K, G, Scaled, InRegisters>(x, n, count, g0, v, value, index, stride)) return false;
  return true;
}

#if defined(SSR_DISPATCH_AVX2)
template <class T, int K, int G, bool Scaled>
SSR_TARGET_AVX2 bool tiles_avx2(const T* x, index_t n, index_t count, const T* v, T* value, T* index, index_t stride) {
  return tiles_in_lanes<T, 32 / static_cast<int>(sizeof(T)), K, G, Scaled, true>(x, n, count, v, value, index, stride);
}
#endif
#if defined(SSR_DISPATCH_AVX512) && defined(SSR_SHUFFLE_VECTOR)
// tiles_in_lanes in 64-byte vectors (for floats the columns of two tiles a vector), whose selects are
// masked moves of one micro-operation where AVX2's blends take three. A step takes half the AVX2 path's
// operations, but 512-bit operations issue on two ports of recent Intel cores where 256-bit ones issue on
// three (docs/performance.md).
template <class T, int K, int G, bool Scaled>
SSR_TARGET_AVX512 bool tiles_avx512(const T* x, index_t n, index_t count, const T* v, T* value, T* index,
                                    index_t stride) {
  return tiles_in_lanes<T, 64 / static_cast<int>(sizeof(T)), K, G, Scaled, true>(x, n, count, v, value, index, stride);
}
#endif

// The top-K of `count` tiles on the widest path this processor runs, each path taking as many tiles a sweep
// as its registers hold, at most Most (value and index hold at least ceil(count / Most) * Most tiles).
template <class T, int K, int Most, bool Scaled>
inline bool tiles(const T* x, index_t n, index_t count, const T* v, T* value, T* index, index_t stride) {
#if defined(SSR_DISPATCH_AVX512) && defined(SSR_SHUFFLE_VECTOR)
  if (lanes::has_avx512()) {
    constexpr int L = 64 / static_cast<int>(sizeof(T));
    return tiles_avx512<T, K, tiles_at_once<T, K, L>(Most, 32), Scaled>(x, n, count, v, value, index, stride);
  }
#endif
#if defined(SSR_DISPATCH_AVX2)
  if (lanes::has_avx2()) {
    constexpr int L = 32 / static_cast<int>(sizeof(T));
    return tiles_avx2<T, K, tiles_at_once<T, K, L>(Most, 16), Scaled>(x, n, count, v, value, index, stride);
  }
#endif
  constexpr int L = widest<T>(), G = tiles_at_once<T, K, L>(Most, lanes::widest_bytes >= 64 ? 32 : 16);
  return tiles_in_lanes<T, L, K, G, Scaled>(x, n, count, v, value, index, stride);
}

}  // namespace SSR_LANES_NAMESPACE
}  // namespace topk
}  // namespace cpu
}  // namespace ssr

#undef SSR_HIDE_FROM_GCC
