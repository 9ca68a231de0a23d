// Counter-based random streams (Philox4x32-10): key (seed, layer), counter (element block, step).
// A draw is a pure function of its coordinates, so every thread count and backend sees the same numbers.
#pragma once

#include <Random123/philox.h>

#include <cmath>
#include <cstdint>

#include "ssr/detail/hd.hpp"
#include "ssr/math/normal_pair.hpp"
#include "ssr/math/philox.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace random {

using Philox = r123::Philox4x32;

// Counter word pair (0xffffffff, 0xffffffff) is reserved for the selective coin: noise blocks never reach it.
constexpr std::uint32_t coin_block = 0xffffffffu;

// The four words of block `block` of the stream (seed, layer, step): Philox4x32-10 (math/philox.hpp) with
// key (seed, layer) and counter (block lo, block hi, step lo, step hi).
SSR_HD inline Philox::ctr_type draw(std::uint32_t seed, std::uint32_t layer, std::uint64_t block, std::uint64_t step) {
  std::uint64_t c[4] = {block & 0xffffffffu, block >> 32, step & 0xffffffffu, step >> 32};
  math::philox4x32_10(c, seed, layer, math::MulLow32{});
  return {{static_cast<std::uint32_t>(c[0]), static_cast<std::uint32_t>(c[1]), static_cast<std::uint32_t>(c[2]),
           static_cast<std::uint32_t>(c[3])}};
}

// Uniform in [0, 1) with 53 random bits, from two 32-bit words.
SSR_HD inline double uniform53(std::uint32_t a, std::uint32_t b) {
  return (static_cast<double>(a >> 5) * 67108864.0 + static_cast<double>(b >> 6)) * (1.0 / 9007199254740992.0);
}

// Uniform in (0, 1) from one word: never 0, so its log is finite (math::uniform_open_of).
SSR_HD inline double uniform_open(std::uint32_t a) {
  double u;
  math::uniform_open_of(std::uint64_t{a}, u);
  return u;
}

// The selective coin of one call: uniform in [0, 1); the Sinkhorn path runs iff coin < p.
SSR_HD inline double coin(std::uint32_t seed, std::uint32_t layer, std::uint64_t step) {
  const auto r = draw(seed, layer, (std::uint64_t{coin_block} << 32) | coin_block, step);
  return uniform53(r[0], r[1]);
}

// The four standard normals of each lane's block of the stream (seed, layer, step), for U an unsigned
// 64-bit integer or a vector of them (a block a lane) and D the doubles of its shape: the block's words as
// uniforms (w + 1/2) / 2^32 make two Box-Muller pairs (math::normal_pair_of), (w0, w1) and (w2, w3).
// Element e of the stream is out[e % 4] of block e / 4. fma, sqrt and mul as math::normal_pair_of and
// math::philox4x32_10 take them.
template <class D, class U, class Fma, class Sqrt, class Mul>
SSR_HD SSR_INLINE void normals_of(std::uint32_t seed, std::uint32_t layer, std::uint64_t step, const U& block,
                                  D (&out)[4], const Fma& fma, const Sqrt& sqrt, const Mul& mul) {
  U c[4] = {block & 0xffffffffu, block >> 32, U{} + (step & 0xffffffffu), U{} + (step >> 32)};
  math::philox4x32_10(c, seed, layer, mul);
  for (int pair = 0; pair < 2; ++pair) {
    D u1, u2;
    math::uniform_open_of(c[2 * pair], u1);
    math::uniform_open_of(c[2 * pair + 1], u2);
    math::normal_pair_of<D, U>(u1, u2, out[2 * pair], out[2 * pair + 1], fma, sqrt);
  }
}

// normals_of for one block, with the platform's fma and sqrt (math::normal_pair's dispatch).
SSR_HD inline void normals4(std::uint32_t seed, std::uint32_t layer, std::uint64_t step, std::uint64_t block,
                            double out[4]) {
  const auto r = draw(seed, layer, block, step);
  for (std::size_t pair = 0; pair < 2; ++pair)
    math::normal_pair(uniform_open(r[2 * pair]), uniform_open(r[2 * pair + 1]), out[2 * pair], out[2 * pair + 1]);
}

SSR_HD inline double normal(std::uint32_t seed, std::uint32_t layer, std::uint64_t step, std::uint64_t element) {
  double z[4];
  normals4(seed, layer, step, element >> 2, z);
  return z[element & 3u];
}

}  // namespace random
}  // namespace ssr
SSR_LANES_END
