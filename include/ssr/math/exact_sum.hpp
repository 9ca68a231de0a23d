// Sums that every rank of a distributed solve computes alike. Floating-point reductions (MPI, NCCL) may
// add in any order and give different bits on different ranks, and a rank that stops one iteration
// early deadlocks the rest. So a non-negative double below 2^64 is written as a fixed-point number with
// 64 fractional bits in four 32-bit limbs held in int64: ranks add limbs as integers, exactly and in any
// order (up to 2^31 ranks), and every rank reads the same carried sum back as the same double.
#pragma once

#include <cmath>
#include <cstdint>

#include "ssr/detail/hd.hpp"

namespace ssr {
namespace math {

constexpr int exact_limbs = 4;
// The resolution of an exact sum: 2^-64. A distributed solve sums with it only values far above it:
// columns whose sum is below exact_sum_floor take the log-domain update, whose sums lie in [1, rows].
constexpr double exact_sum_floor = 1.0 / 1048576;  // 2^-20

// limbs[0, 4) = x in fixed point, x in [0, 2^64) (beyond: clamped), limb k weighing 2^(32 k - 64), the
// last 2^-64 rounded to nearest. Every step is exact but that rounding.
SSR_HD inline void to_exact(double x, std::int64_t* limbs) {
  constexpr double two32 = 4294967296.0;
  double r = x > 0 ? (x < 18446744073709549568.0 ? x : 18446744073709549568.0) : 0.0;  // NaN to 0
  const double l3 = std::floor(r / two32);
  r -= l3 * two32;
  const double l2 = std::floor(r);
  r = (r - l2) * two32;
  const double l1 = std::floor(r);
  const double l0 = std::nearbyint((r - l1) * two32);  // may round up to 2^32: carried when read
  limbs[0] = static_cast<std::int64_t>(l0);
  limbs[1] = static_cast<std::int64_t>(l1);
  limbs[2] = static_cast<std::int64_t>(l2);
  limbs[3] = static_cast<std::int64_t>(l3);
}

// The fixed-point sum of limbs (each a sum of to_exact limbs) as a double (within an ulp), carried from
// the lowest limb: the same inputs give the same bits on every rank.
SSR_HD inline double from_exact(const std::int64_t* limbs) {
  constexpr double two32 = 4294967296.0;
  std::int64_t carried[exact_limbs];
  std::int64_t carry = 0;
  for (int k = 0; k < exact_limbs; ++k) {
    const std::int64_t v = limbs[k] + carry;
    carried[k] = v & 0xffffffff;
    carry = v >> 32;  // limbs are non-negative: an arithmetic shift is a division
  }
  // Most significant first; the lower limbs then add below the leading bits.
  double x = static_cast<double>(carried[3] + carry * 4294967296LL) * two32;
  x += static_cast<double>(carried[2]);
  x += static_cast<double>(carried[1]) / two32;
  x += static_cast<double>(carried[0]) / two32 / two32;
  return x;
}

}  // namespace math
}  // namespace ssr
