// The cost noise of a tile's rows on the CPU: the rows' stretch of the call's Philox stream (math/noise.hpp),
// four blocks of four normals at a time, one block a lane (random::normals_of), into a tile of doubles.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ssr/backend/cpu/tiles.hpp"
#include "ssr/context.hpp"
#include "ssr/math/noise.hpp"
#include "ssr/random.hpp"
#include "ssr/spec.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace cpu {

// z[j * tile + q] = math::noise_value(spec, ctx, row0 + q, n, j) for q < rows, 0 for the tile's other rows.
template <class Isa>
SSR_INLINE void noise_tile(const RouteSpec& spec, const Context& ctx, index_t row0, index_t rows, index_t n,
                           double* z) {
  using U = Half<std::uint64_t>;
  const std::uint64_t e0 = math::element_index(ctx, row0, n, 0), skip = e0 & 3u;
  const std::uint64_t count = static_cast<std::uint64_t>(rows * n), blocks = (skip + count + 3) / 4;
  const std::uint64_t last_block = (std::uint64_t{1} << 62) - 1;  // the stream wraps as its element index
  const double scale = spec.noise_alpha * spec.noise_sigma;
  U lane;
  lane_index(lane);
  index_t r = 0, j = 0;  // the next element's row and column
  for (std::uint64_t b0 = 0; b0 < blocks; b0 += half) {
    Half<double> normal[4];
    random::normals_of(ctx.seed, ctx.layer, ctx.step, (lane + ((e0 >> 2) + b0)) & last_block, normal,
                       typename Isa::Fma{}, typename Isa::Sqrt{}, typename Isa::Mul{});
    double value[4][half];
    std::memcpy(value, normal, sizeof value);
    // Element `at` of these blocks (4 l + w: lane l, word w) is the stream's 4 b0 + at - skip from e0's.
    const std::uint64_t from = b0 == 0 ? skip : 0,
                        to = std::min<std::uint64_t>(std::uint64_t{4} * half, skip + count - 4 * b0);
    for (std::uint64_t at = from; at < to; ++at) {
      z[j * tile + r] = scale * value[at & 3u][at >> 2];
      if (++j == n) {
        j = 0;
        ++r;
      }
    }
  }
  for (index_t q = rows; q < tile; ++q)
    for (index_t c = 0; c < n; ++c) z[c * tile + q] = 0.0;
}

// The noise output of a tile's rows: math::noise_output_value of the drawn z, or zeros without noise.
template <class T>
void write_noise_tile(const RouteSpec& spec, const double* z, index_t n, index_t rows, MatrixView<T> out) {
  for (index_t q = 0; q < rows; ++q)
    for (index_t j = 0; j < n; ++j) out(q, j) = spec.noisy() ? math::noise_output_value<T>(z[j * tile + q]) : T(0);
}

}  // namespace cpu
}  // namespace ssr
SSR_LANES_END
