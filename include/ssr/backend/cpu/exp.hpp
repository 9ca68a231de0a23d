// The CPU backend's float exp: one formula, written once over lanes, run in the widest vectors the build
// has, and with AVX2 and FMA (or AVX-512) where a baseline x86-64 build (SSE2, 4 floats) runs on a
// processor that has them.
//
// The formula: x clamped to [-88, 88] (NaN read as -88, so no conversion is undefined), Cody-Waite
// reduction to r in [-ln2/2, ln2/2] and a degree-7 polynomial (relative error below 1e-7) for exp(r) - 1,
// 2^k put in the exponent bits, and (exp(r) - 1) 2^k + 2^k rounded once (a subnormal result too); inputs
// below -88 (-inf included) give 0 or the subnormals just above it, never NaN. The reduction, the
// polynomial's steps and the scaling are fused multiply-adds (rounded once): half the operations where
// the processor fuses them, and the same bits where it does not (std::fma, exact, a lane at a time: a
// baseline build's own 4-lane code is then several times slower, which only processors without AVX2 and
// FMA run). Lanes are GNU vectors (lanes.hpp) of 4, 8 or 16 floats, the same bits in every width, path
// and build; the last values of a row go through 4 lanes. Without vector extensions (or with
// SSR_NO_VECTOR_EXTENSIONS or EIGEN_DONT_VECTORIZE defined), a float at a time.
#pragma once

#include <cmath>
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
  using F = typename lanes::Floats<L>::Float;
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
  const F log2e = F{} + 1.44269504088896341f, magic = F{} + 12582912.0f;
  const F ln2_hi = F{} - 0.693359375f, ln2_lo = F{} + 2.12194440e-4f;  // -ln2 in two parts
  F shifted, r, y;
  lanes::FusedOwn::apply(shifted, x, log2e, magic);
  const F kf = shifted - magic;
  lanes::FusedOwn::apply(r, kf, ln2_hi, x);
  lanes::FusedOwn::apply(r, kf, ln2_lo, r);
  const F c5 = F{} + 1.9875691500e-4f, c4 = F{} + 1.3981999507e-3f, c3 = F{} + 8.3334519073e-3f,
          c2 = F{} + 4.1665795894e-2f, c1 = F{} + 1.6666665459e-1f, c0 = F{} + 5.0000001201e-1f;
  lanes::FusedOwn::apply(y, c5, r, c4);
  lanes::FusedOwn::apply(y, y, r, c3);
  lanes::FusedOwn::apply(y, y, r, c2);
  lanes::FusedOwn::apply(y, y, r, c1);
  lanes::FusedOwn::apply(y, y, r, c0);
  const F yr = y * r;
  F p;  // exp(r) - 1
  lanes::FusedOwn::apply(p, yr, r, r);
  // 2^k for whole k in [-127, 127]: k + 127 in the exponent bits (0 for k = -127).
  I bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  bits = (bits - (0x4b400000 - 127)) << 23;
  F two_k, result;
  std::memcpy(&two_k, &bits, sizeof two_k);
  lanes::FusedOwn::apply(result, p, two_k, two_k);  // (p + 1) 2^k rounded once
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
// exp_compiled in 8-float AVX2 vectors with FMA, for a baseline build on a processor with both.
SSR_TARGET_AVX2_FMA inline void exp_avx2(const float* in, float* out, index_t count) {
  exp_in_lanes<8>(in, out, count);
}
#endif
#if defined(SSR_DISPATCH_AVX512)
// exp_compiled in 16-float AVX-512 vectors, for a baseline build on a processor with AVX-512.
SSR_TARGET_AVX512_FMA inline void exp_avx512(const float* in, float* out, index_t count) {
  exp_in_lanes<16>(in, out, count);
}
#endif

// out = exp(in) for count floats (in == out allowed): the widest path this processor runs (a baseline
// build's own code has no FMA instruction: it takes the AVX2 or AVX-512 path for any count where it can).
SSR_LANES_INLINE void exp(const float* in, float* out, index_t count) {
#if defined(SSR_DISPATCH_AVX512)
  if (lanes::has_avx512()) return exp_avx512(in, out, count);
#endif
#if defined(SSR_DISPATCH_AVX2)
  if (lanes::has_avx2_fma()) return exp_avx2(in, out, count);
#endif
  exp_compiled(in, out, count);
}

}  // namespace SSR_LANES_NAMESPACE
}  // namespace fexp
}  // namespace cpu
}  // namespace ssr
