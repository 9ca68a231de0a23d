// exp written once for every backend and every vector width, so that the values built from it (the
// softmax cost, softmax scores, Sinkhorn's Q and scalings) have the same bits on the CPU, with Thrust and
// with CUDA, and the CPU can take it eight rows at a time. Two formulas: one in double, and one in float
// for the float Sinkhorn's Q = exp(K + h - c).
//
// In double: x clamped to [-746, 710] (a NaN stays NaN); k = round(x / ln2) by the 1.5 * 2^52 shift;
// r = x - k ln2 in two fused steps (ln2 as the nearest double and its remainder: the first step is
// exact); exp(r) by Taylor's polynomial of degree 13 (truncation below 5e-18 relative on |r| <= ln2 / 2)
// in Horner's fused steps; then 2^k in two factors 2^a 2^b (a + b = k, each a normal power of two), so
// that results below the least normal round once into the subnormals and those beyond the largest double
// overflow to +inf. Within 1 ulp (tests/test_math_exp.cpp measures it against long double).
// In float: x clamped to [-88, 88] (a NaN gives NaN); n = round(8x / ln2) = 8k + j (j in [0, 8));
// r = x - n ln2 / 8 in [-ln2/16, ln2/16] (Cody-Waite, fused); exp(r) - 1 by Taylor's polynomial of degree 4
// (truncation below 1.3e-9 relative); s = 2^(j/8) (a table of 8 correctly rounded floats) times 2^k in the
// exponent bits (0 for k = -127); and (exp(r) - 1) s + s rounded once. Within 0.88 ulp wherever the result
// is normal; inputs below about -87.38 (-inf included) give 0, never NaN.
// Every step is a fused multiply-add (std::fma, exact on every host and device, or the vector kernels'
// instruction), a product, a sum or bit operations: no compiler fuses anything more, and every width gives
// the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "ssr/detail/hd.hpp"
#include "ssr/math/lanes.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace math {

// p = c[0], then p = p * x + c[i] for i = 1 .. N - 1, each step fused (Horner's scheme, highest power
// first), for D a scalar or a vector; the steps are written out at compile time (a loop kept its vector
// steps a lane at a time: 6x slower).
template <class D, class Fma, class C, int N, int... I>
SSR_HD SSR_INLINE void fused_horner_steps(D& p, const D& x, const C (&c)[N], const Fma& fma,
                                          std::integer_sequence<int, I...> /*steps*/) {
  (fma(p, p, x, D{} + c[I + 1]), ...);
}
template <class D, class Fma, class C, int N>
SSR_HD SSR_INLINE void fused_horner(D& p, const D& x, const C (&c)[N], const Fma& fma) {
  p = D{} + c[0];
  fused_horner_steps(p, x, c, fma, std::make_integer_sequence<int, N - 1>{});
}

// out = exp(x) for D a double or a vector of doubles (GNU vectors: the CPU's lanes), with U the unsigned
// 64-bit integers of the same shape and fma(y, a, b, c) setting y = a * b + c rounded once. Vectors go by
// reference: none crosses a function boundary by value (which would change the ABI in a build without
// their registers).
template <class D, class U, class Fma>
SSR_HD SSR_INLINE void exp_of(const D& in, D& out, const Fma& fma) {
  D x = in;
  clamp_in<Fma::piece>(x, D{} - 746.0, D{} + 710.0);  // a NaN stays
  // k = round(x / ln2): 1.5 * 2^52 + k is a double whose last bits are k (ulp 1 there).
  const D magic = D{} + 6755399441055744.0, log2e = D{} + 1.4426950408889634;
  const D ln2_hi = D{} - 0.6931471805599453, ln2_lo = D{} - 2.3190468138462996e-17;  // -ln2 in two parts
  D shifted, r;
  fma(shifted, x, log2e, magic);
  const D k = shifted - magic;
  fma(r, k, ln2_hi, x);
  fma(r, k, ln2_lo, r);
  // Horner's steps from 1 / 13! down to 1 / 0!.
  constexpr double taylor[] = {1.6059043836821613e-10,
                               2.08767569878681e-09,
                               2.505210838544172e-08,
                               2.755731922398589e-07,
                               2.7557319223985893e-06,
                               2.48015873015873e-05,
                               0.0001984126984126984,
                               0.001388888888888889,
                               0.008333333333333333,
                               0.041666666666666664,
                               0.16666666666666666,
                               0.5,
                               1.0,
                               1.0};
  D p;
  fused_horner(p, r, taylor, fma);
  // k + 1076 (in [0, 2100] for x in [-746, 710]) from the last bits; a = floor((k + 1076) / 2) - 538 and
  // b = k - a, each + 1023 in the exponent bits (485 to 1535: normal). Unsigned, so that a NaN's bits wrap
  // without overflow (its product is NaN whatever they are).
  U bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  const U biased = bits - (U{} + (0x4338000000000000ull - 1076)), half = biased >> 1;
  const U a_bits = (half + 485) << 52, b_bits = (biased - half + 485) << 52;
  D two_a, two_b;
  std::memcpy(&two_a, &a_bits, sizeof two_a);
  std::memcpy(&two_b, &b_bits, sizeof two_b);
  out = p * two_a * two_b;
}

// 2^(j/8) for j in [0, 8), each the float nearest the exact value, twice over (a 16-lane vector's table).
alignas(64) inline constexpr float eighths[16] = {0x1p+0f,        0x1.172b84p+0f, 0x1.306fe0p+0f, 0x1.4bfdaep+0f,
                                                  0x1.6a09e6p+0f, 0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f,
                                                  0x1p+0f,        0x1.172b84p+0f, 0x1.306fe0p+0f, 0x1.4bfdaep+0f,
                                                  0x1.6a09e6p+0f, 0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f};

// y = eighths[i & 7] for a scalar (a vector kernel passes a lookup of its own: a permutation of a vector).
struct EighthsScalar {
  SSR_HD void operator()(std::int32_t i, float& y) const {
#if defined(__CUDA_ARCH__)
    constexpr float table[8] = {0x1p+0f,        0x1.172b84p+0f, 0x1.306fe0p+0f, 0x1.4bfdaep+0f,
                                0x1.6a09e6p+0f, 0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f};
    y = table[i & 7];
#else
    y = eighths[i & 7];
#endif
  }
};

// out = exp(in) in float (see the top of this file) for F a float or a vector of floats, I the 32-bit
// integers of its shape, fma as in exp_of and lookup(i, y) setting y = eighths[i & 7] lane by lane.
template <class F, class I, class Fma, class Lookup>
SSR_HD SSR_INLINE void exp_float_of(const F& in, F& out, const Fma& fma, const Lookup& lookup) {
  F x = in;
  clamp_in<Fma::piece>(x, F{} - 88.0f, F{} + 88.0f);
  // n = round(8x / ln2): 1.5 * 2^23 + n is a float whose last bits are n (ulp 1 there).
  const F magic = F{} + 12582912.0f;
  // -ln2 / 8 in two parts: the first's 12 bits times n's (|n| <= 1016) exact, so the first step is exact.
  F shifted, r, y, p, result;
  fma(shifted, x, F{} + 11.5415602f, magic);
  const F nf = shifted - magic;
  fma(r, nf, F{} - 0x1.62ep-4f, x);
  fma(r, nf, F{} - 3.99327291e-6f, r);
  // exp(r) - 1 = r + r^2 (1/2 + r/6 + r^2/24).
  fma(y, r, F{} + 4.16666679e-2f, F{} + 1.66666672e-1f);
  fma(y, y, r, F{} + 0.5f);
  const F yr = y * r;
  fma(p, yr, r, r);
  // n + 1016 in [0, 2032] for x in [-88, 88]: j its last three bits, k + 127 the rest, in the exponent bits
  // (masked to eight bits, which changes nothing there and keeps a NaN's shift defined; its result is NaN).
  I bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  bits -= 0x4b400000 - 1016;
  F eighth, two_k;
  lookup(bits, eighth);
  bits = (bits >> 3 & 0xff) << 23;
  std::memcpy(&two_k, &bits, sizeof two_k);
  const F s = eighth * two_k;  // exact: a power of two times a float, or 0 (k = -127)
  fma(result, p, s, s);        // (p + 1) s rounded once
  out = result;
}

#if defined(__GNUC__) && !defined(__CUDACC__) && defined(__x86_64__) && !defined(__FMA__)
// A build for the x86-64 baseline has no fused multiply-add instruction: std::fma is then a call to libm,
// and exp a dozen of them (28 ns where glibc's exp takes 3). Where the processor has FMA, exp takes a copy
// compiled for it (1.5 ns), the same bits.
#define SSR_MATH_DISPATCH_FMA 1  // log.hpp's too
__attribute__((target("fma"))) inline double exp_fma(double x) {
  double y;
  exp_of<double, std::uint64_t>(x, y, Fused{});
  return y;
}
__attribute__((target("fma"))) inline float exp_float_fma(float x) {
  float y;
  exp_float_of<float, std::int32_t>(x, y, Fused{}, EighthsScalar{});
  return y;
}
inline bool has_fma() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("fma") != 0;
  }();
  return yes;
}
#endif

// exp(x) in double (see the top of this file).
SSR_HD inline double exp(double x) {
#if defined(SSR_MATH_DISPATCH_FMA)
  if (has_fma()) return exp_fma(x);
#endif
  double y;
  exp_of<double, std::uint64_t>(x, y, Fused{});
  return y;
}

// exp(x) by T's formula: the float one for floats, the double one for doubles.
template <class T>
SSR_HD inline T exp_as(T x) {
  if constexpr (sizeof(T) == sizeof(float)) {
#if defined(SSR_MATH_DISPATCH_FMA)
    if (has_fma()) return exp_float_fma(x);
#endif
    float y;
    exp_float_of<float, std::int32_t>(x, y, Fused{}, EighthsScalar{});
    return y;
  } else {
    return math::exp(x);
  }
}

}  // namespace math
}  // namespace ssr
SSR_LANES_END
