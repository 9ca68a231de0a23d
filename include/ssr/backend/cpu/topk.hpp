// The CPU backend's top-k of tiles of rows held by columns (for Simd::topk_tiles_weights), written once
// over GNU vectors (lanes.hpp): in vectors of a tile's column (8 floats) or less, and with AVX2 where a
// baseline x86-64 build runs on a processor that has it. Every width and path chooses the same experts
// with the same values: the work is comparisons and one product.
//
// x holds `count` tiles one after another, tile t's element (q, j) at x[(t * n + j) * tile + q]; each lane
// of a vector is a row, so the work is vertical. Expert j enters each row's sorted list of K where its
// value (times v_j where Scaled) is strictly greater than an entry (ties to the lower index, as
// math::topk), through max and min in std::max's and std::min's argument order, so that a NaN enters no
// list (max(b, NaN) is b). For K <= 4 the update is branch-free; for longer lists a column no row of a
// vector takes skips their update. G tiles are swept at once, each vector of a column an independent chain
// of updates whose latencies overlap.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cpu {
namespace topk {
inline namespace SSR_LANES_NAMESPACE {

constexpr index_t tile = 8;  // rows a tile (Simd<T>::tile)

// Lanes of T in the vectors of the build's own path: its widest, at most a tile's column; 1 without
// vector extensions.
template <class T>
constexpr int widest() {
  return lanes::widest_lanes<T>(static_cast<int>(tile));
}

// Lanes of T on the path this build takes on most processors (AVX2 where it dispatches to it), which sets
// how many tiles a sweep takes: as many chains as the registers hold.
template <class T>
constexpr int path_lanes() {
#if defined(SSR_DISPATCH_AVX2)
  return 32 / static_cast<int>(sizeof(T));
#else
  return widest<T>();
#endif
}

// Tiles a sweep takes for lists of K (a power of two, at most `most`): vectors of lists in 16 registers (32
// with AVX-512), with room for the values they compare.
template <class T, int K>
constexpr int tiles_at_once(int most) {
  const int per = std::max(1, static_cast<int>(tile) / path_lanes<T>());  // vectors a column
  const int chains = K <= 2 ? (K <= 1 ? 4 : 2) * (lanes::widest_bytes >= 64 ? 2 : 1) : 1;
  int g = 1;
  while (2 * g <= most && 2 * g * per <= chains) g *= 2;
  return g;
}

// The top-K of tiles [g0, g0 + G) in vectors of L lanes (tiles past count repeat the last): value[r * stride
// + t * tile + q] and index[...] (as T) are row q of tile t's r-th largest value and its expert. Returns
// false where a chosen value is not finite or a list is not full.
template <class T, int L, int K, int G, bool Scaled>
SSR_LANES_INLINE bool sweep(const T* x, index_t n, index_t count, index_t g0, const T* v, T* value, T* index,
                            index_t stride) {
  SSR_LANES(V, T, L);
  using Mask = decltype(V{} < V{});
  constexpr index_t per = tile / L, C = G * per;  // C chains
  const T* at_tile[G];
  SSR_UNROLL
  for (index_t g = 0; g < G; ++g) at_tile[g] = x + std::min(g0 + g, count - 1) * n * tile;
  const V none = V{} - std::numeric_limits<T>::infinity();
  V best[K][C], at[K][C];
  SSR_UNROLL
  for (int r = 0; r < K; ++r) {
    SSR_UNROLL
    for (index_t c = 0; c < C; ++c) best[r][c] = none, at[r][c] = V{} - T(1);
  }
  V here = V{};
  for (index_t j = 0; j < n; ++j, here += T(1)) {
    SSR_UNROLL
    for (index_t c = 0; c < C; ++c) {
      V e;
      std::memcpy(&e, at_tile[c / per] + j * tile + c % per * L, sizeof e);
      if constexpr (Scaled) e *= v[j];
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
  Mask bad = V{} != V{};  // a chosen value not finite (x - x is NaN), or a list not full (index -1)
  SSR_UNROLL
  for (int r = 0; r < K; ++r) {
    SSR_UNROLL
    for (index_t c = 0; c < C; ++c) {
      bad |= (best[r][c] - best[r][c]) != V{};  // NOLINT(misc-redundant-expression)
      bad |= at[r][c] < V{};
      std::memcpy(value + r * stride + (g0 * per + c) * L, &best[r][c], sizeof(V));
      std::memcpy(index + r * stride + (g0 * per + c) * L, &at[r][c], sizeof(V));
    }
  }
  return !lanes::any_lane(bad);
}

// The top-K of `count` tiles (see the top of this file) in vectors of L lanes, G tiles a sweep; value and
// index hold at least ceil(count / G) * G tiles.
template <class T, int L, int K, int G, bool Scaled>
SSR_LANES_INLINE bool tiles_in_lanes(const T* x, index_t n, index_t count, const T* v, T* value, T* index,
                                     index_t stride) {
  for (index_t g0 = 0; g0 < count; g0 += G)
    if (!sweep<T, L, K, G, Scaled>(x, n, count, g0, v, value, index, stride)) return false;
  return true;
}

#if defined(SSR_DISPATCH_AVX2)
template <class T, int K, int G, bool Scaled>
SSR_TARGET_AVX2 bool tiles_avx2(const T* x, index_t n, index_t count, const T* v, T* value, T* index, index_t stride) {
  return tiles_in_lanes<T, 32 / static_cast<int>(sizeof(T)), K, G, Scaled>(x, n, count, v, value, index, stride);
}
#endif

// The top-K of `count` tiles on the widest path this processor runs.
template <class T, int K, int G, bool Scaled>
inline bool tiles(const T* x, index_t n, index_t count, const T* v, T* value, T* index, index_t stride) {
#if defined(SSR_DISPATCH_AVX2)
  if (lanes::has_avx2()) return tiles_avx2<T, K, G, Scaled>(x, n, count, v, value, index, stride);
#endif
  return tiles_in_lanes<T, widest<T>(), K, G, Scaled>(x, n, count, v, value, index, stride);
}

}  // namespace SSR_LANES_NAMESPACE
}  // namespace topk
}  // namespace cpu
}  // namespace ssr
