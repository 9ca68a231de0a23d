// log in double, written once for every backend and every vector width (as exp.hpp), so that the
// potentials built from it have the same bits everywhere: x = 2^k z with z in [sqrt(2)/2, sqrt(2)) from
// the bits, f = z - 1 (exact), s = f / (2 + f), log(1 + f) = 2 atanh(s) = f - (f^2 / 2 - s (f^2 / 2 + R(s^2)))
// with R the polynomial of degree 7 in s^2 of the classic fdlibm log (its coefficients), and k ln2 added as
// a product exact in its first part (ln2 to 32 bits) plus a remainder. For positive normal finite doubles
// (every log the routing takes: uniforms in (0, 1), column and row sums held above underflow, counts);
// within 1 ulp (tests/test_math_normal_pair.cpp measures it against long double).
#pragma once

#include <cstdint>
#include <cstring>

#include "ssr/detail/hd.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/math/lanes.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace math {

// out = log(in) for D a double or a vector of doubles, U the unsigned 64-bit integers of its shape, fma as in
// exp_of; for positive normal finite doubles (the uniforms of the noise, in (0, 1)).
template <class D, class U, class Fma>
SSR_HD SSR_INLINE void log_of(const D& in, D& out, const Fma& fma) {
  U bits;
  std::memcpy(&bits, &in, sizeof bits);
  // tmp's top 12 bits are k (mod 4096) where z = x / 2^k lies in [sqrt(2)/2, sqrt(2)) (0x3fe6a09e667f3bcd:
  // sqrt(2)/2's bits); k + 2048 (in [973, 3072]) put in the low bits of 2^52 gives k as a double.
  const U tmp = bits - (U{} + 0x3fe6a09e667f3bcdull);
  const U z_bits = bits - (tmp & (U{} + 0xfff0000000000000ull));
  const U k_bits = (((tmp >> 52) + 2048) & (U{} + 0xfffull)) | (U{} + 0x4330000000000000ull);
  D z, k_shifted;
  std::memcpy(&z, &z_bits, sizeof z);
  std::memcpy(&k_shifted, &k_bits, sizeof k_shifted);
  const D k = k_shifted - (D{} + 4503599627372544.0);  // 2^52 + 2048
  const D f = z - 1.0;
  const D s = f / (f + 2.0);
  const D s2 = s * s;
  constexpr double lg[] = {1.479819860511658591e-01, 1.531383769920937332e-01, 1.818357216161805012e-01,
                           2.222219843214978396e-01, 2.857142874366239149e-01, 3.999999999940941908e-01,
                           6.666666666666735130e-01};  // fdlibm's Lg7 down to Lg1
  D p;
  fused_horner(p, s2, lg, fma);
  const D half_f = f * 0.5;   // exact
  const D hfsq = half_f * f;  // f^2 / 2
  D t, u, v;
  fma(t, p, s2, hfsq);                            // f^2 / 2 + R
  const D k_lo = k * 1.90821492927058770002e-10;  // k ln2's remainder
  fma(u, s, t, k_lo);
  fma(v, half_f, f, -u);  // f^2 / 2 - u
  const D w = v - f;
  fma(out, k, D{} + 6.93147180369123816490e-01, -w);  // k ln2's first part (an exact product) - w
}

#if defined(SSR_MATH_DISPATCH_FMA)
// As for exp (exp.hpp): a baseline x86-64 build takes a copy compiled for FMA where the processor has it.
__attribute__((target("fma"))) inline double log_fma(double x) {
  double y;
  log_of<double, std::uint64_t>(x, y, Fused{});
  return y;
}
#endif

// log(x) in double, x a positive normal double (see the top of this file).
SSR_HD inline double log(double x) {
#if defined(SSR_MATH_DISPATCH_FMA)
  if (has_fma()) return log_fma(x);
#endif
  double y;
  log_of<double, std::uint64_t>(x, y, Fused{});
  return y;
}

}  // namespace math
}  // namespace ssr
SSR_LANES_END
