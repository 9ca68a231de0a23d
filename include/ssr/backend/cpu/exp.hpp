// The CPU backend's float exp: one formula, written once over lanes, run in the widest vectors the build
// has, and with AVX2 where a baseline x86-64 build (SSE2, 4 floats) runs on a processor that has it.
//
// The formula: x clamped to [-88, 88] (NaN read as -88, so no conversion is undefined), Cody-Waite
// reduction to r in [-ln2/2, ln2/2] and a degree-7 polynomial (relative error below 1e-7), 2^k put in the
// exponent bits; inputs below -88 (-inf included) give 0 or the subnormals just above it, never NaN.
// Lanes are GNU vectors (lanes.hpp) of 4, 8 or 16 floats, the same bits in every width and path; the last
// values of a row go through 4 lanes. Without vector extensions (or with SSR_NO_VECTOR_EXTENSIONS or
// EIGEN_DONT_VECTORIZE defined), a float at a time.
#pragma once

#include <cstdint>
#include <cstring>

#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cpu {
namespace fexp {
inline namespace SSR_LANES_NAMESPACE {

// Floats in the widest vector (1 without vector extensions).
constexpr int widest = lanes::widest_lanes<float>(16);

// exp of L floats (L a power of two up to 16) from in to out, unaligned: on whole vectors (no calls, so
// no vector crosses a function boundary in a build without its registers), or a float at a time without
// vector extensions (the same operations). max(-88, x) and min(x, 88) in std::max's and std::min's order
// (a NaN x gives -88).
template <int L>
SSR_LANES_INLINE void exp_lanes(const float* in, float* out) {
#if defined(SSR_VECTOR_EXTENSIONS)
  SSR_LANES(F, float, L);
  SSR_LANES(I, std::int32_t, L);
#else
  if constexpr (L > 1) {
    for (int l = 0; l < L; ++l) exp_lanes<1>(in + l, out + l);
    return;
  }
  using F = float;
  using I = std::int32_t;
#endif
  F x;
  std::memcpy(&x, in, sizeof x);
  F lo = F{} - 88.0f, hi = F{} + 88.0f;
#if defined(SSR_VECTOR_EXTENSIONS) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
  // GCC makes max and min instructions of these selects only where the bounds are not known constants
  // (else three bit operations each); the empty statement hides them.
  __asm__("" : "+v"(lo), "+v"(hi));
#endif
  x = lo < x ? x : lo;
  x = hi < x ? hi : x;
  // k = round(x / ln2): 1.5 * 2^23 + k is a float whose last bits are k (ulp 1 there).
  const F shifted = x * 1.44269504088896341f + 12582912.0f;
  const F kf = shifted - 12582912.0f;
  const F r = (x - kf * 0.693359375f) - kf * -2.12194440e-4f;
  F y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  const F p = ((y * r) * r + r) + 1.0f;
  // 2^k for whole k in [-127, 127]: k + 127 in the exponent bits (0 for k = -127).
  I bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  bits = (bits - (0x4b400000 - 127)) << 23;
  F two_k;
  std::memcpy(&two_k, &bits, sizeof two_k);
  const F result = p * two_k;
  std::memcpy(out, &result, sizeof result);
}

// exp of the last count < 4 floats of a row, in 4 lanes.
SSR_LANES_INLINE void exp_tail(const float* in, float* out, index_t count) {
  if (count <= 0) return;
  float lanes[4] = {};
  std::memcpy(lanes, in, static_cast<std::size_t>(count) * sizeof(float));
  exp_lanes<4>(lanes, lanes);
  std::memcpy(out, lanes, static_cast<std::size_t>(count) * sizeof(float));
}

// exp of count floats in vectors of L floats, then 8 and 4, then exp_tail.
template <int L>
SSR_LANES_INLINE void exp_in_lanes(const float* in, float* out, index_t count) {
  index_t c = 0;
  for (; c + L <= count; c += L) exp_lanes<L>(in + c, out + c);
  if constexpr (L > 8)
    for (; c + 8 <= count; c += 8) exp_lanes<8>(in + c, out + c);
  if constexpr (L > 4)
    for (; c + 4 <= count; c += 4) exp_lanes<4>(in + c, out + c);
  exp_tail(in + c, out + c, count - c);
}

// exp of count floats in the build's own vectors.
SSR_LANES_INLINE void exp_compiled(const float* in, float* out, index_t count) { exp_in_lanes<widest>(in, out, count); }

#if defined(SSR_DISPATCH_AVX2)
// exp_compiled in 8-float AVX2 vectors, for a baseline build on a processor with AVX2.
SSR_TARGET_AVX2 inline void exp_avx2(const float* in, float* out, index_t count) { exp_in_lanes<8>(in, out, count); }
#endif

// out = exp(in) for count floats (in == out allowed): the widest path this processor runs. Short rows
// stay in the caller's own code: a call to the AVX2 path cost more than it saved on a tile's 8 floats.
SSR_LANES_INLINE void exp(const float* in, float* out, index_t count) {
#if defined(SSR_DISPATCH_AVX2)
  if (count >= 64 && lanes::has_avx2()) return exp_avx2(in, out, count);
#endif
  exp_compiled(in, out, count);
}

}  // namespace SSR_LANES_NAMESPACE
}  // namespace fexp
}  // namespace cpu
}  // namespace ssr
