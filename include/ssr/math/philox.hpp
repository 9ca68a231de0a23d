// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"; Random123's rounds and
// constants), written once for a scalar and for a vector of lanes, so that the CPU draws many blocks at
// once and every backend draws the same words (tests/test_noise_and_selective.cpp holds it to Random123's
// known answers).
#pragma once

#include <Random123/philox.h>

#include <cstdint>
#include <cstring>

#include "ssr/detail/hd.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace math {

// y = (a mod 2^32) * b, a 64-bit product of 32-bit operands, for scalars (a vector kernel passes its own).
struct MulLow32 {
  SSR_HD void operator()(std::uint64_t& y, std::uint64_t a, std::uint32_t b) const { y = (a & 0xffffffffu) * b; }
};

// The ten rounds on the counter words c[0..4) under key (k0, k1), in place: U an unsigned 64-bit integer
// or a vector of them, each word in the low 32 bits of its lane; mul as MulLow32.
template <class U, class Mul>
SSR_HD SSR_INLINE void philox4x32_10(U (&c)[4], std::uint32_t k0, std::uint32_t k1, const Mul& mul) {
  constexpr std::uint64_t low = 0xffffffffu;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // the key's bump between rounds
      k0 += PHILOX_W32_0;
      k1 += PHILOX_W32_1;
    }
    U p0, p1;
    mul(p0, c[0], PHILOX_M4x32_0);
    mul(p1, c[2], PHILOX_M4x32_1);
    const U next0 = (p1 >> 32) ^ c[1] ^ k0, next2 = (p0 >> 32) ^ c[3] ^ k1;
    c[1] = p1 & low;
    c[3] = p0 & low;
    c[0] = next0;
    c[2] = next2;
  }
}

// u = (w + 1/2) / 2^32 for each 32-bit word w in U's lanes: uniform in (0, 1), never 0, so its log is
// finite; exact (w through the low bits of 2^52).
template <class D, class U>
SSR_HD SSR_INLINE void uniform_open_of(const U& w, D& u) {
  const U bits = w | 0x4330000000000000ull;
  std::memcpy(&u, &bits, sizeof u);
  u = ((u - 4503599627370496.0) + 0.5) * (1.0 / 4294967296.0);
}

}  // namespace math
}  // namespace ssr
SSR_LANES_END
