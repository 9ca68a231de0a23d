// The two standard normals of a Box-Muller pair, radius sqrt(-2 log u1) at the angle 2 pi u2, with log,
// sin and cos written once in double for every backend and every vector width (as math::exp is), so that
// the cost noise has the same bits on the CPU, with Thrust and with CUDA, and the CPU can draw it in vectors.
//
// log: math::log_of (log.hpp).
// cos(2 pi u), sin(2 pi u), u in [0, 1]: q = round(4u), r = u - q / 4 in [-1/8, 1/8] (both exact), sin(2 pi r)
// and cos(2 pi r) by Taylor's polynomials in r of degrees 17 and 18 (truncation below 1e-19), 2 pi and
// -2 pi^2 as their nearest doubles plus remainders, and r^2's rounding error carried into cos, then rotated
// by q quarter turns (a swap and signs, in the bits).
// Every step is a fused multiply-add (std::fma, rounded once on every host and device), a product, a
// quotient, a square root, a sum with an operand that is not a product, or bit operations: no compiler fuses
// anything more, and every width gives the same bits. tests/test_math_normal_pair.cpp measures each against
// long double.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "ssr/detail/hd.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/math/log.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace math {

// cos(2 pi u) and sin(2 pi u) for D a double or a vector of doubles, U as in log_of; for u in [0, 1].
template <class D, class U, class Fma>
SSR_HD SSR_INLINE void cos_sin_turn_of(const D& u, D& cos_out, D& sin_out, const Fma& fma) {
  // q = round(4u) by the 1.5 * 2^52 shift (its last bits are q); r = u - q / 4, exact.
  const D magic = D{} + 6755399441055744.0;
  D shifted, r;
  fma(shifted, u, D{} + 4.0, magic);
  const D q = shifted - magic;
  fma(r, q, D{} - 0.25, u);
  const D z = r * r;
  // ps = sin(2 pi r) / r - (2 pi's nearest double): Horner's steps from r^16 down to r^0, whose last adds
  // 2 pi's remainder; sin = r * that double + r * ps, rounded once.
  constexpr double sin_taylor[] = {0.10422916220813984, -0.7181223017785006, 3.819952584848282,
                                   -15.09464257682299,  42.058693944897655,  -76.70585975306139,
                                   81.60524927607506,   -41.34170224039976,  2.4492935982947064e-16};
  D ps;
  fused_horner(ps, z, sin_taylor, fma);
  const D r_tail = r * ps;
  D sin_r, cos_r;
  fma(sin_r, r, D{} + 6.283185307179586, r_tail);
  // pc = (cos(2 pi r) - 1 + 2 pi^2 r^2) / r^4: from r^14 down to r^0.
  constexpr double cos_taylor[] = {-0.03638284114254567, 0.28200596845579123, -1.714390711088672, 7.903536371318469,
                                   -26.4262567833744,    60.24464137187666,   -85.45681720669373, 64.9393940226683};
  D pc;
  fused_horner(pc, z, cos_taylor, fma);
  // cos = 1 - 2 pi^2 r^2 + r^4 pc: w = 1 - 2 pi^2 z rounded once, and what w, z (r^2 = z + z_err) and
  // -2 pi^2 (the nearest double c2 plus c2_lo) left out, added to it last.
  const D c2 = D{} - 19.739208802178716;
  D z_err, w, w_err, small, tail;
  fma(z_err, r, r, -z);
  fma(w, c2, z, D{} + 1.0);
  const D one_minus_w = 1.0 - w;  // exact: w in [0.69, 1]
  fma(w_err, c2, z, one_minus_w);
  fma(small, pc, z, D{} - 1.2530591017479423e-15);  // c2_lo + z pc
  fma(tail, small, z, w_err);
  fma(tail, c2, z_err, tail);
  cos_r = w + tail;
  // Quarter turn q: (cos, sin) becomes (-sin, cos); odd q swaps them, q & 2 negates sin, (q + 1) & 2 cos.
  U q_bits, c_bits, s_bits;
  std::memcpy(&q_bits, &shifted, sizeof q_bits);
  std::memcpy(&c_bits, &cos_r, sizeof c_bits);
  std::memcpy(&s_bits, &sin_r, sizeof s_bits);
  const U swap = U{} - (q_bits & 1u);  // all ones where q is odd
  const U cos_bits = ((c_bits & ~swap) | (s_bits & swap)) ^ (((q_bits + 1u) & 2u) << 62);
  const U sin_bits = ((s_bits & ~swap) | (c_bits & swap)) ^ ((q_bits & 2u) << 62);
  std::memcpy(&cos_out, &cos_bits, sizeof cos_out);
  std::memcpy(&sin_out, &sin_bits, sizeof sin_out);
}

// The pair sqrt(-2 log u1) (cos 2 pi u2, sin 2 pi u2), u1 in (0, 1], u2 in [0, 1]; sqrt(y, x) sets
// y = sqrt(x), correctly rounded.
template <class D, class U, class Fma, class Sqrt>
SSR_HD SSR_INLINE void normal_pair_of(const D& u1, const D& u2, D& first, D& second, const Fma& fma, const Sqrt& sqrt) {
  D log_u, radius, c, s;
  log_of<D, U>(u1, log_u, fma);
  sqrt(radius, log_u * -2.0);
  cos_sin_turn_of<D, U>(u2, c, s, fma);
  first = radius * c;
  second = radius * s;
}

// y = sqrt(x) for plain doubles.
struct SqrtDouble {
  SSR_HD void operator()(double& y, double x) const { y = std::sqrt(x); }
};

#if defined(__GNUC__) && !defined(__CUDACC__) && defined(__x86_64__) && !defined(__FMA__)
// As for exp (exp.hpp): a baseline x86-64 build takes a copy compiled for FMA where the processor has it.
#define SSR_NORMAL_PAIR_DISPATCH_FMA 1
__attribute__((target("fma"))) inline void normal_pair_fma(double u1, double u2, double& first, double& second) {
  normal_pair_of<double, std::uint64_t>(u1, u2, first, second, Fused{}, SqrtDouble{});
}
#endif

// The Box-Muller pair of (u1, u2) (see the top of this file).
SSR_HD inline void normal_pair(double u1, double u2, double& first, double& second) {
#if defined(SSR_NORMAL_PAIR_DISPATCH_FMA)
  if (has_fma()) return normal_pair_fma(u1, u2, first, second);
#endif
  normal_pair_of<double, std::uint64_t>(u1, u2, first, second, Fused{}, SqrtDouble{});
}

}  // namespace math
}  // namespace ssr
SSR_LANES_END

#undef SSR_NORMAL_PAIR_DISPATCH_FMA
