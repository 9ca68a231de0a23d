// Counter-based random streams (Philox4x32-10): key (seed, layer), counter (element block, step).
// A draw is a pure function of its coordinates, so every thread count and backend sees the same numbers.
#pragma once

#include <Random123/philox.h>

#include <cmath>
#include <cstdint>

#include "ssr/detail/hd.hpp"
#include "ssr/math/normal_pair.hpp"

namespace ssr {
namespace random {

using Philox = r123::Philox4x32;

// Counter word pair (0xffffffff, 0xffffffff) is reserved for the selective coin: noise blocks never reach it.
constexpr std::uint32_t coin_block = 0xffffffffu;

SSR_HD inline Philox::ctr_type::value_type lo(std::uint64_t v) { return static_cast<std::uint32_t>(v); }
SSR_HD inline Philox::ctr_type::value_type hi(std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32); }

SSR_HD inline Philox::ctr_type draw(std::uint32_t seed, std::uint32_t layer, std::uint64_t block, std::uint64_t step) {
  Philox::ctr_type ctr = {{lo(block), hi(block), lo(step), hi(step)}};
  Philox::key_type key = {{seed, layer}};
  return Philox()(ctr, key);
}

// Uniform in [0, 1) with 53 random bits, from two 32-bit words.
SSR_HD inline double uniform53(std::uint32_t a, std::uint32_t b) {
  return (static_cast<double>(a >> 5) * 67108864.0 + static_cast<double>(b >> 6)) * (1.0 / 9007199254740992.0);
}

// Uniform in (0, 1) from one word: never 0, so its log is finite.
SSR_HD inline double uniform_open(std::uint32_t a) { return (static_cast<double>(a) + 0.5) * (1.0 / 4294967296.0); }

// The selective coin of one call: uniform in [0, 1); the Sinkhorn path runs iff coin < p.
SSR_HD inline double coin(std::uint32_t seed, std::uint32_t layer, std::uint64_t step) {
  const auto r = draw(seed, layer, (std::uint64_t{coin_block} << 32) | coin_block, step);
  return uniform53(r[0], r[1]);
}

// The four standard normals of block `block` of the stream (seed, layer, step): two Box-Muller pairs in double
// (math::normal_pair: the same bits on every backend).
// Element e of the stream is lane e % 4 of block e / 4.
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
