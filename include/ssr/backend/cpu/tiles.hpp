// The CPU backend's tiles: `tile` rows of a matrix held by columns, a column's values of the tile's rows
// one vector (lanes.hpp), so that a row's work is vertical, a lane a row. Element (q, j) of the tile at x
// is x[j * tile + q]. The logits come into tiles eight columns at a time by transposes in registers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/view.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace cpu {

constexpr index_t tile = CpuTuning::tile;

#if defined(__CUDACC__)  // nvcc compiles these for the host, and names the pragma its own way
#define SSR_CPU_UNROLL_TILE _Pragma("unroll 8")
#else
#define SSR_CPU_UNROLL_TILE _Pragma("GCC unroll 8")
#endif

// Asks the cache for the value `ahead` values past p: an address, not a pointer (it may lie past the end
// of p's array; a prefetch never faults).
template <class T>
SSR_INLINE void prefetch(const T* p, index_t ahead) {
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) + ahead * sizeof(T);
  __builtin_prefetch(reinterpret_cast<const void*>(at));  // NOLINT(performance-no-int-to-ptr): an address
}

// Rows [0, rows) of s (row stride `stride`, n columns; 1 <= rows <= tile) into the tile at x; a partial
// tile repeats its last row.
template <class T>
SSR_INLINE void load_tile(const T* s, index_t stride, index_t rows, index_t n, T* x) {
  const T* row[tile];
  for (index_t q = 0; q < tile; ++q) row[q] = s + std::min(q, rows - 1) * stride;
  index_t j0 = 0;
  for (; j0 + tile <= n; j0 += tile) {
    Lanes<T> v[tile];  // unrolled, so that the vectors stay in registers
    SSR_CPU_UNROLL_TILE
    for (index_t q = 0; q < tile; ++q) {
      read(row[q] + j0, v[q]);
      prefetch(row[q] + j0, tile * stride);  // the next tile's rows
    }
    transpose(v);
    SSR_CPU_UNROLL_TILE
    for (index_t c = 0; c < tile; ++c) write(x + (j0 + c) * tile, v[c]);
  }
  for (; j0 < n; ++j0)
    for (index_t q = 0; q < tile; ++q) x[j0 * tile + q] = row[q][j0];
}

// out(q, r) = list[r][q] for the tile's first `rows` rows, r in [0, k): per-row outputs (experts,
// weights) from a list of k vectors.
template <class E, class V>
SSR_INLINE void store_rows(const V* list, int k, index_t rows, MatrixView<E> out) {
  for (index_t q = 0; q < rows; ++q)
    for (int r = 0; r < k; ++r) out(q, r) = static_cast<E>(list[r][q]);
}

}  // namespace cpu
}  // namespace ssr
SSR_LANES_END
