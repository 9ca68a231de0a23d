// The CPU backend's scan for non-finite values (Simd::all_finite, under the Router's finiteness check),
// written once over GNU vectors (lanes.hpp): in the build's widest vectors, and with AVX2 or AVX-512 where a
// baseline x86-64 build runs on a processor that has it. x - x is +0 exactly where x is finite (NaN, whose
// bits are not all 0, for a NaN or an infinity), so the bits of every x - x are OR-ed together: no chain of
// additions' latencies, and no comparison (GCC compares 64-byte vectors a lane at a time).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cpu {
namespace finite {
inline namespace SSR_LANES_NAMESPACE {

// Whether each of `count` values lying anywhere is finite, in vectors of L lanes of T, four a step.
template <class T, int L>
SSR_LANES_INLINE bool all_in_lanes(const T* x, index_t count) {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  SSR_LANES(V, T, L);
  SSR_LANES(B, Bits, L);
  constexpr index_t step = 4 * index_t{L};
  B seen{};  // the bits of every x - x
  index_t c = 0;
  for (; c + step <= count; c += step) {
    SSR_UNROLL
    for (index_t a = 0; a < 4; ++a) {
      V e;
      std::memcpy(&e, x + c + a * L, sizeof e);
      const V d = e - e;  // NOLINT(misc-redundant-expression): +0 or NaN
      B bits;
      std::memcpy(&bits, &d, sizeof bits);
      seen |= bits;
    }
  }
  bool any = lanes::any_bit(seen);
  for (; c < count; ++c) any = any || x[c] - x[c] != T(0);  // NOLINT(misc-redundant-expression)
  return !any;
}

#if defined(SSR_DISPATCH_AVX2)
template <class T>
SSR_TARGET_AVX2 bool all_avx2(const T* x, index_t count) {
  return all_in_lanes<T, 32 / static_cast<int>(sizeof(T))>(x, count);
}
#endif
#if defined(SSR_DISPATCH_AVX512)
template <class T>
SSR_TARGET_AVX512 bool all_avx512(const T* x, index_t count) {
  return all_in_lanes<T, 64 / static_cast<int>(sizeof(T))>(x, count);
}
#endif

// Whether every one of `count` values is finite, on the widest path this processor runs.
template <class T>
inline bool all(const T* x, index_t count) {
  static_assert(std::is_floating_point<T>::value, "finite::all scans floating-point values");
#if defined(SSR_DISPATCH_AVX512)
  if (lanes::has_avx512()) return all_avx512(x, count);
#endif
#if defined(SSR_DISPATCH_AVX2)
  if (lanes::has_avx2()) return all_avx2(x, count);
#endif
  return all_in_lanes<T, lanes::widest_lanes<T>(64 / static_cast<int>(sizeof(T)))>(x, count);
}

}  // namespace SSR_LANES_NAMESPACE
}  // namespace finite
}  // namespace cpu
}  // namespace ssr
