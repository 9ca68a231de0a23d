// The cost noise alpha * eps_ij, eps ~ N(0, sigma^2): element (i, j) is number i * n + j of the call's
// Philox stream (seed, layer, step) of the call's Context, i the token's global row (Context::first_row +
// its row in the call), so every backend, thread count and sharding over ranks draws the same numbers.
#pragma once

#include <cstdint>

#include "ssr/context.hpp"
#include "ssr/detail/hd.hpp"
#include "ssr/random.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace math {

// The stream element of the call's row `row` (from 0) and expert j.
SSR_HD inline std::uint64_t element_index(const Context& ctx, index_t row, index_t n, index_t j) {
  return (ctx.first_row + static_cast<std::uint64_t>(row)) * static_cast<std::uint64_t>(n) +
         static_cast<std::uint64_t>(j);
}

// alpha * eps of the call's element (row, j).
SSR_HD inline double noise_value(const RouteSpec& spec, const Context& ctx, index_t row, index_t n, index_t j) {
  return spec.noise_alpha * spec.noise_sigma *
         random::normal(ctx.seed, ctx.layer, ctx.step, element_index(ctx, row, n, j));
}

// z[j] = noise_value(spec, ctx, row, n, j) for the n elements of a row, each block of four normals drawn once.
SSR_HD inline void noise_row(const RouteSpec& spec, const Context& ctx, index_t row, index_t n, double* z) {
  const double scale = spec.noise_alpha * spec.noise_sigma;
  double block[4];
  std::uint64_t loaded = ~std::uint64_t{0};
  for (index_t j = 0; j < n; ++j) {
    const std::uint64_t e = element_index(ctx, row, n, j);
    if ((e >> 2) != loaded) {
      loaded = e >> 2;
      random::normals4(ctx.seed, ctx.layer, ctx.step, loaded, block);
    }
    z[j] = scale * block[e & 3u];
  }
}

// The noise output of element j: z(j) where the call draws noise, 0 where it does not.
template <class T, class Noise>
SSR_HD T noise_output_at(const RouteSpec& spec, const Noise& z, index_t j) {
  return spec.noisy() ? static_cast<T>(z(j)) : T(0);
}

// The noise output of a row of n elements: out[j] = noise_output_at(j).
template <class T, class Noise>
SSR_HD void noise_output(const RouteSpec& spec, index_t n, const Noise& z, T* out) {
  for (index_t j = 0; j < n; ++j) out[j] = noise_output_at<T>(spec, z, j);
}

}  // namespace math
}  // namespace ssr
