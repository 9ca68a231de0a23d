// exp in double, one formula for every backend and every vector width, so that the costs built from it
// (the softmax cost, softmax scores) have the same bits on the CPU, with Thrust and with CUDA, and the
// CPU can take it eight rows at a time.
//
// The formula: x clamped to [-746, 710] (a NaN stays NaN); k = round(x / ln2) by the 1.5 * 2^52 shift;
// r = x - k ln2 in two fused steps (ln2 as the nearest double and its remainder: the first step is
// exact); exp(r) by Taylor's polynomial of degree 13 (truncation below 5e-18 relative on |r| <= ln2 / 2)
// in Horner's fused steps; then 2^k in two factors 2^a 2^b (a + b = k, each a normal power of two), so
// that results below the least normal round once into the subnormals and those beyond the largest double
// overflow to +inf. Every step is a fused multiply-add (rounded once: std::fma, exact on every host and
// device), a product, a sum or bit operations: no compiler fuses anything more, and every width gives the
// same bits. Within 1 ulp of the exact value (tests/test_math_exp.cpp measures it against long double).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "ssr/detail/hd.hpp"

#if defined(__GNUC__) && !defined(__CUDACC__)
// Inlined into the CPU's vector paths (functions compiled for AVX2 or AVX-512), so that no vector is
// passed to a function compiled for another target.
#define SSR_EXP_INLINE __attribute__((always_inline)) inline
#else
#define SSR_EXP_INLINE inline
#endif

namespace ssr {
namespace math {

// y = a * b + c rounded once, for plain doubles.
struct FusedDouble {
  SSR_HD void operator()(double& y, double a, double b, double c) const { y = std::fma(a, b, c); }
};

// p = c[0], then p = p * x + c[i] for i = 1 .. N - 1, each step fused (Horner's scheme, highest power
// first), for D a double or a vector of doubles; the steps are written out at compile time (a loop kept its
// vector steps a lane at a time: 6x slower).
template <class D, class Fma, int N, int... I>
SSR_HD SSR_EXP_INLINE void fused_horner_steps(D& p, const D& x, const double (&c)[N], const Fma& fma,
                                              std::integer_sequence<int, I...> /*steps*/) {
  (fma(p, p, x, D{} + c[I + 1]), ...);
}
template <class D, class Fma, int N>
SSR_HD SSR_EXP_INLINE void fused_horner(D& p, const D& x, const double (&c)[N], const Fma& fma) {
  p = D{} + c[0];
  fused_horner_steps(p, x, c, fma, std::make_integer_sequence<int, N - 1>{});
}

// out = exp(x) for D a double or a vector of doubles (GNU vectors: the CPU's lanes), with U the unsigned
// 64-bit integers of the same shape and fma(y, a, b, c) setting y = a * b + c rounded once. Vectors go by
// reference: none crosses a function boundary by value (which would change the ABI in a build without
// their registers).
template <class D, class U, class Fma>
SSR_HD SSR_EXP_INLINE void exp_of(const D& in, D& out, const Fma& fma) {
  const D lo = D{} - 746.0, hi = D{} + 710.0;
  D x = in < lo ? lo : in;  // std::max(in, lo): a NaN stays
  x = hi < x ? hi : x;      // std::min(x, hi)
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

#if defined(__GNUC__) && !defined(__CUDACC__) && defined(__x86_64__) && !defined(__FMA__)
// A build for the x86-64 baseline has no fused multiply-add instruction: std::fma is then a call to libm,
// and exp a dozen of them (28 ns where glibc's exp takes 3). Where the processor has FMA, exp takes a copy
// compiled for it (1.5 ns), the same bits.
#define SSR_EXP_DISPATCH_FMA 1
__attribute__((target("fma"))) inline double exp_fma(double x) {
  double y;
  exp_of<double, std::uint64_t>(x, y, FusedDouble{});
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
#if defined(SSR_EXP_DISPATCH_FMA)
  if (has_fma()) return exp_fma(x);
#endif
  double y;
  exp_of<double, std::uint64_t>(x, y, FusedDouble{});
  return y;
}

}  // namespace math
}  // namespace ssr

#undef SSR_EXP_INLINE
#undef SSR_EXP_DISPATCH_FMA
