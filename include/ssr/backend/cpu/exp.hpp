// The CPU backend's float exp: one formula, written once over lanes, run in the widest vectors the build
// has, and with AVX2 and FMA (or AVX-512) where a baseline x86-64 build (SSE2, 4 floats) runs on a
// processor that has them.
//
// The formula: x clamped to [-88, 88] (NaN read as -88, so no conversion is undefined); n = round(8x / ln2)
// = 8k + j (j in [0, 8)); Cody-Waite reduction to r = x - n ln2 / 8 in [-ln2/16, ln2/16]; exp(r) - 1 by
// Taylor's polynomial of degree 4 (truncation below 1.3e-9 relative); s = 2^(j/8) from a table of 8 floats
// (each correctly rounded) times 2^k put in the exponent bits (0 for k = -127); and (exp(r) - 1) s + s
// rounded once (a subnormal result too). Within 0.88 ulp of the exact value wherever the result is normal
// (tests/test_cpu_simd.cpp: every float in its hidden case, every 257th in the suite); inputs below about
// -87.38 (-inf included, where k = -127) give 0, those just above it subnormals, never NaN. Against a
// polynomial of degree 7 on [-ln2/2, ln2/2] (the form before: 1.02 ulp), the table leaves 9 operations of
// 12 on the two ports that multiply, for one lookup (a permutation of a vector): 1.15-1.2 times as fast with
// AVX2 and with AVX-512. The reduction, the polynomial's steps and the scaling are fused multiply-adds
// (rounded once): half the operations where the processor fuses them, and the same bits where it does not
// (std::fma, exact, a lane at a time: a baseline build's own 4-lane code is then several times slower,
// which only processors without AVX2 and FMA run). Lanes are GNU vectors (lanes.hpp) of 4, 8 or 16
// floats, the same bits in every width, path and build; the last values of a row go through 4 lanes.
// Without vector extensions (or with SSR_NO_VECTOR_EXTENSIONS or EIGEN_DONT_VECTORIZE defined), a float at
// a time.
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

// 2^(j/8) for j in [0, 8), each the float nearest the exact value, twice over (a 16-lane vector's table).
alignas(64) inline constexpr float eighths[16] = {0x1p+0f,        0x1.172b84p+0f, 0x1.306fe0p+0f, 0x1.4bfdaep+0f,
                                                  0x1.6a09e6p+0f, 0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f,
                                                  0x1p+0f,        0x1.172b84p+0f, 0x1.306fe0p+0f, 0x1.4bfdaep+0f,
                                                  0x1.6a09e6p+0f, 0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f};

// out = eighths[i mod 8] in each of L lanes (i at least 0): one permutation of a vector (GCC's
// __builtin_shuffle, whose indices go modulo the lanes it chooses from), or a lane at a time where the
// compiler has no variable shuffle (Clang) or no vectors.
template <int L, class F, class I>
SSR_LANES_INLINE void eighth_powers(const I& i, F& out) {
#if defined(SSR_VECTOR_EXTENSIONS) && !defined(__clang__)
  if constexpr (L >= 8) {
    F table;
    std::memcpy(&table, eighths, sizeof table);
    out = __builtin_shuffle(table, i);
  } else if constexpr (L == 4) {
    F first, second;
    std::memcpy(&first, eighths, sizeof first);
    std::memcpy(&second, eighths + 4, sizeof second);
    out = __builtin_shuffle(first, second, i);
  } else
#endif
  {
    std::int32_t index[L];
    float value[L];
    std::memcpy(index, &i, sizeof index);
    for (int l = 0; l < L; ++l) value[l] = eighths[index[l] & 7];
    std::memcpy(&out, value, sizeof value);
  }
}

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
  // n = round(8x / ln2): 1.5 * 2^23 + n is a float whose last bits are n (ulp 1 there).
  const F eight_log2e = F{} + 11.5415602f, magic = F{} + 12582912.0f;
  // -ln2 / 8 in two parts: the first's 12 bits times n's (|n| <= 1016) exact, so the first step is exact.
  const F ln2_hi = F{} - 0x1.62ep-4f, ln2_lo = F{} - 3.99327291e-6f;
  F shifted, r, y;
  lanes::FusedOwn::apply(shifted, x, eight_log2e, magic);
  const F nf = shifted - magic;
  lanes::FusedOwn::apply(r, nf, ln2_hi, x);
  lanes::FusedOwn::apply(r, nf, ln2_lo, r);
  // exp(r) - 1 = r + r^2 (1/2 + r/6 + r^2/24).
  lanes::FusedOwn::apply(y, r, F{} + 4.16666679e-2f, F{} + 1.66666672e-1f);
  lanes::FusedOwn::apply(y, y, r, F{} + 0.5f);
  const F yr = y * r;
  F p;  // exp(r) - 1
  lanes::FusedOwn::apply(p, yr, r, r);
  // n + 1016 in [0, 2032] for x in [-88, 88]: j its last three bits, k + 127 the rest, in the exponent bits.
  I bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  bits -= 0x4b400000 - 1016;
  F eighth, two_k, result;  // 2^(j/8), 2^k
  eighth_powers<L>(bits, eighth);
  bits = bits >> 3 << 23;
  std::memcpy(&two_k, &bits, sizeof two_k);
  const F s = eighth * two_k;               // exact: a power of two times a float, or 0 (k = -127)
  lanes::FusedOwn::apply(result, p, s, s);  // (p + 1) s rounded once
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

// exp of count floats in vectors of L floats, then 8 and 4, then exp_tail;
// `ahead`'s lines are asked for along the way, spread over its vectors of L floats.
template <int L>
SSR_LANES_INLINE void exp_in_lanes(const float* in, float* out, index_t count, const lanes::Ahead& ahead = {}) {
  index_t c = 0;
  if (!ahead.empty()) {
    lanes::Ahead::Spread spread(ahead, count / L);
    for (; c + L <= count; c += L) {
      exp_lanes<L>(in + c, out + c);
      spread.step();
    }
  }
  for (; c + L <= count; c += L) exp_lanes<L>(in + c, out + c);
  if constexpr (L > 8)
    for (; c + 8 <= count; c += 8) exp_lanes<8>(in + c, out + c);
  if constexpr (L > 4)
    for (; c + 4 <= count; c += 4) exp_lanes<4>(in + c, out + c);
  exp_tail(in + c, out + c, count - c);
}

// exp of count floats in the build's own vectors.
SSR_LANES_INLINE void exp_compiled(const float* in, float* out, index_t count, const lanes::Ahead& ahead = {}) {
  exp_in_lanes<widest>(in, out, count, ahead);
}

#if defined(SSR_DISPATCH_AVX2)
// exp_compiled in 8-float AVX2 vectors with FMA, for a baseline build on a processor with both.
SSR_TARGET_AVX2_FMA inline void exp_avx2(const float* in, float* out, index_t count, const lanes::Ahead& ahead = {}) {
  exp_in_lanes<8>(in, out, count, ahead);
}
#endif
#if defined(SSR_DISPATCH_AVX512)
// exp_compiled in 16-float AVX-512 vectors, for a baseline build on a processor with AVX-512.
SSR_TARGET_AVX512_FMA inline void exp_avx512(const float* in, float* out, index_t count,
                                             const lanes::Ahead& ahead = {}) {
  exp_in_lanes<16>(in, out, count, ahead);
}
#endif

// out = exp(in) for count floats (in == out allowed): the widest path this processor runs (a baseline
// build's own code has no FMA instruction: it takes the AVX2 or AVX-512 path for any count where it can).
// The lines of `ahead` are asked for meanwhile.
SSR_LANES_INLINE void exp(const float* in, float* out, index_t count, const lanes::Ahead& ahead = {}) {
#if defined(SSR_DISPATCH_AVX512)
  if (lanes::has_avx512()) return exp_avx512(in, out, count, ahead);
#endif
#if defined(SSR_DISPATCH_AVX2)
  if (lanes::has_avx2_fma()) return exp_avx2(in, out, count, ahead);
#endif
  exp_compiled(in, out, count, ahead);
}

}  // namespace SSR_LANES_NAMESPACE
}  // namespace fexp
}  // namespace cpu
}  // namespace ssr
